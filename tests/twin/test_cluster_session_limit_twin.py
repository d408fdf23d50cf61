"""One limit per user over SSH and Session Manager on all login nodes, in the twin.

The login nodes' real agents report their SSH logins (twin/hpops_twin/ssh_logins.py stands in for
the process table: the twin has no sshd; tests/ssh does this against real sshd) through the real
report bus and origin check; the SessionSweep runs the real ASL and handlers; the end-sessions
parameter reaches the node that holds the session through the agent's own poll.
"""

from __future__ import annotations

import json
import time

import pytest

from hpops_core.node_channel import contract
from hpops_twin.ssh_logins import SshLogins
from hpops_twin.world import ENFORCING, TwinWorld


@pytest.fixture
def world():
    with TwinWorld(parameters=ENFORCING) as twin:
        yield twin


@pytest.fixture
def logins(world):
    with SshLogins(world).installed() as installed:
        yield installed


def enforcement(world: TwinWorld) -> dict:
    result = world.wait([world.sessions.sweep()], timeout=120)[0]
    assert result.status == "SUCCEEDED", (result.error, result.cause)
    return result.output["enforcement"]["report"]


def login_nodes(world: TwinWorld) -> list[str]:
    return sorted(n.instance_id for n in world.sim.nodes(world.cluster_name, world.login_group) if n.status == "Running")


def test_ssh_and_session_manager_sessions_of_one_user_count_together_and_the_node_ends_the_newest(world, logins):
    first, second, _ = login_nodes(world)
    now = time.time()
    # alice: a Session Manager shell, then SSH on two nodes (the second tty-less, as `ssh -N`); bob: one SSH login.
    shell = world.sessions.add_sessions("alice", 1, instance_id=first)[0]
    alice_tty = logins.open("alice", first, now + 60)
    alice_tunnel = logins.open("alice", second, now + 120, tty=False)
    bob = logins.open("bob", first, now + 90)
    world.agents_poll()  # each node reports its sessions with its next poll

    out = enforcement(world)

    ssh = out["ssh"]
    assert ssh["sessionsReported"] == 3 and sorted(ssh["nodesReporting"]) == login_nodes(world)
    assert ssh["byUser"]["alice"] == {"ssh": {first: 1, second: 1}, "ssm": {first: 1}}
    assert ssh["byUser"]["bob"] == {"ssh": {first: 1}, "ssm": {}}
    assert [(u["user"], u["limit"], u["activeCount"]) for u in out["usersOverLimit"]] == [("alice", 2, 3)]
    # The newest is alice's SSH session on the second node: that node is told, nobody else.
    assert [(e["node"], e["handle"], e["user"]) for e in ssh["toEnd"]] == [(second, alice_tunnel.handle, "alice")]
    assert ssh["nodesTold"] == {second: 1}
    assert world.sessions.store.terminated_by_api() == []
    assert alice_tunnel.connected, "nothing ends before the node's agent polls"
    (alert,) = [a for a in world.sessions.alerts() if "SSH" in a["subject"]]
    assert "told the login nodes to end 1 SSH session(s) (alice)" in alert["subject"]
    assert f"alice on {second}, session {alice_tunnel.handle}" in alert["message"]

    world.agents_poll()

    assert not alice_tunnel.connected
    assert alice_tty.connected and bob.connected and world.sessions.store.status(shell.session_id) == "Connected"
    again = enforcement(world)
    assert again["usersOverLimit"] == [] and again["ssh"]["toEndCount"] == 0
    assert {(e["handle"], e["user"], e["result"]) for e in again["ssh"]["endedByNodes"]} == {
        (alice_tunnel.handle, "alice", "ended")}
    assert again["ssh"]["byUser"]["alice"] == {"ssh": {first: 1}, "ssm": {first: 1}}


def test_a_session_manager_shell_that_crosses_the_limit_ends_by_terminate_session(world, logins):
    first, second, _ = login_nodes(world)
    now = time.time()
    early = [logins.open("alice", first, now - 600), logins.open("alice", second, now - 300)]
    world.agents_poll()
    shell = world.sessions.add_sessions("alice", 1, instance_id=first)[0]

    out = enforcement(world)

    assert world.sessions.store.terminated_by_api() == [shell.session_id]
    assert out["ssh"]["toEndCount"] == 0 and all(s.connected for s in early)


def test_a_dry_run_tells_no_node():
    # A dry-run deployment: the check its node reports start is a dry run too, as is the sweep.
    with TwinWorld(parameters={"SessionLimitsDryRun": "true"}) as world, SshLogins(world).installed() as logins:
        _dry_run_tells_no_node(world, logins)


def _dry_run_tells_no_node(world: TwinWorld, logins: SshLogins) -> None:
    first, second, _ = login_nodes(world)
    now = time.time()
    opened = [logins.open("alice", node, now + n) for n, node in enumerate((first, second, first))]
    world.agents_poll()
    (reported,) = checks_started_by_reports(world)
    assert reported.output["enforcement"]["report"]["dryRun"] is True

    result = world.wait([world.sessions.start_check({"cluster": world.cluster_name, "mode": "sweep", "dryRun": True})],
                        timeout=120)[0]
    out = result.output["enforcement"]["report"]
    world.agents_poll()

    assert [e["handle"] for e in out["ssh"]["toEnd"]] == [opened[2].handle] and out["ssh"]["nodesTold"] == {}
    assert all(s.connected for s in opened)
    world.wait([world.sessions.start_check({"cluster": world.cluster_name, "mode": "sweep", "dryRun": True})],
               timeout=120)
    alerts = [a for a in world.sessions.alerts() if "SSH" in a["subject"]]
    assert len(alerts) == 1 and "would end 1 SSH session(s) (alice)" in alerts[0]["subject"], "once, not every sweep"


# ---------------------------------------------------------------- a node's report starts the check

def checks_started_by_reports(world: TwinWorld) -> list:
    """The SessionLimits executions CheckReportedSessions started (mode "nodes"), ended."""
    sfn = world.aws.client("stepfunctions")
    listed = sfn.list_executions(stateMachineArn=world.sessions.state_machine_arn())["executions"]
    return world.wait([e["executionArn"] for e in listed if e["name"].startswith("nodes-")], timeout=120)


def report_checks(world: TwinWorld) -> list[dict]:
    return [i.result for i in world.dispatcher.invocations if i.function.endswith("CheckReportedSessionsFunction")]


def test_an_ssh_login_over_the_limit_is_ended_within_two_polls_without_a_sweep(world, logins):
    first, second, _ = login_nodes(world)
    now = time.time()
    held = [logins.open("alice", first, now), logins.open("alice", second, now + 1)]
    bob = logins.open("bob", first, now + 2)
    world.agents_poll()
    assert checks_started_by_reports(world) == [] and report_checks(world), "checked, nobody over: nothing started"

    third = logins.open("alice", second, now + 60)
    world.agents_poll()  # poll 1: the node reports the third login, and its report starts one check

    (run,) = checks_started_by_reports(world)
    assert run.status == "SUCCEEDED" and run.input == {"cluster": world.cluster_name, "mode": "nodes", "users": ["alice"]}
    out = run.output["enforcement"]["report"]
    assert out["mode"] == "nodes" and out["trigger"] == "login node report: over the limit: alice"
    assert [(e["node"], e["handle"]) for e in out["ssh"]["toEnd"]] == [(second, third.handle)]
    assert third.connected, "the holding node has not polled yet"

    world.agents_poll()  # poll 2: the holding node reads its end-sessions instruction

    assert not third.connected and all(s.connected for s in held) and bob.connected
    assert not [r for r in world.routes if r.rule == "SessionSweep"], "no sweep was waited for"
    world.agents_poll()  # the node reports the end: nobody is over any more, nothing more starts
    assert len(checks_started_by_reports(world)) == 1
    assert report_checks(world)[-1]["start"] is False


def test_the_same_situation_announced_again_starts_no_second_execution():
    """A redelivered announcement (or another node's report of the same crossing) names the same
    over-limit sessions, so the same execution name: Step Functions refuses it, which is success.
    (A dry run, where the situation stays; otherwise the run's ledger already says the excess ended.)"""
    with TwinWorld(parameters={"SessionLimitsDryRun": "true"}) as world, SshLogins(world).installed() as logins:
        _same_situation_announced_again(world, logins)


def _same_situation_announced_again(world: TwinWorld, logins: SshLogins) -> None:
    first, second, _ = login_nodes(world)
    now = time.time()
    for n, node in enumerate((first, second, first)):
        logins.open("alice", node, now + n)
    world.agents_poll()
    (run,) = checks_started_by_reports(world)  # ended: its name is refused from now on (while running, reused)
    announcement = {"Source": "hpops.node-reports", "DetailType": "HyperPod Login Node Sessions Changed",
                    "Detail": json.dumps({"cluster": world.cluster_name, "instanceId": first,
                                          "reportedAt": "2026-11-23T08:00:01+00:00", "receivedAt": "2026-11-23T08:00:01Z"})}
    world.aws.client("events").put_events(Entries=[announcement])

    checks = [c for c in report_checks(world) if c["start"]]
    assert len(checks) == 2 and len({c["name"] for c in checks}) == 1
    assert [c["started"] for c in checks] == [True, False]
    assert len(checks_started_by_reports(world)) == 1 and not world.delivery_failures


def test_the_measured_bound_is_the_documented_one(world, logins):
    """The bench's own measurement (simulated clock, real agents and execution) in the worst case."""
    from hpops_twin.session_bound_bench import defaults, measure_ssh

    poll, _ = defaults(world.template)
    row = measure_ssh(world, logins, "alice", "worst", "node report and sweep")
    assert (row.polls, row.sweeps, row.executions) == (2, 0, 1)
    assert row.seconds <= 2 * poll


def _report(world: TwinWorld, sender, claimed_instance: str, sessions: list[dict]) -> dict:
    return {"Source": "hpops.node", "DetailType": "HyperPod Login Node Report", "EventBusName": world.output("NodeReportBusName"),
            "Detail": json.dumps({"format": "hpops.node.report.v1", "cluster": world.cluster_name,
                                  "instanceId": claimed_instance, "ip": sender.ip, "role": "login", "agentVersion": "1.0.0",
                                  "reportedAt": "2026-11-23T08:00:01+00:00", "trigger": "change",
                                  "sessions": {"list": sessions}})}


def test_forged_reports_start_nothing(world, logins):
    """Another node's sessions sent from this node, a huge list, an announcement nobody stored: the
    signature check (or the parse) refuses them before any announcement, and an announcement alone is
    never counted: no check is started, no node is told anything."""
    nodes = sorted((n for n in world.sim.nodes(world.cluster_name, world.login_group) if n.status == "Running"),
                   key=lambda n: n.instance_id)
    sender, victim = nodes[0], nodes[1]
    logins.open("alice", victim.instance_id, time.time())
    world.agents_poll()
    checks_before = len(report_checks(world))
    forged = [{"handle": f"5eed0b07:{pid}:{pid * 10}", "user": "alice", "path": "ssh", "tty": True,
               "startedAt": "2026-11-23T08:00:00Z"} for pid in range(100, 103)]
    huge = [dict(s, handle=f"5eed0b07:{pid}:{pid}") for pid, s in enumerate(forged * (contract.MAX_REPORTED_SESSIONS // 3 + 1), start=1000)]
    events = world.aws.client("events")
    events.put_events(Entries=[_report(world, sender, victim.instance_id, forged),
                               _report(world, sender, sender.instance_id, huge)])
    events.put_events(Entries=[{"Source": "hpops.node-reports", "DetailType": "HyperPod Login Node Sessions Changed",
                                "Detail": json.dumps({"cluster": world.cluster_name, "instanceId": victim.instance_id,
                                                      "reportedAt": "x", "receivedAt": "x"})}])

    # The forged one carries no signature by the victim's enrolled agent key; the huge one fails the parse first.
    assert sorted(f["error"] for f in world.delivery_failures) == ["MalformedNodeReport", "NodeProofMalformedError"]
    assert [c["start"] for c in report_checks(world)[checks_before:]] == [False], "only the bare announcement, counted from the stored reports"
    assert checks_started_by_reports(world) == []
    parameters = world.aws.client("ssm").describe_parameters()["Parameters"]
    assert not [p for p in parameters if "/end-sessions/" in p["Name"]]


def test_on_a_login_node_with_1000_sessions_every_user_counts_and_a_login_over_the_limit_ends_within_two_polls(
        world, logins):
    # A busy node: 499 other users at the default limit of 2 (998 sessions) and alice at hers, one
    # session here and one on the second node; her newest, on the busy node, is the 1,000th there.
    first, second, _ = login_nodes(world)
    now = time.time()
    others = [logins.open(f"user{n:03d}", first, now - 3600 + n + k / 2) for n in range(499) for k in range(2)]
    held = [logins.open("alice", first, now - 1800), logins.open("alice", second, now - 1700)]
    world.agents_poll()
    assert checks_started_by_reports(world) == [] and report_checks(world)[-1]["start"] is False

    assert "every node" in [c["read"] for c in report_checks(world)], "500 users' sessions grew at once: too many to name"

    third = logins.open("alice", first, now)
    world.agents_poll()  # poll 1: the busy node's report (not all of it listed) starts one check

    (run,) = checks_started_by_reports(world)
    assert report_checks(world)[-1]["read"] == ["alice"], "the check read alice's sessions alone"
    out = run.output["enforcement"]["report"]
    assert [(u["user"], u["activeCount"]) for u in out["usersOverLimit"]] == [("alice", 3)]
    assert [(e["node"], e["handle"]) for e in out["ssh"]["toEnd"]] == [(first, third.handle)]
    assert out["ssh"]["sessionsReported"] + out["ssh"]["omittedByNodes"] == 1001
    stored = world.aws.client("dynamodb").query(
        TableName=world.resolver.physical_ids["SyncStateTable"], KeyConditionExpression="pk = :pk",
        ExpressionAttributeValues={":pk": {"S": f"node-report#{world.cluster_name}"}})["Items"]
    busy = next(i for i in stored if i["sk"]["S"].endswith(first))
    report = json.loads(busy["report"]["S"])
    assert report["sessions"]["omitted"] > 0, "the node lists what fits and counts the rest"
    assert len(busy["report"]["S"].encode()) < contract.MAX_REPORT_BYTES < 256 * 1024, "EventBridge, Lambda, DynamoDB"
    counted = {e["user"] for e in report["sessions"]["list"]} | set(report["sessions"].get("omittedByUser", {}))
    assert counted == {f"user{n:03d}" for n in range(499)} | {"alice"}, "every user counted"

    world.agents_poll()  # poll 2: the busy node ends alice's newest, nobody else's

    assert not third.connected and all(s.connected for s in held + others)
