"""`make bench`, budget holds: how long from the usage report that crosses 100 % to the hold applied.

Counted in the clocks the product runs on, the controller agent's usage reports (usageSeconds, 15
min by default), BudgetGuard sweeps (BudgetSweepSchedule, hourly by default) and the agent's polls
(pollSeconds, 30 s by default, up to 20 % later with jitter), by running them one at a time in the
twin until the state is reached: the holds parameter names the user, and her associations read the
hold QOS (holds_twin.FakeSlurmLimits); the same for a release. A live usage report with usage
starts the BudgetGuard check itself (usage_check), so no sweep is waited for. Minutes at the
defaults follow from the counts. `python -m hpops_twin.holds_bench [--merge docs/bench.json]` runs
this section alone and can update only its keys of a bench JSON file.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
import time
from dataclasses import asdict, dataclass
from typing import Callable


from hpops.main import release_user
from hpops_twin import user_spend_demo as chapter
from hpops_twin.holds_twin import FREE, HELD, OPERATOR, attach, holds_world, published_holds, run_holds
from hpops_twin.bench_section import run_alone
from hpops_twin.user_spend_twin import execution_clock

KEY, BOUND_KEY = "budget_holds", "hold_bound"

DEFAULT_SWEEP_MINUTES = 60  # BudgetSweepSchedule's default, rate(1 hour)
DEFAULT_POLL_MINUTES = 0.5 * 1.2  # pollSeconds 30, jitter up to +20 %
DEFAULT_USAGE_MINUTES = 15  # usageSeconds 900
BEFORE_MINUTES = round(DEFAULT_USAGE_MINUTES + DEFAULT_SWEEP_MINUTES + DEFAULT_POLL_MINUTES, 1)
MAX_STEPS = 5


@dataclass
class HoldLatency:
    scenario: str
    usage_reports: int  # the agent's usage runs, the crossing one included
    sweeps: int
    polls: int
    worst_minutes_at_defaults: float
    seconds: float


def _until(done: Callable[[], bool], step: Callable[[int], None]) -> int:
    for count in range(1, MAX_STEPS + 1):
        step(count)
        if done():
            return count
    raise RuntimeError(f"budget holds bench: not reached after {MAX_STEPS} steps")


def holds_section() -> tuple[list[HoldLatency], dict[str, bool]]:
    rows = []
    first = chapter.SWEEPS[0]
    with holds_world() as world:
        month = chapter.prepare(world)
        slurm = attach(month.controller, chapter.USERS)
        sfn, machine = world.aws.client("stepfunctions"), world.output("BudgetGuardStateMachineArn")
        # The agent's usage run just before the first sweep, with the open window's usage in it.
        clock = {"usage": first - chapter.AGENT_BEFORE_SWEEP, "sweep": first, "poll": first}
        world.event_clock = lambda: clock["usage"]

        def published() -> list[str]:
            return published_holds(world)["users"]

        def executions() -> set[str]:
            pages = sfn.get_paginator("list_executions").paginate(stateMachineArn=machine)
            return {e["executionArn"] for page in pages for e in page["executions"]}

        def usage(_: int) -> None:
            before = executions()
            with execution_clock(clock["usage"]):
                month.deliver_until(clock["usage"])
            world.budget.run(sorted(executions() - before))
            clock["poll"] = clock["usage"] + dt.timedelta(seconds=1)
            clock["usage"] += dt.timedelta(minutes=DEFAULT_USAGE_MINUTES)

        def sweep(_: int) -> None:
            world.budget.run([month.start_sweep(clock["sweep"])])
            clock["poll"] = clock["sweep"] + dt.timedelta(seconds=1)
            clock["sweep"] += dt.timedelta(hours=1)

        def poll(_: int) -> None:
            run_holds(month.controller, clock["poll"])
            clock["poll"] += dt.timedelta(seconds=30)

        began = time.perf_counter()
        reports = _until(lambda: published() == ["alice"], usage)
        polls = _until(lambda: slurm.limits("alice") == HELD, poll)
        worst = reports * DEFAULT_USAGE_MINUTES + polls * DEFAULT_POLL_MINUTES
        rows.append(HoldLatency("usage report over 100 % -> alice held (the report starts the check)", reports, 0,
                                polls, round(worst, 1), round(time.perf_counter() - began, 2)))
        began = time.perf_counter()
        release_user(world.aws.client("dynamodb"), world.resolver.physical_ids["SyncStateTable"],
                     world.cluster_name, "alice", "bench", OPERATOR, clock["sweep"] - dt.timedelta(minutes=5))
        sweeps = _until(lambda: published() == [], sweep)
        polls = _until(lambda: slurm.limits("alice") == FREE, poll)
        # `hpops cost release` starts its sweep at once (one execution, well under a minute).
        rows.append(HoldLatency("hpops cost release (starts a sweep) -> QOS restored", 0, sweeps, polls,
                                round(sweeps * 1 + polls * DEFAULT_POLL_MINUTES, 1),
                                round(time.perf_counter() - began, 2)))

    render = [f"{'budget holds scenario':<66} {'reports':>7} {'sweeps':>6} {'polls':>5} {'worst min':>9} {'seconds':>8}"]
    render.append("-" * len(render[0]))
    for r in rows:
        render.append(f"{r.scenario:<66} {r.usage_reports:>7} {r.sweeps:>6} {r.polls:>5} "
                      f"{r.worst_minutes_at_defaults:>9} {r.seconds:8.2f}")
    render.append(f"(worst minutes at the defaults: usage reports x {DEFAULT_USAGE_MINUTES} (usageSeconds; the crossing "
                  f"may come just after a report) + sweeps x 1 (the sweep a release starts) + polls x "
                  f"{DEFAULT_POLL_MINUTES} (pollSeconds 30 with jitter); before a report started the check: 1 report, "
                  f"1 sweep ({DEFAULT_SWEEP_MINUTES} min) and 1 poll, {BEFORE_MINUTES} min)")
    print()
    print("\n".join(render), flush=True)
    verdicts = {
        "budget hold: applied within 1 usage report and 1 agent poll of the crossing, no sweep waited for":
            rows[0].usage_reports == 1 and rows[0].sweeps == 0 and rows[0].polls == 1,
        "budget hold: a release is applied within 1 sweep and 1 agent poll": rows[1].sweeps == 1 and rows[1].polls == 1,
    }
    return rows, verdicts


def bound_record(rows: list[HoldLatency]) -> dict:
    """What docs/bench.json keeps under BOUND_KEY: the bound from crossing to held, and its clocks."""
    crossing = rows[0]
    return {"usage_reports": crossing.usage_reports, "sweeps": crossing.sweeps, "polls": crossing.polls,
            "worst_minutes": crossing.worst_minutes_at_defaults, "usage_minutes": DEFAULT_USAGE_MINUTES,
            "poll_minutes": DEFAULT_POLL_MINUTES, "before_minutes": BEFORE_MINUTES}


def main(argv: list[str]) -> int:
    """Run this section alone; `--merge FILE` also replaces only its keys in that bench JSON file."""
    rows, verdicts = holds_section()
    return run_alone(argv, verdicts, {KEY: [asdict(r) for r in rows], BOUND_KEY: bound_record(rows)},
                     stale_target=lambda text: text.startswith("budget hold:"))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
