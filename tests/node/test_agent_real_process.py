"""The node agent as a real process, against a real sshd and a moto server standing in for AWS.

One login node: a root directory with its own etc/ssh and an sshd on loopback serving it. The agent
runs as `python -m hpops_node_agent` with AWS_ENDPOINT_URL pointing at a moto server in this test
process; the test plays the stack (secret, desired-state parameters, the signer) and reads the
agent's reports from an SQS queue behind a rule on the report bus.

Each test builds its own node, agent process and moto account (a fresh node that presents the
cluster's keys, or one still on its first-boot keys for the first test); they share only the key
bundles, which no test changes. Each ends by checking that nothing its agent wrote or sent carries
private key material, so any order runs.

Needs /usr/sbin/sshd, ssh and ssh-keygen. Skips without them, except under CI=true where a
missing tool is a failure.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import boto3
import pytest
import channel_stand_in
import real_tools
from real_tools import MotoServer, free_port

from hpops_core.host_identity import keys, verifier
from hpops_core.node_channel import contract

pytestmark = pytest.mark.realssh

SSHD = "/usr/sbin/sshd"
SSH = "/usr/bin/ssh"
SSH_KEYGEN = "/usr/bin/ssh-keygen"
CLUSTER = "agent-cluster"
REGION = "us-west-2"
BUS = "hpops-node-reports"
INSTANCE_ID = "i-0a1b2c3d4e5f60718"
POLL_SECONDS = 2
OUTAGE_SECONDS = 65
KEY_NAMES = ("ed25519", "ecdsa", "rsa")
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing"}
# An agent applies a new desired state within this many seconds (3 polls of POLL_SECONDS +-20 %, and a margin).
APPLY_SECONDS = 3 * POLL_SECONDS * 1.2 + 10


@pytest.fixture(autouse=True, scope="module")
def required_tools():
    real_tools.require((SSHD, SSH, SSH_KEYGEN), "real-process agent tests", "apt-get install -y openssh-server")


def wait_until(predicate, timeout: float, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


# --------------------------------------------------------------------------- AWS (moto server)


class Stack:
    """The stack's side of the channel, in a moto server a separate process can reach."""

    def __init__(self, port: int):
        self.port = port
        self.server = MotoServer(port).start()  # from no accounts, whatever ran before on this worker
        self.endpoint = self.server.endpoint
        session = boto3.session.Session(region_name=REGION, **{
            "aws_access_key_id": "testing", "aws_secret_access_key": "testing", "aws_session_token": "testing"})
        self.ssm = session.client("ssm", endpoint_url=self.endpoint)
        self.secrets = session.client("secretsmanager", endpoint_url=self.endpoint)
        self.sqs = session.client("sqs", endpoint_url=self.endpoint)
        events = session.client("events", endpoint_url=self.endpoint)
        events.create_event_bus(Name=BUS)
        self.queue_url = self.sqs.create_queue(QueueName="node-reports")["QueueUrl"]
        arn = self.sqs.get_queue_attributes(QueueUrl=self.queue_url, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"]
        events.put_rule(Name="node-reports", EventBusName=BUS,
                        EventPattern=json.dumps({"source": [contract.REPORT_SOURCE]}))
        events.put_targets(Rule="node-reports", EventBusName=BUS, Targets=[{"Id": "queue", "Arn": arn}])
        self.secret_arn: str | None = None
        self.events: list[dict] = []  # every report the agent sent, in order

    def stop(self) -> None:
        self.server.stop()  # the endpoint is gone

    def restart(self) -> None:
        self.server.restart()  # moto's state lives in this process, so the account survives

    def close(self) -> None:
        self.server.close()  # leave no bus, queue or parameter to the next test on this worker

    def publish_keys(self, bundle: keys.HostKeyBundle, version: str) -> None:
        text = bundle.to_secret_json()
        if self.secret_arn is None:
            self.secret_arn = self.secrets.create_secret(Name=f"hpops/{CLUSTER}/host-keys", SecretString=text)["ARN"]
        else:
            self.secrets.put_secret_value(SecretId=self.secret_arn, SecretString=text)
        self.put(contract.host_identity_parameter(CLUSTER), {
            "format": contract.HOST_IDENTITY_FORMAT, "mode": "keys", "version": version,
            "secretArn": self.secret_arn, "fingerprints": bundle.public_fingerprints()})

    def put(self, name: str, document: dict | str) -> int:
        value = document if isinstance(document, str) else json.dumps(document)
        return self.ssm.put_parameter(Name=name, Value=value, Type="String", Overwrite=True)["Version"]

    def drain(self) -> list[dict]:
        while True:
            messages = self.sqs.receive_message(QueueUrl=self.queue_url, MaxNumberOfMessages=10).get("Messages", [])
            if not messages:
                return self.events
            for message in messages:
                self.events.append(json.loads(message["Body"]))
                self.sqs.delete_message(QueueUrl=self.queue_url, ReceiptHandle=message["ReceiptHandle"])

    def wait_for_report(self, predicate, timeout: float) -> dict | None:
        seen = len(self.events)

        def found():
            for event in self.drain()[seen:]:
                if predicate(event["detail"]):
                    return event["detail"]
            return None

        return wait_until(found, timeout, interval=0.5)


# --------------------------------------------------------------------------- the node


class LoginNode:
    def __init__(self, root: Path, port: int):
        self.root = root
        self.port = port
        self.ssh_dir = root / "etc" / "ssh"
        self.config = self.ssh_dir / "sshd_config"
        self.log = root / "sshd.log"
        self.process: subprocess.Popen | None = None

    def prepare(self, own: keys.HostKeyBundle) -> None:
        self.ssh_dir.mkdir(parents=True)
        (self.root / "run").mkdir()
        for pair in own.pairs():
            private = self.ssh_dir / f"ssh_host_{pair.name}_key"
            private.write_text(pair.private_openssh)
            private.chmod(0o600)
            (self.ssh_dir / f"ssh_host_{pair.name}_key.pub").write_text(pair.public_line + "\n")
        host_keys = "".join(f"HostKey {self.ssh_dir}/ssh_host_{name}_key\n" for name in KEY_NAMES)
        self.config.write_text(
            f"Port {self.port}\nListenAddress 127.0.0.1\n{host_keys}PidFile {self.root}/run/sshd.pid\n"
            "UsePAM no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nLogLevel VERBOSE\n"
        )

    def start(self) -> None:
        with self.log.open("ab") as log:
            # Absolute path and -D: sshd re-execs itself in place on SIGHUP (same pid).
            self.process = subprocess.Popen([SSHD, "-D", "-e", "-f", str(self.config)],
                                            stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        assert wait_until(self._answers, 10, 0.05), self.log.read_text()[-2000:]

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                return sock.recv(64).startswith(b"SSH-")
        except OSError:
            return False

    def presented(self) -> dict[str, str]:
        try:
            return verifier.read_presented_host_keys("127.0.0.1", self.port, timeout=2)
        except verifier.HostUnreachable:
            return {}

    def wait_presenting(self, expected: dict[str, str], timeout: float) -> dict[str, str]:
        return wait_until(lambda: self.presented() == expected and expected, timeout) or self.presented()


def stop_process(process: subprocess.Popen | None) -> None:
    if process is not None and process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def bundles() -> dict[str, keys.HostKeyBundle]:
    """own: the node's first-boot keys; v1: the cluster's keys; v2, v3: rotations. Read only."""
    return {name: keys.generate_bundle() for name in ("own", "v1", "v2", "v3")}


@pytest.fixture
def stack():
    stack = Stack(free_port())
    try:
        yield stack
    finally:
        stack.close()


@pytest.fixture
def node(tmp_path, bundles):
    node = LoginNode(tmp_path / "login-node", free_port())
    node.prepare(bundles["own"])
    node.start()
    try:
        yield node
    finally:
        stop_process(node.process)


class AgentProcess:
    def __init__(self, process: subprocess.Popen, stdout: Path, stderr: Path):
        self.process, self.stdout, self.stderr = process, stdout, stderr

    def output(self) -> str:
        return self.stdout.read_text(errors="replace") + self.stderr.read_text(errors="replace")


@pytest.fixture
def agent(tmp_path, stack, node, bundles):
    """The agent started on a fresh node, the cluster's keys (v1) published before, as for a node HyperPod adds later."""
    stack.publish_keys(bundles["v1"], "v1")
    work = tmp_path / "agent"
    work.mkdir()
    config = work / "node-agent.json"
    config.write_text(json.dumps({
        "cluster": CLUSTER, "region": REGION, "reportBus": BUS, "pollSeconds": POLL_SECONDS,
        "root": str(node.root), "role": "login", "ip": "127.0.0.1", "instanceId": INSTANCE_ID,
        "sshdCmd": SSHD, "reloadCmd": f"kill -HUP {node.process.pid}", "sshKeygenCmd": SSH_KEYGEN,
        "stateDir": str(work / "state"), "nodeChannel": channel_stand_in.FUNCTION,
    }))
    # The node role reads no host keys: the agent enrolls its key and fetches them from NodeChannel.
    channel = channel_stand_in.ChannelStandIn(free_port(), CLUSTER, lambda item, instance: {
        "value": stack.secrets.get_secret_value(SecretId=stack.secret_arn)["SecretString"], "version": "v"})
    env = {key: value for key, value in os.environ.items() if not key.startswith("AWS_")}
    env.update(CREDENTIALS, AWS_ENDPOINT_URL=stack.endpoint, AWS_DEFAULT_REGION=REGION, PYTHONUNBUFFERED="1",
               AWS_ENDPOINT_URL_LAMBDA=channel.endpoint)
    stdout, stderr = work / "agent.out", work / "agent.err"
    with stdout.open("wb") as out, stderr.open("wb") as err:
        process = subprocess.Popen([sys.executable, "-m", "hpops_node_agent", "--config", str(config)],
                                   stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env)
    try:
        yield AgentProcess(process, stdout, stderr)
    finally:
        stop_process(process)
        channel.close()
        print(f"\nagent output (tail):\n{stdout.read_text()[-3000:]}\n{stderr.read_text()[-2000:]}")


@pytest.fixture
def settled(stack, node, agent, bundles):
    """A node whose agent has started and presents the cluster's keys (v1), its start report sent."""
    assert node.wait_presenting(bundles["v1"].public_fingerprints(), 30) == bundles["v1"].public_fingerprints(), \
        agent.output()[-2000:]
    assert stack.wait_for_report(lambda d: d["trigger"] == "start", 15) is not None, agent.output()[-2000:]
    return node


def ssh_host_check(port: int, known_hosts: Path) -> tuple[bool | None, str]:
    """A real OpenSSH client; True when host verification passed (then auth fails: no user key)."""
    command = [SSH, "-F", "/dev/null", "-o", "BatchMode=yes", "-o", f"UserKnownHostsFile={known_hosts}",
               "-o", "GlobalKnownHostsFile=/dev/null", "-o", "StrictHostKeyChecking=yes", "-o", "UpdateHostKeys=no",
               "-o", "PubkeyAuthentication=no", "-o", "ConnectTimeout=5", "-v",
               "-p", str(port), "hpops-probe@127.0.0.1", "true"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL)
    if "Host key verification failed" in result.stderr:
        return False, result.stderr
    if "Permission denied" in result.stderr:
        return True, result.stderr
    return None, result.stderr


# --------------------------------------------------------------------------- what no test's agent may leak


def secret_values(pair: keys.HostKeyPair) -> list[bytes]:
    """The secret numbers of one private key (the public parts are in reports by design)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

    key = serialization.load_ssh_private_key(pair.private_openssh.encode(), None)

    def as_bytes(number: int) -> bytes:
        return number.to_bytes((number.bit_length() + 7) // 8, "big")

    if isinstance(key, ed25519.Ed25519PrivateKey):
        return [key.private_bytes_raw()]
    if isinstance(key, ec.EllipticCurvePrivateKey):
        return [as_bytes(key.private_numbers().private_value)]
    assert isinstance(key, rsa.RSAPrivateKey)
    numbers = key.private_numbers()
    return [as_bytes(numbers.d), as_bytes(numbers.p), as_bytes(numbers.q)]


def private_key_fragments(bundle: keys.HostKeyBundle) -> set[str]:
    """Strings that would show private key material: every PEM body line and every 40-char base64
    window of the key file that covers a secret byte, plus 40-char windows of the secrets' own
    base64 at each byte alignment."""
    fragments = set()
    for pair in bundle.pairs():
        lines = pair.private_openssh.strip().splitlines()[1:-1]
        body = "".join(lines)
        raw = base64.b64decode(body)
        ranges = []
        for secret in secret_values(pair):
            start = raw.find(secret)
            assert start >= 0, "secret not found in the key file (test helper is wrong)"
            ranges.append((start, start + len(secret)))
            for shift in range(3):
                encoded = base64.b64encode(secret[shift:]).decode()
                fragments.update(encoded[i : i + 40] for i in range(0, len(encoded) - 40, 4))

        def covers_secret(first_char: int, end_char: int) -> bool:
            first_byte, end_byte = first_char * 3 // 4, -(-end_char * 3 // 4)
            return any(first_byte < high and end_byte > low for low, high in ranges)

        offset = 0
        for line in lines:
            if covers_secret(offset, offset + len(line)):
                fragments.add(line)
            offset += len(line)
        fragments.update(body[i : i + 40] for i in range(0, len(body) - 40, 4) if covers_secret(i, i + 40))
    return fragments


@pytest.fixture(scope="module")
def secret_fragments(bundles) -> dict[str, set[str]]:
    """Each bundle's private key fragments (private_key_fragments), computed once. Read only."""
    fragments = {name: private_key_fragments(bundle) for name, bundle in bundles.items()}
    for name, found in fragments.items():
        # Control: the detector does find the material in the secret itself.
        assert sum(fragment in bundles[name].to_secret_json() for fragment in found) > 20, name
    return fragments


def assert_nothing_secret_sent_or_written(stack, agent, secret_fragments) -> None:
    """No private key material in what the agent wrote or in any report it sent; every line it wrote
    is one JSON object (journald-friendly), and every report is well-formed."""
    from hpops_core.node_channel.report_proof import unsigned_event
    from hpops_core.node_channel.reports import parse_report_event

    stack.drain()
    assert stack.events, "the agent sent no report"
    sent = json.dumps(stack.events)
    output = agent.output()
    assert "PRIVATE KEY" not in output and "PRIVATE KEY" not in sent
    for name, fragments in secret_fragments.items():
        for fragment in fragments:
            assert fragment not in output, f"{name} private key material in agent output"
            assert fragment not in sent, f"{name} private key material in a report"
    for line in agent.stdout.read_text().splitlines():
        assert isinstance(json.loads(line), dict)
    for event in stack.events:
        parse_report_event(unsigned_event(event)[0])


# --------------------------------------------------------------------------- a node's life, a step per test


def test_a_fresh_node_ends_up_presenting_the_cluster_keys(stack, node, agent, bundles, secret_fragments):
    assert node.presented() == bundles["own"].public_fingerprints()  # before: its own first-boot keys
    assert node.wait_presenting(bundles["v1"].public_fingerprints(), 30) == bundles["v1"].public_fingerprints()
    start = stack.wait_for_report(lambda d: d["trigger"] == "start", 15)
    assert start is not None and start["instanceId"] == INSTANCE_ID and start["cluster"] == CLUSTER
    assert start["hostIdentity"]["version"] == "v1" and start["hostIdentity"]["result"] in ("changed", "unchanged")
    assert agent.process.poll() is None
    assert re.fullmatch(r"i-[a-f0-9]{17}", start["instanceId"])
    assert_nothing_secret_sent_or_written(stack, agent, secret_fragments)


def test_a_rotation_is_applied_within_a_few_poll_intervals(stack, settled, agent, bundles, secret_fragments):
    node, expected = settled, bundles["v2"].public_fingerprints()
    published = time.monotonic()
    stack.publish_keys(bundles["v2"], "v2")
    presented = node.wait_presenting(expected, APPLY_SECONDS)
    print(f"\nrotation: desired state published -> new keys presented in "
          f"{round(time.monotonic() - published, 2)} s (poll {POLL_SECONDS} s +-20%)")
    assert presented == expected
    report = stack.wait_for_report(lambda d: d["hostIdentity"]["version"] == "v2", 10)
    assert report is not None and report["trigger"] == "change" and report["hostIdentity"]["result"] == "changed"
    assert report["hostIdentity"]["fingerprints"] == expected
    assert_nothing_secret_sent_or_written(stack, agent, secret_fragments)


def test_an_sshd_t_failure_keeps_the_last_good_keys_and_reports_failed(stack, settled, agent, bundles,
                                                                       secret_fragments):
    node, last_good = settled, bundles["v1"]
    node.config.write_text(node.config.read_text() + "NoSuchDirective yes\n")  # sshd -t now rejects the node's config
    stack.publish_keys(bundles["v3"], "v3")
    report = stack.wait_for_report(lambda d: d["hostIdentity"]["version"] == "v3", APPLY_SECONDS)
    assert report is not None, "no report for v3"
    assert report["hostIdentity"]["result"] == "failed"
    assert report["hostIdentity"]["reason"].startswith("sshd -t failed")
    assert report["hostIdentity"]["fingerprints"] == last_good.public_fingerprints()
    assert node.presented() == last_good.public_fingerprints()
    assert node.process.poll() is None
    assert (node.ssh_dir / "ssh_host_ed25519_key").read_text() == last_good.ed25519.private_openssh
    assert_nothing_secret_sent_or_written(stack, agent, secret_fragments)


def test_certificate_mode_signed_from_the_reported_public_keys(stack, settled, agent, tmp_path, secret_fragments):
    node, ca = settled, keys.generate_ca()
    stack.put(contract.host_identity_parameter(CLUSTER), {
        "format": contract.HOST_IDENTITY_FORMAT, "mode": "certificate", "version": "c1",
        "caFingerprint": ca.fingerprint()})
    asking = stack.wait_for_report(lambda d: d["hostIdentity"]["mode"] == "certificate", APPLY_SECONDS)
    assert asking is not None and asking["hostIdentity"]["result"] == "waiting"
    public_keys = asking["hostIdentity"]["publicKeys"]
    assert sorted(public_keys) == sorted(KEY_NAMES)

    # The signer: certify exactly what the node reported, leave it in the node's parameter.
    now = int(time.time())
    bundle = keys.certify_host_keys(ca, public_keys, ["127.0.0.1"], f"{CLUSTER}/{INSTANCE_ID}", now - 300, now + 3600)
    version = stack.put(contract.certificate_parameter(CLUSTER, INSTANCE_ID), bundle.to_json())
    installed = stack.wait_for_report(lambda d: d["hostIdentity"].get("certificateVersion") == version, APPLY_SECONDS)
    assert installed is not None and installed["hostIdentity"]["result"] == "changed"

    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(ca.known_hosts_line(f"[127.0.0.1]:{node.port}") + "\n")
    ok, stderr = wait_until(lambda: (lambda r: r if r[0] else None)(ssh_host_check(node.port, known_hosts)), 10) \
        or ssh_host_check(node.port, known_hosts)
    assert ok, stderr[-1500:]
    assert "-CERT" in stderr  # the client really verified a host certificate
    # Control: the same client without the CA line refuses the node.
    known_hosts.write_text("")
    assert ssh_host_check(node.port, known_hosts)[0] is False
    assert_nothing_secret_sent_or_written(stack, agent, secret_fragments)


def test_maxlogins_lands_in_the_limits_file(stack, settled, agent, secret_fragments):
    stack.put(contract.login_limits_parameter(CLUSTER), {
        "format": contract.LOGIN_LIMITS_FORMAT, "version": "l1",
        "limits": {"default": 3, "overrides": {"alice": 5}, "exempt": ["ops"]}})
    path = settled.root / "etc" / "security" / "limits.d" / "90-hpops-maxlogins.conf"
    assert wait_until(path.exists, APPLY_SECONDS)
    text = path.read_text()
    assert "*  hard  maxlogins  3" in text and "alice  hard  maxlogins  5" in text and "ops  hard  maxlogins" in text
    report = stack.wait_for_report(lambda d: (d.get("loginLimits") or {}).get("version") == "l1", 10)
    assert report is not None and report["loginLimits"]["result"] == "changed"
    assert_nothing_secret_sent_or_written(stack, agent, secret_fragments)


def test_the_agent_survives_a_minute_without_the_endpoint(stack, settled, agent, secret_fragments):
    pid = agent.process.pid
    log_lines_before = agent.stdout.read_text().count("poll-failed")
    stack.stop()
    try:
        time.sleep(OUTAGE_SECONDS)
        assert agent.process.poll() is None, agent.output()[-2000:]
        assert agent.stdout.read_text().count("poll-failed") > log_lines_before  # it noticed, and kept going
    finally:
        stack.restart()
    stack.put(contract.login_limits_parameter(CLUSTER), {
        "format": contract.LOGIN_LIMITS_FORMAT, "version": "l2", "limits": {"default": 7}})
    path = settled.root / "etc" / "security" / "limits.d" / "90-hpops-maxlogins.conf"
    assert wait_until(lambda: path.exists() and "*  hard  maxlogins  7" in path.read_text(), APPLY_SECONDS + 5)
    report = stack.wait_for_report(lambda d: (d.get("loginLimits") or {}).get("version") == "l2", 15)
    assert report is not None
    assert agent.process.poll() is None and agent.process.pid == pid
    assert_nothing_secret_sent_or_written(stack, agent, secret_fragments)


def test_sigterm_stops_the_agent_cleanly(stack, settled, agent, secret_fragments):
    agent.process.send_signal(signal.SIGTERM)
    assert agent.process.wait(timeout=15) == 0
    assert '"event": "stopped"' in agent.stdout.read_text()
    assert_nothing_secret_sent_or_written(stack, agent, secret_fragments)
