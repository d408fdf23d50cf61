"""A login node's session list changed: the fact RecordNodeReport announces once it has stored an
accepted report, so that whoever counts sessions (session limits) checks at once instead of at its
next sweep. The decision is pure; the announcement is one PutEvents on the account's default bus,
where node agents have no permission to put anything (their own bus is the node-report bus).

Only a change is announced: an agent's heartbeat repeats its list, and a list that did not change
cannot put anyone over a limit. A busy node lists each user's newest and oldest sessions and counts the
rest (``omittedByUser``): a session that shows only in that count is a change too. A redelivery of the event that brought the stored report is
announced again (its first announcement may be what failed); the reader is idempotent.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from hpops_core.common.clients import client, transient_errors_named
from hpops_core.common.errors import TransientAwsError
from hpops_core.node_channel import contract
from hpops_core.node_channel.reports import NodeReport


@dataclass(frozen=True)
class SessionsChange:
    changed: bool
    reason: str


def _listed(entries: Iterable[Mapping[str, Any]]) -> set[tuple[str, str, str]]:
    return {(str(e.get("path")), str(e.get("user")), str(e.get("handle"))) for e in entries}


def sessions_change(previous: Mapping[str, Any] | None, report: NodeReport, event_id: str | None,
                    grew: Iterable[str] = ()) -> SessionsChange:
    """Pure: does this accepted report list other sessions than the node's previous stored report, or
    did a user gain a session there (``grew``: user_sessions.plan_user_sync's, which also sees a session
    the node only counted)?

    ``previous``: report_store.store_report's return (the replaced report with its eventId), or None."""
    if report.sessions is None:
        return SessionsChange(False, "the agent lists no sessions")
    now = _listed(report.sessions.list)
    if previous is None:
        return SessionsChange(bool(now), f"first report of this node, {len(now)} session(s)")
    if event_id and previous.get("eventId") == event_id:
        return SessionsChange(True, "the same report delivered again; its announcement may have failed")
    before = _listed(((previous.get("sessions") or {}).get("list") or []))
    if now == before:
        grown = sorted(set(grew))
        if grown:
            return SessionsChange(True, f"same sessions listed, {len(grown)} user(s) with a new unlisted session")
        return SessionsChange(False, "same sessions as the node's previous report")
    return SessionsChange(True, f"{len(now - before)} session(s) new, {len(before - now)} gone")


def announcement(cluster: str, report: NodeReport, received_at: str, users: list[str] | None = None) -> dict[str, Any]:
    """The PutEvents entry: which node, which report, and the users with a new session there (None:
    too many to name, or unknown; the reader then reads every node). Readers count from the stored
    items, never from this event: the names only choose whose stored sessions are read, so whoever
    else could put such an event decides nothing (and it carries no session)."""
    detail = {"cluster": cluster, "instanceId": report.instanceId, "reportedAt": report.reportedAt,
              "receivedAt": received_at}
    if users is not None:
        detail["users"] = sorted(users)
    return {"Source": contract.SESSIONS_CHANGED_SOURCE, "DetailType": contract.SESSIONS_CHANGED_DETAIL_TYPE,
            "Detail": json.dumps(detail, sort_keys=True)}


def announce(entry: Mapping[str, Any]) -> None:
    """One PutEvents; a refused entry is a TransientAwsError (EventBridge redelivers the report, and
    sessions_change announces a redelivered report again)."""
    with transient_errors_named("events:PutEvents"):
        response = client("events").put_events(Entries=[dict(entry)])
    if response.get("FailedEntryCount"):
        code = (response.get("Entries") or [{}])[0].get("ErrorCode", "unknown")
        raise TransientAwsError(f"events:PutEvents refused the sessions-changed announcement ({code})")
