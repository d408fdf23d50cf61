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
    pk = "node-users#<cluster>"            sk = <instance id>#<page>   one attribute "u#<user>" per user
        who may hold an item on the node (value: the sequence that named them), USER_LIST_PAGES pages

Only the users whose entries or unlisted count changed since the node's previous report are written,
and users gone from the node get a tombstone (plan_user_sync, pure). The diff is trusted only when
the node's presence item names the previous report (its per-user items were fully written);
otherwise (a first report, a redelivery whose first attempt may have stopped half way, an earlier
failure, a previous report gone) every user of the report is written again, and every other user the
node's user list names gets a tombstone: that list, not a report, says whose items may exist.

Two reports of one node can be in flight at once (the older stored first, its function slower).
Every write is conditional on the report's sequence, so the older never overwrites the newer's
items; a user the newer removed keeps a tombstone (no sessions, the newer sequence, a TTL well past
any function's run), so the older's late write of that user fails its condition instead of bringing
the user back. The user list follows the same rule: a name is added before its item is written and
removed only after its tombstone, each conditional on the sequence, so the list always names every
user with an item. Readers ignore tombstones.

Safe by construction: an item left behind (a node that left, until the sweep) can only count a
session too many, which at most starts a SessionLimits execution that recounts from the whole
reports and ends nothing wrong; a node whose presence is stale or gone is not counted at all. A
missing item cannot happen without the report's redelivery rewriting it.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import ClientError

from hpops_core.common.clients import client, transient_errors_named
from hpops_core.common.state_table import node_sessions_partition, node_users_partition, user_sessions_partition
from hpops_core.node_channel.report_store import REPORT_TTL_SECONDS

# A change that grew more users than this is announced without names: the check then reads every
# node's report instead (fewer calls than this many Queries, and it happens only when a node first
# reports or a report is redelivered).
MAX_ANNOUNCED_USERS = 100
# A removed user's tombstone outlives any run of RecordNodeReport (its Timeout: 15 s) by far: an older
# report's write that arrives later fails against it. DynamoDB deletes it some time after.
TOMBSTONE_TTL_SECONDS = 3600
# The node's user list is split by a hash of the name, so adding or removing one user rewrites a page
# of 1/32 of the names (one write unit up to ~1,000 users on a node), never the whole list.
USER_LIST_PAGES = 32
LIST_ATTRIBUTE_PREFIX = "u#"
LIST_BATCH = 40  # names per UpdateItem: its expressions stay far within DynamoDB's 4 KB


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
    delete: tuple[str, ...] = ()  # users gone from the node: their items become tombstones
    grew: tuple[str, ...] = ()  # users with a session the previous report did not have: who can newly exceed
    sessions: int = 0  # the node's sessions (listed and not) and distinct users, for its presence item
    users: int = 0
    reason: str = ""
    listed: tuple[str, ...] = ()  # users the node's user list gains, before their items are written


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


def full_rewrite_reason(previous: Mapping[str, Any] | None, presence: Mapping[str, Any] | None,
                        event_id: str | None) -> str | None:
    """Pure: why this report must write every user again (no trusted previous state), or None."""
    previous_event = (previous or {}).get("eventId")
    if previous is None:
        return "first report of this node (or its previous report is gone)"
    if previous_event and previous_event == event_id:
        return "the same report delivered again"
    if presence is None or not previous_event or presence.get("eventId") != previous_event:
        return "the node's per-user items were not brought up to its previous report"
    return None


def plan_user_sync(previous: Mapping[str, Any] | None, presence: Mapping[str, Any] | None, sessions: Any,
                   event_id: str | None, listed: Iterable[str] | None = None) -> UserSync:
    """Pure: which per-user items this report writes and turns into tombstones, and whose sessions grew.

    ``previous``: the report it replaced (report_store.store_report's return, with its eventId);
    ``presence``: the node's presence item before this report (presence_of), or None;
    ``sessions``: the new report's sessions section (None: an agent that lists none, nothing kept);
    ``listed``: the users the node's user list names (listed_users), read for a full rewrite only."""
    section = _section(sessions)
    if section is None:
        return UserSync(False, reason="the agent lists no sessions")
    now = users_on_node(section)
    total = len(section.get("list") or ()) + int(section.get("omitted") or 0)
    before = users_on_node((previous or {}).get("sessions"))
    why = full_rewrite_reason(previous, presence, event_id)
    if why is not None:
        known = set(listed or ())
        gone = tuple(sorted((set(before) | known) - set(now)))
        # Every user named again with this sequence, not only the unknown: an older report's removal
        # still in flight (its name's sequence older) must not take a user off that this one writes.
        return UserSync(True, now, gone, tuple(now), total, len(now),
                        f"{why}: all {len(now)} user(s) written, {len(gone)} removed", tuple(now))
    gone = tuple(sorted(set(before) - set(now)))
    write = {user: mine for user, mine in now.items() if before.get(user) != mine}
    grew = tuple(user for user, mine in write.items() if user not in before or _grew(before[user], mine))
    return UserSync(False, write, gone, grew, total, len(now),
                    f"{len(write)} user(s) changed, {len(gone)} gone, {len(grew)} with a new session",
                    tuple(user for user in write if user not in before))


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


def tombstone_item(cluster: str, user: str, instance: str, received_at: str, sequence: int | None,
                   now_epoch: int) -> dict:
    """A removed user's item: no sessions (an older reader counts nothing either), the removing report's
    sequence (what an older report's late write must beat), and a TTL."""
    item = {"pk": {"S": user_sessions_partition(cluster, user)}, "sk": {"S": instance}, "sessions": {"S": "[]"},
            "gone": {"BOOL": True}, "receivedAt": {"S": received_at},
            "ttl": {"N": str(now_epoch + TOMBSTONE_TTL_SECONDS)}}
    if sequence is not None:
        item["sequence"] = {"N": str(sequence)}
    return item


def is_tombstone(item: Mapping[str, Any]) -> bool:
    return bool(item.get("gone", {}).get("BOOL"))


def user_list_page(user: str) -> int:
    return int(hashlib.sha256(user.encode()).hexdigest()[:8], 16) % USER_LIST_PAGES


def _list_key(cluster: str, instance: str, page: int) -> dict:
    return {"pk": {"S": node_users_partition(cluster)}, "sk": {"S": f"{instance}#{page:02d}"}}


def _list_pages(table: str, cluster: str, instance: str) -> dict[str, set[str]]:
    """The node's user-list pages (sk -> users), one strongly consistent paged Query."""
    with transient_errors_named("dynamodb:Query"):
        pages = client("dynamodb").get_paginator("query").paginate(
            TableName=table, KeyConditionExpression="pk = :pk AND begins_with(sk, :node)", ConsistentRead=True,
            ExpressionAttributeValues={":pk": {"S": node_users_partition(cluster)}, ":node": {"S": f"{instance}#"}})
        return {item["sk"]["S"]: {name[len(LIST_ATTRIBUTE_PREFIX):] for name in item
                                  if name.startswith(LIST_ATTRIBUTE_PREFIX)}
                for page in pages for item in page.get("Items", [])}


def listed_users(table: str, cluster: str, instance: str) -> set[str]:
    """Every user the node's user list names: a superset of the users with an item on the node."""
    return set().union(*_list_pages(table, cluster, instance).values())


def _update_list(ddb, table: str, key: dict, users: list[str], sequence: int | None, add: bool) -> None:
    """Name (or stop naming) ``users`` on one page, each only if the sequence that named them is not
    newer (a newer report's name stays). One call for the batch; when its condition fails, one per
    user, so the others still change."""
    names = {f"#u{n}": LIST_ATTRIBUTE_PREFIX + user for n, user in enumerate(users)}
    kwargs: dict[str, Any] = {"TableName": table, "Key": key, "ExpressionAttributeNames": names}
    if add:
        kwargs["UpdateExpression"] = "SET " + ", ".join(f"{n} = :sequence" for n in names)
        kwargs["ExpressionAttributeValues"] = {":sequence": {"N": str(sequence or 0)}}
        if sequence is not None:
            kwargs["ConditionExpression"] = " AND ".join(f"(attribute_not_exists({n}) OR {n} <= :sequence)"
                                                         for n in names)
    else:
        kwargs["UpdateExpression"] = "REMOVE " + ", ".join(names)
        if sequence is not None:
            kwargs["ConditionExpression"] = " AND ".join(f"{n} <= :sequence" for n in names)
            kwargs["ExpressionAttributeValues"] = {":sequence": {"N": str(sequence)}}
    try:
        with transient_errors_named("dynamodb:UpdateItem"):
            ddb.update_item(**kwargs)
    except ClientError as error:
        if not _newer_kept(error):
            raise
        if len(users) > 1:
            for user in users:
                _update_list(ddb, table, key, [user], sequence, add)


def _change_list(ddb, table: str, cluster: str, instance: str, users: Iterable[str], sequence: int | None,
                 add: bool) -> int:
    by_page: dict[int, list[str]] = defaultdict(list)
    for user in sorted(users):
        by_page[user_list_page(user)].append(user)
    calls = 0
    for page, names in sorted(by_page.items()):
        for start in range(0, len(names), LIST_BATCH):
            _update_list(ddb, table, _list_key(cluster, instance, page), names[start:start + LIST_BATCH], sequence, add)
            calls += 1
    return calls


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
    """Name the new users on the node's user list, write the per-user items and the removed users'
    tombstones, take the removed off the list, then write the node's presence item (last: it vouches
    that the items now match this report). One conditional call per item; an item a newer report
    already wrote is left alone. Returns how many of each call were made."""
    ddb = client("dynamodb")
    done = {"put": 0, "gone": 0, "skipped": 0, "list": 0}
    done["list"] += _change_list(ddb, table, cluster, instance, sync.listed, sequence, add=True)
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
    removed = []
    for user in sync.delete:
        try:
            with transient_errors_named("dynamodb:PutItem"):
                ddb.put_item(TableName=table, Item=tombstone_item(cluster, user, instance, received_at, sequence,
                                                                  now_epoch), **_conditional(sequence))
            done["gone"] += 1
            removed.append(user)
        except ClientError as error:  # a newer report wrote the user: their name stays
            if not _newer_kept(error):
                raise
            done["skipped"] += 1
    done["list"] += _change_list(ddb, table, cluster, instance, removed, sequence, add=False)
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
    listed = None
    if full_rewrite_reason(previous, presence, event_id) is not None:  # rare: a Query of the node's list
        listed = listed_users(table, cluster, report.instanceId)
    sync = plan_user_sync(previous, presence, report.sessions, event_id, listed)
    apply_user_sync(table, cluster, report.instanceId, sync, received_at, now_epoch, event_id, sequence)
    return sync


def forget_node(table: str, cluster: str, instance: str, dropped: Mapping[str, Any] | None) -> int:
    """A replaced key's node: its presence, the per-user items of every user its user list names or the
    report that was dropped (report_store.forget_report's return) holds, and the list itself,
    unconditionally, so neither what it claimed nor its sequence counts. The list goes after the
    items it names, so a call that stopped half way and runs again (the dropped report then gone)
    still finds them. The node's next report writes every user again. Returns the items deleted."""
    ddb = client("dynamodb")
    pages = _list_pages(table, cluster, instance)
    users = set(users_on_node((dropped or {}).get("sessions"))).union(*pages.values())
    keys = [{"pk": {"S": user_sessions_partition(cluster, user)}, "sk": {"S": instance}} for user in sorted(users)]
    keys += [{"pk": {"S": node_users_partition(cluster)}, "sk": {"S": sk}} for sk in sorted(pages)]
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
