"""CheckReportedSessions: a login node's session list changed (RecordNodeReport stored its report
after the origin check, then announced it); is anyone now over their limit, cluster-wide? If so,
start one SessionLimits execution (mode "nodes") now, instead of leaving an SSH login over the
limit until the next sweep. That execution recounts everything (DescribeSessions too), decides
and ends exactly as a sweep does; this only decides whether to start it.

Counted here: what the nodes' accepted reports list (a node speaks only for itself; a stale one is
not used), SSH logins and the Session Manager shells the nodes run, with the run's own decision
(cluster_sessions.decide_cluster_wide) and the ledger of sessions already ended. Only the users the
announcement names can newly be over (their sessions grew), so only their per-user items are read
(node_channel/user_sessions.py: one Query per user, whatever the number of nodes); an announcement
naming nobody reads every node's whole report. The event itself is never counted: it only says
whose sessions to read.

Storms: one execution per over-limit situation. Its name comes from the cluster and the sessions
that put each user over, so the reports of one crossing, redeliveries and heartbeats start one
execution between them (Step Functions refuses a name it has seen, ExecutionAlreadyExists, which
is success here); a new login over the limit is a new situation.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hpops_core.common import validation
from hpops_core.common.clients import start_named_execution
from hpops_core.common.errors import MalformedEventError, UnknownClusterError
from hpops_core.node_channel import contract
from hpops_core.node_channel.user_sessions import MAX_ANNOUNCED_USERS

from . import ledger
from .cluster_sessions import decide_cluster_wide, spread_figures
from .node_sessions import ClusterState
from .policy import LimitPolicy
from .request import MAX_NAMED_USERS

NAME_MAX = 80  # Step Functions: 1-80 of letters, digits, "-" and "_"
NAME_PREFIX = "nodes-"
DIGEST_CHARS = 24


@dataclass(frozen=True)
class ReportCheck:
    start: bool
    reason: str
    users: tuple[str, ...] = ()
    name: str | None = None
    input: dict[str, Any] | None = None


def announced_node(event: Any, cluster: str) -> str:
    """The announcement's node (for the log line); a named error for anything else."""
    detail = event.get("detail") if isinstance(event, dict) else None
    if (not isinstance(detail, dict) or event.get("source") != contract.SESSIONS_CHANGED_SOURCE
            or event.get("detail-type") != contract.SESSIONS_CHANGED_DETAIL_TYPE
            or not validation.is_instance_id(detail.get("instanceId"))):
        raise MalformedEventError("expected a login node sessions-changed announcement")
    if detail.get("cluster") != cluster:
        raise UnknownClusterError(f"announcement names another cluster; this stack guards {cluster}")
    return detail["instanceId"]


def announced_users(event: Any) -> tuple[str, ...] | None:
    """The users the announcement names as having a new session (whose stored sessions are read), or
    None when it names none (too many, or an older RecordNodeReport): every node's report is read."""
    users = event["detail"].get("users")
    if users is None:
        return None
    if not (isinstance(users, list) and len(users) <= MAX_ANNOUNCED_USERS
            and all(validation.is_limited_user(u) for u in users)):
        raise MalformedEventError("the announcement's users are not a short list of POSIX users")
    return tuple(sorted(set(users)))


def execution_name(cluster: str, counted: dict[str, list[str]]) -> str:
    """Deterministic and within Step Functions' rules: the same over-limit sessions, the same name."""
    digest = hashlib.sha256(json.dumps({u: sorted(k) for u, k in counted.items()}, sort_keys=True).encode()).hexdigest()
    head = f"{NAME_PREFIX}{cluster}"[: NAME_MAX - DIGEST_CHARS - 1]
    return f"{head}-{digest[:DIGEST_CHARS]}"


def decide_report_check(cluster: str, state: ClusterState, policy: LimitPolicy) -> ReportCheck:
    """Pure: start a check, and under which name, from the stored reports and the ledger."""
    done = {key for key, kind in state.recorded.items() if kind == ledger.ENDED}
    nodes = state.nodes
    decision = decide_cluster_wide(nodes.ssh, nodes.ssm_shells, policy, done, nodes.unlisted)
    over = sorted((v for v in decision.verdicts if v.to_terminate), key=lambda v: v.user)
    if not over:
        return ReportCheck(False, f"nobody over their limit: {len(nodes.ssh)} SSH and {len(nodes.ssm_shells)} "
                                  f"Session Manager session(s) on {len(nodes.nodes)} reporting node(s)")
    users = {v.user for v in over}
    counted: dict[str, list[str]] = defaultdict(list)
    for session in nodes.ssh:
        if session.user in users and session.key not in done:
            counted[session.user].append(session.key)
    for shell in nodes.ssm_shells:
        if shell.posix_user in users and shell.session_id not in done:
            counted[str(shell.posix_user)].append(shell.session_id)
    for instance, counts in sorted(nodes.unlisted.items()):  # a busy node's unlisted sessions: by count
        for user in sorted(users & set(counts)):
            counted[user].append(f"unlisted/{instance}/{counts[user]}")
    named = [v.user for v in over][:MAX_NAMED_USERS]
    reason = "; ".join(f"{v.user}: {v.active_count} session(s), limit {v.limit}" for v in over[:MAX_NAMED_USERS])
    return ReportCheck(True, reason, tuple(named), execution_name(cluster, dict(counted)),
                       {"cluster": cluster, "mode": "nodes", "users": named})


def start_check(state_machine_arn: str, check: ReportCheck) -> bool:
    """Start the execution the check named (clients.start_named_execution: False when it ran already)."""
    return start_named_execution(state_machine_arn, check.name, check.input)


def login_spread(per_node: Mapping[str, int]) -> dict[str, Any]:
    """Pure: sessions per fresh login node (SSH and Session Manager, listed or counted; the nodes'
    presence items) and the busiest over the mean."""
    return {"perNode": dict(sorted(per_node.items()))} | spread_figures(list(per_node.values()))
