"""Step Functions' own "Execution Status Change" events: which ended sync still holds a lease.

A sync that fails inside its states releases its lease through its Catch. One that times out or
is stopped by an operator cannot run a state any more, so without this its lease would hold
every later sync off until the lease expires. EventBridge delivers the status change (Standard
workflows emit it by default); the execution ARN is the lease holder.

Checked with the validation rules directly, not a Parser model: the decision reads three strings
of an event AWS emits and the rule has already filtered, and pydantic with Powertools' event
models would more than double this function's cold start.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpops_core.common import validation
from hpops_core.common.errors import MalformedEventError

SOURCE = "aws.states"
DETAIL_TYPE = "Step Functions Execution Status Change"
# Every status the event documents; anything else is not this event.
STATUSES = frozenset({"RUNNING", "SUCCEEDED", "FAILED", "TIMED_OUT", "ABORTED", "PENDING_REDRIVE"})
ENDED_WITHOUT_RELEASE = frozenset({"TIMED_OUT", "ABORTED", "FAILED"})


@dataclass(frozen=True)
class LeaseCleanup:
    holder: str | None  # the execution whose lease to release, or None
    reason: str


@dataclass(frozen=True)
class ExecutionStatusChange:
    execution_arn: str
    state_machine_arn: str
    status: str


def parse_status_change(event: Any) -> ExecutionStatusChange:
    """The event -> its three fields; MalformedEventError naming the bad fields (never their values)."""
    if not isinstance(event, dict):
        raise MalformedEventError("invalid Step Functions Execution Status Change: not an object")
    detail = event.get("detail")
    detail = detail if isinstance(detail, dict) else {}
    checks = {
        "source": event.get("source") == SOURCE,
        "detail-type": event.get("detail-type") == DETAIL_TYPE,
        "detail.executionArn": validation.is_execution_arn(detail.get("executionArn")),
        "detail.stateMachineArn": validation.is_state_machine_arn(detail.get("stateMachineArn")),
        "detail.status": detail.get("status") in STATUSES,
    }
    bad = [name for name, ok in checks.items() if not ok]
    if bad:
        raise MalformedEventError(f"invalid Step Functions Execution Status Change: {', '.join(bad)}")
    return ExecutionStatusChange(detail["executionArn"], detail["stateMachineArn"], detail["status"])


def lease_to_release(event: Any, sync_state_machine_arn: str) -> LeaseCleanup:
    """Pure: decide whether an ended execution's lease must be released, and why."""
    change = parse_status_change(event)
    if change.state_machine_arn != sync_state_machine_arn:
        return LeaseCleanup(None, "not this stack's LoginNodeSync state machine")
    if change.status not in ENDED_WITHOUT_RELEASE:
        return LeaseCleanup(None, f"execution {change.status}: it released its own lease")
    return LeaseCleanup(change.execution_arn, f"execution {change.status}: release its lease if it still holds it")
