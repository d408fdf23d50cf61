"""An idle SSH session through a TCP proxy with an idle timeout: kept alive by the agent's sshd setting.

The NLB forgets a flow idle for its listener's idle timeout (350 s by default) and resets it; here
haproxy plays the NLB with the timeout scaled down to 3 s (`timeout client/server 3s`). A user logs
in through it (real OpenSSH client, no ServerAliveInterval, as users have it), leaves the session
idle for 3x the timeout, then types a line. With the agent's keepalive setting (sshd_keepalive.apply
with the 3 s timeout: ClientAliveInterval 1 in a drop-in, `sshd -t`, reload) the line comes back;
without it the proxy has already closed the connection.

Needs root (useradd), /usr/sbin/sshd and haproxy; skips without them, except under CI=true.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import time
from pathlib import Path

import pytest
import real_tools
from real_tools import free_port
from test_real_sshd import HAPROXY, SSH, SSH_KEYGEN, SSHD, stop, wait_for_ssh_banner

from hpops_node_agent import sshd_keepalive

pytestmark = pytest.mark.realssh

USER = "hpt29idle"
IDLE_TIMEOUT = 3  # seconds, the proxy's; the NLB's is 60-6000
IDLE_FOR = 3 * IDLE_TIMEOUT


@pytest.fixture(scope="module")
def user_key(tmp_path_factory) -> Path:
    real_tools.require_root_and_programs((SSHD, SSH, SSH_KEYGEN, HAPROXY, "/usr/sbin/useradd"),
                                         "keepalive test", "apt-get install -y openssh-server haproxy")
    real_tools.require((SSHD, SSH, SSH_KEYGEN, HAPROXY), "keepalive test", "apt-get install -y openssh-server haproxy")
    keys = tmp_path_factory.mktemp("idle-client")
    try:
        pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "-m", "-s", "/bin/sh", USER], check=True)
    subprocess.run(["usermod", "-p", "*", USER], check=True)  # no password, not locked: keys only
    key = keys / "id_ed25519"
    subprocess.run([SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    account = pwd.getpwnam(USER)
    ssh_dir = Path(account.pw_dir) / ".ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    (ssh_dir / "authorized_keys").write_text(key.with_suffix(".pub").read_text())
    for path in (ssh_dir, ssh_dir / "authorized_keys"):
        os.chown(path, account.pw_uid, account.pw_gid)
    return key


@pytest.fixture
def login_node(tmp_path):
    """A login node whose sshd_config Includes sshd_config.d (Debian's layout), behind haproxy."""
    root = tmp_path / "node"
    ssh_dir = root / "etc" / "ssh"
    (ssh_dir / "sshd_config.d").mkdir(parents=True)
    subprocess.run([SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-f", str(ssh_dir / "ssh_host_ed25519_key")], check=True)
    port, lb_port = free_port(), free_port()
    (ssh_dir / "sshd_config").write_text(
        f"Include {ssh_dir}/sshd_config.d/*.conf\n"
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {ssh_dir}/ssh_host_ed25519_key\nPidFile {root}/sshd.pid\n"
        "UsePAM no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nLogLevel VERBOSE\n")
    log = root / "sshd.log"
    with log.open("ab") as out:
        sshd = subprocess.Popen([SSHD, "-D", "-e", "-f", str(ssh_dir / "sshd_config")],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    (tmp_path / "haproxy.cfg").write_text(
        "global\n  nbthread 1\ndefaults\n  mode tcp\n  timeout connect 2s\n"
        f"  timeout client {IDLE_TIMEOUT}s\n  timeout server {IDLE_TIMEOUT}s\n"
        f"frontend login\n  bind 127.0.0.1:{lb_port}\n  default_backend nodes\n"
        f"backend nodes\n  server node 127.0.0.1:{port}\n")
    haproxy_log = tmp_path / "haproxy.log"
    with haproxy_log.open("ab") as out:
        haproxy = subprocess.Popen([HAPROXY, "-f", str(tmp_path / "haproxy.cfg"), "-db"],
                                   stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    try:
        wait_for_ssh_banner(port, sshd, log)
        wait_for_ssh_banner(lb_port, haproxy, haproxy_log)
        yield {"root": root, "port": port, "lb_port": lb_port, "sshd": sshd, "log": log}
    finally:
        stop(haproxy)
        stop(sshd)


def idle_then_type(key: Path, lb_port: int) -> tuple[int | None, str]:
    """Log in through the proxy, stay idle IDLE_FOR seconds, type a line; (exit code, what came back)."""
    client = subprocess.Popen(
        [SSH, "-F", "/dev/null", "-i", str(key), "-p", str(lb_port), "-o", "BatchMode=yes",
         "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
         "-o", "ServerAliveInterval=0", f"{USER}@127.0.0.1", 'echo ready; read line; echo "back: $line"'],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert client.stdout.readline().strip() == "ready"  # logged in before the idle stretch starts
        time.sleep(IDLE_FOR)
        try:
            client.stdin.write("still here\n")
            client.stdin.close()
        except BrokenPipeError:
            pass
        client.wait(timeout=15)
        return client.returncode, client.stdout.read()
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()


def test_idle_session_survives_three_idle_timeouts_with_the_agents_keepalive(user_key, login_node):
    outcome = sshd_keepalive.apply(str(login_node["root"]), IDLE_TIMEOUT, SSHD, f"kill -HUP {login_node['sshd'].pid}")
    assert outcome["result"] == "changed" and outcome["clientAliveInterval"] == 1
    assert (login_node["root"] / "etc/ssh/sshd_config.d" / sshd_keepalive.DROP_IN_NAME).exists()
    time.sleep(0.5)  # the HUP re-exec
    wait_for_ssh_banner(login_node["port"], login_node["sshd"], login_node["log"])

    code, out = idle_then_type(user_key, login_node["lb_port"])

    assert (code, out.strip().splitlines()[-1]) == (0, "back: still here")


def test_idle_session_is_cut_by_the_proxy_without_keepalives(user_key, login_node):
    code, out = idle_then_type(user_key, login_node["lb_port"])

    assert code == 255 and "back:" not in out


def test_a_keepalive_sshd_rejects_is_rolled_back_and_sshd_keeps_serving(user_key, login_node, tmp_path):
    config = login_node["root"] / "etc/ssh/sshd_config"
    before = config.read_bytes()
    refusing_sshd = tmp_path / "sshd-t-refuses"
    refusing_sshd.write_text("#!/bin/sh\necho 'line 1: Bad configuration option' >&2\nexit 255\n")
    refusing_sshd.chmod(0o755)

    outcome = sshd_keepalive.apply(str(login_node["root"]), IDLE_TIMEOUT, str(refusing_sshd),
                                   f"kill -HUP {login_node['sshd'].pid}")

    assert outcome["result"] == "failed" and "rolled back" in outcome["reason"]
    assert config.read_bytes() == before
    assert not (login_node["root"] / "etc/ssh/sshd_config.d" / sshd_keepalive.DROP_IN_NAME).exists()
    code, out = idle_then_type(user_key, login_node["lb_port"])  # the node still serves, without keepalives
    assert code == 255 and "back:" not in out
