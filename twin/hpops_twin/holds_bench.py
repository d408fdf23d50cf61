"""`make bench`, budget holds: how long from the usage report that crosses 100 % to the hold applied.

Counted in the two clocks the product runs on, BudgetGuard sweeps (BudgetSweepSchedule, hourly by
default) and the controller agent's polls (pollSeconds, 30 s by default), by running them one at a
time in the twin until the state is reached: the holds parameter names the user, and Slurm's
association limits (holds_twin.FakeSlurmLimits) read 0; the same for a release. Minutes at the
defaults follow from the counts (the usage report itself comes every usageSeconds, 15 min).
"""

from __future__ import annotations

import datetime as dt
import json
import time
from dataclasses import dataclass
from typing import Callable

from hpops.main import release_user
from hpops_core.node_channel import user_holds
from hpops_twin import user_spend_demo as chapter
from hpops_twin.holds_twin import FREE, HELD, OPERATOR, attach, holds_world, run_holds

DEFAULT_SWEEP_MINUTES = 60  # BudgetSweepSchedule's default, rate(1 hour)
DEFAULT_POLL_MINUTES = 0.5 * 1.2  # pollSeconds 30, jitter up to +20 %
DEFAULT_USAGE_MINUTES = 15  # usageSeconds 900
MAX_STEPS = 5


@dataclass
class HoldLatency:
    scenario: str
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
        ssm, parameter = world.aws.client("ssm"), user_holds.user_holds_parameter(world.cluster_name)
        clock = {"sweep": first, "poll": first}

        def published() -> list[str]:
            return json.loads(ssm.get_parameter(Name=parameter)["Parameter"]["Value"])["users"]

        def sweep(_: int) -> None:
            world.budget.run([month.start_sweep(clock["sweep"])])
            clock["poll"] = clock["sweep"] + dt.timedelta(seconds=1)
            clock["sweep"] += dt.timedelta(hours=1)

        def poll(_: int) -> None:
            run_holds(month.controller, clock["poll"])
            clock["poll"] += dt.timedelta(seconds=30)

        for scenario, target, limits in (("usage report over 100 % -> alice held", ["alice"], HELD),
                                         ("hpops cost release (starts a sweep) -> limits restored", [], FREE)):
            began = time.perf_counter()
            if not target:
                release_user(world.aws.client("dynamodb"), world.resolver.physical_ids["SyncStateTable"],
                             world.cluster_name, "alice", "bench", OPERATOR, clock["sweep"] - dt.timedelta(minutes=5))
            sweeps = _until(lambda: published() == target, sweep)
            polls = _until(lambda: slurm.limits("alice") == limits, poll)
            # `hpops cost release` starts its sweep at once (one execution, well under a minute).
            worst = sweeps * (DEFAULT_SWEEP_MINUTES if target else 1) + polls * DEFAULT_POLL_MINUTES
            rows.append(HoldLatency(scenario, sweeps, polls, round(worst, 1), round(time.perf_counter() - began, 2)))

    render = [f"{'budget holds scenario':<48} {'sweeps':>6} {'polls':>5} {'worst min':>9} {'seconds':>8}"]
    render.append("-" * len(render[0]))
    for r in rows:
        render.append(f"{r.scenario:<48} {r.sweeps:>6} {r.polls:>5} {r.worst_minutes_at_defaults:>9} {r.seconds:8.2f}")
    render.append(f"(worst minutes at the defaults: sweeps x {DEFAULT_SWEEP_MINUTES} (x 1 for the sweep a release starts) "
                  f"+ polls x {DEFAULT_POLL_MINUTES}; the crossing usage report itself comes within usageSeconds, "
                  f"{DEFAULT_USAGE_MINUTES} min)")
    print()
    print("\n".join(render), flush=True)
    verdicts = {
        "budget hold: applied within 1 sweep and 1 agent poll of the crossing usage report":
            rows[0].sweeps == 1 and rows[0].polls == 1,
        "budget hold: a release is applied within 1 sweep and 1 agent poll": rows[1].sweeps == 1 and rows[1].polls == 1,
    }
    return rows, verdicts
