"""What starts a SessionLimits execution, normalised to one :class:`SessionLimitsRequest`.

Accepted inputs (the state machine wraps them as ``{"input": ...}`` first):

* a CloudTrail ``StartSession`` record via EventBridge (``events/ssm-start-session.json``);
* a sweep: ``{"cluster": "<name>", "mode": "sweep", "dryRun": <bool, optional>}`` (the schedule's
  Input, or an operator's start-execution);
* a node check: ``{"cluster": "<name>", "mode": "nodes", "users": [<user over>, ...]}``, started by
  CheckReportedSessions when a login node's session list put someone over (report_check.py).

Everything else raises :class:`~hpops_core.common.errors.MalformedEventError`; a cluster this stack does
not guard raises :class:`~hpops_core.common.errors.UnknownClusterError`. Both change nothing. A
StartSession on another instance group of *this* cluster is not an error: the rule's target
prefix ``..._login-`` also matches group ``login-2``, so such a request comes back ``ignored``,
as does a session that is no shell (port forwarding, SSH tunnel, non-interactive command).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError

from hpops_core.common import validation
from hpops_core.common.errors import MalformedEventError, UnknownClusterError

from .config import SessionTriggerConfig
from .documents import session_kind
from .errors import MalformedSessionEvent
from .models import parse_start_session
from .request import MAX_NAMED_USERS, SessionLimitsRequest
from .targets import parse_target


class SweepInput(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    cluster: str = Field(pattern=validation.anchored(validation.CLUSTER_NAME_PATTERN))
    mode: Literal["sweep", "nodes"]
    dry_run: StrictBool = Field(default=False, alias="dryRun")
    # Who the node reports put over, for the trigger line only: the run counts everyone.
    users: list[str] = Field(default_factory=list, max_length=MAX_NAMED_USERS)


def _summary(error: ValidationError) -> str:
    fields = sorted({".".join(str(p) for p in e["loc"]) or "<input>" for e in error.errors()})
    return ", ".join(fields[:8])


def parse_session_input(raw: Any, config: SessionTriggerConfig) -> SessionLimitsRequest:
    """A StartSession event or a sweep input -> the request; named errors for anything else."""
    if not isinstance(raw, dict):
        raise MalformedEventError(f"expected a JSON object, got {type(raw).__name__}")
    if "detail-type" in raw or "detail" in raw or "source" in raw:
        try:
            event = parse_start_session(raw)
        except MalformedSessionEvent as exc:
            raise MalformedEventError(str(exc)) from None
        cluster_id, group, instance_id = parse_target(event.target)  # validated by the model
        if cluster_id != config.cluster_id:
            raise UnknownClusterError(f"session target is on cluster id {cluster_id}, this stack guards {config.cluster_id}")
        trigger = f"StartSession {event.session_id} on {instance_id} by {event.owner_arn}"
        ignored = None
        kind = session_kind(event.detail.requestParameters.documentName)
        if group != config.login_group:
            ignored = f"session is on instance group {group!r}, not the login group {config.login_group!r}"
        elif not kind.counted:
            # Such a session never counts, so it cannot put anyone over a limit: nothing to check.
            ignored = f"session is not an interactive shell ({kind.reason})"
        return SessionLimitsRequest(
            cluster=config.cluster_name,
            mode="event",
            dry_run=config.dry_run,
            trigger=trigger,
            session_id=event.session_id,
            owner=event.owner_arn,
            event_id=event.event_id,
            ignored=ignored,
        )
    try:
        sweep = SweepInput.model_validate(raw)
    except ValidationError as error:
        raise MalformedEventError(f"invalid sweep input: {_summary(error)}") from None
    if sweep.cluster != config.cluster_name:
        raise UnknownClusterError(f"cluster {sweep.cluster} is not managed by this stack ({config.cluster_name})")
    # The deployment's dry-run setting cannot be switched off from an execution's input.
    dry_run = config.dry_run or sweep.dry_run
    if any(not validation.is_posix_user(user) for user in sweep.users):
        raise MalformedEventError("invalid sweep input: users")
    trigger = "sweep" if sweep.mode == "sweep" else "login node report: over the limit: " + ", ".join(sweep.users)
    return SessionLimitsRequest(cluster=sweep.cluster, mode=sweep.mode, dry_run=dry_run, trigger=trigger)
