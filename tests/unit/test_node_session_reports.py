"""Forged session reports change nothing: a node's list of sessions is refused by name when it is
not what an agent sends (hostile user names, huge lists, a handle twice, fields that do not
belong), a report is kept only from the node it names, and a node's sessions are only ever that
node's: the cluster-wide decision tells only the node that reported a session to end it."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from hpops_core.node_channel import contract
from hpops_core.node_channel.reports import MalformedNodeReport, check_report_origin, parse_report_event
from hpops_core.session_limits.cluster_sessions import (
    NodeSshSession,
    decide_cluster_wide,
    end_sessions_document,
    ssh_sessions_of_report,
)
from hpops_core.session_limits.policy import LimitPolicy

NODE_A, NODE_B = "i-0123456789abcdef0", "i-0fedcba9876543210"


def entry(pid: int, user: str = "alice", **changes) -> dict:
    return {"handle": f"5eed0b07:{pid}:{pid * 10}", "user": user, "path": "ssh", "tty": False,
            "startedAt": f"2026-11-23T08:{pid % 60:02d}:00Z"} | changes


def event(sessions: dict, instance: str = NODE_A, ip: str = "10.1.0.5") -> dict:
    detail = {"format": contract.REPORT_FORMAT, "cluster": "ml-research", "instanceId": instance, "ip": ip,
              "role": "login", "agentVersion": "0.1.0", "reportedAt": "2026-11-23T08:00:01Z", "trigger": "change",
              "sessions": sessions}
    return {"source": contract.REPORT_SOURCE, "detail-type": contract.REPORT_DETAIL_TYPE, "detail": detail}


def test_a_session_list_the_agent_sends_parses_and_is_stored_whole():
    report = parse_report_event(event({"list": [entry(1), entry(2, "bob", path="ssm", tty=True,
                                                                   sessionId="bob-0a1b2c3d4e5f6a7b8")],
                                       "omitted": 0, "ended": [{"handle": "5eed0b07:9:90", "user": "alice",
                                                                "result": "ended", "reason": "SIGTERM"}]}))
    stored = json.loads(report.to_json())["sessions"]
    assert [e["user"] for e in stored["list"]] == ["alice", "bob"] and stored["ended"][0]["result"] == "ended"


@pytest.mark.parametrize("sessions, named", [
    ({"list": [entry(1, "root")]}, "sessions.list[].user"),  # root is never limited, never reported
    ({"list": [entry(1, "alice; rm -rf /")]}, "sessions.list[].user"),
    ({"list": [entry(1, "../../etc")]}, "sessions.list[].user"),
    ({"list": [entry(1, handle="1234:5")]}, "sessions.list[].handle"),
    ({"list": [entry(1, path="telnet")]}, "sessions.list[].path"),
    ({"list": [entry(1, sessionId="alice-0a1b2c3d4e5f6a7b8")]}, "sessions.list[].sessionId"),
    ({"list": [entry(1, startedAt="yesterday")]}, "sessions.list[].startedAt"),
    ({"list": [entry(1, uid=1000)]}, "sessions.list[].<1 unknown field(s)>"),
    ({"list": [entry(1), entry(1)]}, "sessions.list[].handle"),  # one session twice would count twice
    ({"list": [entry(n) for n in range(1, contract.MAX_REPORTED_SESSIONS + 2)]}, "sessions.list"),
    ({"list": [], "ended": [{"handle": "5eed0b07:9:90", "user": "alice", "result": "done", "reason": ""}]},
     "sessions.ended[].result"),
])
def test_forged_session_lists_are_refused_by_name_without_echoing_them(sessions, named):
    with pytest.raises(MalformedNodeReport) as error:
        parse_report_event(event(sessions))
    assert named in str(error.value)
    assert "rm -rf" not in str(error.value) and "../" not in str(error.value)


def test_a_report_naming_another_node_or_from_outside_the_login_group_is_not_kept():
    forged = parse_report_event(event({"list": [entry(1)]}, instance=NODE_B, ip="10.1.0.5"))  # sent from A's IP
    node_b = {"InstanceGroupName": "login", "PrivatePrimaryIp": "10.1.0.6"}
    assert "AWS says 10.1.0.6" in check_report_origin(forged, "ml-research", "login", node_b).reason
    worker = parse_report_event(event({"list": [entry(1)]}, ip="10.1.0.9"))
    assert "not login" in check_report_origin(worker, "ml-research", "login",
                                              {"InstanceGroupName": "gpu", "PrivatePrimaryIp": "10.1.0.9"}).reason


def test_each_node_is_told_only_about_the_sessions_it_reported():
    # Two nodes each report alice twice; the same handle on both nodes names two different sessions.
    a = ssh_sessions_of_report(NODE_A, [entry(1), entry(2)])
    b = ssh_sessions_of_report(NODE_B, [entry(2), entry(3)])
    decision = decide_cluster_wide(a + b, [], LimitPolicy(default_max=2, excess="newest"))
    assert [(s.instance_id, s.handle) for s in decision.ssh_to_end] == [(NODE_B, entry(3)["handle"]),
                                                                       (NODE_B, entry(2)["handle"])]
    assert set(decision.ssh_by_node()) == {NODE_B}
    assert end_sessions_document(decision.ssh_by_node()[NODE_B])["sessions"] == [
        {"handle": entry(3)["handle"], "user": "alice"}, {"handle": entry(2)["handle"], "user": "alice"}]


def test_sessions_that_skipped_validation_are_still_never_ended():
    hostile = NodeSshSession(NODE_A, "5eed0b07:1:10", "root", datetime(2026, 11, 23, tzinfo=timezone.utc))
    forged_node = NodeSshSession("not-an-instance", "5eed0b07:2:20", "alice", datetime(2026, 11, 23, tzinfo=timezone.utc))
    decision = decide_cluster_wide([hostile, forged_node], [], LimitPolicy(default_max=1))
    assert decision.ssh_to_end == () and decision.by_user == {}


@pytest.mark.parametrize("at_cap", [
    [{"user": "root", "caps": ["memory"]}],
    [{"user": "alice", "caps": ["gpu"]}],
    [{"user": "alice", "caps": []}],
    [{"user": f"user{n}", "caps": ["cpu"]} for n in range(51)],
])
def test_forged_at_cap_lists_are_refused_by_name(at_cap):
    detail = event({"list": []})
    detail["detail"]["userCaps"] = {"result": "unchanged", "reason": "", "atCap": at_cap}
    with pytest.raises(MalformedNodeReport, match="userCaps.atCap"):
        parse_report_event(detail)
