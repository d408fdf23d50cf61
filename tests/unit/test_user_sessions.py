"""Each user's sessions kept per user and node (node_channel/user_sessions.py), so that a session change
reads only the users whose sessions grew (session_limits/node_sessions.read_users_state): what is
written per report, what the check reads, a node that leaves, a redelivered or reordered report, two
reports of one node in flight at once (tombstones), a full rewrite that finds users through the node's user list."""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime, timedelta, timezone

import boto3
import pytest
from moto import mock_aws

from hpops_core.common import clients
from hpops_core.node_channel import contract, report_store, user_sessions
from hpops_core.node_channel.reports import parse_report_event
from hpops_core.node_channel.session_changes import announcement, sessions_change
from hpops_core.session_limits import node_sessions, report_check
from hpops_core.session_limits.policy import LimitPolicy

CLUSTER = "ml-research"
NODES = ("i-0000000000000000a", "i-0000000000000000b", "i-0000000000000000c")
POLICY = LimitPolicy(default_max=2)
NOW = datetime(2026, 11, 23, 8, 1, tzinfo=timezone.utc)
RECEIVED = "2026-11-23T08:00:30.000Z"


def entry(pid: int, user: str) -> dict:
    return {"handle": f"5eed0b07:{pid + 1}:{pid * 10}", "user": user, "path": "ssh", "tty": True,
            "startedAt": f"2026-11-23T07:{pid % 60:02d}:00Z"}


def report(instance: str, entries: list[dict], unlisted: dict | None = None):
    sessions = {"list": entries} | ({"omitted": sum(unlisted.values()), "omittedByUser": unlisted} if unlisted else {})
    detail = {"format": contract.REPORT_FORMAT, "cluster": CLUSTER, "instanceId": instance, "ip": "10.1.0.5",
              "role": "login", "agentVersion": "0.1.0", "reportedAt": "2026-11-23T08:00:01Z", "trigger": "change",
              "sessions": sessions}
    return parse_report_event({"source": contract.REPORT_SOURCE, "detail-type": contract.REPORT_DETAIL_TYPE,
                               "detail": detail})


def stored(entries: list[dict], event_id: str, unlisted: dict | None = None) -> dict:
    return {"sessions": {"list": entries} | ({"omittedByUser": unlisted} if unlisted else {}), "eventId": event_id}


# ---------------------------------------------------------------- pure: what a report writes

def test_a_report_writes_only_the_users_whose_sessions_changed_and_deletes_the_gone():
    before = [entry(1, "alice"), entry(2, "bob"), entry(3, "carol")]
    after = [entry(1, "alice"), entry(4, "alice"), entry(3, "carol"), entry(5, "dave")]
    sync = user_sessions.plan_user_sync(stored(before, "e-1"), {"eventId": "e-1"}, report(NODES[0], after).sessions, "e-2")
    assert not sync.full and sorted(sync.write) == ["alice", "dave"] and sync.delete == ("bob",)
    assert sorted(sync.grew) == ["alice", "dave"] and (sync.sessions, sync.users) == (4, 3)
    assert json.loads(sync.write["alice"].entries) == [{k: v for k, v in e.items() if k != "user"}
                                                      for e in (entry(1, "alice"), entry(4, "alice"))]


def test_a_heartbeat_writes_no_user_and_a_logout_or_an_unlisted_count_down_grows_nobody():
    listed = [entry(1, "alice"), entry(2, "bob")]
    same = user_sessions.plan_user_sync(stored(listed, "e-1"), {"eventId": "e-1"}, report(NODES[0], listed[::-1]).sessions, "e-2")
    assert (same.write, same.delete, same.grew) == ({}, (), ())
    fewer = user_sessions.plan_user_sync(stored(listed, "e-1", {"carol": 3}), {"eventId": "e-1"},
                                         report(NODES[0], listed[:1], {"carol": 2}).sessions, "e-2")
    assert sorted(fewer.write) == ["carol"] and fewer.delete == ("bob",) and fewer.grew == ()
    more = user_sessions.plan_user_sync(stored(listed, "e-1", {"carol": 2}), {"eventId": "e-1"},
                                        report(NODES[0], listed, {"carol": 3}).sessions, "e-2")
    assert more.grew == ("carol",) and user_sessions.announced_users(more) == ["carol"]
    # Others came and went on a busy node: one of carol's sessions is listed now instead of counted.
    moved = user_sessions.plan_user_sync(stored(listed, "e-1", {"carol": 2}), {"eventId": "e-1"},
                                         report(NODES[0], listed + [entry(7, "carol")], {"carol": 1}).sessions, "e-2")
    assert sorted(moved.write) == ["carol"] and moved.grew == ()
    # One session ended and another opened: the count stays, but the new one may be over the limit.
    replaced = user_sessions.plan_user_sync(stored(listed, "e-1"), {"eventId": "e-1"},
                                            report(NODES[0], [entry(1, "alice"), entry(8, "bob")]).sessions, "e-2")
    assert replaced.grew == ("bob",)


@pytest.mark.parametrize("previous,presence,event_id,why", [
    (None, None, "e-1", "first report"),
    (stored([entry(1, "alice")], "e-1"), {"eventId": "e-1"}, "e-1", "the same report delivered again"),
    (stored([entry(1, "alice")], "e-1"), None, "e-2", "not brought up"),  # stored before per-user items existed
    (stored([entry(1, "alice")], "e-1"), {"eventId": "e-0"}, "e-2", "not brought up"),  # stopped half way
])
def test_without_a_trusted_previous_state_every_user_is_written_again(previous, presence, event_id, why):
    sync = user_sessions.plan_user_sync(previous, presence, report(NODES[0], [entry(1, "alice"), entry(2, "bob")]).sessions,
                                        event_id)
    assert sync.full and sorted(sync.write) == ["alice", "bob"] and why in sync.reason


def test_more_grown_users_than_an_announcement_names_are_announced_as_unknown():
    many = [entry(n, f"user{n:03d}") for n in range(1, user_sessions.MAX_ANNOUNCED_USERS + 2)]
    sync = user_sessions.plan_user_sync(None, None, report(NODES[0], many).sessions, "e-1")
    assert user_sessions.announced_users(sync) is None
    detail = json.loads(announcement(CLUSTER, report(NODES[0], many), RECEIVED, None)["Detail"])
    assert "users" not in detail and "handle" not in json.dumps(detail)


def test_an_announcements_users_are_checked_by_name():
    event = {"source": contract.SESSIONS_CHANGED_SOURCE, "detail-type": contract.SESSIONS_CHANGED_DETAIL_TYPE,
             "detail": {"cluster": CLUSTER, "instanceId": NODES[0], "users": ["alice"]}}
    assert report_check.announced_users(event) == ("alice",)
    for bad in (["root"], ["al ice"], "alice", ["u"] * (user_sessions.MAX_ANNOUNCED_USERS + 1)):
        with pytest.raises(report_check.MalformedEventError):
            report_check.announced_users({"detail": {"users": bad}})
    assert report_check.announced_users({"detail": {}}) is None


# ---------------------------------------------------------------- moto: what is written and read

class _Calls:
    """DynamoDB calls (operation, partition key) and the items each returned, through botocore's hooks."""

    def __init__(self, ddb) -> None:
        self.calls: list[tuple[str, str]] = []
        self.items_read: Counter[str] = Counter()
        ddb.meta.events.register("provide-client-params.dynamodb.*", self.before)
        ddb.meta.events.register("after-call.dynamodb.*", self.after)

    def before(self, params, model, **_) -> None:
        key = params.get("Key") or params.get("Item") or {}
        pk = key.get("pk", {}).get("S") or params.get("ExpressionAttributeValues", {}).get(":pk", {}).get("S")
        self.calls.append((model.name, pk))

    def after(self, parsed, model, **_) -> None:
        pk = self.calls[-1][1]
        self.items_read[pk] += len(parsed.get("Items", [])) + int("Item" in parsed)


@pytest.fixture
def table(monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with mock_aws():
        clients.reset_clients()
        boto3.client("dynamodb", region_name="us-east-1").create_table(
            TableName="t", BillingMode="PAY_PER_REQUEST",
            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
            AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}, {"AttributeName": "sk", "AttributeType": "S"}])
        yield _Calls(clients.client("dynamodb"))
        clients.reset_clients()


class _Node:
    """A login node's reports as RecordNodeReport keeps them: the report stored, then its users (sequence rising)."""

    def __init__(self, instance: str) -> None:
        self.instance, self.sequence = instance, 1_000

    def reports(self, entries: list[dict], unlisted: dict | None = None, event_id: str | None = None,
                received: str = RECEIVED, sequence: int | None = None, sync: bool = True) -> user_sessions.UserSync | None:
        self.sequence = sequence if sequence is not None else self.sequence + 1
        sent = report(self.instance, entries, unlisted)
        event_id = event_id or f"e-{self.instance}-{self.sequence}"
        previous = report_store.store_report("t", CLUSTER, sent, received, 1_764_000_000, event_id, self.sequence)
        if not sync:  # the function stopped after storing the report (EventBridge will redeliver)
            return None
        return user_sessions.keep_user_sessions("t", CLUSTER, sent, previous, received, 1_764_000_000, event_id,
                                                self.sequence)


def check(users, now: datetime = NOW):
    presence = node_sessions.read_node_presence("t", CLUSTER, now)
    state = node_sessions.read_users_state("t", CLUSTER, users, now, presence)
    return report_check.decide_report_check(CLUSTER, state, POLICY), state, presence


OTHERS = 12


def others(index: int) -> list[dict]:
    """OTHERS other users on node ``index``, one session each."""
    return [entry(100 * (index + 1) + k, f"user{index}x{k:02d}") for k in range(OTHERS)]


def busy_tier() -> tuple[_Node, ...]:
    """Three nodes, OTHERS other users on each, alice at her limit (one session on each of two nodes)."""
    nodes = tuple(_Node(n) for n in NODES)
    for index, node in enumerate(nodes):
        node.reports(others(index) + ([entry(90 + index, "alice")] if index < 2 else []))
    return nodes


def test_one_users_new_login_reads_that_users_items_alone_and_starts_a_check_naming_her(table):
    nodes = busy_tier()
    table.calls.clear()
    entries = others(0) + [entry(90, "alice"), entry(95, "alice")]
    sync = nodes[0].reports(entries)
    # Written: alice's item on that node and the node's presence, nothing for the others.
    assert [c for c in table.calls if c[0] in ("PutItem", "DeleteItem") and not c[1].startswith("node-report#")] == [
        ("PutItem", f"user-sessions#{CLUSTER}#alice"), ("PutItem", f"node-sessions#{CLUSTER}")]
    assert user_sessions.announced_users(sync) == ["alice"]
    table.calls.clear()
    table.items_read.clear()

    decided, state, presence = check(user_sessions.announced_users(sync))

    assert decided.start and decided.users == ("alice",) and "alice: 3 session(s), limit 2" in decided.reason
    assert sorted(table.calls) == sorted([("Query", f"session#{CLUSTER}"), ("Query", f"node-sessions#{CLUSTER}"),
                                          ("Query", f"user-sessions#{CLUSTER}#alice")])
    assert +table.items_read == {f"node-sessions#{CLUSTER}": 3, f"user-sessions#{CLUSTER}#alice": 2}  # ledger empty
    assert sorted(presence.fresh.items()) == [(NODES[0], OTHERS + 2), (NODES[1], OTHERS + 1), (NODES[2], OTHERS)]
    # The same name as the whole reports give: one execution per situation, whichever path decided it.
    whole = node_sessions.read_cluster_state("t", CLUSTER, NOW, fresh_node=NODES[0])
    assert report_check.decide_report_check(CLUSTER, whole, POLICY).name == decided.name


def test_unlisted_sessions_of_a_busy_node_count_per_user(table):
    nodes = busy_tier()
    nodes[2].reports(others(2), {"alice": 1})
    decided, state, _ = check(["alice"])
    assert decided.start and decided.users == ("alice",)
    assert state.nodes.unlisted == {NODES[2]: {"alice": 1}}


def test_a_node_that_left_or_fell_silent_holds_nobody(table):
    nodes = busy_tier()
    # The node holding alice's second session stops reporting: past two heartbeats and a poll, it is stale.
    late = NOW + timedelta(seconds=node_sessions.DEFAULT_REPORT_MAX_AGE_SECONDS + 1)
    for node in (nodes[0], nodes[2]):
        node.reports(others(NODES.index(node.instance))
                     + ([entry(90, "alice"), entry(95, "alice")] if node is nodes[0] else []),
                     received=late.strftime("%Y-%m-%dT%H:%M:%S.000Z"))
    decided, state, presence = check(["alice"], late)
    assert presence.stale == (NODES[1],) and NODES[1] not in state.nodes.nodes
    assert not decided.start and sorted(s.handle for s in state.nodes.ssh) == [entry(90, "alice")["handle"],
                                                                               entry(95, "alice")["handle"]]


def test_a_report_redelivered_after_the_function_stopped_half_way_counts_every_new_session(table):
    nodes = busy_tier()
    entries = others(0) + [entry(90, "alice"), entry(95, "alice")]
    nodes[0].reports(entries, event_id="e-again", sync=False)  # stored, users not written, nothing announced
    assert not check(["alice"])[0].start, "alice's item still holds one session on the node"

    sync = nodes[0].reports(entries, event_id="e-again", sequence=nodes[0].sequence)  # EventBridge's redelivery

    assert sync.full and "alice" in sync.grew
    decided, state, _ = check(["alice"])
    assert decided.start and decided.users == ("alice",)
    # The next report is a diff again: the presence now vouches for the redelivered one.
    assert not nodes[0].reports(entries + [entry(96, "user0x01")]).full


def test_an_older_report_processed_late_never_overwrites_a_newer_ones_items(table):
    nodes = busy_tier()
    newer = others(0) + [entry(90, "alice"), entry(95, "alice")]
    nodes[0].reports(newer)
    newest_sequence = nodes[0].sequence
    older = user_sessions.plan_user_sync(None, None, report(NODES[0], [entry(90, "alice")]).sessions, "e-old")
    done = user_sessions.apply_user_sync("t", CLUSTER, NODES[0], older, RECEIVED, 1_764_000_000, "e-old",
                                         newest_sequence - 1)
    assert done["put"] == 0 and done["skipped"] == 2  # alice's item and the presence: both newer already
    assert check(["alice"])[0].start


def test_a_per_user_item_holds_one_users_sessions_on_one_node(table):
    nodes = busy_tier()
    many = [entry(k, "alice") for k in range(1, 201)]
    nodes[0].reports(many)
    item = clients.client("dynamodb").get_item(TableName="t", Key={"pk": {"S": f"user-sessions#{CLUSTER}#alice"},
                                                                   "sk": {"S": NODES[0]}})["Item"]
    assert len(json.loads(item["sessions"]["S"])) == 200 and len(item["sessions"]["S"]) < 400 * 1024 // 10


def test_a_replaced_agent_key_leaves_no_session_of_the_node_counted_and_the_next_report_writes_all(table):
    nodes = busy_tier()
    dropped = report_store.forget_report("t", CLUSTER, NODES[1])  # NodeChannel, the node's key displaced
    listed = user_sessions.listed_users("t", CLUSTER, NODES[1])
    assert listed == {f"user1x{k:02d}" for k in range(OTHERS)} | {"alice"}
    pages = len({user_sessions.user_list_page(user) for user in listed})
    # Its users' items, its user list's pages and the presence.
    assert user_sessions.forget_node("t", CLUSTER, NODES[1], dropped) == OTHERS + 1 + pages + 1
    assert user_sessions.listed_users("t", CLUSTER, NODES[1]) == set()
    decided, state, presence = check(["alice"])
    assert NODES[1] not in presence.fresh and [s.instance_id for s in state.nodes.ssh] == [NODES[0]]
    # The new key's first report (a lower sequence than the old key's, even) is written in full.
    sync = nodes[1].reports(others(1) + [entry(91, "alice")], sequence=5)
    assert sync.full and check(["alice"])[2].fresh[NODES[1]] == OTHERS + 1


def test_the_sweep_removes_the_items_of_a_node_that_left_the_login_group(table):
    busy_tier()
    reads = []

    def reports():
        reads.append(1)
        return report_store.cluster_reports("t", CLUSTER)
    assert user_sessions.remove_departed_nodes("t", CLUSTER, set(NODES), reports) == [] and reads == []
    assert user_sessions.remove_departed_nodes("t", CLUSTER, {NODES[0], NODES[2]}, reports) == [NODES[1]]
    left = clients.client("dynamodb").query(TableName="t", KeyConditionExpression="pk = :pk",
                                            ExpressionAttributeValues={":pk": {"S": f"user-sessions#{CLUSTER}#alice"}})
    assert [i["sk"]["S"] for i in left["Items"]] == [NODES[0]]
    assert sorted(check(["alice"])[2].fresh) == [NODES[0], NODES[2]]


def test_a_change_that_grew_nobody_reads_the_presence_alone(table):
    nodes = busy_tier()
    sync = nodes[0].reports(others(0))  # alice logged out of this node
    assert user_sessions.announced_users(sync) == []
    table.calls.clear()
    decided, state, presence = check([])
    assert not decided.start and table.calls == [("Query", f"node-sessions#{CLUSTER}")]


def test_a_session_a_busy_node_only_counts_is_announced_and_checked(table):
    """Past the listing limit a node lists carol's newest and oldest sessions and counts the rest: her
    third session shows only in that count, and still reaches the check by name."""
    nodes = busy_tier()
    listed = others(2) + [entry(70, "carol")]
    nodes[2].reports(listed, {"carol": 1})
    previous = report_store.latest_report("t", CLUSTER, NODES[2]) | {"eventId": f"e-{NODES[2]}-{nodes[2].sequence}"}
    sent = report(NODES[2], listed, {"carol": 2})
    sync = nodes[2].reports(listed, {"carol": 2})
    change = sessions_change(previous, sent, f"e-{NODES[2]}-{nodes[2].sequence}", sync.grew)
    assert change.changed and "new unlisted session" in change.reason
    assert user_sessions.announced_users(sync) == ["carol"]
    decided, _, _ = check(user_sessions.announced_users(sync))
    assert decided.start and decided.users == ("carol",) and "carol: 3 session(s), limit 2" in decided.reason
    # The same count again (a heartbeat) is no change.
    assert not sessions_change(report_store.latest_report("t", CLUSTER, NODES[2]) | {"eventId": "e-x"}, sent, "e-y",
                               nodes[2].reports(listed, {"carol": 2}).grew).changed


def _slow_report(node: _Node, entries: list[dict]) -> tuple[user_sessions.UserSync, int, str]:
    """A report stored and planned whose function then stalls before writing (apply_user_sync later)."""
    node.sequence += 1
    event_id = f"e-{node.instance}-{node.sequence}"
    sent = report(node.instance, entries)
    previous = report_store.store_report("t", CLUSTER, sent, RECEIVED, 1_764_000_000, event_id, node.sequence)
    plan = user_sessions.plan_user_sync(previous, user_sessions.presence_of("t", CLUSTER, node.instance),
                                        sent.sessions, event_id)
    return plan, node.sequence, event_id


def _user_items(user: str) -> dict[str, dict]:
    items = clients.client("dynamodb").query(
        TableName="t", KeyConditionExpression="pk = :pk", ConsistentRead=True,
        ExpressionAttributeValues={":pk": {"S": f"user-sessions#{CLUSTER}#{user}"}})["Items"]
    return {i["sk"]["S"]: i for i in items}


def _counted(user: str) -> dict[str, int]:
    """node -> the sessions the check would count for ``user`` there."""
    presence = node_sessions.read_node_presence("t", CLUSTER, NOW)
    state = node_sessions.read_users_state("t", CLUSTER, [user], NOW, presence)
    counts = Counter(s.instance_id for s in state.nodes.ssh if s.user == user)
    for node, unlisted in state.nodes.unlisted.items():
        counts[node] += unlisted.get(user, 0)
    return dict(counts)


def test_a_slower_older_report_never_brings_back_a_user_a_newer_one_removed(table):
    """Report 1002 (alice opens a second session) is stored and planned, then its function stalls; 1003
    (alice gone) completes; 1002's writes land last. Nothing of alice's may stay on the node."""
    node, other = _Node(NODES[0]), _Node(NODES[1])
    node.reports([entry(1, "alice"), entry(3, "carol")])
    slow, slow_sequence, slow_event = _slow_report(node, [entry(1, "alice"), entry(2, "alice"), entry(3, "carol")])
    node.reports([entry(3, "carol")])
    done = user_sessions.apply_user_sync("t", CLUSTER, NODES[0], slow, RECEIVED, 1_764_000_000, slow_event,
                                         slow_sequence)
    assert done["put"] == 0, "every write of the slower report is older than what the node now says"
    node.reports([entry(3, "carol")])
    node.reports([entry(3, "carol"), entry(4, "carol")])
    other.sequence = 2_000
    other.reports([entry(50, "alice")])

    assert _counted("alice") == {NODES[1]: 1}
    decided, _, _ = check(["alice"])
    assert not decided.start, decided.reason


def test_a_slower_older_report_never_brings_back_a_user_a_newer_full_rewrite_removed(table):
    node = _Node(NODES[0])
    node.reports([entry(1, "alice"), entry(3, "carol")])
    slow, slow_sequence, slow_event = _slow_report(node, [entry(1, "alice"), entry(2, "alice"), entry(3, "carol")])
    # The newer report finds the node's items not brought up to its previous report (the slow one): full.
    assert node.reports([entry(3, "carol")]).full
    user_sessions.apply_user_sync("t", CLUSTER, NODES[0], slow, RECEIVED, 1_764_000_000, slow_event, slow_sequence)
    node.reports([entry(3, "carol"), entry(4, "carol")])
    assert _counted("alice") == {} and _counted("carol") == {NODES[0]: 2}


def test_a_full_rewrite_removes_users_its_previous_report_no_longer_names(table):
    """The node's previous report is gone (its TTL, or a forget that stopped half way): the full rewrite
    still finds alice's item through the node's user list."""
    node = _Node(NODES[0])
    node.reports([entry(1, "alice"), entry(3, "carol")])
    report_store.forget_report("t", CLUSTER, NODES[0])
    sync = node.reports([entry(3, "carol")])
    assert sync.full and sync.delete == ("alice",)
    assert _counted("alice") == {} and user_sessions.listed_users("t", CLUSTER, NODES[0]) == {"carol"}
    assert user_sessions.is_tombstone(_user_items("alice")[NODES[0]])


def test_a_redelivery_after_a_removal_that_never_ran_removes_the_user(table):
    node = _Node(NODES[0])
    node.reports([entry(1, "alice"), entry(3, "carol")])
    node.reports([entry(3, "carol")], event_id="e-again", sync=False)  # stored, then the function stopped
    sync = node.reports([entry(3, "carol")], event_id="e-again", sequence=node.sequence)  # EventBridge's redelivery
    assert sync.full and sync.delete == ("alice",) and _counted("alice") == {}


def test_a_forget_that_stopped_half_way_is_finished_by_running_it_again(table, monkeypatch):
    nodes = busy_tier()
    dropped = report_store.forget_report("t", CLUSTER, NODES[0])
    real = clients.client("dynamodb").delete_item
    calls = []

    def failing(**kwargs):
        calls.append(kwargs)
        if len(calls) == 3:
            raise RuntimeError("the function timed out")
        return real(**kwargs)
    monkeypatch.setattr(clients.client("dynamodb"), "delete_item", failing)
    with pytest.raises(RuntimeError):
        user_sessions.forget_node("t", CLUSTER, NODES[0], dropped)
    monkeypatch.setattr(clients.client("dynamodb"), "delete_item", real)
    # Run again (the agent's next enroll call), the dropped report already gone.
    user_sessions.forget_node("t", CLUSTER, NODES[0], None)
    assert user_sessions.listed_users("t", CLUSTER, NODES[0]) == set()
    assert _counted("alice") == {NODES[1]: 1} and NODES[0] not in _user_items("user0x05")
    # The new key's first report (a lower sequence) writes its users: nothing of the old key's blocks it.
    nodes[0].reports([entry(90, "alice"), entry(95, "alice")], sequence=3)
    assert _counted("alice") == {NODES[0]: 2, NODES[1]: 1}


def test_a_users_first_login_on_a_node_names_them_on_one_page_of_its_list(table):
    nodes = busy_tier()
    table.calls.clear()
    nodes[2].reports(others(2) + [entry(90, "alice")])
    assert [c for c in table.calls if c[0] in ("PutItem", "UpdateItem", "DeleteItem")
            and not c[1].startswith("node-report#")] == [
        ("UpdateItem", f"node-users#{CLUSTER}"), ("PutItem", f"user-sessions#{CLUSTER}#alice"),
        ("PutItem", f"node-sessions#{CLUSTER}")]
    table.calls.clear()
    nodes[2].reports(others(2))  # and her last logout: a tombstone, then off the list
    assert [c for c in table.calls if c[0] in ("PutItem", "UpdateItem", "DeleteItem")
            and not c[1].startswith("node-report#")] == [
        ("PutItem", f"user-sessions#{CLUSTER}#alice"), ("UpdateItem", f"node-users#{CLUSTER}"),
        ("PutItem", f"node-sessions#{CLUSTER}")]
    assert "alice" not in user_sessions.listed_users("t", CLUSTER, NODES[2])


def test_a_nodes_user_list_page_stays_small_with_every_user_on_one_node(table):
    """2,000 users of 32-character names on one node (more than a report of 200 KB can name: about 880
    listed): each page of the list, and so each write that adds or removes a name, stays small."""
    users = [f"{n:04d}" + "u" * 28 for n in range(2_000)]
    sync = user_sessions.plan_user_sync(None, None, {"list": [], "omittedByUser": {u: 1 for u in users}}, "e-1")
    done = user_sessions.apply_user_sync("t", CLUSTER, NODES[0], sync, RECEIVED, 1_764_000_000, "e-1", 1_001)
    assert done["list"] <= user_sessions.USER_LIST_PAGES * 3  # a first report names everyone in batches
    pages = clients.client("dynamodb").query(
        TableName="t", KeyConditionExpression="pk = :pk",
        ExpressionAttributeValues={":pk": {"S": f"node-users#{CLUSTER}"}})["Items"]
    sizes = [sum(len(name) + len(value["N"]) for name, value in page.items() if name.startswith("u#")) for page in pages]
    assert len(pages) == user_sessions.USER_LIST_PAGES and sum(len(p) - 2 for p in pages) == 2_000
    assert max(sizes) < 4 * 1024, sizes  # a few write units a change, far from DynamoDB's 400 KB item
    print(f"2,000 users of 32 characters: largest page {max(sizes)} bytes, mean {sum(sizes) // len(sizes)}")


def test_on_a_node_past_the_listing_limit_a_user_the_report_only_counts_is_announced_by_name(table):
    """The agent's own listing (hpops_node_agent.ssh_sessions.reported_sessions) on a node with more
    users than a report lists: zoe, last by name, has no session listed there at all, so her second
    login there changes nothing but her count; with her listed session on another node she is over,
    and that login is still announced, naming her, and starts a check."""
    from hpops_node_agent.ssh_sessions import NodeSession, reported_sessions

    base = 1_764_000_000.0
    crowd = [NodeSession(f"5eed0b07:{10_000 + n}:{n}", f"u{n:04d}", "ssh", True, base + n) for n in range(1_100)]
    zoe = [NodeSession(f"5eed0b07:{90_000 + k}:{k}", "zoe", "ssh", True, base - 600 + k) for k in range(2)]
    node = _Node(NODES[0])
    _Node(NODES[1]).reports([entry(5, "zoe")])

    def send(sessions):
        section = reported_sessions(sorted(sessions, key=lambda s: (s.started_at, s.handle)))
        assert not [e for e in section["list"] if e["user"] == "zoe"], "zoe's sessions are counted, not listed"
        event_id = f"e-{node.sequence + 1}"
        previous = report_store.latest_report("t", CLUSTER, NODES[0])
        if previous is not None:
            previous["eventId"] = f"e-{node.sequence}"
        sync = node.reports(section["list"], section["omittedByUser"], event_id=event_id)
        return section, sync, sessions_change(previous, report(NODES[0], section["list"], section["omittedByUser"]),
                                              event_id, sync.grew)

    _, _, first = send(crowd + zoe[:1])
    assert first.changed and not check(["zoe"])[0].start
    after, sync, change = send(crowd + zoe)

    assert after["omittedByUser"]["zoe"] == 2 and change.changed, change.reason
    assert user_sessions.announced_users(sync) == ["zoe"]
    decided, _, _ = check(["zoe"])
    assert decided.start and decided.users == ("zoe",) and "zoe: 3 session(s), limit 2" in decided.reason


def test_an_older_removal_landing_after_a_newer_full_rewrite_leaves_the_user_listed_and_counted(table):
    node = _Node(NODES[0])
    node.reports([entry(1, "alice"), entry(3, "carol")])
    slow, slow_sequence, slow_event = _slow_report(node, [entry(3, "carol")])  # alice logged out, then back
    assert node.reports([entry(1, "alice"), entry(3, "carol")]).full
    done = user_sessions.apply_user_sync("t", CLUSTER, NODES[0], slow, RECEIVED, 1_764_000_000, slow_event,
                                         slow_sequence)
    assert done["gone"] == 0 and _counted("alice") == {NODES[0]: 1}
    assert user_sessions.listed_users("t", CLUSTER, NODES[0]) == {"alice", "carol"}
    # So a later full rewrite that no longer has the previous report still finds her when she leaves.
    report_store.forget_report("t", CLUSTER, NODES[0])
    assert node.reports([entry(3, "carol")]).delete == ("alice",) and _counted("alice") == {}
