"""The node agent as its systemd unit runs it: inside the file-system sandbox the unit file describes.

The node is laid out as a real one is: the lifecycle bundle is built and its install.sh run into a
test root (``--root``, ``--no-systemd``), which writes the agent, its config and the unit. Then the
*installed* unit file is read: its ExecStart and Environment are run (the bundle's code, from the
node's /opt/hpops-node-agent, not the test's), inside the sandbox its settings describe
(ProtectSystem, ReadWritePaths, StateDirectory, ProtectHome, PrivateTmp, UMask...), rebuilt by
tests/node/unit_sandbox.py in a private mount namespace with the node's paths under the test root.
Every feature is on, on every role that runs the service:

* login: host keys from the cluster secret, maxlogins, per-user slice caps (written to
  /etc/systemd/system, then a daemon-reload whose stand-in reads them), sshd keepalives, the login
  slot message (/etc/profile.d), a real SSH session ended by an end-sessions instruction fetched
  through NodeChannel, the IMDS probe run as nobody with the node's interpreter (/usr/bin/python3,
  the bundle's lib/ vendored as on a node);
* controller: Slurm usage (sacct) and budget holds (sacctmgr, squeue, scontrol stand-ins that keep
  the hold), the holds list fetched through NodeChannel, the same IMDS probe.

Each feature's write is asserted where the node keeps it, so a write outside the unit's
ReadWritePaths fails the test ("Read-only file system", as on a node). Every hardening setting the
unit sets is rebuilt (NoNewPrivileges, RestrictAddressFamilies... with setpriv and a seccomp filter)
and checked from inside; a setting not rebuilt fails the test naming it. Settings another change
adds to the unit (a ReadWritePaths entry, a StateDirectory) are covered as they land: nothing here
lists the unit's paths, and a ReadWritePaths entry install.sh does not create stops the sandbox as
it stops systemd (226/NAMESPACE). The IMDS lockdown unit is run as systemd would, in a network
namespace of its own.

Needs root (mount namespaces), unshare, setpriv, python3-seccomp, sshd and ssh-keygen; skips without them, except under CI=true.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import channel_stand_in
import real_tools
from real_tools import free_port
from test_agent_real_process import BUS, CLUSTER, CREDENTIALS, REGION, SSH_KEYGEN, SSHD, LoginNode, Stack, stop_process
from test_imds_guard import namespace, reaches  # noqa: F401 (the fixture, used by name)
from unit_sandbox import Sandbox, UnsupportedSetting, service_settings

from hpops_core.budget_guard.hold_reports import parse_holds_event
from hpops_core.host_identity import keys
from hpops_core.node_channel import contract, user_holds
from hpops_node_agent import bundle as bundle_module
from hpops_node_agent import ssh_sessions

pytestmark = pytest.mark.realssh

UNIT = Path(__file__).resolve().parents[2] / "node/hpops_node_agent/lifecycle/hpops-node-agent.service"
# The test's interpreter (the venv) and checkout stand in for the node's /usr/bin/python3: kept visible if
# they live under a /tmp the unit's PrivateTmp replaces (a CI clone may).
HOST_PATHS = tuple(sorted({sys.prefix, str(Path(__file__).resolve().parents[2])}))
LOGIN_ID, CONTROLLER_ID = "i-0a1b2c3d4e5f60730", "i-0a1b2c3d4e5f60731"
# What an Ubuntu node has before the agent is installed; install.sh makes the rest.
NODE_DIRECTORIES = ("etc/ssh", "etc/security/limits.d", "etc/systemd/system", "var/backups", "var/lib", "run")
READ_ONLY_ERRORS = ("Read-only file system", "Errno 30", "Permission denied")
# The node's interpreter, which any user can run (the IMDS probe runs it as nobody); the venv's, under
# root's home, is not. Its packages are vendored into the bundle's lib/ as the bundle does for a node.
NODE_PYTHON = "/usr/bin/python3"
VENDORED = ("boto3", "botocore", "s3transfer", "jmespath", "dateutil", "urllib3", "six")
SANDBOX_USER = "hpt-sandbox"


@pytest.fixture(scope="module")
def required():
    real_tools.require_root_and_programs(("/usr/bin/unshare", "/usr/bin/mount"), "unit sandbox tests",
                                         "apt-get install -y util-linux")
    real_tools.require((SSHD, SSH_KEYGEN), "unit sandbox tests", "apt-get install -y openssh-server")
    real_tools.require(("/usr/bin/setpriv", NODE_PYTHON), "unit sandbox tests", "apt-get install -y util-linux python3")
    if subprocess.run([NODE_PYTHON, "-c", "import seccomp"], capture_output=True).returncode:
        real_tools.require(("python3-seccomp: import seccomp",), "unit sandbox tests (the unit's system-call settings)",
                           "apt-get install -y python3-seccomp")


@pytest.fixture(scope="module")
def stack(required):
    stack = Stack(free_port())
    try:
        yield stack
    finally:
        stack.close()  # moto keeps its accounts per process: leave none to the next module's stack


@pytest.fixture
def node_root():
    # Not under /tmp or /var/tmp: PrivateTmp= gives the agent its own, which would hide the node.
    root = Path(tempfile.mkdtemp(prefix="hpops-unit-sandbox-", dir="/var/lib"))
    for directory in NODE_DIRECTORIES:
        (root / directory).mkdir(parents=True, exist_ok=True)
    (root / "proc").symlink_to("/proc")  # the session listing reads the node's processes
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def install(root: Path, stack: Stack, agent: dict, work: Path) -> Path:
    """Build the lifecycle bundle with this agent.json and run its install.sh into ``root``; the installed unit."""
    lifecycle = work / "lifecycle"
    lifecycle.mkdir()
    (lifecycle / "provisioning_parameters.json").write_text(json.dumps({
        "version": "1.0.0", "workload_manager": "slurm", "controller_group": "controller-machine",
        "login_group": "login-group", "worker_groups": [{"instance_group_name": "gpu", "partition_name": "p"}]}))
    bundle = bundle_module.build_bundle(lifecycle, CLUSTER, REGION, BUS, vendor=False)
    vendor_from_this_environment(bundle / "lib")
    (bundle / "agent.json").write_text(json.dumps(
        json.loads((bundle / "agent.json").read_text()) | agent | {"pollSeconds": 1}))
    result = subprocess.run(["bash", str(bundle / "install.sh"), "--root", str(root), "--no-systemd"],
                            capture_output=True, text=True, timeout=120, env=agent_env(stack), cwd=lifecycle)
    unit = root / "etc/systemd/system/hpops-node-agent.service"
    assert result.returncode == 0 and unit.exists(), result.stdout + result.stderr
    return unit


def vendor_from_this_environment(lib: Path) -> None:
    """What bundle.vendor_boto3 puts in lib/ (pip, from PyPI), copied from this environment instead."""
    lib.mkdir(exist_ok=True)
    for name in VENDORED:
        module = Path(importlib.import_module(name).__file__)
        if module.name == "__init__.py":
            shutil.copytree(module.parent, lib / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(module, lib / module.name)


def agent_env(stack: Stack) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("AWS_", "PYTHON"))}
    env.update(CREDENTIALS, AWS_ENDPOINT_URL=stack.endpoint, AWS_DEFAULT_REGION=REGION, HPOPS_PYTHON=NODE_PYTHON)
    if getattr(stack, "channel", None) is not None:  # NodeChannel (host keys, end-sessions) on loopback
        env["AWS_ENDPOINT_URL_LAMBDA"] = stack.channel.endpoint
    return env


@pytest.fixture
def channel(stack):
    """NodeChannel for the agent: its enrolled key fetches the host keys and its end-sessions list."""
    def read(item: str, instance: str) -> dict | None:
        if item == "hostKeys":
            return {"value": stack.secrets.get_secret_value(SecretId=stack.secret_arn)["SecretString"], "version": "v"}
        name = (user_holds.user_holds_parameter(CLUSTER) if item == "userHolds"
                else contract.end_sessions_parameter(CLUSTER, instance))
        parameter = stack.ssm.get_parameter(Name=name)["Parameter"]
        return {"value": parameter["Value"], "version": parameter["Version"]}

    stack.channel = channel_stand_in.ChannelStandIn(free_port(), CLUSTER, read)
    try:
        yield stack.channel
    finally:
        stack.channel.close()
        stack.channel = None


def unit_command(root: Path, unit: Path) -> tuple[list[str], dict[str, str]]:
    """The installed unit's ExecStart and Environment, their node paths under the test root."""
    def rebased(word: str) -> str:
        return str(root) + word if word.startswith("/etc/") or word.startswith("/opt/") else word

    settings = service_settings(unit.read_text())
    [exec_start] = settings["ExecStart"]
    argv = [rebased(word) for word in exec_start.split()]
    env = {}
    for assignment in settings.get("Environment", []):
        name, value = assignment.split("=", 1)
        env[name] = ":".join(rebased(part) for part in value.split(":")) if name == "PYTHONPATH" else value
    return argv, env


def run_in_sandbox(root: Path, unit: Path, stack: Stack, until, timeout: float = 60) -> tuple[str, int | None]:
    argv, unit_env = unit_command(root, unit)
    env = agent_env(stack) | unit_env
    log = Path(tempfile.mkstemp(prefix="hpops-sandboxed-agent-")[1])
    with log.open("wb") as out:
        process = subprocess.Popen(Sandbox.from_unit(unit.read_text()).command(root, argv, HOST_PATHS), stdin=subprocess.DEVNULL,
                                   stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and process.poll() is None and not until(process):
            time.sleep(0.3)
        code = process.poll()
    finally:
        stop_process(process)
        output = log.read_text(errors="replace")
        log.unlink()
    return output, code


def identity(role: str, instance_id: str) -> dict:
    return {"role": role, "ip": "127.0.0.1", "instanceId": instance_id}


def test_the_sandbox_is_read_from_the_unit_file():
    sandbox = Sandbox.from_unit(UNIT.read_text())
    assert "/" in sandbox.read_only and sandbox.private_tmp  # ProtectSystem=strict, PrivateTmp=yes
    assert ("/var/lib/hpops-node-agent", False) in sandbox.writable  # StateDirectory=
    with pytest.raises(UnsupportedSetting, match="BindPaths"):
        Sandbox.from_unit(UNIT.read_text().replace("[Service]\n", "[Service]\nBindPaths=/srv\n"))


def test_a_write_the_unit_forbids_fails_in_the_sandbox(required, node_root):
    sandbox = Sandbox.from_unit(UNIT.read_text())
    missing = subprocess.run(sandbox.command(node_root, ["true"], HOST_PATHS), capture_output=True, text=True, timeout=60)
    assert missing.returncode == 226 and "226/NAMESPACE" in missing.stderr  # as systemd: a writable path is missing
    for path, _ in sandbox.writable:
        (node_root / path.lstrip("/")).mkdir(parents=True, exist_ok=True)  # what install.sh makes
    probe = ("import sys\nfor path in sys.argv[1:]:\n    try:\n        open(path, 'w').close(); print('wrote', path)\n"
             "    except OSError as error:\n        print('refused', path, error.strerror)\n")
    allowed = node_root / "etc/ssh/probe"
    forbidden = [node_root / "etc/probe", node_root / "usr-probe", Path("/etc/hpops-unit-sandbox-probe")]
    result = subprocess.run(sandbox.command(node_root, [sys.executable, "-c", probe, str(allowed),
                                                        *map(str, forbidden)], HOST_PATHS),
                            capture_output=True, text=True, timeout=60)
    assert f"wrote {allowed}" in result.stdout, result.stdout + result.stderr
    for path in forbidden:
        assert f"refused {path} Read-only file system" in result.stdout, result.stdout + result.stderr
        assert not path.exists()
    # PrivateDevices=yes: the basic pseudo-devices only, no disks.
    devices = subprocess.run(sandbox.command(node_root, ["ls", "/dev"], HOST_PATHS), capture_output=True, text=True, timeout=60)
    assert set(devices.stdout.split()) == {"full", "null", "pts", "random", "shm", "tty", "urandom", "zero"}


# One check per hardening setting, run inside the sandbox: "SETTING ok" when the setting holds.
DIRECTIVE_PROBE = r"""
import ctypes, os, socket
libc = ctypes.CDLL(None, use_errno=True)
def denied(call, *args):
    return call(*args) == -1 and ctypes.get_errno() == 1
def says(name, ok):
    print(name, "ok" if ok else "NOT APPLIED")
status = open("/proc/self/status").read()
says("NoNewPrivileges", "NoNewPrivs:\t1" in status)
bounding = int(next(l.split()[1] for l in status.splitlines() if l.startswith("CapBnd:")), 16)
try:
    socket.socket(socket.AF_PACKET, socket.SOCK_RAW).close(); packet = False
except OSError as error:
    packet = error.errno == 97
says("RestrictAddressFamilies", packet and socket.socket(socket.AF_INET) is not None)
says("RestrictNamespaces", denied(libc.unshare, 0x04000000) and denied(libc.unshare, 0x40000000))
says("LockPersonality", denied(libc.personality, 8))
open("/tmp/suid", "w").close()
try:
    os.chmod("/tmp/suid", 0o4755); suid = False
except PermissionError:
    suid = True
says("RestrictSUIDSGID", suid)
try:
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1)); realtime = False
except PermissionError:
    realtime = True
says("RestrictRealtime", realtime)
says("ProtectHostname", denied(libc.sethostname, b"x", 1))
timespec = (ctypes.c_long * 2)(0, 0)
says("ProtectClock", denied(libc.clock_settime, 0, timespec) and not bounding & (1 << 25))
says("ProtectKernelModules", denied(libc.delete_module, b"x", 0) and not bounding & (1 << 16)
     and not os.access("/usr/lib/modules/.", os.R_OK | os.X_OK) if os.path.isdir("/usr/lib/modules") else
     denied(libc.delete_module, b"x", 0) and not bounding & (1 << 16))
says("ProtectKernelLogs", denied(libc.klogctl, 3, None, 0) and not bounding & (1 << 34))
"""
HARDENING = ("NoNewPrivileges", "RestrictAddressFamilies", "RestrictNamespaces", "LockPersonality", "RestrictSUIDSGID",
             "RestrictRealtime", "ProtectHostname", "ProtectClock", "ProtectKernelModules", "ProtectKernelLogs")


def test_every_hardening_setting_the_unit_sets_holds_in_the_sandbox(required, node_root):
    text = UNIT.read_text()
    sandbox = Sandbox.from_unit(text)
    for path, _ in sandbox.writable:
        (node_root / path.lstrip("/")).mkdir(parents=True, exist_ok=True)
    result = subprocess.run(sandbox.command(node_root, [sys.executable, "-c", DIRECTIVE_PROBE], HOST_PATHS),
                            capture_output=True, text=True, timeout=60)
    said = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    set_by_unit = [name for name in HARDENING if service_settings(text).get(name)]
    assert set_by_unit and {name: said.get(name) for name in set_by_unit} == dict.fromkeys(set_by_unit, "ok"), \
        result.stdout + result.stderr
    # Without the settings, the same checks say so: they test the settings, not the machine.
    bare = Sandbox.from_unit("[Service]\nProtectSystem=strict\nReadWritePaths=/etc/ssh\n")
    loose = subprocess.run(bare.command(node_root, [sys.executable, "-c", DIRECTIVE_PROBE], HOST_PATHS),
                           capture_output=True, text=True, timeout=60)
    assert "NoNewPrivileges NOT APPLIED" in loose.stdout and "RestrictNamespaces NOT APPLIED" in loose.stdout, \
        loose.stdout + loose.stderr


@pytest.mark.parametrize("setting", ["SystemCallFilter=@system-service", "MemoryDenyWriteExecute=yes",
                                     "CapabilityBoundingSet=CAP_NET_ADMIN", "RestrictAddressFamilies=~AF_PACKET"])
def test_a_sandbox_setting_not_rebuilt_fails_naming_it(setting):
    with pytest.raises(UnsupportedSetting, match=setting.split("=")[0]):
        Sandbox.from_unit(UNIT.read_text().replace("[Service]\n", f"[Service]\n{setting}\n"))


DAEMON_RELOAD_STAND_IN = """#!/bin/sh
# Stand-in for systemctl daemon-reload (no systemd here): reads the caps drop-in as systemd would, into the
# service's private /tmp, where the test finds it through /proc/PID/root.
cat {root}/etc/systemd/system/user-.slice.d/90-hpops-caps.conf > /tmp/daemon-reloaded
"""


@pytest.fixture
def sandbox_user(tmp_path):
    """A user with a key, to open a real SSH session the agent ends."""
    created = subprocess.run(["useradd", "-m", "-s", "/bin/sh", SANDBOX_USER], capture_output=True).returncode == 0
    subprocess.run(["usermod", "-p", "*", SANDBOX_USER], check=True)
    key = tmp_path / "user_key"
    subprocess.run([SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    account = pwd.getpwnam(SANDBOX_USER)
    ssh_dir = Path(account.pw_dir) / ".ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    (ssh_dir / "authorized_keys").write_text(Path(f"{key}.pub").read_text())
    for path in (ssh_dir, ssh_dir / "authorized_keys"):
        os.chown(path, account.pw_uid, account.pw_gid)
    try:
        yield key
    finally:
        if created:
            subprocess.run(["userdel", "-r", SANDBOX_USER], capture_output=True)


def test_login_node_every_feature_on_under_the_unit(node_root, stack, channel, sandbox_user, tmp_path):
    bundle = keys.generate_bundle()
    node = LoginNode(node_root, free_port())
    shutil.rmtree(node.ssh_dir)
    shutil.rmtree(node_root / "run")
    node.prepare(keys.generate_bundle())
    node.start()
    reload_stand_in = node_root / "opt/stand-in/daemon-reload"
    reload_stand_in.parent.mkdir(parents=True)
    reload_stand_in.write_text(DAEMON_RELOAD_STAND_IN.format(root=node_root))
    reload_stand_in.chmod(0o755)
    # A real SSH session of a user, opened before the agent runs: the stack picks it to end.
    client = subprocess.Popen(["/usr/bin/ssh", "-N", "-i", str(sandbox_user), "-p", str(node.port),
                               "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                               "-o", "BatchMode=yes", "-o", "LogLevel=ERROR", f"{SANDBOX_USER}@127.0.0.1"],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    loaded: dict[str, str] = {}
    try:
        deadline = time.monotonic() + 15
        while not (mine := [s for s in ssh_sessions.list_sessions(listener_pids=[node.process.pid])
                            if s.user == SANDBOX_USER]):
            assert time.monotonic() < deadline and client.poll() is None, client.stderr.read()
            time.sleep(0.1)
        [session] = mine
        unit = install(node_root, stack, identity("login", LOGIN_ID) | {
            "sshdCmd": SSHD, "reloadCmd": f"kill -HUP {node.process.pid}", "sshKeygenCmd": SSH_KEYGEN,
            "daemonReloadCmd": str(reload_stand_in), "nodeChannel": channel_stand_in.FUNCTION}, tmp_path)
        # Published after install.sh's first cycle: what follows is the service's work, in its sandbox.
        stack.publish_keys(bundle, "s1")
        stack.put(contract.login_limits_parameter(CLUSTER), {
            "format": contract.LOGIN_LIMITS_FORMAT, "version": "s1",
            "limits": {"default": 2, "overrides": {"nobody": 4}, "exempt": ["daemon"]}})
        stack.put(contract.user_caps_parameter(CLUSTER), {
            "format": contract.USER_CAPS_FORMAT, "caps": {"default": {"cpuQuota": "200%", "memoryMax": "8G",
                                                                      "tasksMax": 512},
                                                          "overrides": {"nobody": {"memoryMax": "16G"}},
                                                          "exempt": ["daemon"]}})
        stack.put(contract.ssh_keepalive_parameter(CLUSTER), {"format": "hpops.node.ssh-keepalive.v1",
                                                              "listenerIdleTimeoutSeconds": 350})
        stack.put(contract.login_slots_parameter(CLUSTER), {"format": "hpops.node.login-slots.v1",
                                                            "host": "login.example.edu", "portBase": 2200,
                                                            "slots": {"127.0.0.1": 3}})
        # A handle that names no process (the agent answers "gone"), and the user's real session.
        stale = f"{Path('/proc/sys/kernel/random/boot_id').read_text().strip().replace('-', '')[:8]}:4194000:1"
        end = contract.end_sessions_parameter(CLUSTER, LOGIN_ID)
        version = stack.put(end, {"format": contract.END_SESSIONS_FORMAT, "sessions": [
            {"handle": stale, "user": "nobody"}, {"handle": session.handle, "user": SANDBOX_USER}]})
        stack.put(contract.instruction_marker_parameter(end), {"format": contract.INSTRUCTION_MARKER_FORMAT,
                                                               "version": version})
        seen = len(stack.drain())

        def reported(process=None):
            if process is not None and not loaded:
                with contextlib.suppress(OSError):
                    loaded["caps"] = Path(f"/proc/{process.pid}/root/tmp/daemon-reloaded").read_text()
            return [e["detail"] for e in stack.drain()[seen:] if e["detail"].get("instanceId") == LOGIN_ID
                    and "userCaps" in e["detail"] and len((e["detail"].get("sessions") or {}).get("ended", [])) == 2
                    and "sshKeepalive" in e["detail"]] if loaded or process is None else []

        output, code = run_in_sandbox(node_root, unit, stack, reported)
        client_exit = client.wait(timeout=10)
    finally:
        stop_process(node.process)
        if client.poll() is None:
            client.kill()

    assert code is None, f"the agent exited {code}:\n{output[-3000:]}"  # a service keeps running
    [report, *_] = reported() or [None]
    assert report is not None, output[-3000:]
    text = json.dumps(report) + output
    assert not [error for error in READ_ONLY_ERRORS if error in text], output[-3000:]
    assert report["hostIdentity"]["result"] == "changed", report["hostIdentity"]
    assert report["loginLimits"]["result"] == "changed", report["loginLimits"]
    assert report["userCaps"]["result"] == "changed", report["userCaps"]
    assert report["sshKeepalive"]["result"] == "changed", report["sshKeepalive"]
    ended = {e["handle"]: e["result"] for e in report["sessions"]["ended"]}
    assert ended == {stale: "gone", session.handle: "ended"}, report["sessions"]
    assert client_exit == 255  # the user's client saw the connection closed by the node
    # systemd (its stand-in) was told, from inside the sandbox, and read the caps the agent wrote.
    assert "MemoryMax=8G" in loaded.get("caps", ""), loaded
    # The IMDS probe ran as nobody, with the node's interpreter: an answer, not "the probe did not run".
    assert report["imds"]["nonRoot"] in ("reachable", "blocked", "no-imds"), report["imds"]
    # The kernel's pressure, read inside the sandbox (ProtectKernelTunables leaves /proc/pressure readable).
    if Path("/proc/pressure/cpu").exists():
        assert {"cpuSome60", "memorySome60", "memoryFull60", "load1", "cpus"} <= set(report["load"]), report["load"]
    else:
        assert "no /proc/pressure" in report["load"]["reason"]
    assert "# BEGIN hpops keepalive" in (node_root / "etc/ssh/sshd_config").read_text()
    assert "you are on login-03" in (node_root / "etc/profile.d/hpops-login-slot.sh").read_text()
    # What the unit let it write, where a node keeps it.
    assert (node_root / "etc/systemd/system/user-.slice.d/90-hpops-caps.conf").read_text().count("MemoryMax=8G") == 1
    assert "nobody  hard  maxlogins  4" in (node_root / "etc/security/limits.d/90-hpops-maxlogins.conf").read_text()
    assert (node_root / "etc/ssh/ssh_host_ed25519_key").read_text() == bundle.ed25519.private_openssh
    assert (node_root / "var/lib/hpops-node-agent/state.json").exists()


SLURM_STUB = """#!/bin/sh
# Stand-in for {name}: a controller with one user association (hpt-held, inheriting account research's
# QOS), whose hold lives in the service's private /tmp, answered as sacctmgr/scontrol/squeue answer.
state=/tmp/slurm-stand-in
mkdir -p "$state"
case "$*" in
  *"show config"*) echo "ClusterName = sandbox"; echo "AccountingStorageEnforce = associations,limits,qos,safe";;
  *"show qos"*) [ ! -f "$state/qos" ] || echo "hpopshold|0|0|OverPartQOS|$(cat "$state/qos")";;
  *"add qos"*|*"modify qos"*)
    for word in "$@"; do case "$word" in Description=*) printf %s "${{word#Description=}}" > "$state/qos";; esac; done;;
  *"show assoc"*)
    if [ -f "$state/held" ]; then qos=hpopshold; default=hpopshold
    elif [ -n "${{*##*WOPLimits*}}" ]; then qos=normal; default=normal
    else qos=; default=; fi
    case "$*" in *qos=hpopshold*) [ -f "$state/held" ] || exit 0;; esac
    echo "7|1|sandbox|research|hpt-held||$qos|$default||";;
  *"modify user"*QOS=hpopshold*) touch "$state/held"; echo " Modified user associations...";;
  *"modify user"*) rm -f "$state/held"; echo " Modified user associations...";;
esac
exit 0
"""


def test_controller_node_every_feature_on_under_the_unit(node_root, stack, channel, tmp_path):
    slurm = node_root / "opt/slurm/bin"
    slurm.mkdir(parents=True)
    for name in ("sacct", "sacctmgr", "scontrol", "squeue", "scancel", "sinfo"):
        (slurm / name).write_text(SLURM_STUB.format(name=name))
        (slurm / name).chmod(0o755)
    unit = install(node_root, stack, identity("controller", CONTROLLER_ID) | {
        "usageSeconds": 60, "sacctCmd": str(slurm / "sacct"), "nodeChannel": channel_stand_in.FUNCTION}, tmp_path)
    month = time.strftime("%Y-%m", time.gmtime())
    expires = time.strftime("%Y-%m-%dT%H:00:00Z", time.gmtime(time.time() + 86400))
    # The holds list as the stack keeps it: private, fetched through NodeChannel when its marker moves.
    holds_parameter = user_holds.user_holds_parameter(CLUSTER)
    version = stack.put(holds_parameter,
                        user_holds.canonical_json(user_holds.desired_document(month, expires, False, ["hpt-held"])))
    stack.put(contract.instruction_marker_parameter(holds_parameter),
              {"format": contract.INSTRUCTION_MARKER_FORMAT, "version": version})
    seen = len(stack.drain())
    state = node_root / "var/lib/hpops-node-agent"

    def usage_sent():
        return [e["detail"] for e in stack.drain()[seen:] if e["detail-type"] == contract.USAGE_DETAIL_TYPE]

    def reported(process=None):
        # Both reports sent and their state written (the agent writes its state after it sends). The usage
        # state advances only past a final window: none is final in the first USAGE_SETTLE_SECONDS of an hour.
        types = {e["detail-type"] for e in stack.drain()[seen:]}
        written = {p.name for p in state.iterdir()} if state.is_dir() else set()
        wanted = {"slurm-holds.json"} | ({"usage-state.json"} if any(d["final"] for d in usage_sent()) else set())
        held = [e for e in stack.drain()[seen:] if e["detail-type"] == user_holds.HOLDS_DETAIL_TYPE
                and e["detail"]["users"]]
        return {contract.USAGE_DETAIL_TYPE} <= types and held and wanted <= written

    output, code = run_in_sandbox(node_root, unit, stack, reported)

    assert code is None, f"the agent exited {code}:\n{output[-3000:]}"
    assert reported(), output[-3000:]
    assert not [error for error in READ_ONLY_ERRORS if error in output], output[-3000:]
    assert "crashed" not in output and "holds-state-unreadable" not in output, output[-3000:]
    written = {p.name for p in state.iterdir() if p.suffix == ".json"}
    assert "slurm-holds.json" in written
    assert "usage-state.json" in written or not any(d["final"] for d in usage_sent())
    holds = [e["detail"] for e in stack.drain()[seen:] if e["detail-type"] == user_holds.HOLDS_DETAIL_TYPE]
    # The list came through the real fetch path (the enrolled key's signed request), and was applied.
    assert "fetch" in channel.requests, channel.requests
    [row] = holds[-1]["users"]
    assert (row["user"], row["state"]) == ("hpt-held", "held"), holds[-1]
    assert json.loads((state / "slurm-holds.json").read_text())["users"]["hpt-held"]["associations"] == {
        "7": {"account": "research", "partition": "", "qos": "", "defaultQos": ""}}
    # The IMDS probe ran as nobody with the node's interpreter: an answer, not "the probe did not run".
    assert holds[-1]["imds"]["nonRoot"] in ("reachable", "blocked", "no-imds"), holds[-1]
    assert parse_holds_event({"source": contract.REPORT_SOURCE, "detail-type": user_holds.HOLDS_DETAIL_TYPE,
                              "detail": {k: v for k, v in holds[-1].items() if k not in ("sequence", "proof")}})


LOCKDOWN_UNIT = UNIT.parent / "hpops-imds-lockdown.service"


def test_the_imds_lockdown_unit_runs_as_systemd_would_and_only_root_keeps_imds(namespace, node_root, stack,
                                                                                 tmp_path):
    unit = install(node_root, stack, identity("login", LOGIN_ID), tmp_path)
    # The node's config with the lockdown on, and its unit as install.sh writes it (@PYTHON@ replaced).
    config = node_root / "etc/hpops/node-agent.json"
    config.write_text(json.dumps(json.loads(config.read_text()) | {"imdsLockdown": "on"}))
    installed = node_root / "etc/systemd/system/hpops-imds-lockdown.service"
    installed.write_text(LOCKDOWN_UNIT.read_text().replace("@PYTHON@", NODE_PYTHON))
    settings = service_settings(installed.read_text())
    assert settings["Type"] == ["oneshot"] and unit.exists()
    argv, env = unit_command(node_root, installed)
    # Its ExecStart with its Environment, in its (empty) sandbox, in the node's network namespace.
    done = subprocess.run(["ip", "netns", "exec", namespace,
                           *Sandbox.from_unit(installed.read_text()).command(node_root, argv, HOST_PATHS)],
                          capture_output=True, text=True, timeout=60, env=agent_env(stack) | env, cwd="/")
    assert done.returncode == 0 and done.stdout.startswith("IMDS lockdown applied"), done.stdout + done.stderr
    assert reaches(namespace), "root must keep IMDS"
    assert not reaches(namespace, (65534, 65534)), "a user must not reach IMDS"
    # What every report then says, probed as the agent probes (as nobody, with the node's interpreter).
    probe = subprocess.run(["ip", "netns", "exec", namespace, NODE_PYTHON, "-c",
                            "from hpops_node_agent import imds_guard; print(imds_guard.probe()[0])"],
                           capture_output=True, text=True, timeout=60, cwd="/",
                           env=dict(os.environ, PYTHONPATH=env["PYTHONPATH"]))
    assert probe.stdout.strip() == "blocked", probe.stdout + probe.stderr
