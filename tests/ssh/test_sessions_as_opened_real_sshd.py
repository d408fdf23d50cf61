"""Sessions as users open them, on a real sshd: multiplexed channels and directory user names.

* One OpenSSH ControlMaster connection carrying 4 shells, under a limit of 2: the node agent lists
  4 sessions (one per channel, not one per connection), the stack's decision picks the 2 newest,
  and the agent ends exactly those 2 channels. The 2 older shells on the same connection keep
  answering, and bob's shell is untouched.
* A handle listed while the connection carried one shell is not used to end the connection once
  it carries more: nothing is ended that nobody chose.
* A directory user as SSSD/realmd names them (``user@domain``, created here with
  ``useradd --badname``) is counted and limited like any other.

Real OpenSSH with PAM. Needs root (useradd) and /usr/sbin/sshd; skips without them, except under
CI=true.
"""

from __future__ import annotations

import os
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
import real_tools

from hpops_core.node_channel import reports
from hpops_core.session_limits.cluster_sessions import decide_cluster_wide, end_sessions_document, ssh_sessions_of_report
from hpops_core.session_limits.policy import LimitPolicy
from hpops_node_agent import ssh_sessions

pytestmark = pytest.mark.realssh

MUX_USER, BOB, DIRECTORY_USER = "hpt30mux", "hpt30bob", "hpt30b@example.edu"
INSTANCE = "i-00000000000000030"
DOC = Path(__file__).resolve().parents[2] / "docs" / "session-limits.md"


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    return real_tools.key_users((MUX_USER, BOB, DIRECTORY_USER), tmp_path_factory.mktemp("client-keys"),
                                "multiplexed session tests")


@pytest.fixture
def sshd(keys, tmp_path):
    with real_tools.running_sshd(tmp_path, keys) as ssh:
        yield ssh


def listing(ssh) -> list[ssh_sessions.NodeSession]:
    return ssh_sessions.list_sessions(listener_pids=[ssh.listener])


def wait_for(ssh, user: str, count: int, timeout: float = 15) -> list[ssh_sessions.NodeSession]:
    deadline = time.monotonic() + timeout
    while True:
        mine = [s for s in listing(ssh) if s.user == user]
        if len(mine) == count or time.monotonic() > deadline:
            return mine
        time.sleep(0.1)


def answers(client: subprocess.Popen, word: str) -> bool:
    """The remote shell runs a command: its answer (6*7 computed remotely) is not in what a pty echoes."""
    try:
        client.stdin.write(f"echo {word}-$((6*7))\n".encode())
        client.stdin.flush()
    except BrokenPipeError:
        return False
    deadline = time.monotonic() + 10
    line = b""
    while time.monotonic() < deadline and f"{word}-42".encode() not in line:
        line = client.stdout.readline()
        if not line and client.poll() is not None:
            return False
    return f"{word}-42".encode() in line


def decide(sessions: list[ssh_sessions.NodeSession], limit: int):
    """The stack's cluster-wide decision over this node's report, ordered by the exact start ticks."""
    entries = [s.to_report() for s in sessions]
    bad: list[str] = []
    assert [reports._session_entry(e, "sessions.list", bad) for e in entries] == entries and not bad
    parsed = ssh_sessions_of_report(INSTANCE, entries)
    exact = {s.handle: s.started_at for s in sessions}
    seen = [type(s)(s.instance_id, s.handle, s.user, datetime.fromtimestamp(exact[s.handle], timezone.utc), s.tty)
            for s in parsed]
    return decide_cluster_wide(seen, [], LimitPolicy(default_max=limit, excess="newest"))


def test_four_shells_on_one_controlmaster_connection_under_a_limit_of_two_end_exactly_the_two_newest(sshd, tmp_path):
    control = f"{tmp_path}/cm-%r"
    mux = ("-o", f"ControlPath={control}")
    master = sshd(MUX_USER, "-N", "-o", "ControlMaster=yes", *mux)
    bob = sshd(BOB, "-tt")
    assert answers(bob, "bob-up")
    deadline = time.monotonic() + 10
    while not list(tmp_path.glob("cm-*")):
        assert time.monotonic() < deadline and master.poll() is None, master.stderr.read()
        time.sleep(0.05)

    first = sshd(MUX_USER, "-tt", "-o", "ControlMaster=no", *mux)
    assert answers(first, "shell-1")
    [only] = wait_for(sshd, MUX_USER, 1)  # one channel: the connection is the session
    shells = [first]
    for number in (2, 3, 4):
        time.sleep(0.05)  # distinct start ticks, so "newest" is never a tie broken by handle
        shells.append(sshd(MUX_USER, "-tt", "-o", "ControlMaster=no", *mux))
        assert answers(shells[-1], f"shell-{number}")

    listed = wait_for(sshd, MUX_USER, 4)
    assert len(listed) == 4 and all(s.tty for s in listed), listed
    # One connection: one sshd monitor, as a listing by connection would have counted.
    monitors = subprocess.run(["pgrep", "-c", "-f", f"^sshd: {MUX_USER} \\[priv\\]"], capture_output=True, text=True)
    assert monitors.stdout.strip() == "1"

    # The handle from when it carried one shell names the whole connection now: not used to end it.
    stale = ssh_sessions.end_session(only.handle, MUX_USER)
    assert stale.result == "gone" and "4 channels" in stale.reason
    assert all(answers(shell, f"after-stale-{n}") for n, shell in enumerate(shells))

    decision = decide(listed + wait_for(sshd, BOB, 1), limit=2)
    assert decision.by_user[MUX_USER]["ssh"] == {INSTANCE: 4} and decision.by_user[BOB]["ssh"] == {INSTANCE: 1}
    newest_two = sorted(listed, key=lambda s: s.started_at)[2:]
    assert sorted(e.handle for e in decision.ssh_to_end) == sorted(s.handle for s in newest_two)

    results = ssh_sessions.end_sessions(end_sessions_document(decision.ssh_by_node()[INSTANCE]))

    assert sorted((r.user, r.result) for r in results) == [(MUX_USER, "ended"), (MUX_USER, "ended")], results
    for shell in shells[2:]:
        shell.wait(timeout=10)  # their channels closed: the clients are gone
    # Exactly the two oldest channels of the same connection keep working, and bob is untouched.
    assert answers(shells[0], "shell-1-still") and answers(shells[1], "shell-2-still")
    assert master.poll() is None and answers(bob, "bob-still")
    assert len(wait_for(sshd, MUX_USER, 2)) == 2 and len(wait_for(sshd, BOB, 1)) == 1


def mux_master(sshd, tmp_path) -> tuple[str, ...]:
    """A ControlMaster connection of MUX_USER; the options that open a channel on it."""
    mux = ("-o", f"ControlPath={tmp_path}/cm-%r")
    master = sshd(MUX_USER, "-N", "-o", "ControlMaster=yes", *mux)
    deadline = time.monotonic() + 10
    while not list(tmp_path.glob("cm-*")):
        assert time.monotonic() < deadline and master.poll() is None, master.stderr.read()
        time.sleep(0.05)
    return ("-o", "ControlMaster=no", *mux)


def running(marker: str) -> list[int]:
    """Live processes whose command line is exactly ``sleep <marker>``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "cmdline").read_bytes() == f"sleep\0{marker}\0".encode() and \
                    (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                found.append(int(entry.name))
        except OSError:
            pass
    return found


def test_ending_one_channel_ends_what_it_started_setsid_included_and_names_what_it_cannot_tie(sshd, tmp_path):
    mux = mux_master(sshd, tmp_path)
    shell = sshd(MUX_USER, "-tt", *mux)
    assert answers(shell, "first")
    # From the shell: a nohup'd job (same POSIX session) and a setsid'd one (leaves the tree at once).
    shell.stdin.write(b"nohup sleep 7772 >/dev/null 2>&1 & setsid nohup sleep 7771 >/dev/null 2>&1 </dev/null &\n")
    shell.stdin.flush()
    time.sleep(0.05)
    # A command channel whose double-forked setsid child has left its tree and has no terminal to tie it.
    command = sshd(MUX_USER, "-T", *mux, "-o",
                   "RemoteCommand=(setsid sleep 7773 >/dev/null 2>&1 </dev/null &); exec sleep 600")
    time.sleep(0.05)
    other = sshd(MUX_USER, "-tt", *mux)
    assert answers(other, "other")
    deadline = time.monotonic() + 10
    while not (running("7771") and running("7772") and running("7773")):
        assert time.monotonic() < deadline, "the user's background jobs did not start"
        time.sleep(0.05)
    listed = sorted(wait_for(sshd, MUX_USER, 3), key=lambda s: s.started_at)
    assert len(listed) == 3, listed

    ended = ssh_sessions.end_session(listed[0].handle, MUX_USER)

    assert ended.result == "ended", ended
    shell.wait(timeout=10)
    assert running("7771") == running("7772") == [], ended  # both of that shell's jobs ended with it
    assert running("7773") and answers(other, "other-still") and command.poll() is None

    untied = ssh_sessions.end_session(listed[1].handle, MUX_USER)

    assert untied.result == "ended" and command.wait(timeout=10) == 255
    assert f"not tied to any channel (they end with it): pid(s) {running('7773')[0]}" in untied.reason, untied
    assert answers(other, "other-after")
    for pid in running("7773"):
        os.kill(pid, 9)


def test_an_internal_sftp_channel_has_a_process_of_its_own_and_counts(sshd, tmp_path):
    mux = mux_master(sshd, tmp_path)
    shell = sshd(MUX_USER, "-tt", *mux)
    assert answers(shell, "beside-sftp")
    sftp = subprocess.Popen(["/usr/bin/sftp", "-q", "-o", "BatchMode=yes", *mux, f"{MUX_USER}@127.0.0.1"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        listed = wait_for(sshd, MUX_USER, 2)
        titles = subprocess.run(["ps", "-o", "args=", "-u", MUX_USER], capture_output=True, text=True).stdout
        # What docs/session-limits.md says: its own process, titled so, counted like a shell.
        assert f"sshd: {MUX_USER}@internal-sftp" in titles.splitlines(), titles
        assert len(listed) == 2 and sorted(s.tty for s in listed) == [False, True], listed
        assert f"`sshd: USER@internal-sftp`" in DOC.read_text()
    finally:
        sftp.kill()
        sftp.wait(timeout=5)


def test_a_channel_handle_of_another_user_is_refused_and_nothing_is_signalled(sshd, tmp_path):
    mux = ("-o", f"ControlPath={tmp_path}/cm-%r")
    sshd(MUX_USER, "-N", "-o", "ControlMaster=yes", *mux)
    deadline = time.monotonic() + 10
    while not list(tmp_path.glob("cm-*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    shells = [sshd(MUX_USER, "-tt", "-o", "ControlMaster=no", *mux) for _ in range(2)]
    assert all(answers(shell, f"up-{n}") for n, shell in enumerate(shells))
    listed = wait_for(sshd, MUX_USER, 2)

    refused = ssh_sessions.end_session(listed[0].handle, BOB)

    assert refused.result == "refused"
    assert all(answers(shell, f"still-{n}") for n, shell in enumerate(shells))


def test_a_directory_user_name_is_counted_and_limited(sshd):
    shell = sshd(DIRECTORY_USER, "-tt")
    assert answers(shell, "dir-shell")
    tunnel = sshd(DIRECTORY_USER, "-N")
    wait_for(sshd, DIRECTORY_USER, 2)
    time.sleep(0.05)
    command = sshd(DIRECTORY_USER, "-T")
    assert answers(command, "dir-command")
    bob = sshd(BOB, "-tt")
    assert answers(bob, "bob-up")

    listed = wait_for(sshd, DIRECTORY_USER, 3)
    assert len(listed) == 3 and {s.user for s in listed} == {DIRECTORY_USER}
    decision = decide(listed + wait_for(sshd, BOB, 1), limit=2)
    newest = max(listed, key=lambda s: s.started_at)
    assert [(e.handle, e.user) for e in decision.ssh_to_end] == [(newest.handle, DIRECTORY_USER)]

    results = ssh_sessions.end_sessions(end_sessions_document(decision.ssh_by_node()[INSTANCE]))

    assert [(r.user, r.result) for r in results] == [(DIRECTORY_USER, "ended")]
    command.wait(timeout=10)
    assert command.returncode == 255
    assert answers(shell, "dir-shell-still") and tunnel.poll() is None and answers(bob, "bob-still")
