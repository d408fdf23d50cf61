"""A login node's report starts a session-limit check: when its session list changed (node_channel),
and whether someone is now over, under which execution name (session_limits). Pure: no AWS."""

from __future__ import annotations

import re
from datetime import datetime, timezone

import pytest
from botocore.exceptions import ClientError

from hpops_core.common import clients
from hpops_core.common.errors import MalformedEventError, UnknownClusterError
from hpops_core.node_channel import contract
from hpops_core.node_channel.reports import parse_report_event
from hpops_core.node_channel.session_changes import announcement, sessions_change
from hpops_core.session_limits import ledger, report_check
from hpops_core.session_limits.cluster_sessions import ssh_sessions_of_report
from hpops_core.session_limits.node_sessions import ClusterState, ReportedSessions
from hpops_core.session_limits.policy import ActiveSession, LimitPolicy

NODE_A, NODE_B = "i-0123456789abcdef0", "i-0fedcba9876543210"
CLUSTER = "ml-research"
POLICY = LimitPolicy(default_max=2)
STEP_FUNCTIONS_NAME = re.compile(r"\A[A-Za-z0-9_-]{1,80}\Z")


def entry(pid: int, user: str = "alice") -> dict:
    return {"handle": f"5eed0b07:{pid}:{pid * 10}", "user": user, "path": "ssh", "tty": True,
            "startedAt": f"2026-11-23T08:{pid % 60:02d}:00Z"}


def report(entries: list[dict], instance: str = NODE_A):
    detail = {"format": contract.REPORT_FORMAT, "cluster": CLUSTER, "instanceId": instance, "ip": "10.1.0.5",
              "role": "login", "agentVersion": "0.1.0", "reportedAt": "2026-11-23T08:00:01Z", "trigger": "change",
              "sessions": {"list": entries}}
    return parse_report_event({"source": contract.REPORT_SOURCE, "detail-type": contract.REPORT_DETAIL_TYPE,
                               "detail": detail})


def stored(entries: list[dict], event_id: str = "e-1") -> dict:
    return {"sessions": {"list": entries}, "eventId": event_id}


# ---------------------------------------------------------------- node_channel: did the list change?

def test_a_heartbeat_with_the_same_sessions_announces_nothing():
    change = sessions_change(stored([entry(1), entry(2)]), report([entry(2), entry(1)]), "e-2")
    assert not change.changed and "same sessions" in change.reason


def test_a_new_or_gone_session_is_a_change():
    assert sessions_change(stored([entry(1)]), report([entry(1), entry(2)]), "e-2").reason == "1 session(s) new, 0 gone"
    assert sessions_change(stored([entry(1), entry(2)]), report([entry(1)]), "e-2").changed


def test_a_redelivery_of_the_stored_report_is_announced_again():
    # Its first announcement may be what failed (PutEvents), so EventBridge redelivered the report.
    assert sessions_change(stored([entry(1)], "e-1"), report([entry(1)]), "e-1").changed


def test_a_first_report_is_a_change_only_when_it_lists_sessions():
    assert sessions_change(None, report([entry(1)]), "e-1").changed
    assert not sessions_change(None, report([]), "e-1").changed


def test_the_announcement_carries_no_sessions():
    entry_ = announcement(CLUSTER, report([entry(1, "alice")]), "2026-11-23T08:00:02Z")
    assert (entry_["Source"], entry_["DetailType"]) == (contract.SESSIONS_CHANGED_SOURCE, contract.SESSIONS_CHANGED_DETAIL_TYPE)
    assert "alice" not in entry_["Detail"] and "EventBusName" not in entry_  # the default bus


# ---------------------------------------------------------------- session_limits: who is over, which name

def state(nodes: dict[str, list[dict]], shells: tuple[ActiveSession, ...] = (), recorded: dict | None = None) -> ClusterState:
    ssh = tuple(s for node, entries in nodes.items() for s in ssh_sessions_of_report(node, entries))
    reported = ReportedSessions(ssh, len(shells), tuple(sorted(nodes)), (), 0, {}, shells)
    return ClusterState(reported, recorded or {}, None)


def test_nobody_over_starts_nothing():
    check = report_check.decide_report_check(CLUSTER, state({NODE_A: [entry(1)], NODE_B: [entry(2)]}), POLICY)
    assert not check.start and check.name is None and "nobody over" in check.reason


def test_ssh_on_two_nodes_and_a_shell_the_nodes_list_count_together():
    shell = ActiveSession("alice-0a1b2c3d4e5f6a7b8", "", NODE_B, datetime(2026, 11, 23, 8, 30, tzinfo=timezone.utc), "alice")
    check = report_check.decide_report_check(
        CLUSTER, state({NODE_A: [entry(1), entry(3, "bob")], NODE_B: [entry(2)]}, (shell,)), POLICY)
    assert check.start and check.users == ("alice",)
    assert check.reason == "alice: 3 session(s), limit 2"
    assert check.input == {"cluster": CLUSTER, "mode": "nodes", "users": ["alice"]}
    assert STEP_FUNCTIONS_NAME.match(check.name) and check.name.startswith("nodes-ml-research-")


def test_the_same_over_limit_sessions_give_the_same_name_and_a_new_login_a_new_one():
    over = {NODE_A: [entry(1), entry(3)], NODE_B: [entry(2)]}
    same = report_check.decide_report_check(CLUSTER, state(over), POLICY)
    # bob's sessions, or the order nodes list them in, do not change alice's situation
    reordered = {NODE_B: [entry(2), entry(9, "bob")], NODE_A: [entry(3), entry(1)]}
    assert report_check.decide_report_check(CLUSTER, state(reordered), POLICY).name == same.name
    more = {NODE_A: [entry(1), entry(3), entry(4)], NODE_B: [entry(2)]}
    assert report_check.decide_report_check(CLUSTER, state(more), POLICY).name != same.name


def test_sessions_already_ended_are_not_counted_again():
    over = {NODE_A: [entry(1), entry(3)], NODE_B: [entry(2)]}
    ended = {f"ssh/{NODE_A}/{entry(3)['handle']}": ledger.ENDED}
    assert not report_check.decide_report_check(CLUSTER, state(over, recorded=ended), POLICY).start
    dry_run = {f"ssh/{NODE_A}/{entry(3)['handle']}": ledger.DRY_RUN_REPORTED}  # still open: still over
    assert report_check.decide_report_check(CLUSTER, state(over, recorded=dry_run), POLICY).start


def test_exempt_users_and_overrides_are_the_runs_own():
    over = {NODE_A: [entry(1), entry(3)], NODE_B: [entry(2)]}
    assert not report_check.decide_report_check(CLUSTER, state(over), LimitPolicy(2, exempt_users=frozenset({"alice"}))).start
    assert not report_check.decide_report_check(CLUSTER, state(over), LimitPolicy(2, overrides={"alice": 3})).start


@pytest.mark.parametrize("cluster", ["a", "c" * 63])
def test_the_name_keeps_step_functions_rules_for_any_cluster_name(cluster):
    name = report_check.execution_name(cluster, {"alice": ["ssh/i-0123456789abcdef0/5eed0b07:1:10"]})
    assert STEP_FUNCTIONS_NAME.match(name) and len(name) <= 80


def test_many_users_over_are_named_up_to_ten():
    nodes = {NODE_A: [entry(n * 10 + k, f"user{n:02d}") for n in range(12) for k in (1, 2, 3)]}
    check = report_check.decide_report_check(CLUSTER, state(nodes), POLICY)
    assert check.start and len(check.users) == 10 and check.users[0] == "user00"


@pytest.mark.parametrize("event,error", [
    ({"source": "hpops.node", "detail-type": contract.SESSIONS_CHANGED_DETAIL_TYPE,
      "detail": {"cluster": CLUSTER, "instanceId": NODE_A}}, MalformedEventError),
    ({"source": contract.SESSIONS_CHANGED_SOURCE, "detail-type": contract.SESSIONS_CHANGED_DETAIL_TYPE,
      "detail": {"cluster": CLUSTER, "instanceId": "i-1; reboot"}}, MalformedEventError),
    ({"source": contract.SESSIONS_CHANGED_SOURCE, "detail-type": contract.SESSIONS_CHANGED_DETAIL_TYPE,
      "detail": {"cluster": "other", "instanceId": NODE_A}}, UnknownClusterError),
    ([], MalformedEventError),
])
def test_anything_but_this_clusters_announcement_is_refused_by_name(event, error):
    with pytest.raises(error):
        report_check.announced_node(event, CLUSTER)


class _StepFunctions:
    def __init__(self, code: str | None):
        self.code, self.started = code, []

    def start_execution(self, **kwargs):
        if self.code:
            raise ClientError({"Error": {"Code": self.code, "Message": "x"}}, "StartExecution")
        self.started.append(kwargs)
        return {"executionArn": "arn"}


def test_a_name_step_functions_already_ran_is_success_and_other_errors_are_not(monkeypatch):
    check = report_check.decide_report_check(CLUSTER, state({NODE_A: [entry(1), entry(2), entry(3)]}), POLICY)
    arn = "arn:aws:states:us-east-1:123456789012:stateMachine:SessionLimits"
    fake = _StepFunctions(None)
    monkeypatch.setattr(clients, "client", lambda service: fake)
    assert report_check.start_check(arn, check) is True and fake.started[0]["name"] == check.name
    fake.code = "ExecutionAlreadyExists"
    assert report_check.start_check(arn, check) is False
    fake.code = "AccessDeniedException"
    with pytest.raises(ClientError):
        report_check.start_check(arn, check)


class _Reads:
    """A DynamoDB client whose Query still returns a node's report from before the change (eventual consistency)."""

    def __init__(self, before: dict, after: dict, other: dict) -> None:
        self.items, self.fresh, self.kinds = [before, other], after, []

    def query(self, **kwargs):
        self.kinds.append(("Query", kwargs["ExpressionAttributeValues"][":pk"]["S"], kwargs["ConsistentRead"]))
        return {"Items": self.items if kwargs["ExpressionAttributeValues"][":pk"]["S"].startswith("node-report#") else []}

    def get_item(self, **kwargs):
        self.kinds.append(("GetItem", kwargs["Key"]["sk"]["S"], kwargs["ConsistentRead"]))
        return {"Item": self.fresh}


def test_the_check_reads_the_announcing_nodes_report_strongly_and_the_others_at_half_the_units(monkeypatch):
    from hpops_core.session_limits import node_sessions

    now = datetime(2026, 11, 23, 8, 1, tzinfo=timezone.utc)

    def item(instance: str, entries: list[dict]) -> dict:
        return {"sk": {"S": f"node-report#{instance}"}, "receivedAt": {"S": "2026-11-23T08:00:30Z"},
                "report": {"S": report(entries, instance).to_json()}}
    reads = _Reads(item(NODE_A, [entry(1)]), item(NODE_A, [entry(1), entry(2)]), item(NODE_B, [entry(3)]))
    monkeypatch.setattr(node_sessions, "client", lambda service: reads)

    state = node_sessions.read_cluster_state("t", CLUSTER, now, fresh_node=NODE_A)

    assert sorted(s.handle for s in state.nodes.ssh) == [entry(n)["handle"] for n in (1, 2, 3)], "the new login is counted"
    assert (report_check.decide_report_check(CLUSTER, state, POLICY).users == ("alice",))
    assert ("Query", f"node-report#{CLUSTER}", False) in reads.kinds
    assert ("GetItem", f"node-report#{NODE_A}", True) in reads.kinds
    assert ("Query", f"session#{CLUSTER}", True) in reads.kinds  # the ledger: small, and what was ended must count
