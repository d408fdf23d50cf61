"""HyperPod's EventBridge events: a Parser model for each detail-type, and a one-line summary of each.

Inputs (see events/*.json for samples):
  * the three HyperPod detail-types EventBridge delivers (source aws.sagemaker);
  * the scheduled sweep and manual repairs: {"cluster": "...", "mode": "sweep"|"repair", "dryRun": bool,
    "trigger": optional label, e.g. the daily host certificate check}.

None of the HyperPod events carries a login node's IP, so every event
is reduced to "cluster X may have changed" and the state machine reconciles the whole login
group (level-triggered). Only the cluster is required and checked strictly; every other field
is a hint for the human-readable trigger line. A hint that looks odd (AWS's own documented
node-health example carries InstanceId "i-12345678abcdefghi") never fails the parse: it shows
as "<hint> (unrecognised)" and is logged by name, and the cluster is reconciled anyway.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from aws_lambda_powertools.utilities.parser import parse
from aws_lambda_powertools.utilities.parser.models import EventBridgeModel
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StringConstraints, ValidationError

from hpops_core.common import validation
from hpops_core.common.errors import MalformedEventError


# The cluster decides what is reconciled, so it is checked strictly (hpops_core/common/validation.py):
# shell metacharacters, ANSI escapes or 10 kB strings never reach a log line, an API call or a
# target group. Everything else in an event is a hint for the trigger text (see _Hints).
ClusterNameStr = Annotated[str, StringConstraints(pattern=validation.anchored(validation.CLUSTER_NAME_PATTERN))]
GroupNameStr = Annotated[str, StringConstraints(pattern=validation.anchored(validation.INSTANCE_GROUP_PATTERN))]
ClusterArnStr = Annotated[str, StringConstraints(pattern=validation.anchored(validation.CLUSTER_ARN_PATTERN))]
ShortTextStr = Annotated[str, StringConstraints(max_length=1024)]

# AWS adds cluster statuses over time (SystemUpdating came later); a status the code does not know
# is treated as a live cluster, never as a reason to refuse the event. It must still be a word.
CLUSTER_STATUS_PATTERN = r"[A-Za-z]{1,40}"
ClusterStatusStr = Annotated[str, StringConstraints(pattern=f"^{CLUSTER_STATUS_PATTERN}$")]
EVENT_LEVELS = ("Info", "Warn", "Error")
RESOURCE_TYPES = ("Cluster", "InstanceGroup", "Instance")

STATE_CHANGE = "SageMaker HyperPod Cluster State Change"
NODE_HEALTH = "SageMaker HyperPod Cluster Node Health Event"
CLUSTER_EVENT = "SageMaker HyperPod Cluster Event"
HYPERPOD_DETAIL_TYPES = (STATE_CHANGE, NODE_HEALTH, CLUSTER_EVENT)
MAX_GROUPS_SHOWN = 20


class _Lenient(BaseModel):
    # AWS adds fields over time; unknown fields must not break parsing.
    model_config = ConfigDict(extra="ignore")


# --- the budget guard's model of a state change (its groups are data there, not hints) -------------


class InstanceGroupState(_Lenient):
    InstanceGroupName: GroupNameStr
    CurrentCount: int | None = Field(default=None, ge=0)
    TargetCount: int | None = Field(default=None, ge=0)
    InstanceType: ShortTextStr | None = None
    Status: ShortTextStr | None = None


class ClusterStateChangeDetail(_Lenient):
    ClusterArn: ClusterArnStr
    ClusterName: ClusterNameStr
    ClusterStatus: ClusterStatusStr
    InstanceGroups: list[InstanceGroupState] = []


class ClusterStateChangeEvent(EventBridgeModel):
    source: Literal["aws.sagemaker"]
    detail_type: Literal["SageMaker HyperPod Cluster State Change"] = Field(alias="detail-type")
    detail: ClusterStateChangeDetail


# --- what a sync needs from any HyperPod event: which cluster, and nothing else for sure ----------


class HyperPodEvent(EventBridgeModel):
    """Any of the three HyperPod detail-types; the detail is read by :func:`summarise_event`."""

    source: Literal["aws.sagemaker"]
    detail_type: Literal[
        "SageMaker HyperPod Cluster State Change",
        "SageMaker HyperPod Cluster Node Health Event",
        "SageMaker HyperPod Cluster Event",
    ] = Field(alias="detail-type")
    detail: dict[str, Any]


class EventCluster(_Lenient):
    """The cluster an event is about: required, and validated strictly."""

    ClusterName: ClusterNameStr
    ClusterArn: ClusterArnStr | None = None


class _ClusterEventDetail(_Lenient):
    EventDetails: dict[str, Any]


@dataclass(frozen=True)
class EventSummary:
    """What a HyperPod event says for our purposes: which cluster, and a readable trigger line."""

    cluster: str
    trigger: str
    event_id: str | None
    # Hints that looked odd and were replaced in `trigger` (names only, never values).
    odd_hints: tuple[str, ...] = field(default=(), compare=False)


def validation_summary(error: ValidationError) -> str:
    # Name the fields that failed, never echo the offending (possibly hostile) values.
    fields = sorted({".".join(str(p) for p in e["loc"]) for e in error.errors()})
    return ", ".join(fields[:8]) or "unknown"


def parse_event(event: dict, model: type[EventBridgeModel]) -> EventBridgeModel:
    """Parse with a Powertools Parser model; any failure becomes MalformedEventError naming the bad fields."""
    label = event.get("detail-type", "event")
    try:
        return parse(event=event, model=model)
    except ValidationError as error:
        raise MalformedEventError(f"invalid {label}: {validation_summary(error)}") from None
    except Exception as error:  # Powertools wraps some failures in its own exception types
        raise MalformedEventError(f"invalid {label}: {type(error).__name__}") from None


# A hint shown as is: a short word or phrase (HealthStatus "Unschedulable", RepairAction "Replace").
_WORD_PATTERN = r"[A-Za-z0-9][A-Za-z0-9 _.-]{0,63}"
_WORD_RE = re.compile(rf"\A(?:{_WORD_PATTERN})\Z")


def _is_word(value: Any) -> bool:
    return isinstance(value, str) and _WORD_RE.match(value) is not None


def _is_status(value: Any) -> bool:
    return isinstance(value, str) and re.fullmatch(CLUSTER_STATUS_PATTERN, value) is not None


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class _Hints:
    """Renders event hints for the trigger text: a hint that fails its rule becomes "<label> (unrecognised)"
    and its label is remembered, so the parse never fails on a hint and never echoes one."""

    def __init__(self) -> None:
        self.odd: list[str] = []

    def show(self, value: Any, ok: Callable[[Any], bool], label: str, missing: str | None = None) -> str | None:
        if value is None:
            return missing
        if ok(value):
            return str(value)
        if label not in self.odd:
            self.odd.append(label)
        return f"{label} (unrecognised)"


def _cluster_of(fields: dict[str, Any], where: str) -> EventCluster:
    try:
        return EventCluster.model_validate(fields)
    except ValidationError as error:
        # Name the fields, never echo the values (they may be hostile).
        raise MalformedEventError(f"invalid event cluster: {where}.{validation_summary(error)}") from None


def _state_change_trigger(detail: dict[str, Any], hints: _Hints) -> str:
    status = hints.show(detail.get("ClusterStatus"), _is_status, "status", "unknown")
    groups = detail.get("InstanceGroups")
    shown: list[str] = []
    if isinstance(groups, list):
        for group in groups[:MAX_GROUPS_SHOWN]:
            if not isinstance(group, dict):
                hints.show(group, lambda v: False, "instance group")
                continue
            name = hints.show(group.get("InstanceGroupName"), validation.is_instance_group, "instance group", "?")
            current = hints.show(group.get("CurrentCount"), _is_count, "instance count", "?")
            target = hints.show(group.get("TargetCount"), _is_count, "instance count", "?")
            shown.append(f"{name} {current}/{target}")
        if len(groups) > MAX_GROUPS_SHOWN:
            shown.append(f"+{len(groups) - MAX_GROUPS_SHOWN} more")
    elif groups is not None:
        hints.show(groups, lambda v: False, "instance groups")
    return f"cluster state {status}" + (f" ({', '.join(shown)})" if shown else "")


def _node_health_trigger(detail: dict[str, Any], hints: _Hints) -> str:
    instance = hints.show(detail.get("InstanceId"), validation.is_event_instance_id, "instance id", "unknown instance")
    health = detail.get("HealthSummary")
    if not isinstance(health, dict):
        hints.show(health, lambda v: False, "health summary")
        health = {}
    status = hints.show(health.get("HealthStatus"), _is_word, "health status", "unknown")
    action = hints.show(health.get("RepairAction"), _is_word, "repair action")
    return f"node health {instance}: {status}" + (f", {action}" if action else "")


def _cluster_event_trigger(details: dict[str, Any], hints: _Hints) -> str:
    level = hints.show(details.get("EventLevel"), lambda v: v in EVENT_LEVELS, "event level", "Info")
    if details.get("InstanceId") is not None:
        subject = hints.show(details["InstanceId"], validation.is_event_instance_id, "instance id")
    elif details.get("InstanceGroupName") is not None:
        subject = hints.show(details["InstanceGroupName"], validation.is_instance_group, "instance group")
    else:
        subject = hints.show(details.get("ResourceType"), lambda v: v in RESOURCE_TYPES, "resource type", "cluster")
    return f"cluster event {level} on {subject}"


def summarise_event(event: EventBridgeModel) -> EventSummary:
    """A parsed HyperPod event -> its cluster and a one-line trigger text built from its hints."""
    detail = event.detail
    hints = _Hints()
    if event.detail_type == CLUSTER_EVENT:
        try:
            details = _ClusterEventDetail.model_validate(detail).EventDetails
        except ValidationError as error:
            raise MalformedEventError(f"invalid event cluster: detail.{validation_summary(error)}") from None
        cluster = _cluster_of(details, "detail.EventDetails")
        trigger = _cluster_event_trigger(details, hints)
    else:
        cluster = _cluster_of(detail, "detail")
        if event.detail_type == STATE_CHANGE:
            trigger = _state_change_trigger(detail, hints)
        else:
            trigger = _node_health_trigger(detail, hints)
    return EventSummary(cluster=cluster.ClusterName, trigger=trigger, event_id=event.id, odd_hints=tuple(hints.odd))
