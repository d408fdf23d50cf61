"""What starts a BudgetGuard execution, validated into one BudgetRequest. PURE: no AWS.

Accepted inputs:
  * the HyperPod ``SageMaker HyperPod Cluster State Change`` event (the Parser model in
    hpops_core.cluster.events, reused): its ``detail`` is the cluster's state (status, instance
    groups with TargetCount and InstanceType), and its ``time`` is "now";
  * the scheduled sweep ``{"cluster": "...", "mode": "sweep"}``: "now" is the execution's
    start time, and the cluster's state is read with DescribeCluster later.

Time is an input: nothing here reads a clock.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from hpops_core.common.errors import MalformedEventError, UnknownClusterError
from hpops_core.cluster.events import STATE_CHANGE, ClusterNameStr, ClusterStateChangeEvent, parse_event, validation_summary
from hpops_core.budget_guard.projection import compact_groups, describe_groups, observed_from_describe

__all__ = ["BudgetRequest", "observed_from_describe", "parse_budget_input"]


class BudgetSweepInput(BaseModel):
    """The schedule's Input in template.yaml (BudgetSweep)."""

    model_config = ConfigDict(extra="forbid")
    cluster: ClusterNameStr
    mode: Literal["sweep"]


@dataclass(frozen=True)
class BudgetRequest:
    cluster: str
    mode: Literal["event", "sweep"]
    now: dt.datetime
    trigger: str
    event_id: str | None
    # {"ClusterStatus", "InstanceGroups": [...]} from the event; None for a sweep.
    observed: dict[str, Any] | None

    def to_state(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "mode": self.mode,
            "now": self.now.isoformat(),
            "trigger": self.trigger,
            "eventId": self.event_id,
            "observed": self.observed,
        }


def _aware(value: dt.datetime, what: str) -> dt.datetime:
    if value.tzinfo is None or value.utcoffset() is None:
        raise MalformedEventError(f"{what} has no time zone")
    return value.astimezone(dt.timezone.utc)


def _start_time(start_time: Any) -> dt.datetime:
    if not isinstance(start_time, str) or not start_time:
        raise MalformedEventError("no execution start time to use as 'now'")
    try:
        return _aware(dt.datetime.fromisoformat(start_time), "execution start time")
    except ValueError:
        raise MalformedEventError("execution start time is not an ISO 8601 timestamp") from None


def parse_budget_input(raw: Any, start_time: Any, managed_cluster: str) -> BudgetRequest:
    """Any accepted input -> BudgetRequest; else MalformedEventError / UnknownClusterError."""
    if not isinstance(raw, dict):
        raise MalformedEventError(f"expected a JSON object, got {type(raw).__name__}")
    if "detail-type" in raw:
        if raw.get("detail-type") != STATE_CHANGE:
            raise MalformedEventError("budget guard only accepts the HyperPod cluster state change event")
        event = parse_event(raw, ClusterStateChangeEvent)
        detail = event.detail
        observed = {
            "ClusterStatus": detail.ClusterStatus,
            "InstanceGroups": compact_groups([g.model_dump() for g in detail.InstanceGroups]),
        }
        groups = describe_groups(observed)
        request = BudgetRequest(
            cluster=detail.ClusterName,
            mode="event",
            now=_aware(event.time, "event time"),
            trigger=f"cluster state {detail.ClusterStatus}" + (f" ({groups})" if groups else ""),
            event_id=event.id,
            observed=observed,
        )
    else:
        try:
            sweep = BudgetSweepInput.model_validate(raw)
        except ValidationError as error:
            raise MalformedEventError(f"invalid sweep input: {validation_summary(error)}") from None
        request = BudgetRequest(
            cluster=sweep.cluster,
            mode="sweep",
            now=_start_time(start_time),
            trigger="scheduled sweep",
            event_id=None,
            observed=None,
        )
    if request.cluster != managed_cluster:
        raise UnknownClusterError(f"cluster {request.cluster!r} is not managed by this stack")
    return request
