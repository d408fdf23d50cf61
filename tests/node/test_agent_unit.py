"""The node agent in-process: config, identity, report logic, and ticks against moto.

The sshd side is stood in by `true` (sshd -t and reload always pass), so these tests are about
what the agent decides and writes; tests/node/test_agent_real_process.py runs it against a real sshd.
"""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from hpops_core.host_identity import keys
from hpops_core.node_channel import contract
from hpops_node_agent import host_keys, identity
from hpops_node_agent.agent import NodeAgent, TickOutcome, backoff_active, choose_trigger, report_digest
from hpops_node_agent.config import AgentConfig, ConfigError, load_config

CLUSTER = "test-cluster"
REGION = "us-west-2"
BUS = "hpops-node-reports"
INSTANCE_ID = "i-0123456789abcdef0"
SSH_KEYGEN = "/usr/bin/ssh-keygen"

needs_ssh_keygen = pytest.mark.skipif(not os.access(SSH_KEYGEN, os.X_OK), reason="needs /usr/bin/ssh-keygen")


# --------------------------------------------------------------------------- config


def minimal(**extra) -> dict:
    document = {"cluster": CLUSTER, "region": REGION, "reportBus": BUS}
    document.update(extra)
    return document


@pytest.mark.parametrize("missing", ["cluster", "region", "reportBus"])
def test_config_names_the_missing_key(tmp_path, missing):
    document = minimal()
    del document[missing]
    path = tmp_path / "agent.json"
    path.write_text(json.dumps(document))
    with pytest.raises(ConfigError, match=f"missing required key '{missing}'"):
        load_config(str(path))


def test_config_defaults_and_validation(tmp_path):
    config = AgentConfig.from_dict(minimal())
    assert config.poll_seconds == contract.DEFAULT_POLL_SECONDS
    assert config.heartbeat_seconds == contract.DEFAULT_HEARTBEAT_SECONDS
    assert config.root == "/" and config.state_dir == "/var/lib/hpops-node-agent"
    assert config.instance_id is None and config.role is None
    with pytest.raises(ConfigError, match="unknown key"):
        AgentConfig.from_dict(minimal(pollSecond=3))
    with pytest.raises(ConfigError, match="'pollSeconds'"):
        AgentConfig.from_dict(minimal(pollSeconds="30"))
    with pytest.raises(ConfigError, match="'pollSeconds'"):
        AgentConfig.from_dict(minimal(pollSeconds=0))
    with pytest.raises(ConfigError, match="'role'"):
        AgentConfig.from_dict(minimal(role="worker"))
    with pytest.raises(ConfigError, match="'instanceId'"):
        AgentConfig.from_dict(minimal(instanceId="node-1"))
    with pytest.raises(ConfigError, match="'cluster'"):
        AgentConfig.from_dict(minimal(cluster="bad name"))
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(str(tmp_path / "absent.json"))
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_config(str(tmp_path / "broken.json"))


# --------------------------------------------------------------------------- identity


def hyperpod_files(tmp_path: Path, with_instance_ids: bool = True) -> tuple[Path, Path]:
    def instance(ip, suffix):
        entry = {"InstanceName": f"node-{suffix}", "CustomerIpAddress": ip}
        if with_instance_ids:
            entry["InstanceId"] = f"i-0000000000000000{suffix}"
        return entry

    resource = tmp_path / "resource_config.json"
    resource.write_text(json.dumps({"InstanceGroups": [
        {"Name": "controller-machine", "Instances": [instance("10.1.0.2", "2")]},
        {"Name": "login-group", "Instances": [instance("10.1.0.5", "5"), instance("10.1.0.6", "6")]},
        {"Name": "gpu-workers", "Instances": [instance("10.1.1.9", "9")]},
    ]}))
    provisioning = tmp_path / "provisioning_parameters.json"
    provisioning.write_text(json.dumps({
        "version": "1.0.0", "workload_manager": "slurm", "controller_group": "controller-machine",
        "login_group": "login-group", "worker_groups": [{"instance_group_name": "gpu-workers", "partition_name": "p"}],
    }))
    return resource, provisioning


@pytest.mark.parametrize("ip, role, instance_id", [
    ("10.1.0.5", "login", "i-00000000000000005"),
    ("10.1.0.2", "controller", None),
    ("10.1.1.9", "compute", None),
])
def test_role_and_instance_id_from_hyperpod_files(tmp_path, ip, role, instance_id):
    resource, provisioning = hyperpod_files(tmp_path)
    config = AgentConfig.from_dict(minimal(ip=ip, resourceConfig=str(resource),
                                           provisioningParameters=str(provisioning)))

    def no_imds():
        raise AssertionError("IMDS must not be asked when resource_config names the instance")

    node = identity.resolve(config, imds=no_imds)
    assert (node.role, node.ip, node.instance_id, node.group) == (
        role, ip, instance_id, {"login": "login-group", "controller": "controller-machine",
                                "compute": "gpu-workers"}[role])


def test_instance_id_falls_back_to_imds_then_a_clear_error(tmp_path):
    resource, provisioning = hyperpod_files(tmp_path, with_instance_ids=False)
    config = AgentConfig.from_dict(minimal(ip="10.1.0.6", resourceConfig=str(resource),
                                           provisioningParameters=str(provisioning)))
    assert identity.resolve(config, imds=lambda: "i-0abcdef0123456789").instance_id == "i-0abcdef0123456789"
    # A real IMDS call from a machine that is not EC2: refused or timed out within the 1 s budget.
    with pytest.raises(identity.IdentityError, match="set instanceId in the agent config"):
        identity.resolve(config, imds=lambda: identity.imds_instance_id(timeout=0.2))


def test_identity_errors_name_the_file(tmp_path):
    resource, provisioning = hyperpod_files(tmp_path)
    absent = AgentConfig.from_dict(minimal(ip="10.1.0.5", resourceConfig=str(tmp_path / "nope.json"),
                                           provisioningParameters=str(provisioning)))
    with pytest.raises(identity.IdentityError, match="resource_config.json not found at .*nope.json"):
        identity.resolve(absent)
    no_provisioning = AgentConfig.from_dict(minimal(ip="10.1.0.5", resourceConfig=str(resource),
                                                    provisioningParameters=str(tmp_path / "gone.json")))
    with pytest.raises(identity.IdentityError, match="provisioning_parameters.json not found"):
        identity.resolve(no_provisioning)
    stranger = AgentConfig.from_dict(minimal(ip="10.9.9.9", resourceConfig=str(resource),
                                             provisioningParameters=str(provisioning)))
    with pytest.raises(identity.IdentityError, match="10.9.9.9 is not in"):
        identity.resolve(stranger)
    # Overrides need no files at all.
    override = AgentConfig.from_dict(minimal(ip="10.1.0.7", role="login", instanceId=INSTANCE_ID,
                                             resourceConfig=str(tmp_path / "nope.json")))
    assert identity.resolve(override).instance_id == INSTANCE_ID


def test_primary_ip_is_an_ipv4_address():
    parts = identity.primary_ip().split(".")
    assert len(parts) == 4 and all(0 <= int(part) <= 255 for part in parts)


# --------------------------------------------------------------------------- report logic (pure)


def report(host_result="unchanged", host_version="v1", host_reason="presenting version v1", limits_result="unchanged"):
    return {
        "instanceId": INSTANCE_ID, "ip": "10.1.0.5", "reportedAt": "2026-01-01T00:00:00+00:00", "trigger": None,
        "hostIdentity": {"mode": "keys", "version": host_version, "result": host_result, "reason": host_reason,
                         "fingerprints": {"ssh-ed25519": "SHA256:abc"}},
        "loginLimits": {"version": "l1", "result": limits_result, "reason": "maxlogins"},
    }


def test_digest_ignores_time_and_changed_vs_unchanged_but_not_version_or_failure():
    base = report_digest(report())
    assert report_digest(report(host_result="changed", host_reason="installed version v1 (6 files)")) == base
    assert report_digest(report(limits_result="changed")) == base
    assert report_digest(dict(report(), reportedAt="2027-01-01T00:00:00+00:00", trigger="heartbeat")) == base
    assert report_digest(report(host_version="v2")) != base
    assert report_digest(report(host_result="failed", host_reason="sshd -t failed")) != base
    assert report_digest(report(host_result="failed", host_reason="sshd -t failed")) != report_digest(
        report(host_result="failed", host_reason="reload failed"))


def test_trigger_start_then_change_then_heartbeat():
    state = {"lastReportDigest": "d1", "lastReportAt": 1000.0}
    assert choose_trigger(True, False, "d1", state, 1001, 600) == "start"
    assert choose_trigger(False, False, "d1", state, 1001, 600) is None
    assert choose_trigger(False, True, "d1", state, 1001, 600) == "change"
    assert choose_trigger(False, False, "d2", state, 1001, 600) == "change"
    assert choose_trigger(False, False, "d1", state, 1599, 600) is None
    assert choose_trigger(False, False, "d1", state, 1600, 600) == "heartbeat"
    assert choose_trigger(False, False, "d1", {}, 5, 600) == "change"  # never sent anything


def test_backoff_holds_one_version_for_ten_minutes_only():
    state = {"backoff": {"key": "keys:v2", "at": 1000.0, "reason": "sshd -t failed (exit 255): bad"}}
    assert backoff_active(state, "keys:v2", 1000 + 599) == "sshd -t failed (exit 255): bad"
    assert backoff_active(state, "keys:v2", 1000 + 600) is None
    assert backoff_active(state, "keys:v3", 1001) is None  # a new desired version retries at once


# --------------------------------------------------------------------------- ticks against moto


@pytest.fixture(scope="module")
def own_keys() -> keys.HostKeyBundle:
    return keys.generate_bundle()


@pytest.fixture(scope="module")
def canonical() -> keys.HostKeyBundle:
    return keys.generate_bundle()


@pytest.fixture(scope="module")
def rotated() -> keys.HostKeyBundle:
    return keys.generate_bundle()


def write_node_keys(root: Path, bundle: keys.HostKeyBundle) -> None:
    ssh_dir = root / "etc" / "ssh"
    ssh_dir.mkdir(parents=True, exist_ok=True)
    (ssh_dir / "sshd_config").write_text("Port 22\n")
    for pair in bundle.pairs():
        private = ssh_dir / f"ssh_host_{pair.name}_key"
        private.write_text(pair.private_openssh)
        private.chmod(0o600)
        (ssh_dir / f"ssh_host_{pair.name}_key.pub").write_text(pair.public_line + "\n")


class Aws:
    """moto account with the stack's side of the channel: bus -> rule -> SQS, secret, parameters."""

    def __init__(self):
        self.session = boto3.session.Session(region_name=REGION)
        self.ssm = self.session.client("ssm")
        self.secrets = self.session.client("secretsmanager")
        events = self.session.client("events")
        self.sqs = self.session.client("sqs")
        events.create_event_bus(Name=BUS)
        self.queue_url = self.sqs.create_queue(QueueName="reports")["QueueUrl"]
        queue_arn = self.sqs.get_queue_attributes(QueueUrl=self.queue_url, AttributeNames=["QueueArn"])[
            "Attributes"]["QueueArn"]
        events.put_rule(Name="reports", EventBusName=BUS, EventPattern=json.dumps({"source": [contract.REPORT_SOURCE]}))
        events.put_targets(Rule="reports", EventBusName=BUS, Targets=[{"Id": "q", "Arn": queue_arn}])
        self.secret_arn = None

    def publish_keys(self, bundle: keys.HostKeyBundle, version: str, secret_text: str | None = None) -> None:
        text = secret_text if secret_text is not None else bundle.to_secret_json()
        if self.secret_arn is None:
            self.secret_arn = self.secrets.create_secret(Name=f"hpops/{CLUSTER}/host-keys", SecretString=text)["ARN"]
        else:
            self.secrets.put_secret_value(SecretId=self.secret_arn, SecretString=text)
        self.put(contract.host_identity_parameter(CLUSTER), {
            "format": contract.HOST_IDENTITY_FORMAT, "mode": "keys", "version": version,
            "secretArn": self.secret_arn, "fingerprints": bundle.public_fingerprints()})

    def put(self, name: str, document: dict) -> int:
        return self.ssm.put_parameter(Name=name, Value=json.dumps(document), Type="String", Overwrite=True)["Version"]

    def reports(self) -> list[dict]:
        events = []
        while True:
            messages = self.sqs.receive_message(QueueUrl=self.queue_url, MaxNumberOfMessages=10).get("Messages", [])
            if not messages:
                return events
            for message in messages:
                events.append(json.loads(message["Body"]))
                self.sqs.delete_message(QueueUrl=self.queue_url, ReceiptHandle=message["ReceiptHandle"])


@pytest.fixture
def aws(monkeypatch):
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": REGION}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        yield Aws()


class Clock:
    def __init__(self, now: float = 1_700_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def node_root(tmp_path, own_keys) -> Path:
    root = tmp_path / "root"
    write_node_keys(root, own_keys)
    return root


def make_agent(aws: Aws, root: Path, clock: Clock | None = None, **overrides) -> NodeAgent:
    document = minimal(root=str(root), role="login", ip="10.1.0.5", instanceId=INSTANCE_ID,
                       sshdCmd="true", reloadCmd="true", sshKeygenCmd=SSH_KEYGEN)
    document.update(overrides)
    agent = NodeAgent(AgentConfig.from_dict(document), aws.session, clock=clock or Clock())
    # NodeChannel's answer to this (enrolled) agent, as the stack gives it: the secret the desired state names.
    # The signed request and the function itself: tests/node/test_enrollment_real_process.py, the twin.
    agent._fetch = lambda item: _channel_answer(aws, agent, item)
    return agent


def _channel_answer(aws: Aws, agent: NodeAgent, item: str) -> dict:
    assert item == "hostKeys"
    document = json.loads(aws.session.client("ssm").get_parameter(
        Name=contract.host_identity_parameter(agent.config.cluster))["Parameter"]["Value"])
    secret = aws.session.client("secretsmanager").get_secret_value(SecretId=document["secretArn"])
    return {"value": secret["SecretString"], "version": secret["VersionId"]}


def on_disk_fingerprints(root: Path) -> dict[str, str]:
    found = {}
    for name, key_type in host_keys.KEY_TYPES.items():
        line = (root / "etc" / "ssh" / f"ssh_host_{name}_key.pub").read_text()
        found[key_type] = host_keys.fingerprint(host_keys.parse_public_line(line, key_type, name))
    return found


def private_fragments(*bundles: keys.HostKeyBundle) -> list[str]:
    """PEM body lines of the private keys that are not also part of the public line."""
    fragments = []
    for bundle in bundles:
        for pair in bundle.pairs():
            for line in pair.private_openssh.splitlines():
                if not line.startswith("-----") and line not in pair.public_line:
                    fragments.append(line)
    return fragments


@needs_ssh_keygen
def test_keys_mode_tick_installs_canonical_keys_and_reports_once(aws, node_root, canonical, own_keys, capsys):
    aws.publish_keys(canonical, "v1")
    aws.put(contract.login_limits_parameter(CLUSTER), {
        "format": contract.LOGIN_LIMITS_FORMAT, "version": "l1",
        "limits": {"default": 2, "overrides": {"alice": 4}, "exempt": ["ops"]}})
    clock = Clock()
    agent = make_agent(aws, node_root, clock)

    first = agent.tick()

    assert isinstance(first, TickOutcome)
    assert first.host_identity_result == "changed" and first.login_limits["result"] == "changed"
    assert on_disk_fingerprints(node_root) == canonical.public_fingerprints()
    private = node_root / "etc" / "ssh" / "ssh_host_ed25519_key"
    assert private.read_text() == canonical.ed25519.private_openssh and stat.S_IMODE(private.stat().st_mode) == 0o600
    limits = (node_root / "etc" / "security" / "limits.d" / "90-hpops-maxlogins.conf").read_text()
    assert "*  hard  maxlogins  2" in limits and "alice  hard  maxlogins  4" in limits
    # The keys came from NodeChannel (stood in above): the node role made no secret read.
    assert first.api_calls == {"ssm:GetParameters": 1, "events:PutEvents": 1}
    events = aws.reports()
    assert len(events) == 1
    event = events[0]
    assert event["source"] == contract.REPORT_SOURCE and event["detail-type"] == contract.REPORT_DETAIL_TYPE
    detail = event["detail"]
    assert detail["trigger"] == "start" and detail["instanceId"] == INSTANCE_ID and detail["role"] == "login"
    assert detail["hostIdentity"]["version"] == "v1"
    assert detail["hostIdentity"]["fingerprints"] == canonical.public_fingerprints()
    assert detail["loginLimits"] == {"version": "l1", "result": "changed",
                                     "reason": "maxlogins default 2, 1 override(s), 1 exempt"}
    # The stack's own validator accepts what the agent sends.
    from hpops_core.node_channel.reports import parse_report_event
    assert parse_report_event(event).hostIdentity.result == "changed"
    state_file = node_root / "var" / "lib" / "hpops-node-agent" / "state.json"
    assert stat.S_IMODE(state_file.stat().st_mode) == 0o600

    # Steady state: one GetParameters, nothing written, nothing sent.
    clock.now += 30
    files_before = {p.name: p.read_bytes() for p in (node_root / "etc" / "ssh").iterdir()}
    second = agent.tick()
    assert second.host_identity_result == "unchanged" and second.login_limits["result"] == "unchanged"
    assert second.api_calls == {"ssm:GetParameters": 1}
    assert not second.report_sent and second.trigger is None
    assert aws.reports() == []
    assert {p.name: p.read_bytes() for p in (node_root / "etc" / "ssh").iterdir()} == files_before

    # Heartbeat after heartbeatSeconds, with no other change.
    clock.now += contract.DEFAULT_HEARTBEAT_SECONDS
    third = agent.tick()
    assert third.trigger == "heartbeat" and third.report_sent
    assert [e["detail"]["trigger"] for e in aws.reports()] == ["heartbeat"]

    output = capsys.readouterr()
    for fragment in private_fragments(canonical, own_keys):
        assert fragment not in output.out + output.err
        assert fragment not in json.dumps(events)


@needs_ssh_keygen
def test_broken_bundle_changes_nothing_reports_failed_and_backs_off(aws, node_root, canonical, own_keys):
    document = json.loads(canonical.to_secret_json())
    document["keys"]["rsa"]["public"] = own_keys.rsa.public_line  # public line of another key
    aws.publish_keys(canonical, "v1", secret_text=json.dumps(document))
    clock = Clock()
    agent = make_agent(aws, node_root, clock)
    files_before = {p.name: p.read_bytes() for p in (node_root / "etc" / "ssh").iterdir()}

    first = agent.tick()

    assert first.host_identity_result == "failed"
    assert "does not belong to the public line" in first.host_identity["reason"]
    assert {p.name: p.read_bytes() for p in (node_root / "etc" / "ssh").iterdir()} == files_before
    detail = aws.reports()[0]["detail"]
    assert detail["hostIdentity"]["result"] == "failed"
    assert detail["hostIdentity"]["fingerprints"] == own_keys.public_fingerprints()

    # Same desired version inside the backoff: no secret fetch, no new report.
    clock.now += 60
    held = agent.tick()
    assert held.host_identity_result == "failed" and held.api_calls == {"ssm:GetParameters": 1}
    assert aws.reports() == []

    # A new desired version is tried at once, and a good bundle converges.
    aws.publish_keys(canonical, "v2")
    clock.now += 30
    fixed = agent.tick()
    assert fixed.host_identity_result == "changed" and fixed.trigger == "change"
    assert on_disk_fingerprints(node_root) == canonical.public_fingerprints()
    assert [e["detail"]["hostIdentity"]["result"] for e in aws.reports()] == ["changed"]


@needs_ssh_keygen
def test_secret_not_yet_rotated_waits_without_touching_files(aws, node_root, canonical, rotated):
    aws.publish_keys(canonical, "v1")
    # The parameter already names the rotated keys; the secret still holds the old ones.
    aws.put(contract.host_identity_parameter(CLUSTER), {
        "format": contract.HOST_IDENTITY_FORMAT, "mode": "keys", "version": "v2",
        "secretArn": aws.secret_arn, "fingerprints": rotated.public_fingerprints()})
    agent = make_agent(aws, node_root)
    files_before = {p.name: p.read_bytes() for p in (node_root / "etc" / "ssh").iterdir()}
    outcome = agent.tick()
    assert outcome.host_identity_result == "waiting" and "rotation in flight" in outcome.host_identity["reason"]
    assert {p.name: p.read_bytes() for p in (node_root / "etc" / "ssh").iterdir()} == files_before


@needs_ssh_keygen
def test_sshd_t_failure_rolls_back_and_reports_failed(aws, node_root, canonical, own_keys):
    aws.publish_keys(canonical, "v1")
    agent = make_agent(aws, node_root, sshdCmd="false")
    outcome = agent.tick()
    assert outcome.host_identity_result == "failed" and outcome.host_identity["reason"].startswith("sshd -t failed")
    assert on_disk_fingerprints(node_root) == own_keys.public_fingerprints()
    assert (node_root / "etc" / "ssh" / "ssh_host_rsa_key").read_text() == own_keys.rsa.private_openssh


def test_no_parameters_means_waiting_and_a_start_report(aws, node_root, own_keys):
    agent = make_agent(aws, node_root)
    outcome = agent.tick()
    assert outcome.host_identity == {"mode": "off", "version": None, "result": "waiting",
                                     "reason": "no host-identity parameter published yet",
                                     "fingerprints": own_keys.public_fingerprints()}
    assert outcome.login_limits["result"] == "waiting"
    assert outcome.trigger == "start" and outcome.report_sent
    assert outcome.api_calls == {"ssm:GetParameters": 1, "events:PutEvents": 1}


def test_failed_send_is_retried_next_tick_keeping_the_start_trigger(aws, node_root):
    agent = make_agent(aws, node_root, reportBus="no-such-bus")
    first = agent.tick()
    assert first.trigger == "start" and not first.report_sent  # moto: unknown bus fails the entry or call
    agent.config = AgentConfig.from_dict(dict(minimal(root=str(node_root), role="login", ip="10.1.0.5",
                                                      instanceId=INSTANCE_ID, sshdCmd="true", reloadCmd="true")))
    second = agent.tick()
    assert second.trigger == "start" and second.report_sent
    assert [e["detail"]["trigger"] for e in aws.reports()] == ["start"]


def test_aws_outage_never_raises(aws, node_root, monkeypatch):
    agent = make_agent(aws, node_root)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens on the discard port
    offline = NodeAgent(agent.config, boto3.session.Session(region_name=REGION))
    outcome = offline.tick()
    assert outcome.error and outcome.error.startswith("ssm:GetParameters:")
    assert not outcome.report_sent


def test_malformed_limits_are_refused_and_reported(aws, node_root):
    aws.put(contract.login_limits_parameter(CLUSTER), {
        "format": contract.LOGIN_LIMITS_FORMAT, "version": "l2", "limits": {"default": 0}})
    outcome = make_agent(aws, node_root).tick()
    assert outcome.login_limits["result"] == "failed" and outcome.login_limits["version"] == "l2"
    assert not (node_root / "etc" / "security").exists()


@needs_ssh_keygen
def test_certificate_mode_reports_public_keys_then_installs_the_certificate(aws, node_root, own_keys):
    ca = keys.generate_ca()
    aws.put(contract.host_identity_parameter(CLUSTER), {
        "format": contract.HOST_IDENTITY_FORMAT, "mode": "certificate", "version": "c1",
        "caFingerprint": ca.fingerprint()})
    clock = Clock()
    agent = make_agent(aws, node_root, clock)
    first = agent.tick()
    assert first.host_identity_result == "waiting"
    published = aws.reports()[0]["detail"]["hostIdentity"]
    assert published["publicKeys"] == {p.name: " ".join(p.public_line.split()[:2]) for p in own_keys.pairs()}
    assert published["certificateVersion"] is None

    now = int(time.time())  # host_keys checks validity against the real clock
    bundle = keys.certify_host_keys(ca, published["publicKeys"], ["10.1.0.5"], f"{CLUSTER}/{INSTANCE_ID}",
                                    now - 60, now + 3600)
    version = aws.ssm.put_parameter(Name=contract.certificate_parameter(CLUSTER, INSTANCE_ID),
                                    Value=bundle.to_json(), Type="String", Overwrite=True)["Version"]
    clock.now += 30
    second = agent.tick()
    assert second.host_identity_result == "changed" and second.host_identity["certificateVersion"] == version
    assert (node_root / "etc" / "ssh" / "ssh_host_ed25519_key-cert.pub").read_text() == \
        bundle.certificates["ed25519"] + "\n"
    assert "HostCertificate" in (node_root / "etc" / "ssh" / "sshd_config").read_text()
    assert aws.reports()[0]["detail"]["hostIdentity"]["certificateVersion"] == version

    # Installed: the next tick runs no ssh-keygen -y and sends nothing; after the signer deletes
    # the parameter the node still reports what it installed.
    clock.now += 30
    assert agent.tick().host_identity_result == "unchanged"
    aws.ssm.delete_parameter(Name=contract.certificate_parameter(CLUSTER, INSTANCE_ID))
    clock.now += 30
    after = agent.tick()
    assert after.host_identity_result == "unchanged" and after.host_identity["certificateVersion"] == version
    assert not after.report_sent


def test_non_login_roles_do_nothing(aws, node_root):
    for role in ("compute", "controller"):
        outcome = make_agent(aws, node_root, role=role).tick()
        assert outcome.role == role and outcome.api_calls == {} and not outcome.report_sent


def test_agent_logs_are_json_lines(aws, node_root, capsys):
    make_agent(aws, node_root).tick()
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert lines and all(json.loads(line)["event"] for line in lines)
    assert any(json.loads(line)["event"] == "report-sent" for line in lines)


# --------------------------------------------------------------------------- the shared name rules


def test_shared_rules_module_ships_in_the_bundle_and_parses_as_python_38(tmp_path):
    """hpops_core/common/validation.py (the name and id rules) is imported by the node channel modules, so
    the bundle carries it, it is Python 3.8 syntax with standard-library imports only, and the
    bundled channel modules load it from the bundle, not from the operator's checkout."""
    import ast
    import subprocess
    import sys

    from hpops_core.common import validation
    from hpops_node_agent import bundle as bundle_module

    source = Path(validation.__file__)
    tree = ast.parse(source.read_text(), feature_version=(3, 8))
    for node in ast.walk(tree):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
            [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
        for name in names:
            # the error root travels with it (errors.py is standard-library only too)
            assert name.split(".")[0] in sys.stdlib_module_names or name in ("__future__", "hpops_core.common.errors"), name

    built = bundle_module.build_bundle(tmp_path, CLUSTER, REGION, BUS, vendor=False)
    assert (built / "hpops_core" / "common" / "validation.py").read_text() == source.read_text()
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); "
             "from hpops_core.node_channel import contract, login_limits; import hpops_core.common.validation as v; "
             "print(v.__file__); print(contract.check_instance_id('i-12345678abcdefghi')); "
             "print(login_limits.parse_limits('{\"default\": 2, \"overrides\": {\"j.doe\": 4}}'))")
    result = subprocess.run([sys.executable, "-c", probe, str(built)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == str(built / "hpops_core" / "common" / "validation.py")
    assert lines[1] == "i-12345678abcdefghi" and "'j.doe': 4" in lines[2]


def test_agent_config_refuses_an_instance_id_naming_the_key():
    with pytest.raises(ConfigError, match=r"config key 'instanceId': 'i-\.\./x' is not an instance id"):
        AgentConfig.from_dict(minimal(instanceId="i-../x"))
    assert AgentConfig.from_dict(minimal(instanceId="i-12345678abcdefghi")).instance_id == "i-12345678abcdefghi"


def test_keepalive_and_login_slot_from_the_published_documents(aws, node_root):
    aws.put(contract.ssh_keepalive_parameter(CLUSTER), {"format": "hpops.node.ssh-keepalive.v1",
                                                         "listenerIdleTimeoutSeconds": 350})
    aws.put(contract.login_slots_parameter(CLUSTER), {"format": "hpops.node.login-slots.v1", "host": "login.example.edu",
                                                      "portBase": 2200, "slots": {"10.1.0.5": 2}})
    agent = make_agent(aws, node_root)
    agent.tick()
    (report,) = [r["detail"] for r in aws.reports()]
    assert report["sshKeepalive"]["clientAliveInterval"] == 120 and report["sshKeepalive"]["result"] == "changed"
    assert (node_root / "etc/ssh/sshd_config").read_text().startswith("# BEGIN hpops keepalive")
    message = (node_root / "etc/profile.d/hpops-login-slot.sh").read_text()
    assert "you are on login-02; come back to this node with: ssh -p 2202 login.example.edu" in message

    aws.put(contract.login_slots_parameter(CLUSTER), {"format": "hpops.node.login-slots.v1", "host": "login.example.edu",
                                                      "portBase": 2200, "slots": {}})
    agent.tick()
    assert not (node_root / "etc/profile.d/hpops-login-slot.sh").exists()  # this node no longer has a slot


def test_a_bad_keepalive_or_slot_document_changes_nothing(aws, node_root):
    before = (node_root / "etc/ssh/sshd_config").read_text()
    aws.put(contract.ssh_keepalive_parameter(CLUSTER), {"format": "hpops.node.ssh-keepalive.v1",
                                                         "listenerIdleTimeoutSeconds": 1})
    aws.put(contract.login_slots_parameter(CLUSTER), {"format": "hpops.node.login-slots.v1", "host": "$(reboot)",
                                                      "slots": {"10.1.0.5": 1}})
    make_agent(aws, node_root).tick()
    (report,) = [r["detail"] for r in aws.reports()]
    assert report["sshKeepalive"]["result"] == "failed" and "refused" in report["sshKeepalive"]["reason"]
    assert (node_root / "etc/ssh/sshd_config").read_text() == before
    assert not (node_root / "etc/profile.d").exists()
