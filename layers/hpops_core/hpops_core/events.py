"""What enters the system: a Parser model for every input shape, normalised to one SyncRequest.

Inputs (see events/*.json for samples):
  * the three HyperPod detail-types EventBridge delivers (source aws.sagemaker);
  * the scheduled sweep and manual repairs: {"cluster": "...", "mode": "sweep"|"repair", "dryRun": bool,
    "trigger": optional label, e.g. the daily host certificate check}.

None of the HyperPod events carries a login node's IP (see shared/aws-facts.md), so every event
is reduced to "cluster X may have changed" and the state machine reconciles the whole login
group (level-triggered). The event's details are kept only as a human-readable trigger line.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Annotated, Any, Literal

from aws_lambda_powertools.utilities.parser import parse
from aws_lambda_powertools.utilities.parser.models import EventBridgeModel
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from hpops_core.errors import MalformedEventError, UnknownClusterError

# HyperPod's own name patterns; anything else (shell metacharacters, ANSI escapes, 10 kB strings)
# is rejected before it reaches a log line, an API call or a target group.
ClusterNameStr = Annotated[str, StringConstraints(pattern=r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")]
GroupNameStr = Annotated[str, StringConstraints(pattern=r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")]
InstanceIdStr = Annotated[str, StringConstraints(pattern=r"^i-[a-f0-9]{8,17}$")]
ClusterArnStr = Annotated[
    str,
    StringConstraints(pattern=r"^arn:aws[a-z-]*:sagemaker:[a-z0-9-]+:[0-9]{12}:cluster/[a-zA-Z0-9-]{1,63}$"),
]
ShortTextStr = Annotated[str, StringConstraints(max_length=1024)]

ClusterStatusStr = Literal["Creating", "InService", "Updating", "RollingBack", "Deleting", "Failed", "SystemUpdating"]

STATE_CHANGE = "SageMaker HyperPod Cluster State Change"
NODE_HEALTH = "SageMaker HyperPod Cluster Node Health Event"
CLUSTER_EVENT = "SageMaker HyperPod Cluster Event"


class _Lenient(BaseModel):
    # AWS adds fields over time; unknown fields must not break parsing.
    model_config = ConfigDict(extra="ignore")


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


class HealthSummaryModel(_Lenient):
    HealthStatus: ShortTextStr | None = None
    HealthStatusReason: ShortTextStr | None = None
    RepairAction: ShortTextStr | None = None
    Recommendation: ShortTextStr | None = None


class NodeHealthDetail(_Lenient):
    ClusterName: ClusterNameStr
    ClusterArn: ClusterArnStr | None = None
    InstanceId: InstanceIdStr
    HealthSummary: HealthSummaryModel | None = None


class ClusterEventDetails(_Lenient):
    EventId: ShortTextStr
    ClusterName: ClusterNameStr
    ClusterArn: ClusterArnStr | None = None
    InstanceGroupName: GroupNameStr | None = None
    InstanceId: InstanceIdStr | None = None
    ResourceType: Literal["Cluster", "InstanceGroup", "Instance"]
    EventTime: int | None = None
    EventLevel: Literal["Info", "Warn", "Error"] | None = None
    Description: ShortTextStr | None = None


class ClusterEventDetail(_Lenient):
    EventDetails: ClusterEventDetails


class ClusterStateChangeEvent(EventBridgeModel):
    source: Literal["aws.sagemaker"]
    detail_type: Literal["SageMaker HyperPod Cluster State Change"] = Field(alias="detail-type")
    detail: ClusterStateChangeDetail


class NodeHealthEvent(EventBridgeModel):
    source: Literal["aws.sagemaker"]
    detail_type: Literal["SageMaker HyperPod Cluster Node Health Event"] = Field(alias="detail-type")
    detail: NodeHealthDetail


class ClusterEvent(EventBridgeModel):
    source: Literal["aws.sagemaker"]
    detail_type: Literal["SageMaker HyperPod Cluster Event"] = Field(alias="detail-type")
    detail: ClusterEventDetail


class SyncInput(BaseModel):
    """Scheduled sweep (Input set on the schedule in template.yaml) or a manual repair."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    cluster: ClusterNameStr
    mode: Literal["sweep", "repair"]
    dry_run: bool = Field(default=False, alias="dryRun")
    # Set by schedules that start a repair (the daily host certificate check), shown in the plan.
    trigger: str | None = Field(default=None, pattern=r"^[A-Za-z0-9 ._-]{1,80}$")


_EVENT_MODELS: dict[str, type[EventBridgeModel]] = {
    STATE_CHANGE: ClusterStateChangeEvent,
    NODE_HEALTH: NodeHealthEvent,
    CLUSTER_EVENT: ClusterEvent,
}


@dataclass(frozen=True)
class SyncRequest:
    """The one thing every input becomes: reconcile `cluster`, in `mode`, for this `trigger`."""

    cluster: str
    mode: Literal["event", "sweep", "repair"]
    dry_run: bool
    trigger: str
    event_id: str | None = None

    def to_state(self) -> dict[str, Any]:
        state = asdict(self)
        return {
            "cluster": state["cluster"],
            "mode": state["mode"],
            "dryRun": state["dry_run"],
            "trigger": state["trigger"],
            "eventId": state["event_id"],
        }


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


def parse_sync_input(event: Any) -> SyncRequest:
    """Turn any accepted input into a SyncRequest or raise MalformedEventError."""
    if not isinstance(event, dict):
        raise MalformedEventError(f"expected a JSON object, got {type(event).__name__}")
    if "detail-type" in event:
        model = _EVENT_MODELS.get(event["detail-type"]) if isinstance(event["detail-type"], str) else None
        if model is None:
            raise MalformedEventError("unsupported detail-type")
        return _request_from_event(parse_event(event, model))
    try:
        manual = SyncInput.model_validate(event)
    except ValidationError as error:
        raise MalformedEventError(f"invalid sweep/repair input: {validation_summary(error)}") from None
    return SyncRequest(
        cluster=manual.cluster,
        mode=manual.mode,
        dry_run=manual.dry_run,
        trigger=manual.trigger or ("scheduled sweep" if manual.mode == "sweep" else "manual repair"),
    )


def _request_from_event(event: EventBridgeModel) -> SyncRequest:
    detail = event.detail
    if isinstance(event, ClusterStateChangeEvent):
        groups = ", ".join(f"{g.InstanceGroupName} {g.CurrentCount}/{g.TargetCount}" for g in detail.InstanceGroups)
        trigger = f"cluster state {detail.ClusterStatus}" + (f" ({groups})" if groups else "")
        cluster = detail.ClusterName
    elif isinstance(event, NodeHealthEvent):
        health = detail.HealthSummary
        status = health.HealthStatus if health and health.HealthStatus else "unknown"
        action = f", {health.RepairAction}" if health and health.RepairAction else ""
        trigger = f"node health {detail.InstanceId}: {status}{action}"
        cluster = detail.ClusterName
    else:
        details = detail.EventDetails
        subject = details.InstanceId or details.InstanceGroupName or details.ResourceType
        trigger = f"cluster event {details.EventLevel or 'Info'} on {subject}"
        cluster = details.ClusterName
    return SyncRequest(cluster=cluster, mode="event", dry_run=False, trigger=trigger, event_id=event.id)


def require_managed_cluster(request: SyncRequest, managed_cluster: str) -> SyncRequest:
    if request.cluster != managed_cluster:
        raise UnknownClusterError(f"cluster {request.cluster!r} is not managed by this stack")
    return request
