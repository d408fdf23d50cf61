"""Helpers for tests that run real programs (sshd, ssh, haproxy, the agent, moto's server) on loopback."""

from __future__ import annotations

import contextlib
import os
import pwd
import random
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

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


def _ephemeral_ports() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_port() -> int:
    """A loopback port free now and outside the kernel's ephemeral range: a daemon binds it a moment
    later, and in between any outgoing connection (slurmdbd to MariaDB, an SDK to moto) may be given an
    ephemeral port, so one picked from that range can be taken ("Address already in use")."""
    low, _high = _ephemeral_ports()
    candidates = list(range(10000, low)) if low > 11000 else []
    random.shuffle(candidates)
    for port in candidates[:200]:
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:  # no room below the ephemeral range: the kernel's pick
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


class MotoServer:
    """moto's in-process server on a loopback port, for a program of its own (the agent, install.sh)
    to reach. moto keeps its accounts in the process, whatever server shows them: it starts from
    none (another test on this worker may have left a bus or a cluster) and leaves none behind.
    ``restart`` after ``stop`` is the endpoint coming back with the account as it was."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._server = None

    def start(self) -> MotoServer:
        self._serve()
        self.reset()
        return self

    def _serve(self) -> None:
        from moto.server import ThreadedMotoServer

        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self._server.start()

    @property
    def serving(self) -> bool:
        return self._server is not None

    def reset(self) -> None:
        urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST"),
                               timeout=30).close()

    def stop(self) -> None:
        self._server.stop()
        self._server._server.server_close()  # stop() leaves the socket listening; the endpoint must be gone
        self._server = None

    def restart(self) -> None:
        self._serve()

    def close(self) -> None:
        """Leave no account behind, and stop serving."""
        if not self.serving:
            self._serve()
        self.reset()
        self.stop()

    def __enter__(self) -> MotoServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


SSHD, SSH, SSH_KEYGEN = "/usr/sbin/sshd", "/usr/bin/ssh", "/usr/bin/ssh-keygen"


def key_users(users: tuple[str, ...], folder: Path, what: str) -> Path:
    """The machine's users (made if missing) who log in with a key kept in ``folder`` (one a user)."""
    require_root_and_programs((SSHD, SSH, SSH_KEYGEN, "/usr/sbin/useradd"), what,
                              "apt-get install -y openssh-server openssh-client")
    require((SSHD, SSH, SSH_KEYGEN), what, "apt-get install -y openssh-server")
    for user in users:
        try:
            pwd.getpwnam(user)
        except KeyError:
            # --badname: Debian's NAME_REGEX refuses '@'; SSSD serves such names without useradd.
            subprocess.run(["useradd", "--badname", "-m", "-s", "/bin/sh", user], check=True)
        subprocess.run(["usermod", "-p", "*", user], check=True)  # no password, not locked: keys only
        key = folder / user
        subprocess.run([SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        account = pwd.getpwnam(user)
        ssh_dir = Path(account.pw_dir) / ".ssh"
        ssh_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        (ssh_dir / "authorized_keys").write_text((folder / f"{user}.pub").read_text())
        for path in (ssh_dir, ssh_dir / "authorized_keys"):
            os.chown(path, account.pw_uid, account.pw_gid)
    if not Path("/run/utmp").exists():  # systemd-tmpfiles makes it on a real node
        subprocess.run(["install", "-m664", "/dev/null", "/run/utmp"], check=True)
    return folder


@contextlib.contextmanager
def running_sshd(directory: Path, keys: Path, client: Callable[[list[str]], Any] | None = None) -> Iterator[Callable]:
    """A real sshd with PAM on a free loopback port, its host key, config and log in ``directory``.
    Yields ``ssh(user, *args)``: a client session of ``user`` (key from ``keys``), made by ``client``
    from the ssh command (default: a Popen with pipes); ``ssh.listener`` is sshd's pid. Every client
    still running is killed, then sshd stopped."""
    subprocess.run([SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-f", str(directory / "host_key")], check=True)
    port = free_port()
    # MaxSessions 10 is OpenSSH's default, written out: the channels a connection may carry.
    (directory / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {directory}/host_key\nPidFile {directory}/sshd.pid\n"
        "UsePAM yes\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nMaxSessions 10\nLogLevel VERBOSE\n"
        "Subsystem sftp internal-sftp\n")
    with (directory / "sshd.log").open("ab") as log:
        listener = subprocess.Popen([SSHD, "-D", "-e", "-f", str(directory / "sshd_config")], stdout=log, stderr=log,
                                    stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while subprocess.run(["bash", "-c", f"exec 3<>/dev/tcp/127.0.0.1/{port}"], capture_output=True).returncode:
        assert time.monotonic() < deadline and listener.poll() is None, "sshd did not start"
        time.sleep(0.05)
    processes: list[subprocess.Popen] = []
    start = client or (lambda command: subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                        stderr=subprocess.PIPE))

    def ssh(user: str, *args: str) -> Any:
        session = start([SSH, "-i", str(keys / user), "-p", str(port), "-o", "StrictHostKeyChecking=no",
                         "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes", "-o", "LogLevel=ERROR",
                         *args, "-l", user, "127.0.0.1"])
        processes.append(getattr(session, "process", session))
        return session

    ssh.listener = listener.pid
    try:
        yield ssh
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=5)
        listener.terminate()
        listener.wait(timeout=10)
