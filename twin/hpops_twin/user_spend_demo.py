"""The demo's per-user spend chapter: a month of Slurm usage, priced per user, one alert.

A twin of its own, deployed with per-user limits (UserMonthlyBudgetUsd, UserBudgetOverrides) and
a cluster with a controller group and a CPU partition. The controller's real node agent reads a
generated month of sacct from Nov 1 (every 6 hours in the twin, every 15 minutes on a cluster:
the same windows either way) and sends it through the node-report bus to RecordUsageReport. Then
the hourly budget sweeps: alice, who started a 6-node allocation last night, is projected past 80 %
of her limit and gets one alert; the next sweep stays quiet. The `hpops cost` table ends it.

Time is an input: the month is November 2026 whatever day the demo runs (the agent's clock and
the sweeps' start times are set), so every figure is the same on every run.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from hpops_twin.budget_twin import VOLUME_USAGE
from hpops_twin.user_spend_twin import CONTROLLER_GROUP, ControllerNode, SlurmJob, UserSpendTwin, execution_clock
from hpops_twin.world import TwinWorld

if TYPE_CHECKING:
    from hpops_twin.demo import Demo

UTC = dt.timezone.utc
MONTH = "2026-11"
MONTH_START = dt.datetime(2026, 11, 1, tzinfo=UTC)
AGENT_FIRST_RUN = MONTH_START + dt.timedelta(minutes=15)
AGENT_EVERY = dt.timedelta(hours=6)
PROGRESS_RUNS = 4  # the demo says how far the agent got every day of runs
# The day of the sweeps: the month so far is five complete days (each is 24 signed reports the twin plays).
SWEEP_DAY = 6
FIRST_SWEEP = dt.datetime(2026, 11, SWEEP_DAY, 12, 0, tzinfo=UTC)
SWEEPS = (FIRST_SWEEP, FIRST_SWEEP + dt.timedelta(hours=1))
# The agent's last run before each sweep (on the 3-minute grid every job time is on: see demo_jobs).
AGENT_BEFORE_SWEEP = dt.timedelta(minutes=9)
USERS = ("alice", "bob", "carol")

# instance group -> (instance type, nodes); Slurm partition -> instance group
GROUPS = {"gpu": ("ml.p5.48xlarge", 8), "cpu": ("ml.c5.4xlarge", 4), CONTROLLER_GROUP: ("ml.m5.xlarge", 1),
          "login": ("ml.m5.4xlarge", 3)}
PARTITIONS = {"gpu": "gpu", "cpu": "cpu"}
PARAMETERS = {"UserMonthlyBudgetUsd": "35000", "UserBudgetOverrides": "alice=280000",
              # The sync's host identity checks are another chapter's story.
              "HostIdentityMode": "off"}
# What Cost Explorer bills the cluster for Nov 1-5 (the complete days before the sweeps: 120 h per node), per
# instance type (USD, hours); the gpu nodes below list price (a Savings Plan, say).
BILLED_HOURS = (SWEEP_DAY - 1) * 24
RATES = {"ml.p5.48xlarge": Decimal("85.00"), "ml.c5.4xlarge": Decimal("0.80"), "ml.m5.xlarge": Decimal("0.23"),
         "ml.m5.4xlarge": Decimal("0.922")}
VOLUMES_BILLED = Decimal("1200.00")


def billed_usage() -> dict[str, tuple[str, str]]:
    nodes = {instance_type: count for instance_type, count in GROUPS.values()}
    return {t: (f"{RATES[t] * nodes[t] * BILLED_HOURS:f}", str(nodes[t] * BILLED_HOURS)) for t in RATES}


def _grid(rng: random.Random, low_minutes: int, high_minutes: int) -> int:
    """Seconds, a multiple of 3 minutes: node-seconds x $85/3600 is then whole micro-dollars."""
    return rng.randrange(low_minutes // 3, high_minutes // 3 + 1) * 180


def demo_jobs(seed: int = 2026) -> list[SlurmJob]:
    """November's allocations, deterministic: alice runs 4-node GPU jobs every day and starts a
    6-node run the evening before the sweeps (20:00); bob runs 1-node GPU jobs on weekdays; carol CPU jobs only."""
    rng = random.Random(seed)
    jobs: list[SlurmJob] = []

    def job(user: str, partition: str, nodes: int, gpus_per_node: int, cpus_per_node: int, start: dt.datetime,
            seconds: int) -> None:
        begin = int(start.timestamp())
        jobs.append(SlurmJob(len(jobs) + 1001, user, partition, nodes, nodes * cpus_per_node, nodes * gpus_per_node,
                             begin, begin + seconds))

    for day in range(30):
        midnight = MONTH_START + dt.timedelta(days=day)
        if day < SWEEP_DAY - 1:  # the complete days before the sweeps
            job("alice", "gpu", 4, 8, 192, midnight + dt.timedelta(seconds=_grid(rng, 30, 120)), _grid(rng, 720, 900))
        if midnight.weekday() < 5:
            job("bob", "gpu", 1, 8, 192, midnight + dt.timedelta(seconds=_grid(rng, 450, 540)), _grid(rng, 480, 630))
        job("carol", "cpu", rng.choice((2, 3, 4)), 0, 16, midnight + dt.timedelta(seconds=_grid(rng, 360, 480)),
            _grid(rng, 300, 720))
    job("alice", "gpu", 6, 8, 192, dt.datetime(2026, 11, SWEEP_DAY - 1, 20, 0, tzinfo=UTC), 60 * 3600)
    return jobs


@dataclass
class Month:
    """The chapter's twin: observers, the controller, and what happened."""

    world: TwinWorld
    spend: UserSpendTwin
    controller: ControllerNode
    jobs: list[SlurmJob]
    sweeps: list[Any] = field(default_factory=list)
    agent_runs: list[dt.datetime] = field(default_factory=list)

    def run_agent(self, when: dt.datetime) -> int:
        self.agent_runs.append(when)
        return self.controller.run_agent(when).windows_sent

    def deliver_until(self, last: dt.datetime, progress: Callable[[dt.datetime, int], None] | None = None) -> int:
        """The agent's runs from where it stopped (or Nov 1) to ``last``: windows sent. ``progress`` hears
        of every PROGRESS_RUNS runs."""
        when = self.agent_runs[-1] + AGENT_EVERY if self.agent_runs else AGENT_FIRST_RUN
        sent = 0
        while when < last:
            sent += self.run_agent(when)
            if progress and len(self.agent_runs) % PROGRESS_RUNS == 0:
                progress(when, sent)
            when += AGENT_EVERY
        return sent + self.run_agent(last)

    def start_sweep(self, when: dt.datetime, progress: Callable[[dt.datetime, int], None] | None = None) -> str:
        """The hourly BudgetSweep, started at ``when`` (after the agent's run just before it)."""
        self.deliver_until(when - AGENT_BEFORE_SWEEP, progress)
        with execution_clock(when):
            return self.world.budget.sweep()


def month_world(progress: Callable[[str], None] | None = None) -> TwinWorld:
    extra = {name: spec for name, spec in GROUPS.items() if name not in ("login", "gpu")}
    return TwinWorld(login_group="login", login_count=GROUPS["login"][1], worker_group="gpu",
                     worker_count=GROUPS["gpu"][1], extra_groups=extra, parameters=PARAMETERS, progress=progress)


def prepare(world: TwinWorld) -> Month:
    """Observers on the alerts, Cost Explorer's bill, and the controller node with its agent."""
    made = {g["InstanceGroupName"]: (g["InstanceType"], g["CurrentCount"])
            for g in world.sim.cluster(world.cluster_name).instance_groups}
    if made != GROUPS:  # the bill below is for GROUPS' nodes
        raise RuntimeError(f"the twin's cluster has {made}, the chapter bills {GROUPS}")
    spend = UserSpendTwin(world, users=USERS)
    world.budget.set_billed_usage(billed_usage(), other={VOLUME_USAGE: f"{VOLUMES_BILLED:f}"})
    jobs = demo_jobs()
    return Month(world, spend, spend.controller(jobs, PARTITIONS), jobs)


def play(month: Month) -> dict[str, Any]:
    """The whole chapter without narration (`hpops cost --twin`): the `hpops cost` document at the last sweep."""
    for when in SWEEPS:
        month.sweeps.extend(month.world.wait([month.start_sweep(when)], timeout=120))
    return month.spend.cost_document(SWEEPS[-1])


# --------------------------------------------------------------------------- the demo chapter


def run_user_spend_chapter(main: Demo, then: Callable[[Month], None] = lambda month: None) -> None:
    """The chapter in a month_world of its own; ``then`` goes on with the month it played, in the same world."""
    limits = ", ".join(f"{name}={PARAMETERS[name]}" for name in ("UserMonthlyBudgetUsd", "UserBudgetOverrides"))
    main.say(f"per-user spend: a third stack, with {limits}, on a cluster with groups "
             + ", ".join(f"{g} {n} x {t}" for g, (t, n) in GROUPS.items()))
    with month_world(progress=lambda text: main.say(f"        {text}")) as world:
        _spend_steps(main, world, then)


def _spend_steps(main: Demo, world: TwinWorld, then: Callable[[Month], None]) -> None:
    from hpops.output import print_cost
    from hpops_twin.demo import Demo

    demo = Demo(world, main.out)
    demo.steps, demo.started = main.steps, main.started  # one table, one clock
    world.wait([world.run_schedule("Sweep")])  # the login target group in sync, as after the first steps
    month = prepare(world)
    controller, spend = month.controller, month.spend
    demo.say(f"        controller {controller.instance_id} (group {CONTROLLER_GROUP}): the real node agent; sacct answers "
             f"from {len(month.jobs)} generated jobs of alice (GPU), bob (GPU), carol (CPU only); time is an input")
    demo.say(f"        Cost Explorer bills Nov 1-{SWEEP_DAY - 1}: " + ", ".join(
        f"{t} ${Decimal(usd):,.2f} over {hours} h" for t, (usd, hours) in billed_usage().items())
        + f", volumes ${VOLUMES_BILLED:,.2f}")
    sent: list[int] = []
    first_collection = FIRST_SWEEP - AGENT_BEFORE_SWEEP

    def deliver() -> list[str]:
        # The month is hundreds of signed reports: say how far the agent got every day.
        def progress(when: dt.datetime, so_far: int) -> None:
            demo.say(f"          ... agent runs through {when:%b %d %H:%M}: {so_far} window reports sent")

        sent.append(month.deliver_until(first_collection, progress))
        return []

    demo.step(f"per-user spend: the controller's agent reports Nov 1 to {first_collection:%b %d %H:%M} (node-report bus)",
              deliver, "every window stored by RecordUsageReport, none refused",
              lambda: spend.stored_windows(month=MONTH) > 0 and not spend.rejected_reports(), targets=False)
    demo.say(f"        {len(month.agent_runs)} agent runs, {sent[0]} window reports sent, "
             f"{spend.stored_windows(MONTH)} window parts stored for {MONTH}")

    login = world.sim.nodes(world.cluster_name, world.login_group)[0]
    impostor = spend.controller(month.jobs, PARTITIONS, instance_id=login.instance_id)
    stored_before = spend.stored_windows(MONTH)

    def impostor_reports() -> list[str]:
        impostor.run_agent(FIRST_SWEEP - dt.timedelta(minutes=8))
        return []

    demo.step(f"per-user spend: a login node ({login.instance_id}) sends a usage report", impostor_reports,
              "refused (ReportRoleError: its key is enrolled for a login node; event to the DLQ), nothing stored",
              lambda: bool(spend.rejected_reports()) and spend.stored_windows(MONTH) == stored_before, targets=False)
    for text in dict.fromkeys(f"{f['error']}: {f['message']}" for f in spend.rejected_reports()):
        demo.say(f"          {len(spend.rejected_reports())} report(s) refused, {text}")

    def one_alert_for_alice() -> bool:
        platform, inboxes = spend.platform_messages(), {u: spend.user_inbox(u) for u in USERS}
        return (len(platform) == 1 and len(spend.topic_messages()) == 1 and len(spend.alert_events()) == 1
                and [len(inboxes[u]) for u in USERS] == [1, 0, 0]
                and inboxes["alice"][0]["MessageAttributes"]["user"]["Value"] == "alice")

    demo.step(f"per-user spend: budget sweep at {SWEEPS[0]:%b %d %H:%M}",
              lambda: [month.start_sweep(SWEEPS[0])],
              "one alert, for alice: AlertTopic + her filtered subscription (attribute user=alice) + one event",
              one_alert_for_alice, targets=False)
    for message in spend.user_inbox("alice"):
        demo.say(f"          alice's inbox: {message['Subject']}")
        demo.say(f"            {message['Message'].splitlines()[0]}")
    demo.step(f"per-user spend: agent at {SWEEPS[1] - AGENT_BEFORE_SWEEP:%H:%M}, budget sweep at {SWEEPS[1]:%H:%M}",
              lambda: [month.start_sweep(SWEEPS[1])], "no second alert",
              lambda: len(spend.platform_messages()) == 1 and len(spend.user_inbox("alice")) == 1
              and len(spend.alert_events()) == 1, targets=False)
    for result in world.wait(world.budget.executions([r.execution_arn for r in world.routes])[-1:]):
        demo.say(f"          CheckUserSpend: {((result.output or {}).get('userSpend') or {}).get('reason')}")

    printed: list[str] = []

    def operator_runs_hpops_cost() -> list[str]:
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):
            print_cost(spend.cost_document(SWEEPS[-1]))
        printed.extend(buffer.getvalue().splitlines())
        return []

    def lines_add_up() -> bool:
        figures = table_figures(printed)
        return figures["users"] + figures["idle"] + figures["other"] == figures["cluster cost"]

    demo.step(f"per-user spend: operator runs `hpops cost` (as of {SWEEPS[-1]:%Y-%m-%d %H:%M} UTC)",
              operator_runs_hpops_cost, "users + idle + other = the cluster's cost, to the cent", lines_add_up, targets=False)
    for line in printed:
        demo.say("          " + line)
    then(month)


def table_figures(lines: list[str]) -> dict[str, Decimal]:
    """The totals `hpops cost` printed: users, idle, other, cluster cost (read back from the text)."""
    figures = {}
    for line in lines:
        for label in ("users", "idle", "other", "cluster cost"):
            head = line[:45].strip()
            if head == label:
                figures[label] = Decimal(line[45:61].strip().replace(",", ""))
    return figures
