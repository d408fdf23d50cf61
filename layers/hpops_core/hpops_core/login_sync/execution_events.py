"""Step Functions' own "Execution Status Change" events: which ended sync still holds a lease.

A sync that fails inside its states releases its lease through its Catch. One that times out or
is stopped by an operator cannot run a state any more, so without this its lease would hold
every later sync off until the lease expires. EventBridge delivers the status change (Standard
workflows emit it by default); the execution ARN is the lease holder.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from aws_lambda_powertools.utilities.parser.models import EventBridgeModel
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from hpops_core.cluster.events import parse_event
from hpops_core.common import validation

ENDED_WITHOUT_RELEASE = frozenset({"TIMED_OUT", "ABORTED", "FAILED"})

ExecutionArnStr = Annotated[str, StringConstraints(pattern=validation.anchored(validation.EXECUTION_ARN_PATTERN))]
StateMachineArnStr = Annotated[str, StringConstraints(pattern=validation.anchored(validation.STATE_MACHINE_ARN_PATTERN))]


class ExecutionStatusDetail(BaseModel):
    # The event also carries the execution's input and output; they are neither needed nor kept.
    model_config = ConfigDict(extra="ignore")
    executionArn: ExecutionArnStr
    stateMachineArn: StateMachineArnStr
    status: Literal["RUNNING", "SUCCEEDED", "FAILED", "TIMED_OUT", "ABORTED", "PENDING_REDRIVE"]


class ExecutionStatusChangeEvent(EventBridgeModel):
    source: Literal["aws.states"]
    detail_type: Literal["Step Functions Execution Status Change"] = Field(alias="detail-type")
    detail: ExecutionStatusDetail


@dataclass(frozen=True)
class LeaseCleanup:
    holder: str | None  # the execution whose lease to release, or None
    reason: str


def lease_to_release(event: dict, sync_state_machine_arn: str) -> LeaseCleanup:
    """Pure: decide whether an ended execution's lease must be released, and why."""
    parsed = parse_event(event, ExecutionStatusChangeEvent)
    detail = parsed.detail
    if detail.stateMachineArn != sync_state_machine_arn:
        return LeaseCleanup(None, "not this stack's LoginNodeSync state machine")
    if detail.status not in ENDED_WITHOUT_RELEASE:
        return LeaseCleanup(None, f"execution {detail.status}: it released its own lease")
    return LeaseCleanup(detail.executionArn, f"execution {detail.status}: release its lease if it still holds it")

