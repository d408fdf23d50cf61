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
    ({"list": [], "omittedByUser": {"root": 3}}, "sessions.omittedByUser"),
    ({"list": [], "omittedByUser": {"alice; rm -rf /": 3}}, "sessions.omittedByUser"),
    ({"list": [], "omittedByUser": {"alice": -1}}, "sessions.omittedByUser"),
    ({"list": [], "omittedByUser": {"alice": True}}, "sessions.omittedByUser"),
    ({"list": [], "omittedByUser": {f"u{n}": 1 for n in range(contract.MAX_OMITTED_USERS + 1)}},
     "sessions.omittedByUser"),
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


def busy_node(users: int, per_user: int, started: float = 1_764_000_000.0) -> list:
    from hpops_node_agent.ssh_sessions import NodeSession

    return sorted((NodeSession(f"5eed0b07:{1000 + u * per_user + k}:{u * 100 + k}", f"user{u:04d}", "ssh", True,
                               started + u + k * 0.001) for u in range(users) for k in range(per_user)),
                  key=lambda s: (s.started_at, s.handle))


def test_a_node_lists_every_session_while_they_fit_as_before():
    from hpops_node_agent.ssh_sessions import reported_sessions

    listed = busy_node(100, 1)
    section = reported_sessions(listed)
    assert section == {"list": [s.to_report() for s in listed], "omitted": 0}


@pytest.mark.parametrize("users, per_user", [(500, 2), (100, 10), (1500, 1), (40, 250)])
def test_a_busy_node_counts_every_users_sessions_lists_each_users_newest_and_fits_every_limit(users, per_user):
    from hpops_node_agent.ssh_sessions import reported_sessions

    listed = busy_node(users, per_user)
    section = reported_sessions(listed) | {"ended": []}
    listed_now = [e for e in section["list"]]
    counted = {}
    for e in listed_now:
        counted[e["user"]] = counted.get(e["user"], 0) + 1
    for user, n in section.get("omittedByUser", {}).items():
        counted[user] = counted.get(user, 0) + n
    assert counted == {f"user{u:04d}": per_user for u in range(users)}, "every session of every user counted"
    newest = {}
    for s in listed:
        newest[s.user] = s.handle  # oldest first: the last one is each user's newest
    handles = {e["handle"] for e in listed_now}
    # Each user's newest is listed (a limit can end it), or, with more users than fit, only newest ones are.
    assert set(newest.values()) <= handles or handles <= set(newest.values())
    oldest = {}
    for s in reversed(listed):
        oldest[s.user] = s.handle
    if users <= 400:  # two entries a user fit: the oldest too, for SessionExcessPolicy=oldest
        assert set(oldest.values()) <= handles
    assert section["omitted"] == len(listed) - len(listed_now) > 0
    report = parse_report_event(event(section))  # the stack accepts it whole
    assert len(report.to_json().encode()) < contract.MAX_REPORT_BYTES < 256 * 1024


def test_sessions_a_busy_node_did_not_list_count_against_the_limit_but_are_never_picked():
    now = datetime(2026, 11, 23, 8, 0, tzinfo=timezone.utc)
    listed = [NodeSshSession(NODE_A, f"5eed0b07:{n}:{n}", "alice", now.replace(minute=n)) for n in (1, 2)]
    policy = LimitPolicy(default_max=3)
    under = decide_cluster_wide(listed, [], policy)
    assert under.ssh_to_end == ()
    over = decide_cluster_wide(listed, [], policy, unlisted={NODE_B: {"alice": 2, "bob": 3}})
    assert [(s.instance_id, s.handle) for s in over.ssh_to_end] == [(NODE_A, "5eed0b07:2:2")]
    assert over.by_user["alice"]["ssh"] == {NODE_A: 2, NODE_B: 2} and over.by_user["bob"]["ssh"] == {NODE_B: 3}
    (alice,) = [v for v in over.verdicts if v.user == "alice"]
    assert alice.active_count == 4 and alice.over_limit
