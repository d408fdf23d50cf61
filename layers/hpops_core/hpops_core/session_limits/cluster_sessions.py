"""One cluster-wide rule over both ways in: a user's SSH sessions on every login node plus their
Session Manager shells together stay within their limit. Pure: no AWS, no clock.

Where each count comes from:

* **SSH** sessions: the login nodes' own reports (node agents list them from the process table,
  ``ssh -N`` included, which utmp and so ``maxlogins`` never see). Only a report that passed the
  origin check (the node is in this cluster's login group at the IP it claims) is used, and a node
  speaks only for itself: its sessions are keyed by its instance id.
* **Session Manager** shells: DescribeSessions, attributed to POSIX users as before (decide.py).
  Nodes list their SSM shells too, but those are shown, never counted again.

The excess is picked exactly as for Session Manager alone (policy.py: overrides, exempt users,
``newest``/``oldest``), across both paths: an SSM shell is ended with TerminateSession, an SSH
session by the agent of the node that holds it (its handle and user go to that node's
end-sessions parameter; the agent re-checks both before it signals anything).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any

from hpops_core.common import validation
from hpops_core.node_channel import contract

from .policy import ActiveSession, LimitPolicy, UserVerdict, decide_terminations
from .targets import parse_target

SSH_KEY_PREFIX = "ssh/"


@dataclass(frozen=True)
class NodeSshSession:
    instance_id: str
    handle: str
    user: str
    start: datetime
    tty: bool = True

    @property
    def key(self) -> str:
        return f"{SSH_KEY_PREFIX}{self.instance_id}/{self.handle}"


@dataclass(frozen=True)
class SshSessionToEnd:
    instance_id: str
    handle: str
    user: str
    reason: str


@dataclass(frozen=True)
class ClusterDecision:
    verdicts: tuple[UserVerdict, ...]
    ssm_to_terminate: tuple[str, ...]
    ssh_to_end: tuple[SshSessionToEnd, ...]
    # user -> {"ssh": {instance: n}, "ssm": {instance or target: n}}: what status shows against the limit
    by_user: Mapping[str, Mapping[str, Mapping[str, int]]]

    def ssh_by_node(self) -> dict[str, list[SshSessionToEnd]]:
        grouped: dict[str, list[SshSessionToEnd]] = defaultdict(list)
        for session in self.ssh_to_end:
            grouped[session.instance_id].append(session)
        return dict(grouped)


def ssh_sessions_of_report(instance_id: str, sessions: Iterable[Mapping[str, Any]]) -> list[NodeSshSession]:
    """A validated report's SSH entries as sessions of that node (reports.py checked each field)."""
    found = []
    for entry in sessions:
        if entry.get("path") != "ssh":
            continue
        start = datetime.fromisoformat(str(entry["startedAt"]).replace("Z", "+00:00"))
        found.append(NodeSshSession(instance_id, entry["handle"], entry["user"], start, bool(entry.get("tty"))))
    return found


def decide_cluster_wide(
    ssh: Iterable[NodeSshSession],
    ssm: Iterable[ActiveSession],
    policy: LimitPolicy,
    already_ended: Iterable[str] = frozenset(),
    unlisted: Mapping[str, Mapping[str, int]] | None = None,
) -> ClusterDecision:
    """Which sessions end so that every user's SSH + SSM sessions on all login nodes fit their limit.

    ``already_ended``: SSM session ids and SSH keys (``NodeSshSession.key``) ended by an earlier run
    that the listings may still show; neither counted nor picked again.
    ``unlisted``: node -> user -> SSH sessions a busy node counted without listing them; counted, never picked.
    """
    done = frozenset(already_ended)
    active: list[ActiveSession] = []
    by_user: dict[str, dict[str, dict[str, int]]] = defaultdict(lambda: {"ssh": defaultdict(int), "ssm": defaultdict(int)})
    ssh_by_key: dict[str, NodeSshSession] = {}
    for session in ssm:
        # Exempt principals are an SSM notion (owner ARNs); decided here, since SSH sessions have no owner ARN.
        if policy.principal_exempt(session.owner) is None:
            active.append(session)
            if session.posix_user is not None and session.session_id not in done:
                parsed = parse_target(session.target)
                by_user[session.posix_user]["ssm"][parsed[2] if parsed else session.target] += 1
    for session in ssh:
        if not (validation.is_instance_id(session.instance_id) and contract.SESSION_HANDLE_RE.match(session.handle)
                and validation.is_limited_user(session.user)):
            continue  # reports.py refuses such reports; a caller that skipped it still never ends one
        ssh_by_key[session.key] = session
        start = session.start if session.start.tzinfo else session.start.replace(tzinfo=timezone.utc)
        active.append(ActiveSession(session.key, "", session.instance_id, start, session.user))
        if session.key not in done:
            by_user[session.user]["ssh"][session.instance_id] += 1
    per_user: dict[str, int] = defaultdict(int)
    for instance, counts in sorted((unlisted or {}).items()):
        for user, count in counts.items():
            if validation.is_instance_id(instance) and validation.is_limited_user(user) and count > 0:
                per_user[user] += count
                by_user[user]["ssh"][instance] += count
    decision = decide_terminations(active, replace(policy, exempt_principal_patterns=()), done, per_user)
    reason_of = {sid: f"{v.user}: {v.reason} (SSH and Session Manager on all login nodes)"
                 for v in decision.verdicts for sid in v.to_terminate}
    ssm_ids = tuple(sid for sid in decision.to_terminate if sid not in ssh_by_key)
    ssh_ends = tuple(
        SshSessionToEnd(ssh_by_key[sid].instance_id, ssh_by_key[sid].handle, ssh_by_key[sid].user, reason_of[sid])
        for sid in decision.to_terminate if sid in ssh_by_key
    )
    frozen = {user: {path: dict(nodes) for path, nodes in paths.items()} for user, paths in sorted(by_user.items())}
    return ClusterDecision(decision.verdicts, ssm_ids, ssh_ends, frozen)


def end_sessions_document(sessions: Iterable[SshSessionToEnd]) -> dict[str, Any]:
    """The end-sessions parameter's value for one node (contract.END_SESSIONS_FORMAT)."""
    return {"format": contract.END_SESSIONS_FORMAT,
            "sessions": [{"handle": s.handle, "user": s.user} for s in sessions][: contract.MAX_END_SESSIONS]}


def sessions_by_user(reports: Mapping[str, Mapping[str, Any]], default_limit: int, overrides: Mapping[str, int],
                     exempt: Iterable[str], top: int = 10) -> dict[str, Any]:
    """Pure, for ``hpops status``: per user, the sessions the login nodes report by path and node
    against the user's limit (most sessions first), each node's per-user caps result, and who reached
    a cap since their node's previous poll (user -> node -> caps).

    ``reports``: instance id -> latest report of the Running login nodes. Session Manager shells
    appear under the user the node runs them as (root's, Run As off, are never listed)."""
    exempt_users = set(exempt)
    users: dict[str, dict[str, dict[str, int]]] = defaultdict(lambda: {"ssh": defaultdict(int), "ssm": defaultdict(int)})
    caps = {}
    at_cap: dict[str, dict[str, list[str]]] = defaultdict(dict)
    for instance, report in sorted(reports.items()):
        for entry in (report.get("sessions") or {}).get("list", []):
            if entry.get("path") in ("ssh", "ssm"):
                users[entry["user"]][entry["path"]][instance] += 1
        if report.get("userCaps"):
            caps[instance] = f"{report['userCaps'].get('result')}: {report['userCaps'].get('reason', '')}"
            for hit in report["userCaps"].get("atCap") or []:
                at_cap[hit["user"]][instance] = list(hit["caps"])
    rows = []
    for user, paths in users.items():
        total = sum(paths["ssh"].values()) + sum(paths["ssm"].values())
        limit = None if user in exempt_users else overrides.get(user, default_limit)
        rows.append({"user": user, "limit": limit, "total": total, "over": limit is not None and total > limit,
                     "ssh": dict(paths["ssh"]), "ssm": dict(paths["ssm"])})
    rows.sort(key=lambda r: (-r["total"], r["user"]))
    return {"users": rows[:top], "userCount": len(rows), "caps": caps,
            "atCap": {user: dict(nodes) for user, nodes in sorted(at_cap.items())}}


def session_spread(reports: Mapping[str, Mapping[str, Any]], running: Iterable[str]) -> dict[str, Any]:
    """Pure, for ``hpops status``: how evenly the Running login nodes carry sessions, from their reports.

    Per node its SSH and Session Manager sessions and distinct users; ``maxOverMean`` is the busiest
    node's sessions over the mean of the nodes that reported (1.0 = even; None without sessions).
    A Running node without a report is listed with ``sessions`` None and left out of the mean."""
    nodes = []
    for instance in sorted(running):
        listed = (reports.get(instance) or {}).get("sessions")
        entries = [e for e in (listed or {}).get("list", []) if e.get("path") in ("ssh", "ssm")]
        nodes.append({"instanceId": instance, "sessions": None if listed is None else len(entries),
                      "users": None if listed is None else len({e["user"] for e in entries})})
    return {"nodes": nodes} | spread_figures([n["sessions"] for n in nodes if n["sessions"] is not None])


def spread_figures(counted: list[int]) -> dict[str, Any]:
    """Sessions in all, nodes counted, mean per node and the busiest node over the mean (None without sessions)."""
    total = sum(counted)
    mean = total / len(counted) if counted else 0.0
    return {"sessions": total, "reporting": len(counted), "meanPerNode": round(mean, 2),
            "maxOverMean": round(max(counted) / mean, 2) if total else None}
