"""`make bench`, budget guard: what each budget check costs, per event and per sweep.

BudgetGuard executions are started directly with the event as input (what its EventBridge rule
does), so the counts are the budget guard's alone, not LoginNodeSync's on the same event.
Counts are exact; seconds are this machine's. Cost Explorer charges $0.01 per request, so an event
asks it only when an instance group scaled out, and the hourly sweep reuses the answer it keeps for
CostExplorerMaxAgeHours (24 by default): the "day of hourly sweeps" row is what the cost model
reads for Cost Explorer requests a month.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import time
from dataclasses import dataclass

from hpops_core.budget_guard.ce_cache import SORT_KEY, cache_key
from hpops_twin.budget_twin import at
from hpops_twin.user_spend_twin import execution_clock
from hpops_twin.world import TwinWorld

NOV_10 = dt.datetime(2026, 11, 10, 12, 0, tzinfo=dt.timezone.utc)


@dataclass
class BudgetRow:
    scenario: str
    calls: dict
    total_calls: int
    state_transitions: int
    seconds: float


def _measure(world: TwinWorld, scenario: str, payload: dict | None, sweep_at: dt.datetime | None = None) -> BudgetRow:
    """One execution: the event `payload`, or a sweep (started at `sweep_at`, its "now", if given)."""
    world.counter.reset()
    began = time.perf_counter()
    if payload is not None:
        arn = world.budget.start_raw(payload)
    else:
        with execution_clock(sweep_at) if sweep_at else contextlib.nullcontext():
            arn = world.budget.sweep()
    (result,) = world.wait([arn], timeout=120)
    seconds = time.perf_counter() - began
    if result.status != "SUCCEEDED":
        raise RuntimeError(f"budget bench '{scenario}': {result.error} {result.cause}")
    calls = dict(sorted(world.counter.calls.items()))
    return BudgetRow(scenario, calls, sum(calls.values()), world.state_transitions(arn), seconds)


def _day_of_sweeps(world: TwinWorld, scenario: str, first: dt.datetime, sweeps: int = 24) -> BudgetRow:
    """`sweeps` hourly sweeps from an empty Cost Explorer cache, their calls and transitions summed."""
    table = world.resolver.physical_ids["SyncStateTable"]
    world.aws.client("dynamodb").delete_item(
        TableName=table, Key={"pk": {"S": cache_key(world.cluster_name)}, "sk": {"S": SORT_KEY}})
    world.counter.reset()
    began, transitions = time.perf_counter(), 0
    for hour in range(sweeps):
        with execution_clock(first + dt.timedelta(hours=hour)):
            arn = world.budget.sweep()
        (result,) = world.wait([arn], timeout=120)
        if result.status != "SUCCEEDED":
            raise RuntimeError(f"budget bench '{scenario}': {result.error} {result.cause}")
        transitions += world.state_transitions(arn)
    calls = dict(sorted(world.counter.calls.items()))
    return BudgetRow(scenario, calls, sum(calls.values()), transitions, time.perf_counter() - began)


def budget_guard_section() -> tuple[list[BudgetRow], dict[str, bool]]:
    rows = []
    with TwinWorld() as world:
        sim, cluster = world.sim, world.cluster_name
        world.budget.tag_cluster("hpops:monthly-budget-usd", "750000")
        world.budget.set_month_to_date_cost("200000")
        rows.append(_measure(world, "first event: budget created", at(sim.state_change_event(cluster), NOV_10)))
        rows.append(_measure(world, "state change, no scale-out", at(sim.state_change_event(cluster), NOV_10 + dt.timedelta(minutes=1))))
        scale_out = at(sim.scale_group(cluster, world.worker_group, 16)[0], NOV_10 + dt.timedelta(minutes=2))
        rows.append(_measure(world, "scale-out -> projected overrun alert", scale_out))
        rows.append(_measure(world, "same scale-out event again", scale_out))
        # An hour after the scale-out, whose fresh Cost Explorer answer the sweep reuses (as 23 of 24 do).
        rows.append(_measure(world, "hourly sweep (DescribeCluster)", None, NOV_10 + dt.timedelta(hours=1)))
        rows.append(_day_of_sweeps(world, "day of hourly sweeps (24, Cost Explorer answer kept)",
                                   NOV_10 + dt.timedelta(days=1)))

    # The same hourly sweep in a stack without per-user spend (UserSpendEnabled=false): the cost model's lean column.
    with TwinWorld(parameters={"UserSpendEnabled": "false"}) as world:
        world.budget.tag_cluster("hpops:monthly-budget-usd", "750000")
        world.budget.set_month_to_date_cost("200000")
        _measure(world, "first event: budget created", at(world.sim.state_change_event(world.cluster_name), NOV_10))
        rows.append(_measure(world, "hourly sweep, UserSpendEnabled=false", None, NOV_10 + dt.timedelta(hours=1)))

    render = [f"{'budget guard scenario':<38} {'calls':>5} {'transitions':>11} {'seconds':>8}  calls"]
    render.append("-" * len(render[0]))
    for r in rows:
        calls = ", ".join(f"{k}={v}" for k, v in r.calls.items())
        render.append(f"{r.scenario:<38} {r.total_calls:>5} {r.state_transitions:>11} {r.seconds:8.2f}  {calls}")
    print()
    print("\n".join(render), flush=True)

    by_name = {r.scenario: r for r in rows}
    quiet = [by_name["state change, no scale-out"], by_name["same scale-out event again"]]
    alert = by_name["scale-out -> projected overrun alert"]
    verdicts = {
        "budget check without a scale-out <= 5 AWS calls, no Cost Explorer": all(
            r.total_calls <= 5 and "cost-explorer.GetCostAndUsage" not in r.calls for r in quiet),
        "a scale-out alert: 1 Cost Explorer call, 1 SNS publish, 1 PutEvents": (
            alert.calls.get("cost-explorer.GetCostAndUsage") == 1 and alert.calls.get("sns.Publish") == 1
            and alert.calls.get("eventbridge.PutEvents") == 1),
        "a sweep without per-user spend: no Cost Explorer call": (
            "cost-explorer.GetCostAndUsage" not in by_name["hourly sweep, UserSpendEnabled=false"].calls),
        "a day of hourly sweeps: 1 Cost Explorer call": (
            by_name["day of hourly sweeps (24, Cost Explorer answer kept)"].calls.get("cost-explorer.GetCostAndUsage") == 1),
    }
    return rows, verdicts
