"""A real one-node Slurm with slurmdbd accounting, MariaDB and munge, all under one pytest directory.

No systemd: every daemon is started directly, runs as root (pytest's directory is one only root
may enter), listens on loopback on free ports, and is stopped by its pid file, never by name.
Slurm's commands find this cluster through SLURM_CONF (``env()``); the private munge socket is
named in slurm.conf (AuthInfo for slurmctld/slurmd, AccountingStoragePass for slurmdbd
connections) and slurmdbd.conf, so nothing under /etc or /run is used. The one exception is
slurmd's spool (see ``__init__``). Jobs are submitted as the test users with root's --uid.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import real_tools
from real_tools import free_port

MUNGED = "/usr/sbin/munged"
MUNGEKEY = "/usr/sbin/mungekey"
MARIADB_INSTALL_DB = "/usr/bin/mariadb-install-db"
MARIADBD = "/usr/sbin/mariadbd"
MARIADB = "/usr/bin/mariadb"
SLURMDBD = "/usr/sbin/slurmdbd"
SLURMCTLD = "/usr/sbin/slurmctld"
SLURMD = "/usr/sbin/slurmd"
SACCT = "/usr/bin/sacct"
SACCTMGR = "/usr/bin/sacctmgr"
SREPORT = "/usr/bin/sreport"
SBATCH = "/usr/bin/sbatch"
SINFO = "/usr/bin/sinfo"
TOOLS = (MUNGED, MUNGEKEY, MARIADB_INSTALL_DB, MARIADBD, MARIADB, SLURMDBD, SLURMCTLD, SLURMD, SACCT, SACCTMGR,
         SREPORT, SBATCH, SINFO, "/usr/sbin/useradd", "/usr/sbin/userdel")
INSTALL = "apt-get install -y slurm-wlm slurmdbd mariadb-server munge"

USERS = ("hpusage-alice", "hpusage-bob")
CLUSTER = "hpopsusage"
ACCOUNT = "research"
PARTITION = "batch"
GPUS = 2


class SlurmWithAccounting:
    def __init__(self, base: Path, enforce: str = "associations") -> None:
        self.base = Path(base)
        self.enforce = enforce
        self.host = socket.gethostname().split(".")[0]
        self.cpus = os.cpu_count() or 1
        self.ports = {name: free_port() for name in ("slurmctld", "slurmd", "slurmdbd", "mariadb")}
        for name in ("munge", "db", "etc", "etc-noacct", "state", "run", "log"):
            (self.base / name).mkdir(parents=True, exist_ok=True)
        # The one exception to "everything under base": slurmd's spool holds each job's script, which
        # the job's user executes, and pytest's directory is not reachable by other users.
        self.spool = Path(tempfile.mkdtemp(prefix="hpops-slurmd-spool-"))
        os.chmod(self.spool, 0o755)
        self.conf = self.base / "etc" / "slurm.conf"
        self.conf_without_accounting = self.base / "etc-noacct" / "slurm.conf"
        self.munge_socket = self.base / "munge" / "munge.sock"
        self.db_socket = self.base / "run" / "mysqld.sock"
        self.pid_files = {
            "munged": self.base / "munge" / "munged.pid",
            "mariadbd": self.base / "run" / "mysqld.pid",
            "slurmdbd": self.base / "run" / "slurmdbd.pid",
            "slurmctld": self.base / "run" / "slurmctld.pid",
            "slurmd": self.base / "run" / "slurmd.pid",
        }
        self.timings: dict[str, float] = {}
        self.sacct = SACCT

    # ------------------------------------------------------------------ commands

    def env(self, conf: Path | None = None) -> dict[str, str]:
        env = dict(os.environ, SLURM_CONF=str(conf or self.conf), TZ="UTC", SLURM_TIME_FORMAT="standard")
        env.pop("SACCT_FORMAT", None)
        return env

    def run(self, *command: str, conf: Path | None = None, check: bool = True,
            timeout: float = 30) -> subprocess.CompletedProcess:
        result = subprocess.run(list(command), capture_output=True, text=True, timeout=timeout,
                                env=self.env(conf))
        if check and result.returncode != 0:
            raise RuntimeError("{} exited {}: {}{}\n{}".format(
                " ".join(command), result.returncode, result.stdout, result.stderr, self.logs()))
        return result

    def logs(self) -> str:
        tails = []
        for log in sorted((self.base / "log").glob("*.log")):
            lines = log.read_text(errors="replace").splitlines()[-15:]
            tails.append("--- {}\n{}".format(log.name, "\n".join(lines)))
        return "\n".join(tails)

    def wait_for(self, what: str, condition, timeout: float = 30, interval: float = 0.2):
        deadline = time.monotonic() + timeout
        while True:
            value = condition()
            if value:
                return value
            if time.monotonic() > deadline:
                raise RuntimeError("timed out waiting for {}\n{}".format(what, self.logs()))
            time.sleep(interval)

    # ------------------------------------------------------------------ bring-up

    def start(self, users: tuple[str, ...]) -> None:
        began = time.monotonic()
        self._start_munge()
        self._start_mariadb()
        self._write_slurm_config()
        self._start_slurmdbd()
        self._add_associations(users)
        self._start_slurm()
        self.timings["up"] = time.monotonic() - began

    def _start_munge(self) -> None:
        key = self.base / "munge" / "munge.key"
        subprocess.run([MUNGEKEY, "--create", "--keyfile", str(key)], check=True, capture_output=True)
        os.chmod(key, 0o400)
        # --force: root, and a socket in a directory only root can enter (nobody else needs it here).
        subprocess.run([MUNGED, "--force", "--key-file", str(key), "--socket", str(self.munge_socket),
                        "--pid-file", str(self.pid_files["munged"]),
                        "--log-file", str(self.base / "log" / "munged.log"),
                        "--seed-file", str(self.base / "munge" / "munged.seed")], check=True, capture_output=True)
        self.wait_for("munge socket", self.munge_socket.exists)

    def _start_mariadb(self) -> None:
        datadir = self.base / "db"
        # --no-defaults first: nothing from /etc/mysql; TCP on loopback only, on a free port.
        subprocess.run([MARIADB_INSTALL_DB, "--no-defaults", "--user=root", "--datadir=" + str(datadir),
                        "--auth-root-authentication-method=socket", "--skip-test-db"],
                       check=True, capture_output=True, timeout=120)
        with open(self.base / "log" / "mariadb.log", "ab") as log:
            self.mariadbd = subprocess.Popen(
                [MARIADBD, "--no-defaults", "--user=root", "--datadir=" + str(datadir),
                 "--socket=" + str(self.db_socket), "--port={}".format(self.ports["mariadb"]),
                 "--bind-address=127.0.0.1", "--skip-name-resolve", "--pid-file=" + str(self.pid_files["mariadbd"]),
                 "--log-error=" + str(self.base / "log" / "mariadb.log"),
                 "--innodb-buffer-pool-size=32M", "--innodb-log-file-size=8M"],
                stdout=log, stderr=log, start_new_session=True)
        self.wait_for("mariadb", lambda: self.db_socket.exists() and self.pid_files["mariadbd"].exists(), timeout=60)
        self.db_password = secrets.token_hex(12)
        sql = ("CREATE DATABASE slurm_acct_db; "
               "CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY '{0}'; "
               "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1'; FLUSH PRIVILEGES;").format(self.db_password)
        subprocess.run([MARIADB, "--no-defaults", "--socket=" + str(self.db_socket), "-uroot", "-e", sql],
                       check=True, capture_output=True, timeout=30)

    def slurm_conf_text(self, accounting: bool) -> str:
        lines = [
            "ClusterName=" + CLUSTER,
            "SlurmctldHost={}(127.0.0.1)".format(self.host),
            "SlurmctldPort={}".format(self.ports["slurmctld"]),
            "SlurmdPort={}".format(self.ports["slurmd"]),
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            "AuthInfo=socket={}".format(self.munge_socket),
            "StateSaveLocation={}".format(self.base / "state"),
            "SlurmdSpoolDir={}".format(self.spool),
            "SlurmctldPidFile={}".format(self.pid_files["slurmctld"]),
            "SlurmdPidFile={}".format(self.pid_files["slurmd"]),
            "SlurmctldLogFile={}".format(self.base / "log" / "slurmctld.log"),
            "SlurmdLogFile={}".format(self.base / "log" / "slurmd.log"),
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "MpiDefault=none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "ReturnToService=2",
            "SchedulerParameters=sched_interval=1",
            "GresTypes=gpu",
            "NodeName={} NodeAddr=127.0.0.1 CPUs={} RealMemory=1000 Gres=gpu:{} State=UNKNOWN".format(
                self.host, self.cpus, GPUS),
            "PartitionName={} Nodes={} Default=YES MaxTime=INFINITE State=UP".format(PARTITION, self.host),
        ]
        if accounting:
            lines += [
                "AccountingStorageType=accounting_storage/slurmdbd",
                "AccountingStorageHost=127.0.0.1",
                "AccountingStoragePort={}".format(self.ports["slurmdbd"]),
                # For slurmdbd connections the munge socket is named here, not by AuthInfo.
                "AccountingStoragePass={}".format(self.munge_socket),
                # GPUs are only in AllocTRES when accounting tracks them.
                "AccountingStorageTRES=gres/gpu",
                "AccountingStorageEnforce=" + self.enforce,
            ]
        else:
            lines.append("AccountingStorageType=accounting_storage/none")
        return "\n".join(lines) + "\n"

    def _write_slurm_config(self) -> None:
        self.conf.write_text(self.slurm_conf_text(accounting=True))
        self.conf_without_accounting.write_text(self.slurm_conf_text(accounting=False))
        # Fake GPUs: character devices that are /dev/null underneath (slurmd only stats them).
        for index in range(GPUS):
            device = self.base / "etc" / "gpu{}".format(index)
            try:
                os.mknod(device, stat.S_IFCHR | 0o600, os.makedev(1, 3))
            except OSError:  # no CAP_MKNOD: a plain file still counts, with an error in slurmd's log
                device.touch()
        gres = "NodeName={} Name=gpu File={}/gpu[0-{}]\n".format(self.host, self.base / "etc", GPUS - 1)
        for directory in ("etc", "etc-noacct"):
            (self.base / directory / "gres.conf").write_text(gres)
        dbd = self.base / "etc" / "slurmdbd.conf"
        dbd.write_text("\n".join([
            "AuthType=auth/munge",
            "AuthInfo=socket={}".format(self.munge_socket),
            "DbdHost=localhost",
            "DbdAddr=127.0.0.1",
            "DbdPort={}".format(self.ports["slurmdbd"]),
            "SlurmUser=root",
            "PidFile={}".format(self.pid_files["slurmdbd"]),
            "LogFile={}".format(self.base / "log" / "slurmdbd.log"),
            "StorageType=accounting_storage/mysql",
            "StorageHost=127.0.0.1",
            "StoragePort={}".format(self.ports["mariadb"]),
            "StorageLoc=slurm_acct_db",
            "StorageUser=slurm",
            "StoragePass={}".format(self.db_password),
        ]) + "\n")
        os.chmod(dbd, 0o600)  # slurmdbd refuses a config others can read (it holds the password)

    def _start_slurmdbd(self) -> None:
        self.run(SLURMDBD)
        self.wait_for("slurmdbd", lambda: self.run(SACCTMGR, "-n", "list", "cluster", check=False).returncode == 0)

    def _add_associations(self, users: tuple[str, ...]) -> None:
        self.run(SACCTMGR, "-i", "add", "cluster", CLUSTER)
        self.run(SACCTMGR, "-i", "add", "account", ACCOUNT, "Cluster=" + CLUSTER)
        for user in users:
            self.run(SACCTMGR, "-i", "add", "user", user, "Account=" + ACCOUNT, "Cluster=" + CLUSTER)

    def _start_slurm(self) -> None:
        self.run(SLURMCTLD, "-c")
        self.run(SLURMD)

        def idle() -> bool:
            result = self.run(SINFO, "-h", "-o", "%T", check=False)
            return result.returncode == 0 and result.stdout.strip() == "idle"

        self.wait_for("the node to be idle", idle, timeout=30)

    # ------------------------------------------------------------------ jobs and accounting

    def submit(self, user: str, *options: str) -> str:
        """Submit as `user` (root's --uid: the user needs no access to this directory)."""
        result = self.run(SBATCH, "--parsable", "--uid=" + user, "--chdir=/tmp", "--output=/dev/null",
                          "--partition=" + PARTITION, *options)
        return result.stdout.strip().split(";")[0]

    def sacct_lines(self, start: str, *extra: str, conf: Path | None = None) -> list[list[str]]:
        result = self.run(SACCT, "-a", "-X", "--parsable2", "--noheader", "-S", start, *extra, conf=conf)
        return [line.split("|") for line in result.stdout.splitlines() if line.strip()]

    def rollup(self, start: str, end: str) -> None:
        """sreport shows nothing before slurmdbd's hourly rollup; force it (end must pass the current hour)."""
        self.run(SACCTMGR, "-i", "rollup", start, end)

    def sreport_used_by_user(self, start: str, tres: str) -> dict[str, int]:
        """Per-user allocated seconds of one TRES (cpu, node, gres/gpu) from sreport."""
        result = self.run(SREPORT, "-n", "-P", "-t", "Seconds", "-T", tres, "cluster", "AccountUtilizationByUser",
                          "start=" + start, "end=now", "format=Login,Used")
        used = {}
        for line in result.stdout.splitlines():
            login, _, value = line.partition("|")
            if login:
                used[login] = int(value)
        return used

    # ------------------------------------------------------------------ teardown

    def stop(self, name: str, timeout: float = 20) -> None:
        path = self.pid_files[name]
        try:
            pid = int(path.read_text().strip())
        except (OSError, ValueError):
            return
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            if name == "mariadbd":  # our child (the others daemonize): reaped, or it lingers as a zombie
                self.mariadbd.poll()
            time.sleep(0.1)
        os.kill(pid, signal.SIGKILL)

    def stop_all(self) -> None:
        began = time.monotonic()
        for name in ("slurmd", "slurmctld", "slurmdbd", "mariadbd", "munged"):
            try:
                self.stop(name)
            except OSError:
                pass
        shutil.rmtree(self.spool, ignore_errors=True)
        self.timings["down"] = time.monotonic() - began


def add_user(name: str) -> bool:
    """useradd without a home; False when the user already exists (then it is not ours to delete)."""
    result = subprocess.run(["/usr/sbin/useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                            capture_output=True, text=True)
    if result.returncode == 9:  # exists
        return False
    if result.returncode != 0:
        raise RuntimeError("useradd {}: {}".format(name, result.stderr.strip()))
    return True


@contextlib.contextmanager
def running_slurm(base: Path, users: tuple[str, ...], what: str, tools: tuple[str, ...] = TOOLS,
                  enforce: str = "associations"):
    """A Slurm with accounting up with `users` associated; torn down by pid files, users we made deleted."""
    real_tools.require_root_and_programs(tools, what, INSTALL)
    created = [user for user in users if add_user(user)]
    cluster = SlurmWithAccounting(base, enforce=enforce)
    try:
        cluster.start(users)
        yield cluster
    finally:
        cluster.stop_all()
        for user in created:
            subprocess.run(["/usr/sbin/userdel", user], capture_output=True)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """One Slurm with accounting for the module's tests, up with USERS associated."""
    with running_slurm(tmp_path_factory.mktemp("slurm"), USERS, "real Slurm accounting tests") as cluster:
        yield cluster
