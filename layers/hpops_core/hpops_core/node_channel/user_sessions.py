"""Each user's sessions on each login node, kept per user so that a session change reads that user alone.

RecordNodeReport keeps every node's latest report whole (report_store.py); counting a user against
their limit from those means reading every node's report, ~100 KB each on a busy tier. So, from the
same accepted report, it also keeps:

    pk = "user-sessions#<cluster>#<user>"  sk = <instance id>   sessions (JSON: that user's entries on
        that node, without the user), unlisted (their SSH sessions the node counted without listing),
        sequence (the report's), receivedAt
    pk = "node-sessions#<cluster>"         sk = <instance id>   receivedAt, eventId, sequence,
        sessions (all the node's), users, ttl: which nodes are fresh enough to count, and which
        report the node's per-user items were last brought up to

Only the users whose entries or unlisted count changed since the node's previous report are written,
and users gone from the node deleted (plan_user_sync, pure). The diff is trusted only when the node's
presence item names the previous report (its per-user items were fully written); otherwise (a first
report, a redelivery whose first attempt may have stopped half way, an earlier failure) every user
of the report is written again. Writes are conditional on the report's sequence, so a slower older
report never overwrites a newer one's items.

Safe by construction: an item left behind (a write that failed after the report was stored, a node
that left) can only count a session too many, which at most starts a SessionLimits execution that
recounts from the whole reports and ends nothing wrong; a node whose presence is stale or gone is
not counted at all. A missing item cannot happen without the report's redelivery rewriting it.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import ClientError

from hpops_core.common.clients import client, transient_errors_named
from hpops_core.common.state_table import node_sessions_partition, user_sessions_partition
from hpops_core.node_channel.report_store import REPORT_TTL_SECONDS

# A change that grew more users than this is announced without names: the check then reads every
# node's report instead (fewer calls than this many Queries, and it happens only when a node first
# reports or a report is redelivered).
MAX_ANNOUNCED_USERS = 100


@dataclass(frozen=True)
class UserOnNode:
    """One user's sessions on one node: their listed entries (canonical JSON) and unlisted count."""

    entries: str
    unlisted: int

    def handles(self) -> set[str]:
        return {e["handle"] for e in json.loads(self.entries)}


@dataclass(frozen=True)
class UserSync:
    full: bool  # every user of the report written (no trusted previous state)
    write: Mapping[str, UserOnNode] = field(default_factory=dict)
    delete: tuple[str, ...] = ()
    grew: tuple[str, ...] = ()  # users with a session the previous report did not have: who can newly exceed
    sessions: int = 0  # the node's sessions (listed and not) and distinct users, for its presence item
    users: int = 0
    reason: str = ""


def users_on_node(section: Mapping[str, Any] | None) -> dict[str, UserOnNode]:
    """A report's sessions section (as stored, or the parsed report's) -> user -> their sessions there."""
    listed: dict[str, list[dict]] = defaultdict(list)
    for entry in (section or {}).get("list") or ():
        listed[entry["user"]].append({k: v for k, v in entry.items() if k != "user"})
    unlisted = dict((section or {}).get("omittedByUser") or {})
    return {user: UserOnNode(json.dumps(sorted(listed.get(user, []), key=lambda e: e["handle"]), sort_keys=True,
                                        separators=(",", ":")), int(unlisted.get(user, 0)))
            for user in sorted(set(listed) | set(unlisted))}


def _section(sessions: Any) -> dict | None:
    if sessions is None or isinstance(sessions, Mapping):
        return sessions
    return {"list": list(sessions.list), "omittedByUser": sessions.omittedByUser}


def plan_user_sync(previous: Mapping[str, Any] | None, presence: Mapping[str, Any] | None, sessions: Any,
                   event_id: str | None) -> UserSync:
    """Pure: which per-user items this report writes and deletes, and whose sessions grew.

    ``previous``: the report it replaced (report_store.store_report's return, with its eventId);
    ``presence``: the node's presence item before this report (presence_of), or None;
    ``sessions``: the new report's sessions section (None: an agent that lists none, nothing kept)."""
    section = _section(sessions)
    if section is None:
        return UserSync(False, reason="the agent lists no sessions")
    now = users_on_node(section)
    total = len(section.get("list") or ()) + int(section.get("omitted") or 0)
    before = users_on_node((previous or {}).get("sessions"))
    gone = tuple(sorted(set(before) - set(now)))
    previous_event = (previous or {}).get("eventId")
    if previous is None or presence is None or not previous_event or presence.get("eventId") != previous_event \
            or previous_event == event_id:
        why = ("first report of this node" if previous is None else
               "the same report delivered again" if previous_event and previous_event == event_id else
               "the node's per-user items were not brought up to its previous report")
        return UserSync(True, now, gone, tuple(now), total, len(now), f"{why}: all {len(now)} user(s) written")
    write = {user: mine for user, mine in now.items() if before.get(user) != mine}
    grew = tuple(user for user, mine in write.items() if user not in before or _grew(before[user], mine))
    return UserSync(False, write, gone, grew, total, len(now),
                    f"{len(write)} user(s) changed, {len(gone)} gone, {len(grew)} with a new session")


def _grew(before: UserOnNode, now: UserOnNode) -> bool:
    """Did the user open a session here? A busy node lists each user's newest and oldest first and
    counts the rest, so a session can move between the list and the count as other users come and go:
    a newly listed handle the unlisted count gave up, or a listed one that became counted, is no new
    session. One ended and another opened is (the count stays, but the new one may be over)."""
    appeared = len(now.handles() - before.handles())
    vanished = len(before.handles() - now.handles())
    return appeared > max(0, before.unlisted - now.unlisted) or now.unlisted - before.unlisted > vanished


def announced_users(sync: UserSync) -> list[str] | None:
    """The users the announcement names (whose sessions grew), or None: too many, read every node."""
    return list(sync.grew) if len(sync.grew) <= MAX_ANNOUNCED_USERS else None


def _conditional(sequence: int | None) -> dict:
    if sequence is None:
        return {}
    return {"ConditionExpression": "attribute_not_exists(#sequence) OR #sequence <= :sequence",
            "ExpressionAttributeNames": {"#sequence": "sequence"},
            "ExpressionAttributeValues": {":sequence": {"N": str(sequence)}}}


def _newer_kept(error: ClientError) -> bool:
    return error.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException"


def user_item(cluster: str, user: str, instance: str, mine: UserOnNode, received_at: str,
              sequence: int | None) -> dict:
    item = {"pk": {"S": user_sessions_partition(cluster, user)}, "sk": {"S": instance},
            "sessions": {"S": mine.entries}, "receivedAt": {"S": received_at}}
    if mine.unlisted:
        item["unlisted"] = {"N": str(mine.unlisted)}
    if sequence is not None:
        item["sequence"] = {"N": str(sequence)}
    return item


def presence_of(table: str, cluster: str, instance: str) -> dict | None:
    """The node's presence item as plain values (strongly consistent: it says what was written last), or None."""
    with transient_errors_named("dynamodb:GetItem"):
        item = client("dynamodb").get_item(
            TableName=table, Key={"pk": {"S": node_sessions_partition(cluster)}, "sk": {"S": instance}},
            ConsistentRead=True, ProjectionExpression="eventId").get("Item")
    return None if item is None else {"eventId": item.get("eventId", {}).get("S")}


def apply_user_sync(table: str, cluster: str, instance: str, sync: UserSync, received_at: str, now_epoch: int,
                    event_id: str | None, sequence: int | None) -> dict[str, int]:
    """Write and delete the per-user items, then the node's presence item (last: it vouches that the
    items now match this report). One conditional call per item; an item a newer report already
    wrote is left alone. Returns how many of each call were made."""
    ddb = client("dynamodb")
    done = {"put": 0, "delete": 0, "skipped": 0}
    for user, mine in sorted(sync.write.items()):
        try:
            with transient_errors_named("dynamodb:PutItem"):
                ddb.put_item(TableName=table, Item=user_item(cluster, user, instance, mine, received_at, sequence),
                             **_conditional(sequence))
            done["put"] += 1
        except ClientError as error:
            if not _newer_kept(error):
                raise
            done["skipped"] += 1
    for user in sync.delete:
        try:
            with transient_errors_named("dynamodb:DeleteItem"):
                ddb.delete_item(TableName=table, Key={"pk": {"S": user_sessions_partition(cluster, user)},
                                                      "sk": {"S": instance}}, **_conditional(sequence))
            done["delete"] += 1
        except ClientError as error:
            if not _newer_kept(error):
                raise
            done["skipped"] += 1
    presence = {"pk": {"S": node_sessions_partition(cluster)}, "sk": {"S": instance},
                "receivedAt": {"S": received_at}, "sessions": {"N": str(sync.sessions)},
                "users": {"N": str(sync.users)}, "ttl": {"N": str(now_epoch + REPORT_TTL_SECONDS)}}
    if event_id:
        presence["eventId"] = {"S": event_id}
    if sequence is not None:
        presence["sequence"] = {"N": str(sequence)}
    try:
        with transient_errors_named("dynamodb:PutItem"):
            ddb.put_item(TableName=table, Item=presence, **_conditional(sequence))
        done["put"] += 1
    except ClientError as error:
        if not _newer_kept(error):
            raise
        done["skipped"] += 1
    return done



def keep_user_sessions(table: str, cluster: str, report: Any, previous: Mapping[str, Any] | None, received_at: str,
                       now_epoch: int, event_id: str | None, sequence: int | None) -> UserSync:
    """RecordNodeReport's step after storing ``report`` (a NodeReport): bring its per-user items and
    presence up to it. Every report with sessions, a heartbeat too (the presence keeps the node's
    users counted), and before the announcement: a failure here is redelivered, and a redelivery
    writes every user again."""
    if report.sessions is None:
        return plan_user_sync(previous, None, None, event_id)
    presence = None if previous is None else presence_of(table, cluster, report.instanceId)
    sync = plan_user_sync(previous, presence, report.sessions, event_id)
    apply_user_sync(table, cluster, report.instanceId, sync, received_at, now_epoch, event_id, sequence)
    return sync


def forget_node(table: str, cluster: str, instance: str, dropped: Mapping[str, Any] | None) -> int:
    """A replaced key's node: its presence and the per-user items of the report that was dropped
    (report_store.forget_report's return), unconditionally, so neither what it claimed nor its
    sequence counts. The node's next report writes every user again. Returns the items deleted."""
    ddb = client("dynamodb")
    keys = [{"pk": {"S": user_sessions_partition(cluster, user)}, "sk": {"S": instance}}
            for user in users_on_node((dropped or {}).get("sessions"))]
    keys.append({"pk": {"S": node_sessions_partition(cluster)}, "sk": {"S": instance}})
    for key in keys:
        with transient_errors_named("dynamodb:DeleteItem"):
            ddb.delete_item(TableName=table, Key=key)
    return len(keys)


def remove_departed_nodes(table: str, cluster: str, listed: set[str],
                          reports: Callable[[], Mapping[str, Mapping[str, Any]]]) -> list[str]:
    """The sweep's cleanup: every node with a presence item that is not in ``listed`` (the login group's
    nodes in any status) loses its presence and its users' items (``reports``: read only when a node
    left, instance id -> stored report). Freshness already keeps such a node from counting; this keeps
    users' partitions from growing with every replaced node. Returns the instance ids removed."""
    with transient_errors_named("dynamodb:Query"):
        pages = client("dynamodb").get_paginator("query").paginate(
            TableName=table, KeyConditionExpression="pk = :pk", ConsistentRead=True, ProjectionExpression="sk",
            ExpressionAttributeValues={":pk": {"S": node_sessions_partition(cluster)}})
        present = [item["sk"]["S"] for page in pages for item in page.get("Items", [])]
    gone = sorted(instance for instance in present if instance not in listed)
    stored = reports() if gone else {}
    for instance in gone:
        forget_node(table, cluster, instance, stored.get(instance))
    return gone
