"""A login node leaving rotation tells its users, on a real sshd: the notice reaches each session's
terminal (a directory user ``user@domain`` too), once, and nothing else is written anywhere.

The document is the one the stack publishes (hpops_core.login_sync.leave_notices), read by the node
agent's own code (hpops_node_agent.leave_notice) against the real /proc and /dev/pts. Real OpenSSH
with PAM; needs root (useradd) and /usr/sbin/sshd; skips without them, except under CI=true.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
import real_tools

from hpops_core.cluster.login_group import LoginNode
from hpops_core.login_sync.leave_notices import leaving_nodes, notice_document
from hpops_node_agent import leave_notice

pytestmark = pytest.mark.realssh

ALICE, BOB, DIRECTORY_USER = "hpt38al", "hpt38bob", "hpt38d@example.edu"
INSTANCE, OTHER = "i-00000000000000038", "i-00000000000000039"
HOST = "login.hpc.example.edu"


class Client:
    """An ssh client whose output is collected as it arrives."""

    def __init__(self, command: list[str]):
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.output = b""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while chunk := os.read(self.process.stdout.fileno(), 4096):
            self.output += chunk

    def run(self, word: str) -> None:
        """Wait until the remote shell answers, so its session is fully up."""
        self.process.stdin.write(f"echo {word}-$((6*7))\n".encode())
        self.process.stdin.flush()
        self.wait_for(f"{word}-42".encode())

    def wait_for(self, text: bytes, timeout: float = 10) -> bool:
        deadline = time.monotonic() + timeout
        while text not in self.output:
            if time.monotonic() > deadline or self.process.poll() is not None:
                return False
            time.sleep(0.05)
        return True


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    return real_tools.key_users((ALICE, BOB, DIRECTORY_USER), tmp_path_factory.mktemp("client-keys"), "leave notice tests")


@pytest.fixture
def node(keys, tmp_path):
    with real_tools.running_sshd(tmp_path, keys, client=Client) as ssh:
        yield ssh


def published(grace: int = 10) -> str:
    """What the stack writes when HyperPod shuts this node down (and another node is held out)."""
    notices = leaving_nodes([LoginNode(INSTANCE, "ShuttingDown", "10.1.0.38"), LoginNode(OTHER, "Running", "10.1.0.39")],
                            {"10.1.0.39": "pressure"}, {}, datetime(2026, 11, 28, 15, 30, tzinfo=timezone.utc))
    return notice_document(notices.nodes, grace, HOST)


def test_every_terminal_session_is_told_once_and_nothing_else_is_written(node, tmp_path):
    alice, directory = node(ALICE, "-tt"), node(DIRECTORY_USER, "-tt")
    bob_command = node(BOB, "sleep 60; echo bob-done")  # no terminal
    bob_tunnel = node(BOB, "-N")
    alice.run("alice-up")
    directory.run("directory-up")
    # A pty of alice's that is no session's terminal: never written.
    master, slave = os.openpty()
    os.fchown(slave, pwd.getpwnam(ALICE).pw_uid, -1)
    os.set_blocking(master, False)

    section, state = leave_notice.converge(published(), INSTANCE, {}, Path("/proc"), Path("/dev"), [node.listener])

    told = b"Continue on another login node with: ssh " + HOST.encode()
    assert alice.wait_for(told) and directory.wait_for(told), (alice.output, directory.output)
    for client in (alice, directory):
        assert b"HyperPod is shutting it down" in client.output and b"log out within 10 minutes (by 15:40 UTC)" in client.output
    assert section["result"] == "changed" and "2 terminal(s) told" in section["reason"], section
    assert len(state["told"]) == 2
    time.sleep(0.3)  # anything wrongly written would have arrived by now
    assert told not in bob_command.output and bob_tunnel.output == b""
    with pytest.raises(BlockingIOError):
        os.read(master, 4096)

    # The next ticks tell nobody again; a session opened later is told once.
    again, state = leave_notice.converge(published(), INSTANCE, state, Path("/proc"), Path("/dev"), [node.listener])
    later = node(ALICE, "-tt")
    later.run("later-up")
    third, state = leave_notice.converge(published(), INSTANCE, state, Path("/proc"), Path("/dev"), [node.listener])
    assert again["result"] == "unchanged" and third["result"] == "changed" and len(state["told"]) == 3
    assert later.wait_for(told)
    alice.run("alice-still")  # the notice does not disturb the shell
    assert alice.output.count(told) == 1 and directory.output.count(told) == 1
    os.close(master)
    os.close(slave)


def test_a_node_in_rotation_or_a_hostile_document_writes_nothing(node):
    alice = node(ALICE, "-tt")
    alice.run("alice-up")
    document = published()
    in_rotation, _ = leave_notice.converge(document, "i-0000000000000abcd", {}, Path("/proc"), Path("/dev"), [node.listener])
    hostile = document.replace("ShuttingDown", "\\u001b]0;owned\\u0007")
    refused, _ = leave_notice.converge(hostile, INSTANCE, {}, Path("/proc"), Path("/dev"), [node.listener])
    assert in_rotation["result"] == "unchanged" and refused["result"] == "failed", (in_rotation, refused)
    alice.run("alice-after")
    assert b"hpops" not in alice.output
