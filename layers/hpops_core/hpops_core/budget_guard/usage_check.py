"""A usage report can put a user over their limit: with ``UserBudgetAction=hold``, RecordUsageReport
starts the BudgetGuard check (a sweep) as soon as it has kept a report with usage in it, instead of
leaving the hold to the next scheduled sweep (up to an hour later at the default).

The sweep decides exactly as every hour (prices, limits, overrides, releases, exempt users) and
publishes the holds; the controller's agent applies them at its next poll. So a crossing is held
within one usage report plus one agent poll. This only decides whether to start it: the dollars
need the month's rates and every window, which the sweep already reads.

Only live reports start it: one EventBridge put within FRESH of its collection (a redelivery
or a late retry does not), for a window that was open at collection or had just closed (an agent
catching up after an outage sends old windows at once: its newest window starts one check, the
sweep reads every window). "Now" is the event's time: time is an input.

Storms: one execution per kept report. Its name comes from the cluster, the window, the part and
the collection time, so redeliveries of the same report start one execution between them (Step
Functions refuses a name it has seen, ExecutionAlreadyExists, which is success here). A report
that was not kept (older than the one stored), or has no usage in it, starts nothing.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from hpops_core.budget_guard.usage_reports import UsageReport
from hpops_core.common.clients import start_named_execution
from hpops_core.node_channel import contract

NAME_MAX = 80  # Step Functions: 1-80 of letters, digits, "-" and "_"
NAME_PREFIX = "usage-"
DIGEST_CHARS = 24
FRESH = dt.timedelta(minutes=15)  # the agent's default usageSeconds: a report older than that has a newer one
RECENT_WINDOW = dt.timedelta(hours=1)


@dataclass(frozen=True)
class UsageCheck:
    start: bool
    reason: str
    name: str | None = None
    input: dict[str, Any] | None = None


def execution_name(report: UsageReport) -> str:
    """The same report, the same name; within Step Functions' rules."""
    identity = [report.cluster, report.window_start, report.part, report.collected_at]
    digest = hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:DIGEST_CHARS]
    return f"{f'{NAME_PREFIX}{report.cluster}'[: NAME_MAX - DIGEST_CHARS - 1]}-{digest}"


def _utc(text: Any) -> dt.datetime | None:
    try:
        value = dt.datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None
    return value.astimezone(dt.timezone.utc) if value.tzinfo else None


def decide_usage_check(report: UsageReport, kept: bool, hold_action: str, event_time: Any) -> UsageCheck:
    """Pure: start the BudgetGuard check for this report, and under which name. ``event_time``: the
    EventBridge event's ``time`` (when the agent put it)."""
    if hold_action != "hold":
        return UsageCheck(False, f"UserBudgetAction is {hold_action}: usage waits for the scheduled sweep")
    if not kept:
        return UsageCheck(False, "report not kept (an older collection of its window): nothing new to check")
    put, collected, window_end = _utc(event_time), _utc(report.collected_at), _utc(report.window_end)
    if put is None or collected is None or window_end is None or put - collected > FRESH:
        return UsageCheck(False, f"not a live report (collected {report.collected_at}, put {event_time}): "
                                 "the scheduled sweep checks it")
    if window_end < collected - RECENT_WINDOW:
        return UsageCheck(False, f"window {report.window_start} closed long before collection (catching up): "
                                 "the newest window's report checks it")
    used = [r for r in report.records if r.node_seconds or r.cpu_seconds or r.gpu_seconds]
    if report.status != contract.USAGE_OK or not used:
        return UsageCheck(False, f"no usage in the report (status {report.status}): nobody can have crossed")
    users = sorted({r.user for r in used})
    return UsageCheck(True, f"usage of {len(users)} user(s) in window {report.window_start}: check their limits now",
                      execution_name(report), {"cluster": report.cluster, "mode": "sweep"})


def start_check(state_machine_arn: str, check: UsageCheck) -> bool:
    """Start the execution the check named (clients.start_named_execution: False when it ran already)."""
    return start_named_execution(state_machine_arn, check.name, check.input)
