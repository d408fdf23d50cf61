"""The request ParseSessionTrigger hands on through the execution state, and how the later tasks
read it back. No pydantic: only ParseSessionTrigger parses raw events (trigger.py)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Literal

from hpops_core.common.requests import request_state
from hpops_core.common import validation
from hpops_core.common.errors import MalformedEventError, UnknownClusterError

# "nodes": a login node's session list changed and someone is over (report_check.py); checked as a
# sweep, without republishing the login limits.
Mode = Literal["event", "sweep", "nodes"]
MAX_NAMED_USERS = 10  # users a "nodes" request names in its trigger line (the run counts everyone)


@dataclass(frozen=True)
class SessionLimitsRequest:
    cluster: str
    mode: Mode
    dry_run: bool
    trigger: str
    session_id: str | None = None  # the session a StartSession event announced
    owner: str | None = None  # its principal ARN (what DescribeSessions reports as Owner)
    event_id: str | None = None
    ignored: str | None = None  # why there is nothing to check (another instance group)

    def to_state(self) -> dict[str, Any]:
        return request_state(self.cluster, self.mode, self.dry_run, self.trigger, sessionId=self.session_id,
                             owner=self.owner, eventId=self.event_id, ignored=self.ignored is not None,
                             ignoredReason=self.ignored)

    @classmethod
    def from_state(cls, state: Any) -> SessionLimitsRequest:
        """The request as ParseSessionTrigger emitted it; anything else is MalformedEventError."""
        if not isinstance(state, dict):
            raise MalformedEventError("request must be a JSON object")
        mode, dry_run, cluster = state.get("mode"), state.get("dryRun"), state.get("cluster")
        session_id, owner = state.get("sessionId"), state.get("owner")
        if mode not in ("event", "sweep", "nodes") or not isinstance(dry_run, bool) or not isinstance(cluster, str):
            raise MalformedEventError("request needs cluster, mode (event|sweep|nodes) and dryRun")
        if mode == "event" and not (validation.is_session_id(session_id) and isinstance(owner, str)):
            raise MalformedEventError("an event request needs sessionId and owner")
        return cls(
            cluster=cluster,
            mode=mode,
            dry_run=dry_run,
            trigger=str(state.get("trigger") or mode)[:300],
            session_id=session_id if mode == "event" else None,
            owner=owner if mode == "event" else None,
            event_id=state.get("eventId") if isinstance(state.get("eventId"), str) else None,
            ignored=state.get("ignoredReason") if state.get("ignored") else None,
        )


def parse_now(value: Any) -> datetime:
    """The execution's clock (``$$.State.EnteredTime``), so every task of a run agrees on "now";
    the current time only when a caller sent none. MalformedEventError when it is no ISO 8601 time."""
    if value is None:
        return datetime.now(timezone.utc)
    try:
        parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        raise MalformedEventError("now must be an ISO 8601 timestamp") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def read_task_input(event: Any, cluster_name: str) -> tuple[SessionLimitsRequest, datetime]:
    """``{"request": <ParseSessionTrigger output>, "now": ISO time}`` -> (request, now) for this
    stack's cluster; MalformedEventError / UnknownClusterError otherwise, before any AWS call."""
    request = SessionLimitsRequest.from_state(event.get("request") if isinstance(event, dict) else None)
    if request.cluster != cluster_name:
        raise UnknownClusterError(f"cluster {request.cluster} is not managed by this stack ({cluster_name})")
    return request, parse_now(event.get("now"))
