"""Helpers for tests that run real programs (sshd, ssh, haproxy, the agent) on loopback."""

from __future__ import annotations

import os
import socket

import pytest

# `make test` spreads the suite over the machine's CPUs (pytest-xdist, `--dist loadgroup`). A test that
# uses a resource of the whole machine carries the resource's marker; every test with that marker runs
# in one xdist group, on one worker, one at a time. Every other test must not depend on order or worker.
SHARED_RESOURCE_GROUPS = {
    # Real sshd with PAM and useradd users (the session listing reads every sshd on the machine through
    # /proc), and Slurm's daemons with slurmdbd, MariaDB and munge and the users they account: both add and
    # remove the machine's users and read its processes, so they share one group and never run side by side.
    "realssh": "system-users",
    "realslurm": "system-users",
    # Network namespaces and iptables rules, made and removed as root.
    "netns": "netns",
}


def require(tools: tuple[str, ...], what: str, install: str) -> None:
    """Skip without the tools, except under CI=true, where a missing tool is a failure (.ci/run installs them)."""
    missing = [tool for tool in tools if not os.access(tool, os.X_OK)]
    if not missing and not os.path.isdir("/run/sshd"):
        try:
            os.makedirs("/run/sshd", mode=0o755)  # sshd's privilege-separation directory
        except PermissionError:
            missing.append("/run/sshd (create it as root)")
    if missing:
        reason = f"{what} need {', '.join(missing)} ({install})"
        if os.environ.get("CI") == "true":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def require_root_and_programs(programs: tuple[str, ...], what: str, install: str) -> None:
    """Like require, for tests that start system daemons (Slurm, MariaDB, munge): root and the programs."""
    missing = [program for program in programs if not os.access(program, os.X_OK)]
    if os.geteuid() != 0:
        missing.append("root (the daemons and useradd)")
    if missing:
        reason = f"{what} need {', '.join(missing)} ({install})"
        if os.environ.get("CI") == "true":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
