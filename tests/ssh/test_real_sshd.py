"""Two real sshd "login nodes" behind a real haproxy (TCP, round robin) on loopback.

This is the production failure in miniature: users connect to one address, a
load balancer picks a node, and unless every node presents the same host
identity, OpenSSH clients report "REMOTE HOST IDENTIFICATION HAS CHANGED".
The node script, the verifier and the OpenSSH client are all the real things.

Needs /usr/sbin/sshd, haproxy, ssh and ssh-keygen (apt-get install -y
openssh-server haproxy). Skips without them, except under CI=true where a
missing tool is a failure.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import real_tools
from real_tools import free_port

import hpops_node_agent.host_keys
from hpops_core.host_identity import keys, verifier

pytestmark = pytest.mark.realssh

SSHD = "/usr/sbin/sshd"
SSH = "/usr/bin/ssh"
SSH_KEYGEN = "/usr/bin/ssh-keygen"
HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
NODE_SCRIPT = Path(hpops_node_agent.host_keys.__file__)
KEY_NAMES = ("ed25519", "ecdsa", "rsa")
LB_CONNECTIONS = 20


@pytest.fixture(autouse=True, scope="module")
def required_tools():
    real_tools.require((SSHD, SSH, SSH_KEYGEN, HAPROXY), "real-sshd tests", "apt-get install -y openssh-server haproxy")


def wait_for_ssh_banner(port: int, process: subprocess.Popen, log: Path, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"process exited with {process.returncode}: {log.read_text()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
                if sock.recv(64).startswith(b"SSH-"):
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"nothing answered SSH on port {port}: {log.read_text()[-2000:]}")


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


@dataclass
class Node:
    """One login node: a root directory with etc/ssh and an sshd serving it."""

    name: str
    root: Path
    port: int
    process: subprocess.Popen | None = None

    @property
    def ssh_dir(self) -> Path:
        return self.root / "etc" / "ssh"

    @property
    def config(self) -> Path:
        return self.ssh_dir / "sshd_config"

    @property
    def log(self) -> Path:
        return self.root / "sshd.log"

    @property
    def pid(self) -> int:
        return self.process.pid

    def reload_cmd(self) -> str:
        # What `systemctl reload ssh` does: SIGHUP makes sshd re-exec itself (same pid).
        return f"kill -HUP {self.pid}"

    def install_keys_directly(self, bundle: keys.HostKeyBundle) -> None:
        """The node's own keys as first boot (ssh-keygen -A) would have made them."""
        for pair in bundle.pairs():
            private = self.ssh_dir / f"ssh_host_{pair.name}_key"
            private.write_text(pair.private_openssh)
            private.chmod(0o600)
            (self.ssh_dir / f"ssh_host_{pair.name}_key.pub").write_text(pair.public_line + "\n")

    def write_config(self) -> None:
        host_keys = "".join(f"HostKey {self.ssh_dir}/ssh_host_{name}_key\n" for name in KEY_NAMES)
        self.config.write_text(
            f"Port {self.port}\n"
            "ListenAddress 127.0.0.1\n"
            f"{host_keys}"
            f"PidFile {self.root}/run/sshd.pid\n"
            "UsePAM no\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "LogLevel VERBOSE\n"
        )

    def start(self) -> None:
        log = self.log.open("ab")
        try:
            # Absolute path and -D: sshd re-execs itself in place on SIGHUP.
            self.process = subprocess.Popen(
                [SSHD, "-D", "-e", "-f", str(self.config)], stdin=subprocess.DEVNULL, stdout=log, stderr=log
            )
        finally:
            log.close()
        wait_for_ssh_banner(self.port, self.process, self.log)

    def key_files(self) -> dict[str, tuple[bytes, int]]:
        """Content and mode of every host key file (for "nothing changed" assertions)."""
        return {
            path.name: (path.read_bytes(), path.stat().st_mode & 0o7777)
            for path in sorted(self.ssh_dir.glob("ssh_host_*"))
        }

    def public_lines(self) -> dict[str, str]:
        return {name: (self.ssh_dir / f"ssh_host_{name}_key.pub").read_text().strip() for name in KEY_NAMES}

    def is_running(self) -> bool:
        return self.process.poll() is None


@dataclass
class Cluster:
    a: Node
    b: Node
    lb_port: int

    @property
    def nodes(self) -> tuple[Node, Node]:
        return self.a, self.b


@pytest.fixture(scope="module")
def own_bundles() -> dict[str, keys.HostKeyBundle]:
    """Each node's own first-boot keys (generated once; RSA-3072 generation is the slow part)."""
    return {"a": keys.generate_bundle(), "b": keys.generate_bundle()}


@pytest.fixture(scope="module")
def canonical() -> keys.HostKeyBundle:
    return keys.generate_bundle()


def write_haproxy_config(path: Path, lb_port: int, backends: tuple[Node, ...]) -> None:
    servers = "".join(f"  server {node.name} 127.0.0.1:{node.port}\n" for node in backends)
    path.write_text(
        "global\n"
        "  nbthread 1\n"  # one thread: strict A, B, A, B rotation
        "defaults\n"
        "  mode tcp\n"
        "  timeout connect 2s\n"
        "  timeout client 30s\n"
        "  timeout server 30s\n"
        "frontend login\n"
        f"  bind 127.0.0.1:{lb_port}\n"
        "  default_backend nodes\n"
        "backend nodes\n"
        "  balance roundrobin\n"
        f"{servers}"
    )


@pytest.fixture
def cluster(tmp_path, own_bundles):
    nodes = []
    haproxy = None
    try:
        for name in ("a", "b"):
            node = Node(name, tmp_path / f"node-{name}", free_port())
            node.ssh_dir.mkdir(parents=True)
            (node.root / "run").mkdir()
            node.install_keys_directly(own_bundles[name])
            node.write_config()
            nodes.append(node)
            node.start()
        lb_port = free_port()
        config = tmp_path / "haproxy.cfg"
        write_haproxy_config(config, lb_port, tuple(nodes))
        haproxy_log = tmp_path / "haproxy.log"
        with haproxy_log.open("ab") as log:
            haproxy = subprocess.Popen(
                [HAPROXY, "-f", str(config), "-db"], stdin=subprocess.DEVNULL, stdout=log, stderr=log
            )
        wait_for_ssh_banner(lb_port, haproxy, haproxy_log)
        yield Cluster(nodes[0], nodes[1], lb_port)
    finally:
        if haproxy is not None:
            stop(haproxy)
        for node in nodes:
            if node.process is not None:
                stop(node.process)


# --------------------------------------------------------------------------- helpers


@dataclass(frozen=True)
class SshOutcome:
    host_key_ok: bool | None  # None: neither outcome recognised (a test bug or broken sshd)
    stderr: str


def ssh_through(port: int, known_hosts: Path, *options: str) -> SshOutcome:
    """One real OpenSSH client connection; judges only the host key check.

    No user key and BatchMode: a passed host key check ends in "Permission
    denied", a failed one in "Host key verification failed".
    """
    command = [
        SSH, "-F", "/dev/null",
        "-o", "BatchMode=yes",
        "-o", f"UserKnownHostsFile={known_hosts}",
        "-o", "GlobalKnownHostsFile=/dev/null",
        "-o", "StrictHostKeyChecking=yes",
        "-o", "UpdateHostKeys=no",
        "-o", "PubkeyAuthentication=no",
        "-o", "ConnectTimeout=5",
        *options,
        "-p", str(port), "hpops-probe@127.0.0.1", "true",
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL)
    if "Host key verification failed" in result.stderr:
        return SshOutcome(False, result.stderr)
    if "Permission denied" in result.stderr:
        return SshOutcome(True, result.stderr)
    return SshOutcome(None, result.stderr)


def write_known_hosts(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def run_node_script(*args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    # -I -S: no site-packages, so a third-party import in the script would fail here.
    return subprocess.run(
        [sys.executable, "-I", "-S", str(NODE_SCRIPT), *map(str, args)],
        capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
    )


def sync_node(node: Node, bundle_file: Path, *extra: str) -> subprocess.CompletedProcess:
    return run_node_script(
        "--bundle-file", bundle_file, "--root", node.root, "--reload-cmd", node.reload_cmd(), *extra
    )


def assert_no_private_material(output: str, *bundles) -> None:
    assert "PRIVATE KEY" not in output
    for bundle in bundles:
        for pair in bundle.pairs():
            for line in pair.private_openssh.splitlines():
                # The private file embeds the public key; a line of it may rightly be in a public line.
                if not line.startswith("-----") and line not in pair.public_line:
                    assert line not in output


def wait_until_presenting(port: int, expected: dict[str, str], timeout: float = 10) -> dict[str, str]:
    """After SIGHUP sshd re-execs; poll until it presents the expected keys (or give up)."""
    deadline = time.monotonic() + timeout
    presented: dict[str, str] = {}
    while time.monotonic() < deadline:
        try:
            presented = verifier.read_presented_host_keys("127.0.0.1", port, timeout=2)
            if presented == expected:
                break
        except verifier.HostUnreachable:
            pass
        time.sleep(0.1)
    return presented


def wait_until_certified(port: int, timeout: float = 10) -> verifier.PresentedHostCertificate:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return verifier.read_presented_host_certificate("127.0.0.1", port, timeout=2)
        except (verifier.HostUnreachable, verifier.HostCertificateMissing):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def outcomes_through_lb(cluster: Cluster, known_hosts: Path, count: int, *options: str) -> list[SshOutcome]:
    outcomes = [ssh_through(cluster.lb_port, known_hosts, *options) for _ in range(count)]
    unrecognised = [o.stderr for o in outcomes if o.host_key_ok is None]
    assert not unrecognised, f"unexpected ssh output: {unrecognised[:2]}"
    return outcomes


@pytest.fixture
def bundle_file(tmp_path, canonical) -> Path:
    path = tmp_path / "bundle.json"
    path.write_text(canonical.to_secret_json())
    path.chmod(0o600)
    return path


@pytest.fixture
def synced(cluster, canonical, bundle_file):
    """Both nodes after a successful sync; the same steps test (b) asserts in detail."""
    for node in cluster.nodes:
        result = sync_node(node, bundle_file)
        assert result.returncode == 0, result.stderr
    for node in cluster.nodes:
        assert wait_until_presenting(node.port, canonical.public_fingerprints()) == canonical.public_fingerprints()
    return cluster


# --------------------------------------------------------------------------- (a) the problem


def test_before_sync_users_behind_the_lb_see_host_identity_changes(cluster, own_bundles, tmp_path):
    # The user first met node A and pinned its keys.
    pinned = own_bundles["a"].known_hosts_lines(f"[127.0.0.1]:{cluster.lb_port}")
    known_hosts = write_known_hosts(tmp_path / "known_hosts", pinned)
    outcomes = outcomes_through_lb(cluster, known_hosts, 10)
    passed = [o for o in outcomes if o.host_key_ok]
    refused = [o for o in outcomes if not o.host_key_ok]
    assert len(passed) == 5 and len(refused) == 5  # strict round robin: A, B, A, B, ...
    assert all("REMOTE HOST IDENTIFICATION HAS CHANGED" in o.stderr for o in refused)
    # The verifier sees the same thing without any client: B is not A.
    expected = own_bundles["a"].public_fingerprints()
    assert verifier.verify_node("127.0.0.1", cluster.a.port, expected).ok
    result_b = verifier.verify_node("127.0.0.1", cluster.b.port, expected)
    assert not result_b.ok and result_b.presented == own_bundles["b"].public_fingerprints()


# --------------------------------------------------------------------------- (b) (c) (d) the fix


def test_sync_gives_both_nodes_one_identity_users_can_pin(cluster, canonical, own_bundles, bundle_file, tmp_path):
    pids_before = {node.name: node.pid for node in cluster.nodes}
    # A connection that is open during the reload must survive it (SIGHUP, not restart).
    open_session = paramiko_preauth_session(cluster.a.port)
    try:
        for node in cluster.nodes:
            result = sync_node(node, bundle_file)
            assert result.returncode == 0, result.stderr
            summary = json.loads(result.stdout)
            assert summary["result"] == "changed"
            assert summary["fingerprints"] == canonical.public_fingerprints()
            assert_no_private_material(result.stdout + result.stderr, canonical, own_bundles[node.name])
            assert_installed_bundle(node, canonical)
            assert Path(summary["backup"]).stat().st_mode & 0o777 == 0o700
            backed_up = Path(summary["backup"]) / "ssh_host_rsa_key"
            assert backed_up.read_text() == own_bundles[node.name].rsa.private_openssh

        # (d) the verifier: every node presents exactly the bundle's keys.
        for node in cluster.nodes:
            assert wait_until_presenting(node.port, canonical.public_fingerprints()) == canonical.public_fingerprints()
            result = verifier.verify_node("127.0.0.1", node.port, canonical.public_fingerprints())
            assert result.ok, result.reason
        assert {node.name: node.pid for node in cluster.nodes} == pids_before  # reloaded in place
        # ... and really reloaded (OpenSSH < 9.8 would serve new key files even without it).
        assert all(node.log.read_text().count("Received SIGHUP; restarting.") == 1 for node in cluster.nodes)
        assert all(node.is_running() for node in cluster.nodes)
        assert_session_still_alive(open_session)
    finally:
        open_session.close()

    # (c) 20 users through the LB, each with only the canonical keys pinned.
    pinned = canonical.known_hosts_lines(f"[127.0.0.1]:{cluster.lb_port}")
    known_hosts = write_known_hosts(tmp_path / "known_hosts", pinned)
    outcomes = outcomes_through_lb(cluster, known_hosts, LB_CONNECTIONS)
    assert all(o.host_key_ok for o in outcomes), [o.stderr for o in outcomes if not o.host_key_ok][:2]
    # Whatever algorithm a client prefers, both nodes agree.
    for algorithm in ("ssh-ed25519", "ecdsa-sha2-nistp256", "rsa-sha2-512"):
        outcomes = outcomes_through_lb(cluster, known_hosts, 4, "-o", f"HostKeyAlgorithms={algorithm}")
        assert all(o.host_key_ok for o in outcomes), (algorithm, outcomes[0].stderr)


def assert_installed_bundle(node: Node, bundle: keys.HostKeyBundle) -> None:
    for pair in bundle.pairs():
        private = node.ssh_dir / f"ssh_host_{pair.name}_key"
        public = node.ssh_dir / f"ssh_host_{pair.name}_key.pub"
        assert private.read_text() == pair.private_openssh
        assert public.read_text().strip() == pair.public_line
        assert private.stat().st_mode & 0o7777 == 0o600
        assert public.stat().st_mode & 0o7777 == 0o644
        if os.geteuid() == 0:
            assert (private.stat().st_uid, private.stat().st_gid) == (0, 0)


def paramiko_preauth_session(port: int):
    """An SSH transport that has finished key exchange but not authenticated: a live session."""
    import paramiko

    transport = paramiko.Transport(socket.create_connection(("127.0.0.1", port), timeout=5))
    transport.start_client(timeout=5)
    assert transport.is_active()
    return transport


def assert_session_still_alive(transport) -> None:
    import paramiko

    # The server answers "none" auth with the methods it allows: proof the session is served.
    with pytest.raises(paramiko.BadAuthenticationType) as answer:
        transport.auth_none("hpops-probe")
    assert "publickey" in answer.value.allowed_types


def test_verifier_through_the_lb_sees_one_identity_after_sync(synced, canonical):
    for _ in range(4):  # consecutive handshakes alternate between the nodes
        assert verifier.read_presented_host_keys("127.0.0.1", synced.lb_port) == canonical.public_fingerprints()


# --------------------------------------------------------------------------- (f) idempotence


def test_second_run_is_unchanged_and_does_not_reload(synced, canonical, bundle_file, tmp_path):
    node = synced.a
    files_before = node.key_files()
    inodes_before = {path.name: path.stat().st_ino for path in node.ssh_dir.glob("ssh_host_*")}
    marker = tmp_path / "reloaded"
    result = run_node_script(
        "--bundle-file", bundle_file, "--root", node.root, "--reload-cmd", f"touch {marker} && {node.reload_cmd()}"
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["result"] == "unchanged"
    assert summary["fingerprints"] == canonical.public_fingerprints()
    assert "\n" not in result.stdout.strip()  # one line
    assert not marker.exists()
    assert node.key_files() == files_before
    assert {path.name: path.stat().st_ino for path in node.ssh_dir.glob("ssh_host_*")} == inodes_before


# --------------------------------------------------------------------------- (e) failures roll back


def with_wrong_ed25519_private_scalar(bundle: keys.HostKeyBundle) -> str:
    """A bundle that passes every structural check but whose ed25519 key cannot sign for its public key."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    real = serialization.load_ssh_private_key(bundle.ed25519.private_openssh.encode(), None)
    real_seed = real.private_bytes_raw()
    lines = bundle.ed25519.private_openssh.strip().splitlines()
    raw = base64.b64decode("".join(lines[1:-1]))
    assert raw.count(real_seed) == 1
    raw = raw.replace(real_seed, ed25519.Ed25519PrivateKey.generate().private_bytes_raw())
    body = base64.b64encode(raw).decode()
    text = "\n".join([lines[0], *(body[i : i + 70] for i in range(0, len(body), 70)), lines[-1]]) + "\n"
    document = json.loads(bundle.to_secret_json())
    document["keys"]["ed25519"]["private"] = text
    return json.dumps(document)


def truncated_json(bundle: keys.HostKeyBundle) -> str:
    return bundle.to_secret_json()[: len(bundle.to_secret_json()) // 2]


def swapped_public_line(bundle: keys.HostKeyBundle) -> str:
    document = json.loads(bundle.to_secret_json())
    document["keys"]["rsa"]["public"] = keys.generate_bundle().rsa.public_line
    return json.dumps(document)


FAILURES = {
    # name: (make bundle text, extra script args, expected exit code, files were written then restored)
    "truncated-json": (truncated_json, (), 3, False),
    "public-not-matching-private": (swapped_public_line, (), 3, False),
    # Caught by the signing self-test in a staging directory, before /etc/ssh is touched.
    "private-cannot-sign": (with_wrong_ed25519_private_scalar, (), 3, False),
    "sshd-t-fails": (lambda b: b.to_secret_json(), ("--sshd-config", "BROKEN_CONFIG"), 4, True),
    "reload-fails": (lambda b: b.to_secret_json(), ("--reload-cmd", "false"), 5, True),
}


@pytest.mark.parametrize("failure", sorted(FAILURES))
def test_failed_install_leaves_old_keys_and_sshd_serving(cluster, canonical, own_bundles, tmp_path, failure):
    make_bundle, extra, exit_code, wrote_then_restored = FAILURES[failure]
    node = cluster.a
    bad_bundle = tmp_path / "bad-bundle.json"
    bad_bundle.write_text(make_bundle(canonical))
    broken_config = tmp_path / "broken_sshd_config"
    broken_config.write_text(node.config.read_text() + "NoSuchDirective yes\n")
    extra = tuple(str(broken_config) if arg == "BROKEN_CONFIG" else arg for arg in extra)
    files_before = node.key_files()

    result = sync_node(node, bad_bundle, *extra)

    assert result.returncode == exit_code, (result.stdout, result.stderr)
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("install_host_keys: ")
    summary = json.loads(result.stdout)
    assert summary["result"] == "failed" and summary["rolled_back"] is wrote_then_restored
    assert_no_private_material(result.stdout + result.stderr, canonical, own_bundles["a"])
    assert node.key_files() == files_before  # bytes and modes
    assert not list(node.ssh_dir.glob(".ssh_host_*"))  # no temp files left behind
    assert not list((node.root / "var" / "backups" / "hpops-host-keys").glob(".selftest-*"))
    assert node.is_running()
    presented = wait_until_presenting(node.port, own_bundles["a"].public_fingerprints())
    assert presented == own_bundles["a"].public_fingerprints()


# --------------------------------------------------------------------------- (g) certificate mode


def certificate_bundle_for(node: Node, ca: keys.HostCA) -> keys.HostCertificateBundle:
    now = int(time.time())
    principals = ["127.0.0.1", "login.example.internal"]
    return keys.certify_host_keys(ca, node.public_lines(), principals, f"test-cluster/{node.name}", now - 300, now + 3600)


def test_certificate_mode_one_ca_line_trusts_every_node(cluster, own_bundles, tmp_path):
    ca = keys.generate_ca()
    known_hosts = write_known_hosts(tmp_path / "known_hosts", [ca.known_hosts_line(f"[127.0.0.1]:{cluster.lb_port}")])

    # Control: without certificates the CA line vouches for nobody.
    assert not any(o.host_key_ok for o in outcomes_through_lb(cluster, known_hosts, 4))
    with pytest.raises(verifier.HostCertificateMissing):
        verifier.read_presented_host_certificate("127.0.0.1", cluster.a.port)

    # A certificate for another node's key is refused before anything changes.
    wrong = tmp_path / "wrong-node-certs.json"
    wrong.write_text(certificate_bundle_for(cluster.a, ca).to_json())
    config_before = cluster.b.config.read_text()
    result = sync_node(cluster.b, wrong, "--mode", "certificate")
    assert result.returncode == 3 and "different host key" in result.stderr
    assert cluster.b.config.read_text() == config_before
    assert not list(cluster.b.ssh_dir.glob("*-cert.pub"))

    for node in cluster.nodes:
        cert_file = tmp_path / f"certs-{node.name}.json"
        cert_file.write_text(certificate_bundle_for(node, ca).to_json())
        result = sync_node(node, cert_file, "--mode", "certificate")
        assert result.returncode == 0, result.stderr
        summary = json.loads(result.stdout)
        assert summary["result"] == "changed" and summary["ca_fingerprint"] == ca.fingerprint()
        assert summary["certified_fingerprints"] == own_bundles[node.name].public_fingerprints()
        assert_no_private_material(result.stdout + result.stderr, own_bundles[node.name])
        assert f"HostCertificate {node.ssh_dir}/ssh_host_ed25519_key-cert.pub" in node.config.read_text()
        assert sync_node(node, cert_file, "--mode", "certificate").stdout.count('"unchanged"') == 1

    # Both nodes kept their own keys, and both present a certificate from the one CA.
    presented = {}
    for node in cluster.nodes:
        wait_until_certified(node.port)  # the reload has taken effect
        for key_type in ("ssh-ed25519", "ecdsa-sha2-nistp256", "ssh-rsa"):
            certificate = verifier.read_presented_host_certificate("127.0.0.1", node.port, key_type)
            assert certificate.host_key_fingerprint == own_bundles[node.name].public_fingerprints()[key_type]
            accepted = verifier.check_host_certificate(certificate, ca.fingerprint(), "127.0.0.1")
            assert accepted == (True, "certificate accepted")
            assert certificate.key_id == f"test-cluster/{node.name}"
        presented[node.name] = verifier.read_presented_host_keys("127.0.0.1", node.port)
        assert presented[node.name] == own_bundles[node.name].public_fingerprints()
    assert presented["a"] != presented["b"]

    outcomes = outcomes_through_lb(cluster, known_hosts, LB_CONNECTIONS)
    assert all(o.host_key_ok for o in outcomes), [o.stderr for o in outcomes if not o.host_key_ok][:2]
    # The client really used certificates (a plain key is never in known_hosts here).
    verbose = ssh_through(cluster.lb_port, known_hosts, "-v")
    assert verbose.host_key_ok and "-CERT" in verbose.stderr


def test_certificate_flow_certifies_exactly_the_keys_each_node_reports(cluster, own_bundles, tmp_path):
    """The production loop on real sshd: report-public-keys, the signer, then certificate mode.

    The signer sees only what the node printed (as the Lambda sees only the command output),
    so this proves the report is exactly what sshd serves, and that the certificates made
    from it are accepted by the node script, presented by sshd and trusted by a client.
    """
    ca = keys.generate_ca()
    reported: dict[str, dict] = {}
    for node in cluster.nodes:
        files_before, config_before = node.key_files(), node.config.read_text()
        result = run_node_script("--mode", "report-public-keys", "--root", node.root)
        assert result.returncode == 0, result.stderr
        assert result.stdout.count("\n") == 1
        report = json.loads(result.stdout)
        assert report["mode"] == "report-public-keys" and report["result"] == "reported"
        assert report["public_keys"] == {name: " ".join(line.split()[:2]) for name, line in node.public_lines().items()}
        assert report["fingerprints"] == own_bundles[node.name].public_fingerprints()
        assert_no_private_material(result.stdout + result.stderr, own_bundles[node.name])
        # Reporting wrote nothing: same key files, same config, not even a lock directory.
        assert node.key_files() == files_before and node.config.read_text() == config_before
        assert not (node.root / "var").exists()
        reported[node.name] = report

        # The signer: certify exactly the reported lines, write the bundle where the node reads it.
        now = int(time.time())
        bundle = keys.certify_host_keys(
            ca, report["public_keys"], ["127.0.0.1"], f"test-cluster/{node.name}", now - 300, now + 3600
        )
        cert_file = tmp_path / f"reported-certs-{node.name}.json"
        cert_file.write_text(bundle.to_json())
        result = sync_node(node, cert_file, "--mode", "certificate")
        assert result.returncode == 0, result.stderr
        installed = json.loads(result.stdout)
        assert installed["result"] == "changed" and installed["ca_fingerprint"] == ca.fingerprint()
        assert installed["certified_fingerprints"] == report["fingerprints"]
        for name in KEY_NAMES:
            assert (node.ssh_dir / f"ssh_host_{name}_key-cert.pub").read_text() == bundle.certificates[name] + "\n"

    # Each node presents, for every key type, a certificate from the CA for its own key.
    for node in cluster.nodes:
        wait_until_certified(node.port)  # the reload has taken effect
        for key_type in ("ssh-ed25519", "ecdsa-sha2-nistp256", "ssh-rsa"):
            certificate = verifier.read_presented_host_certificate("127.0.0.1", node.port, key_type)
            assert certificate.ca_fingerprint == ca.fingerprint()
            assert certificate.host_key_fingerprint == reported[node.name]["fingerprints"][key_type]
            assert certificate.key_id == f"test-cluster/{node.name}" and certificate.principals == ("127.0.0.1",)
            assert verifier.check_host_certificate(certificate, ca.fingerprint(), "127.0.0.1") == (
                True, "certificate accepted",
            )
    assert reported["a"]["fingerprints"] != reported["b"]["fingerprints"]  # each kept its own keys

    # A client with one @cert-authority line and nothing else trusts both nodes behind the LB.
    known_hosts = write_known_hosts(tmp_path / "known_hosts", [ca.known_hosts_line(f"[127.0.0.1]:{cluster.lb_port}")])
    connections_before = {node.name: node.log.read_text().count("Connection from") for node in cluster.nodes}
    outcomes = outcomes_through_lb(cluster, known_hosts, LB_CONNECTIONS)
    assert all(o.host_key_ok for o in outcomes), [o.stderr for o in outcomes if not o.host_key_ok][:2]
    served = {node.name: node.log.read_text().count("Connection from") - connections_before[node.name]
              for node in cluster.nodes}
    assert served == {"a": LB_CONNECTIONS // 2, "b": LB_CONNECTIONS // 2}  # round robin: both nodes answered
    verbose = ssh_through(cluster.lb_port, known_hosts, "-v")
    assert verbose.host_key_ok and "-CERT" in verbose.stderr


def test_certificate_for_other_principal_is_refused_by_clients(cluster, own_bundles, tmp_path):
    """Negative control for (g): the client really checks principals, so (g) could fail."""
    ca = keys.generate_ca()
    now = int(time.time())
    for node in cluster.nodes:
        bundle = keys.certify_host_keys(ca, node.public_lines(), ["elsewhere.example"], node.name, now - 60, now + 3600)
        cert_file = tmp_path / f"certs-{node.name}.json"
        cert_file.write_text(bundle.to_json())
        assert sync_node(node, cert_file, "--mode", "certificate").returncode == 0
        certificate = wait_until_certified(node.port)
        ok, reason = verifier.check_host_certificate(certificate, ca.fingerprint(), "127.0.0.1")
        assert not ok and "principal" in reason
    known_hosts = write_known_hosts(tmp_path / "known_hosts", [ca.known_hosts_line(f"[127.0.0.1]:{cluster.lb_port}")])
    assert not any(o.host_key_ok for o in outcomes_through_lb(cluster, known_hosts, 4))
