"""One cluster-wide session limit across two real sshd "login nodes" (two sshd on loopback ports).

alice opens three SSH sessions across both nodes (a login shell on a tty, an ``ssh -N`` that
utmp and so ``maxlogins`` never sees, and a remote command); bob opens one. Each node's session
listing (the node agent's, from the process table) is what its report carries; the stack's
cluster-wide decision (limit 2, ``newest``) picks alice's newest session; the end-sessions document
goes to the node that holds it, whose agent ends exactly that one. The client sees its connection
closed; alice's other two sessions and bob's keep working.

Real OpenSSH with PAM (pam_loginuid gives each session its audit id). Needs root (useradd) and
/usr/sbin/sshd; skips without them, except under CI=true.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import pytest
import real_tools
from real_tools import free_port

from hpops_core.session_limits.cluster_sessions import decide_cluster_wide, end_sessions_document, ssh_sessions_of_report
from hpops_core.session_limits.policy import LimitPolicy
from hpops_node_agent import ssh_sessions

pytestmark = pytest.mark.realssh

SSHD, SSH, SSH_KEYGEN = "/usr/sbin/sshd", "/usr/bin/ssh", "/usr/bin/ssh-keygen"
USERS = ("hpt23alice", "hpt23bob")


@pytest.fixture(scope="module")
def users(tmp_path_factory):
    real_tools.require_root_and_programs((SSHD, SSH, SSH_KEYGEN, "/usr/sbin/useradd"), "cluster session limit test",
                                         "apt-get install -y openssh-server openssh-client")
    real_tools.require((SSHD, SSH, SSH_KEYGEN), "cluster session limit test", "apt-get install -y openssh-server")
    keys = tmp_path_factory.mktemp("client-keys")
    os.chmod(keys, 0o755)
    for user in USERS:
        try:
            pwd.getpwnam(user)
        except KeyError:
            subprocess.run(["useradd", "-m", "-s", "/bin/sh", user], check=True)
        subprocess.run(["usermod", "-p", "*", user], check=True)  # no password, not locked: keys only
        key = keys / user
        if not key.exists():
            subprocess.run([SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        home = Path(pwd.getpwnam(user).pw_dir)
        ssh_dir = home / ".ssh"
        ssh_dir.mkdir(mode=0o700, exist_ok=True)
        (ssh_dir / "authorized_keys").write_text((keys / f"{user}.pub").read_text())
        account = pwd.getpwnam(user)
        for path in (ssh_dir, ssh_dir / "authorized_keys"):
            os.chown(path, account.pw_uid, account.pw_gid)
    if not Path("/run/utmp").exists():  # systemd-tmpfiles makes it on a real node
        subprocess.run(["install", "-m664", "/dev/null", "/run/utmp"], check=True)
    return keys


@dataclass
class LoginNode:
    instance_id: str
    port: int
    process: subprocess.Popen


@pytest.fixture
def nodes(users, tmp_path):
    started = []
    for index in (1, 2):
        root = tmp_path / f"node{index}"
        root.mkdir()
        subprocess.run([SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-f", str(root / "host_key")], check=True)
        port = free_port()
        (root / "sshd_config").write_text(
            f"Port {port}\nListenAddress 127.0.0.1\nHostKey {root}/host_key\nPidFile {root}/sshd.pid\n"
            "UsePAM yes\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nLogLevel VERBOSE\n")
        log = (root / "sshd.log").open("ab")
        process = subprocess.Popen([SSHD, "-D", "-e", "-f", str(root / "sshd_config")], stdout=log, stderr=log,
                                   stdin=subprocess.DEVNULL)
        log.close()
        started.append(LoginNode(f"i-0000000000000000{index}", port, process))
    for node in started:
        deadline = time.monotonic() + 10
        while subprocess.run(["bash", "-c", f"exec 3<>/dev/tcp/127.0.0.1/{node.port}"],
                             capture_output=True).returncode != 0:
            assert time.monotonic() < deadline and node.process.poll() is None, "sshd did not start"
            time.sleep(0.05)
    yield started
    for node in started:
        node.process.terminate()
        node.process.wait(timeout=10)


clients: list[subprocess.Popen] = []


def ssh(keys: Path, user: str, node: LoginNode, *args: str, stdin=subprocess.PIPE) -> subprocess.Popen:
    command = [SSH, "-i", str(keys / user), "-p", str(node.port), "-o", "StrictHostKeyChecking=no",
               "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes", "-o", "LogLevel=ERROR",
               "-o", "ServerAliveInterval=1", *args, f"{user}@127.0.0.1"]
    process = subprocess.Popen(command, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    clients.append(process)
    return process


def listing(node: LoginNode) -> list[ssh_sessions.NodeSession]:
    return ssh_sessions.list_sessions(listener_pids=[node.process.pid])


def wait_for_sessions(nodes, expected: int, timeout: float = 15) -> dict[str, list[ssh_sessions.NodeSession]]:
    deadline = time.monotonic() + timeout
    while True:
        seen = {node.instance_id: listing(node) for node in nodes}
        if sum(len(v) for v in seen.values()) >= expected or time.monotonic() > deadline:
            return seen
        time.sleep(0.1)


def still_works(process: subprocess.Popen) -> bool:
    return process.poll() is None


def shell_answers(process: subprocess.Popen, word: str) -> bool:
    """The remote shell runs a command: its answer (6*7 computed remotely) is not in what a pty echoes."""
    try:
        process.stdin.write(f"echo {word}-$((6*7))\n".encode())
        process.stdin.flush()
    except BrokenPipeError:
        return False
    deadline = time.monotonic() + 10
    line = b""
    while time.monotonic() < deadline and f"{word}-42".encode() not in line:
        line = process.stdout.readline()
        if not line and process.poll() is not None:
            return False
    return f"{word}-42".encode() in line


@pytest.fixture(autouse=True)
def close_clients():
    yield
    for process in clients:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=5)
    clients.clear()


def test_three_ssh_sessions_across_two_nodes_over_a_cluster_limit_of_two_end_exactly_the_newest(users, nodes):
    keys, (node1, node2) = users, nodes
    # alice: a login shell on node 1, a tty-less `ssh -N` on node 2, then a remote command on node 2.
    shell = ssh(keys, "hpt23alice", node1, "-tt")
    assert shell_answers(shell, "alice-shell-up")
    tunnel = ssh(keys, "hpt23alice", node2, "-N")
    wait_for_sessions(nodes, 2)
    time.sleep(0.05)  # distinct start ticks, so "newest" is the command, not a tie broken by handle
    command = ssh(keys, "hpt23alice", node2, "-T", stdin=subprocess.PIPE)
    bob = ssh(keys, "hpt23bob", node1, "-tt")
    assert shell_answers(bob, "bob-shell-up") and shell_answers(command, "alice-command-up")

    seen = wait_for_sessions(nodes, 4)
    assert sorted((s.user, s.tty) for s in seen[node1.instance_id]) == [("hpt23alice", True), ("hpt23bob", True)]
    assert sorted((s.user, s.tty) for s in seen[node2.instance_id]) == [("hpt23alice", False), ("hpt23alice", False)]
    # What maxlogins counts: the tty logins only (utmp), so `ssh -N` would dodge it.
    utmp = subprocess.run(["who"], capture_output=True, text=True).stdout
    assert "hpt23bob" in utmp and utmp.count("hpt23alice") == 1

    # The reports as the stack receives them, one per node, each about that node only.
    reports = {instance: [s.to_report() for s in sessions] for instance, sessions in seen.items()}
    assert all(set(entry) == {"handle", "user", "path", "tty", "startedAt"} for r in reports.values() for entry in r)
    ssh_sessions_seen = [s for instance, entries in reports.items() for s in ssh_sessions_of_report(instance, entries)]
    # startedAt has whole seconds; the decision here uses the node's exact start (ticks) to order.
    exact = {s.handle: s.started_at for sessions in seen.values() for s in sessions}
    ssh_sessions_seen = [type(s)(s.instance_id, s.handle, s.user, datetime.fromtimestamp(exact[s.handle], timezone.utc),
                                 s.tty) for s in ssh_sessions_seen]

    decision = decide_cluster_wide(ssh_sessions_seen, [], LimitPolicy(default_max=2, excess="newest"))

    newest = max((s for s in seen[node2.instance_id]), key=lambda s: s.started_at)
    assert [(e.instance_id, e.handle, e.user) for e in decision.ssh_to_end] == [
        (node2.instance_id, newest.handle, "hpt23alice")]
    assert decision.by_user["hpt23alice"]["ssh"] == {node1.instance_id: 1, node2.instance_id: 2}
    assert decision.by_user["hpt23bob"]["ssh"] == {node1.instance_id: 1}

    # Node 2's agent reads its end-sessions document; node 1's has nothing for it.
    assert set(decision.ssh_by_node()) == {node2.instance_id}
    results = ssh_sessions.end_sessions(end_sessions_document(decision.ssh_by_node()[node2.instance_id]))

    assert [(r.handle, r.user, r.result) for r in results] == [(newest.handle, "hpt23alice", "ended")]
    command.wait(timeout=10)
    assert command.returncode == 255 and b"closed by remote host" in command.stderr.read()
    # The others keep working: alice's shell answers, her `ssh -N` is connected, bob's shell answers.
    assert shell_answers(shell, "alice-shell-still-up") and still_works(tunnel)
    assert shell_answers(bob, "bob-shell-still-up")
    after = wait_for_sessions(nodes, 0)
    assert sorted((i, s.user) for i, ss in after.items() for s in ss) == sorted(
        [(node1.instance_id, "hpt23alice"), (node1.instance_id, "hpt23bob"), (node2.instance_id, "hpt23alice")])

    # The same instruction again (a re-read parameter): the handle names nothing now; nothing else ends.
    again = ssh_sessions.end_sessions(end_sessions_document(decision.ssh_by_node()[node2.instance_id]))
    assert [r.result for r in again] == ["gone"] and still_works(tunnel) and still_works(shell)


def test_an_instruction_naming_another_users_session_is_refused_and_ends_nothing(users, nodes):
    keys, (node1, _) = users, nodes
    bob = ssh(keys, "hpt23bob", node1, "-tt")
    assert shell_answers(bob, "bob-up")
    (session,) = wait_for_sessions(nodes, 1)[node1.instance_id]

    forged = {"format": "hpops.node.end-sessions.v1", "sessions": [{"handle": session.handle, "user": "hpt23alice"}]}
    (result,) = ssh_sessions.end_sessions(forged)

    assert result.result == "refused" and "another user's session" in result.reason
    assert shell_answers(bob, "bob-still-up")
    stale = session.handle.rsplit(":", 1)[0] + ":1"
    (result,) = ssh_sessions.end_sessions({"format": "hpops.node.end-sessions.v1",
                                           "sessions": [{"handle": stale, "user": "hpt23bob"}]})
    assert result.result == "gone" and shell_answers(bob, "bob-up-after-stale-handle")
    with pytest.raises(ValueError):
        ssh_sessions.end_sessions({"format": "hpops.node.end-sessions.v1", "sessions": [{"handle": session.handle,
                                                                                          "user": "root"}]})
