"""The login nodes' side of the cluster-wide limit: their reported SSH sessions in, instructions out.

In: the latest report of each login node (node_channel/report_store.py; only reports that passed
the origin check are ever stored, and a node speaks only for itself), read each run with the
ledger. A report older than ``max_age_seconds`` is not used: its node may be gone or cut
off, and sessions it listed may have ended long ago; counting them could end a newer session.

Out: for each node holding a session to end, its end-sessions parameter (one PutParameter per
node) lists every session this stack told it to end that the node still reports, plus the new
ones, so a second run before the agent polls never drops the first run's instruction. The agent
ends each listed session once, if its handle still names a session of that user on that node.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from hpops_core.common.clients import client, transient_errors_named
from hpops_core.common.state_table import (node_report_partition, node_sessions_partition, session_partition,
                                           user_sessions_partition)
from hpops_core.node_channel import contract, instructions
from hpops_core.node_channel.report_store import SK_PREFIX
from hpops_core.node_channel.user_sessions import is_tombstone

from . import ledger
from .policy import ActiveSession
from .cluster_sessions import SSH_KEY_PREFIX, NodeSshSession, SshSessionToEnd, end_sessions_document, ssh_sessions_of_report

# Agents report on change and at least every heartbeat (600 s by default): two heartbeats and a
# poll without a report means the node's list can no longer be trusted.
DEFAULT_REPORT_MAX_AGE_SECONDS = 2 * contract.DEFAULT_HEARTBEAT_SECONDS + contract.DEFAULT_POLL_SECONDS


@dataclass(frozen=True)
class ReportedSessions:
    ssh: tuple[NodeSshSession, ...]
    ssm_on_nodes: int  # Session Manager shells the nodes list (counted from DescribeSessions, not again)
    nodes: tuple[str, ...]  # nodes whose report was used
    stale: tuple[str, ...]  # nodes whose latest report was too old to use
    omitted: int  # sessions nodes left out of full reports (MAX_REPORTED_SESSIONS)
    ended: Mapping[str, Mapping[str, str]]  # "ssh/<node>/<handle>" -> the agent's outcome
    # The Session Manager shells the nodes list, as sessions of the user they run as: what the
    # report check counts (report_check.py); a run counts DescribeSessions' instead.
    ssm_shells: tuple[ActiveSession, ...] = ()
    # A busy node's SSH sessions it counted without listing them (contract "omittedByUser"):
    # node -> user -> sessions. Counted against the user's limit, never picked (no handle).
    unlisted: Mapping[str, Mapping[str, int]] = field(default_factory=dict)


def _received(value: str | None) -> datetime | None:
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None


@dataclass(frozen=True)
class ClusterState:
    """What the state table says: the nodes' sessions, the ledger of sessions already ended
    (ledger.py) and whether Run As was last seen off."""

    nodes: ReportedSessions
    recorded: Mapping[str, str]  # ledger: session id or SSH key -> kind
    run_as: str | None  # ledger.RUN_AS_ON / RUN_AS_OFF, None when never recorded


def _partition(ddb, table: str, pk: str, projection: str | None, names: dict[str, str], consistent: bool = True):
    """Every item of one partition of the state table (paged past 1 MB); all attributes without a projection."""
    kwargs = {"TableName": table, "KeyConditionExpression": "pk = :pk", "ExpressionAttributeValues": {":pk": {"S": pk}},
              "ConsistentRead": consistent}
    if projection:
        kwargs["ProjectionExpression"] = projection
    if names:  # DynamoDB refuses an empty map
        kwargs["ExpressionAttributeNames"] = names
    while True:
        with transient_errors_named("dynamodb:Query"):
            page = ddb.query(**kwargs)
        yield from page.get("Items", [])
        if "LastEvaluatedKey" not in page:
            return
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def _node_reports(ddb, table: str, cluster: str, fresh_node: str | None):
    """The node-report partition's items. With ``fresh_node`` (a node whose report was just stored and
    announced), the Query is eventually consistent (half the read units) and that node's item alone
    is read strongly, replacing the Query's copy: the change being checked is always seen, and
    another node's change moments earlier is checked by its own announcement, else by the sweep."""
    items = _partition(ddb, table, node_report_partition(cluster), "sk, report, receivedAt", {},
                       consistent=fresh_node is None)
    if fresh_node is None:
        yield from items
        return
    key = {"pk": {"S": node_report_partition(cluster)}, "sk": {"S": SK_PREFIX + fresh_node}}
    with transient_errors_named("dynamodb:GetItem"):
        fresh = ddb.get_item(TableName=table, Key=key, ConsistentRead=True,
                             ProjectionExpression="sk, report, receivedAt").get("Item")
    for item in items:
        if item["sk"]["S"] != key["sk"]["S"]:
            yield item
    if fresh:
        yield fresh


def _ledger(ddb, table: str, cluster: str, now: datetime) -> tuple[dict[str, str], str | None]:
    """The ledger of sessions already ended (still within their TTL) and the Run As state, read strongly:
    what was ended must never count again."""
    recorded: dict[str, str] = {}
    run_as = None
    cutoff = int(now.timestamp())
    for item in _partition(ddb, table, session_partition(cluster), "sk, #kind, #ttl, #state",
                           {"#kind": "kind", "#ttl": "ttl", "#state": "state"}):  # reserved words
        record = ledger.session_record(item, cutoff)
        if record is not None:
            recorded[record[0]] = record[1]
        if item["sk"]["S"] == ledger.RUN_AS_SK:
            run_as = item.get("state", {}).get("S")
    return recorded, run_as


@dataclass(frozen=True)
class NodePresence:
    """The login nodes' presence items (node_channel/user_sessions.py): whose per-user items count."""

    fresh: Mapping[str, int]  # node -> its sessions (listed and not), report fresh enough to count
    stale: tuple[str, ...]


def read_node_presence(table: str, cluster: str, now: datetime,
                       max_age_seconds: int = DEFAULT_REPORT_MAX_AGE_SECONDS) -> NodePresence:
    """One strongly consistent Query of the nodes' presence partition (~150 bytes a node: one read unit
    for 25 nodes), so a node that just reported again after a silence counts at once. No projection:
    DynamoDB charges a read by the whole item anyway."""
    fresh, stale = {}, []
    for item in _partition(client("dynamodb"), table, node_sessions_partition(cluster), None, {}):
        received = _received(item.get("receivedAt", {}).get("S"))
        if received is None or (now - received).total_seconds() > max_age_seconds:
            stale.append(item["sk"]["S"])
        else:
            fresh[item["sk"]["S"]] = int(item.get("sessions", {}).get("N") or 0)
    return NodePresence(dict(sorted(fresh.items())), tuple(sorted(stale)))


def read_users_state(table: str, cluster: str, users: Iterable[str], now: datetime,
                     presence: NodePresence) -> ClusterState:
    """The named users' sessions on every fresh login node and the ledger: one strongly consistent Query
    of each user's partition (a node per item, a few hundred bytes each: one read unit per user on
    most tiers), whatever the number of nodes, other users and sessions. A user's items on a node
    whose presence is stale or gone are not counted (read_cluster_state does the same with reports)."""
    ddb = client("dynamodb")
    users = sorted(set(users))
    # Nobody's sessions grew (logouts only): nobody can be newly over, and the ledger is not needed.
    recorded, run_as = _ledger(ddb, table, cluster, now) if users else ({}, None)
    ssh: list[NodeSshSession] = []
    ssm: list[ActiveSession] = []
    unlisted: dict[str, dict[str, int]] = defaultdict(dict)
    for user in users:
        for item in _partition(ddb, table, user_sessions_partition(cluster, user), None, {}):
            instance = item["sk"]["S"]
            if instance not in presence.fresh or is_tombstone(item):  # a removed user's tombstone counts nothing
                continue
            entries = [dict(e, user=user) for e in json.loads(item.get("sessions", {}).get("S") or "[]")]
            ssh.extend(ssh_sessions_of_report(instance, entries))
            ssm.extend(ActiveSession(e["sessionId"], "", instance, _received(e["startedAt"]) or now, user)
                       for e in entries if e.get("path") == "ssm" and e.get("sessionId"))
            if int(item.get("unlisted", {}).get("N") or 0):
                unlisted[instance][user] = int(item["unlisted"]["N"])
    omitted = sum(n for counts in unlisted.values() for n in counts.values())
    reported = ReportedSessions(tuple(ssh), len(ssm), tuple(presence.fresh), presence.stale, omitted, {}, tuple(ssm),
                                {node: dict(counts) for node, counts in sorted(unlisted.items())})
    return ClusterState(reported, recorded, run_as)


def read_cluster_state(table: str, cluster: str, now: datetime,
                       max_age_seconds: int = DEFAULT_REPORT_MAX_AGE_SECONDS,
                       fresh_node: str | None = None) -> ClusterState:
    """The cluster's node reports and its ledger with the Run As state: one Query (paged) of each partition
    (``fresh_node``: see _node_reports).

    Every run needs the nodes' SSH sessions (they can put a user over with a single new shell). The
    two kinds have partitions of their own so that the nodes' report writer can never touch the ledger."""
    ddb = client("dynamodb")
    recorded, run_as = _ledger(ddb, table, cluster, now)
    ssh: list[NodeSshSession] = []
    nodes, stale, ssm, omitted, ended, unlisted = [], [], [], 0, {}, {}
    for item in _node_reports(ddb, table, cluster, fresh_node):
        sk = item["sk"]["S"]
        if not sk.startswith(SK_PREFIX):
            continue
        instance = sk[len(SK_PREFIX):]
        received = _received(item.get("receivedAt", {}).get("S"))
        report = json.loads(item.get("report", {}).get("S") or "{}")
        sessions = report.get("sessions")
        if sessions is None:
            continue  # an agent that does not list sessions (older version): nothing to count
        if received is None or (now - received).total_seconds() > max_age_seconds:
            stale.append(instance)
            continue
        nodes.append(instance)
        ssh.extend(ssh_sessions_of_report(instance, sessions.get("list", [])))
        ssm.extend(ActiveSession(s["sessionId"], "", instance, _received(s["startedAt"]) or now, s["user"])
                   for s in sessions.get("list", []) if s.get("path") == "ssm" and s.get("sessionId"))
        omitted += int(sessions.get("omitted") or 0)
        if sessions.get("omittedByUser"):
            unlisted[instance] = dict(sessions["omittedByUser"])
        for outcome in sessions.get("ended", []):
            ended[f"{SSH_KEY_PREFIX}{instance}/{outcome['handle']}"] = outcome
    reported = ReportedSessions(tuple(ssh), len(ssm), tuple(sorted(nodes)), tuple(sorted(stale)), omitted, ended,
                                tuple(ssm), unlisted)
    return ClusterState(reported, recorded, run_as)


def instruct_nodes(cluster: str, to_end: Iterable[SshSessionToEnd], reported: Iterable[NodeSshSession],
                   earlier_keys: Iterable[str]) -> dict[str, int]:
    """Write each affected node's end-sessions parameter; returns node -> sessions listed in it."""
    still_there = {s.key: s for s in reported}
    by_node: dict[str, dict[str, SshSessionToEnd]] = defaultdict(dict)
    for session in to_end:
        by_node[session.instance_id][session.handle] = session
    for key in earlier_keys:
        earlier = still_there.get(key)
        if earlier is not None and earlier.instance_id in by_node:
            by_node[earlier.instance_id].setdefault(
                earlier.handle, SshSessionToEnd(earlier.instance_id, earlier.handle, earlier.user, "told earlier"))
    written = {}
    for instance, sessions in sorted(by_node.items()):
        document = end_sessions_document(sessions.values())
        instructions.write_instruction(contract.end_sessions_parameter(cluster, instance),
                                       json.dumps(document, sort_keys=True, separators=(",", ":")))
        written[instance] = len(document["sessions"])
    return written


def remove_departed_instructions(cluster: str, listed: set[str]) -> list[str]:
    """Delete the end-sessions instruction and its marker of every node not in ``listed`` (the login
    group's nodes in any status: a node still there, even updating, may yet fetch what it was told).
    Returns the instance ids whose parameters went."""
    ssm = client("ssm")
    path = contract.end_sessions_path(cluster)
    with transient_errors_named("ssm:GetParametersByPath"):
        names = [p["Name"] for page in ssm.get_paginator("get_parameters_by_path").paginate(Path=path)
                 for p in page.get("Parameters", [])]
    gone = sorted(name for name in names if name.rsplit("/", 1)[1] not in listed)
    doomed = [n for name in gone for n in (name, contract.instruction_marker_parameter(name))]
    for start in range(0, len(doomed), 10):  # DeleteParameters takes at most 10 names; missing ones are no error
        with transient_errors_named("ssm:DeleteParameters"):
            ssm.delete_parameters(Names=doomed[start:start + 10])
    return [name.rsplit("/", 1)[1] for name in gone]
