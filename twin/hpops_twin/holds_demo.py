"""The demo's budget holds chapter: alice crosses 100 % of her limit, Slurm holds her, the operator releases her.

The user spend chapter's stack and month go on: the platform team turns holds on with a stack update
(`sam deploy --parameter-overrides`, holds_twin.HOLD_PARAMETERS), so the month already reported is
not played again. The real BudgetGuard sweep decides, the holds parameter carries the decision, the controller's real
agent sets alice's association limits (in holds_twin.FakeSlurmLimits: the real Slurm's answers are
tests/slurm/test_holds_real_slurm.py's), alerts go to alice and the platform team, and the release
`hpops cost release` records lifts the hold at the next sweep.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING

from hpops.main import release_user
from hpops_twin import user_spend_demo as chapter
from hpops_twin.holds_twin import FREE, HELD, HOLD_PARAMETERS, OPERATOR, attach, published_holds, run_holds

if TYPE_CHECKING:
    from hpops_twin.demo import Demo

# After the user spend chapter's sweeps (12:00, 13:00): the next two hourly sweeps.
HOLD_SWEEPS = tuple(when + dt.timedelta(hours=2) for when in chapter.SWEEPS)


def run_holds_chapter(main: Demo, month: chapter.Month) -> None:
    """On the user spend chapter's world and ``month``, after its sweeps."""
    from hpops_twin.demo import Demo

    first, second = HOLD_SWEEPS
    world = month.world
    demo = Demo(world, main.out)
    demo.steps, demo.started = main.steps, main.started  # one table, one clock
    overrides = " ".join(f"{k}={v}" for k, v in HOLD_PARAMETERS.items())

    def turn_holds_on() -> list[str]:
        world.update_parameters(HOLD_PARAMETERS)
        return []

    demo.step(f"budget holds: the platform team turns holds on for the same stack and month "
              f"(`sam deploy --parameter-overrides {overrides}`)", turn_holds_on,
              "the budget sweep's CheckUserSpend now holds (USER_BUDGET_ACTION=hold)",
              lambda: month.spend.spend_environment().get("USER_BUDGET_ACTION") == "hold", targets=False)
    slurm = attach(month.controller, chapter.USERS)
    decided: list[dict] = []

    def held_users() -> list[str]:
        return published_holds(world)["users"]

    def sweep(when: dt.datetime) -> list[str]:
        [result] = world.budget.run([month.start_sweep(when)])
        decided.append(result.output["userSpend"]["holds"])
        return []

    def hold_subjects(user: str) -> list[str]:
        return [m["Subject"] for m in month.spend.user_inbox(user)
                if m["MessageAttributes"]["kind"]["Value"] == "user-hold"]

    demo.step(f"budget holds: budget sweep at {first:%b %d %H:%M}", lambda: sweep(first),
              "alice (over her limit) is held: the holds parameter names her, she gets one 'held' alert",
              lambda: held_users() == ["alice"] and len(hold_subjects("alice")) == 1 and not hold_subjects("bob"),
              targets=False)
    for row in decided[-1]["decisions"]:
        demo.say(f"          {row['user']}: {'HOLD' if row['hold'] else 'no hold'}: {row['reason']}")
    jobs = {user: slurm.submit(user) for user in ("alice", "bob")}  # queued before the agent's poll

    def poll() -> list[str]:
        run_holds(month.controller, first + dt.timedelta(minutes=1))
        return []

    demo.step("budget holds: the controller's agent polls", poll,
              "alice's associations in QOS hpopshold, her pending jobs too (they pend QOSMaxJobsPerUserLimit); bob's, carol's untouched",
              lambda: slurm.limits("alice") == HELD and slurm.limits("bob") == slurm.limits("carol") == FREE
              and slurm.squeue(jobs["alice"]).startswith("PENDING"), targets=False)
    for user, job in jobs.items():
        demo.say(f"          {user}'s job {job}: squeue -o %T|%r -> {slurm.squeue(job)}")

    def release() -> list[str]:
        release_user(world.aws.client("dynamodb"), world.resolver.physical_ids["SyncStateTable"], world.cluster_name,
                     "alice", "grant renewed", OPERATOR, first + dt.timedelta(minutes=30))
        sweep(second)
        run_holds(month.controller, second + dt.timedelta(minutes=1))
        return []

    demo.step("budget holds: `hpops cost release` alice, then the next sweep and poll", release,
              "alice released (one 'released' alert naming who and why), her QOS restored",
              lambda: held_users() == [] and slurm.limits("alice") == FREE and len(hold_subjects("alice")) == 2
              and slurm.squeue(jobs["alice"]).startswith("RUNNING"), targets=False)
    demo.say(f"          alice's job {jobs['alice']}: squeue -o %T|%r -> {slurm.squeue(jobs['alice'])}")
    for subject in hold_subjects("alice"):
        demo.say(f"          alice's inbox: {subject}")
