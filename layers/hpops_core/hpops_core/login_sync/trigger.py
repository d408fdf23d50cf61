"""What starts a login node sync: a HyperPod event, the scheduled sweep or a manual repair, as one SyncRequest.

Inputs (see events/*.json for samples):
  * the three HyperPod detail-types EventBridge delivers (source aws.sagemaker);
  * the scheduled sweep and manual repairs: {"cluster": "...", "mode": "sweep"|"repair", "dryRun": bool,
    "trigger": optional label, e.g. the daily host certificate check}.

None of the HyperPod events carries a login node's IP, so every event is reduced to "cluster X may
have changed" and the state machine reconciles the whole login group (level-triggered).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from aws_lambda_powertools import Logger
from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError

from hpops_core.cluster.events import (
    HYPERPOD_DETAIL_TYPES,
    ClusterNameStr,
    HyperPodEvent,
    parse_event,
    summarise_event,
    validation_summary,
)
from hpops_core.common.errors import MalformedEventError, UnknownClusterError
from hpops_core.common.requests import request_state

logger = Logger(child=True)


class SyncInput(BaseModel):
    """Scheduled sweep (Input set on the schedule in template.yaml) or a manual repair."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    cluster: ClusterNameStr
    mode: Literal["sweep", "repair"]
    # Strict: the string "false" must not quietly mean False (or a typo mean a real repair).
    dry_run: StrictBool = Field(default=False, alias="dryRun")
    # Set by schedules that start a repair (the daily host certificate check), shown in the plan.
    trigger: str | None = Field(default=None, pattern=r"^[A-Za-z0-9 ._-]{1,80}$")


@dataclass(frozen=True)
class SyncRequest:
    """The one thing every input becomes: reconcile `cluster`, in `mode`, for this `trigger`."""

    cluster: str
    mode: Literal["event", "sweep", "repair"]
    dry_run: bool
    trigger: str
    event_id: str | None = None
    # Event hints that looked odd and were replaced in `trigger` (names only, never values).
    odd_hints: tuple[str, ...] = field(default=(), compare=False)

    def to_state(self) -> dict[str, Any]:
        return request_state(self.cluster, self.mode, self.dry_run, self.trigger, eventId=self.event_id)


def parse_sync_input(event: Any) -> SyncRequest:
    """Turn any accepted input into a SyncRequest or raise MalformedEventError."""
    if not isinstance(event, dict):
        raise MalformedEventError(f"expected a JSON object, got {type(event).__name__}")
    if "detail-type" in event:
        if event["detail-type"] not in HYPERPOD_DETAIL_TYPES:
            raise MalformedEventError("unsupported detail-type")
        summary = summarise_event(parse_event(event, HyperPodEvent))
        request = SyncRequest(summary.cluster, "event", False, summary.trigger, summary.event_id, summary.odd_hints)
        if request.odd_hints:
            logger.warning(
                "event hints unrecognised and replaced in the trigger text; the cluster is reconciled anyway",
                extra={"oddHints": list(request.odd_hints), "eventId": request.event_id, "cluster": request.cluster},
            )
        return request
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


def require_managed_cluster(request: SyncRequest, managed_cluster: str) -> SyncRequest:
    if request.cluster != managed_cluster:
        raise UnknownClusterError(f"cluster {request.cluster!r} is not managed by this stack")
    return request
