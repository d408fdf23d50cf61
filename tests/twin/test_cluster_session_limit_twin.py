"""One limit per user over SSH and Session Manager on all login nodes, in the twin.

The login nodes' real agents report their SSH logins (twin/hpops_twin/ssh_logins.py stands in for
the process table: the twin has no sshd; tests/ssh does this against real sshd) through the real
report bus and origin check; the SessionSweep runs the real ASL and handlers; the end-sessions
parameter reaches the node that holds the session through the agent's own poll.
"""

from __future__ import annotations

import time

import pytest

from hpops_twin.ssh_logins import SshLogins
from hpops_twin.world import TwinWorld


@pytest.fixture
def world():
    with TwinWorld() as twin:
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


def test_a_dry_run_tells_no_node(world, logins):
    first, second, _ = login_nodes(world)
    now = time.time()
    opened = [logins.open("alice", node, now + n) for n, node in enumerate((first, second, first))]
    world.agents_poll()

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
