"""The operator CLI against a (moto) deployment: `status`, `repair`, `host-keys generate|adopt|rotate|show`
and `lifecycle`, each reading a CloudFormation stack that carries template.yaml's output and parameter
names and points at real moto resources (target group, state machine, table, secret, event bus).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shutil
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import boto3
import pytest
from moto import mock_aws
from moto.core import DEFAULT_ACCOUNT_ID

from hpops.main import main
from hpops_core.host_identity.identity_record import read_expected
from hpops_core.host_identity.keys import HostKeyBundle
from hpops_twin.hyperpod_sim import HyperPodSimulator
from hpops_twin.template_model import TemplateModel

REGION = "us-east-1"
STACK_NAME = "hpops-ml"
CLUSTER = "ml-research"
LB_DNS = "login-nlb-0123456789.elb.us-east-1.amazonaws.com"
ROLE_ARN = f"arn:aws:iam::{DEFAULT_ACCOUNT_ID}:role/hpops-login-sync"
CLI_SOURCE = Path(__file__).resolve().parents[2] / "cli" / "hpops" / "main.py"
EXECUTING = {"stepfunctions": {"execute_state_machine": True}}

# A stand-in for LoginNodeSync that answers like it: a dry run plans, a repair applies.
REPAIR_DEFINITION = {
    "StartAt": "IsDryRun",
    "States": {
        "IsDryRun": {"Type": "Choice", "Default": "Apply",
                     "Choices": [{"Variable": "$.dryRun", "BooleanEquals": True, "Next": "Plan"}]},
        "Plan": {"Type": "Pass", "End": True, "Result": {"plan": {
            "summary": "dry run: would register 1, deregister 1",
            "reasons": ["register 10.1.0.14: Running login node, host keys verified",
                        "deregister 10.1.0.11: node is ShuttingDown"]}}},
        "Apply": {"Type": "Pass", "End": True, "Result": {"plan": {
            "summary": "registered 1, deregistered 1",
            "reasons": ["register 10.1.0.14: Running login node, host keys verified",
                        "deregister 10.1.0.11: node is ShuttingDown"]}}},
    },
}
FAILING_DEFINITION = {"StartAt": "AcquireLease", "States": {"AcquireLease": {
    "Type": "Fail", "Error": "LeaseHeld", "Cause": "another sync of ml-research holds the lease"}}}

STATE_TABLE = {"Type": "AWS::DynamoDB::Table", "Properties": {
    "BillingMode": "PAY_PER_REQUEST",
    "AttributeDefinitions": [{"AttributeName": "pk", "AttributeType": "S"}, {"AttributeName": "sk", "AttributeType": "S"}],
    "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}]}}


def create_stack(*, parameters: dict[str, str], outputs: dict[str, object], resources: dict | None = None,
                 region: str = REGION, stack_name: str = STACK_NAME) -> None:
    """A stack with template.yaml's parameter and output names. An output is a {"Ref": ...} of a resource
    or parameter; moto's CloudFormation cannot create secrets or Ref an event bus, so those are made
    by the test and handed in as parameters."""
    template = {
        "Parameters": {name: {"Type": "String"} for name in parameters},
        "Resources": resources or {"Placeholder": {"Type": "AWS::SNS::Topic"}},
        "Outputs": {name: {"Value": value} for name, value in outputs.items()},
    }
    boto3.client("cloudformation", region_name=region).create_stack(
        StackName=stack_name, TemplateBody=json.dumps(template),
        Parameters=[{"ParameterKey": k, "ParameterValue": v} for k, v in parameters.items()])


def stack_outputs(region: str = REGION) -> dict[str, str]:
    stack = boto3.client("cloudformation", region_name=region).describe_stacks(StackName=STACK_NAME)["Stacks"][0]
    return {o["OutputKey"]: o["OutputValue"] for o in stack["Outputs"]}


def run(capsys, *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.fixture
def region(monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    return REGION


class FakeClock:
    """Stands in for the `time` module inside hpops.main: sleeps advance a fake clock (and yield briefly,
    so moto's interpreter thread can finish an execution) instead of waiting 2 s per poll."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        import time
        self.sleeps.append(seconds)
        self.now += seconds
        time.sleep(0.01)


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr("hpops.main.time", fake)
    return fake


# --------------------------------------------------------------------------- names


def _names_read(source: str, mapping: str) -> tuple[set[str], set[str]]:
    """(names read with mapping["X"], names read with mapping.get("X"...)) in the CLI's source."""
    indexed = set(re.findall(rf"""\b{mapping}\[["'](\w+)["']\]""", source))
    optional = set(re.findall(rf"""\b{mapping}\.get\(["'](\w+)["']""", source))
    return indexed, optional


def test_every_output_and_parameter_the_cli_reads_exists_in_template_yaml():
    template = TemplateModel().raw
    source = CLI_SOURCE.read_text(encoding="utf-8")
    outputs_required, outputs_optional = _names_read(source, "outputs")
    parameters_required, parameters_optional = _names_read(source, "parameters")
    assert {"TargetGroupArn", "LoginNodeSyncStateMachineArn", "SyncStateTableName", "HostIdentitySecretArn",
            "HostCertificateAuthoritySecretArn", "NodeReportBusName"} <= outputs_required
    assert "LoadBalancerDnsName" in outputs_optional
    assert {"ClusterName"} <= parameters_required and {"LoginGroupName", "HostCertificatePrincipals"} <= parameters_optional
    assert outputs_required | outputs_optional <= set(template["Outputs"])
    assert parameters_required | parameters_optional <= set(template["Parameters"])
    # An output that exists only under a condition (no load balancer created) must be read with .get().
    conditional = {name for name, output in template["Outputs"].items() if "Condition" in output}
    assert not conditional & outputs_required, f"read {conditional & outputs_required} with .get(): they can be absent"


# --------------------------------------------------------------------------- status


@pytest.fixture
def deployment(region):
    """A HyperPod cluster (moto, nodes with IPs via the twin's simulator) and a stack with a real
    IP target group and state machine. Login group `login`: 3 nodes, one of them being replaced
    (old ShuttingDown, new Pending); group `login-staging` (its name contains "login") and `gpu`."""
    with mock_aws():
        sim = HyperPodSimulator(REGION, DEFAULT_ACCOUNT_ID, clock=lambda: datetime.now(timezone.utc))
        sim.create_cluster(CLUSTER, {"login": ("ml.m5.xlarge", 3), "login-staging": ("ml.m5.xlarge", 1),
                                     "gpu": ("ml.p5.48xlarge", 2)})
        login = sorted(sim.nodes(CLUSTER, "login"), key=lambda n: n.ip)
        sim.replace_node(CLUSTER, login[0].instance_id)
        create_stack(
            parameters={"ClusterName": CLUSTER, "LoginGroupName": "login"},
            resources={
                "Vpc": {"Type": "AWS::EC2::VPC", "Properties": {"CidrBlock": "10.1.0.0/16"}},
                "LoginTargetGroup": {"Type": "AWS::ElasticLoadBalancingV2::TargetGroup", "Properties": {
                    "Name": "hpops-login", "Protocol": "TCP", "Port": 22, "TargetType": "ip", "VpcId": {"Ref": "Vpc"}}},
                "LoginNodeSyncStateMachine": {"Type": "AWS::StepFunctions::StateMachine", "Properties": {
                    "StateMachineName": "hpops-login-sync", "RoleArn": ROLE_ARN,
                    "DefinitionString": json.dumps(REPAIR_DEFINITION)}},
            },
            outputs={"TargetGroupArn": {"Ref": "LoginTargetGroup"},
                     "LoginNodeSyncStateMachineArn": {"Ref": "LoginNodeSyncStateMachine"}},
        )
        yield sim


def _by_status(sim: HyperPodSimulator, group: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for node in sim.nodes(CLUSTER, group):
        found.setdefault(node.status, []).append(node.ip)
    return {status: sorted(ips) for status, ips in found.items()}


def _register(ips: list[str]) -> None:
    boto3.client("elbv2").register_targets(TargetGroupArn=stack_outputs()["TargetGroupArn"],
                                           Targets=[{"Id": ip, "Port": 22} for ip in ips])


def _target_rows(out: str) -> list[tuple[str, str, str]]:
    return re.findall(r"^(\d+\.\d+\.\d+\.\d+)\s+(\d+)\s+(\S+)$", out, flags=re.MULTILINE)


def test_status_in_sync_lists_targets_running_login_nodes_and_recent_executions(deployment, capsys):
    login = _by_status(deployment, "login")
    assert len(login["Running"]) == 2 and len(login["Pending"]) == 1 and len(login["ShuttingDown"]) == 1
    _register(login["Running"])
    sfn = boto3.client("stepfunctions")
    machine = stack_outputs()["LoginNodeSyncStateMachineArn"]
    sfn.start_execution(stateMachineArn=machine, name="sweep-0001", input="{}")
    stopped = sfn.start_execution(stateMachineArn=machine, name="repair-0002", input="{}")["executionArn"]
    sfn.stop_execution(executionArn=stopped)

    status, out, _ = run(capsys, "status", "--stack-name", STACK_NAME, "--region", REGION)

    assert status == 0
    assert _target_rows(out) == [(ip, "22", "healthy") for ip in login["Running"]]
    # Running nodes of the exact login group only: not the Pending/ShuttingDown ones, not login-staging or gpu.
    assert f"Running login nodes: {', '.join(login['Running'])}" in out.splitlines()
    assert "in sync" in out.splitlines() and "OUT OF SYNC" not in out
    executions = out.split("recent executions:", 1)[1]
    assert re.search(r"^  \d{4}-\d\d-\d\d \d\d:\d\d:\d\d  RUNNING\s+sweep-0001$", executions, re.MULTILINE)
    assert re.search(r"^  \d{4}-\d\d-\d\d \d\d:\d\d:\d\d  ABORTED\s+repair-0002$", executions, re.MULTILINE)


def test_status_out_of_sync_when_a_shutting_down_node_is_registered_and_a_running_one_is_not(deployment, capsys):
    login = _by_status(deployment, "login")
    registered = sorted([login["Running"][0], login["ShuttingDown"][0]])
    _register(registered)

    status, out, _ = run(capsys, "status", "--stack-name", STACK_NAME, "--region", REGION)

    assert status == 0
    assert _target_rows(out) == [(ip, "22", "healthy") for ip in registered]
    assert f"Running login nodes: {', '.join(login['Running'])}" in out.splitlines()
    assert "OUT OF SYNC: start `hpops repair`" in out.splitlines() and "in sync" not in out.splitlines()
    assert out.rstrip().endswith("recent executions:")  # none started yet


# --------------------------------------------------------------------------- repair


def _repair_stack(definition: dict) -> str:
    # Created through the API, not as a stack resource: with execute_state_machine moto's Step Functions
    # API is served by its interpreter's backend, which does not see machines CloudFormation created.
    machine = boto3.client("stepfunctions").create_state_machine(
        name="hpops-login-sync", roleArn=ROLE_ARN, definition=json.dumps(definition))["stateMachineArn"]
    create_stack(parameters={"ClusterName": CLUSTER, "SyncStateMachine": machine},
                 outputs={"LoginNodeSyncStateMachineArn": {"Ref": "SyncStateMachine"}})
    assert stack_outputs()["LoginNodeSyncStateMachineArn"] == machine
    return machine


def _only_execution(machine: str) -> dict:
    sfn = boto3.client("stepfunctions")
    executions = sfn.list_executions(stateMachineArn=machine)["executions"]
    assert len(executions) == 1
    return sfn.describe_execution(executionArn=executions[0]["executionArn"])


def _name(execution: dict) -> str:
    """The execution's name; moto's interpreter leaves `name` (optional in the API model) out of
    DescribeExecution for an unnamed execution, whose ARN ends in it."""
    return execution.get("name") or execution["executionArn"].rsplit(":", 1)[-1]


@pytest.mark.parametrize("flags, dry_run, summary, verb", [
    ([], False, "registered 1, deregistered 1", "Apply"),
    (["--dry-run"], True, "dry run: would register 1, deregister 1", "Plan"),
])
def test_repair_starts_the_execution_waits_for_it_and_prints_the_plan(region, clock, capsys, flags, dry_run, summary, verb):
    with mock_aws(config=EXECUTING):  # moto's Step Functions interpreter runs the definition
        machine = _repair_stack(REPAIR_DEFINITION)
        status, out, _ = run(capsys, "repair", "--stack-name", STACK_NAME, "--region", REGION, *flags)
        execution = _only_execution(machine)

    assert status == 0
    assert execution["status"] == "SUCCEEDED"
    assert json.loads(execution["input"]) == {"cluster": CLUSTER, "mode": "repair", "dryRun": dry_run}
    reasons = REPAIR_DEFINITION["States"][verb]["Result"]["plan"]["reasons"]
    assert out.splitlines() == [
        f"started {execution['executionArn']}",
        f"execution {_name(execution)}: SUCCEEDED",
        f"  plan: {summary}",
        *(f"    {reason}" for reason in reasons),
    ]


def test_repair_that_fails_exits_1_and_prints_the_error(region, clock, capsys):
    with mock_aws(config=EXECUTING):
        machine = _repair_stack(FAILING_DEFINITION)
        status, out, _ = run(capsys, "repair", "--stack-name", STACK_NAME, "--region", REGION)
        execution = _only_execution(machine)

    assert status == 1
    assert execution["status"] == "FAILED"
    assert json.loads(execution["input"]) == {"cluster": CLUSTER, "mode": "repair", "dryRun": False}
    assert f"execution {_name(execution)}: FAILED" in out.splitlines()
    assert "  error: LeaseHeld: another sync of ml-research holds the lease" in out.splitlines()
    assert "plan:" not in out


def test_repair_still_running_at_the_timeout_exits_2(region, clock, capsys):
    with mock_aws():  # by default moto does not run definitions: the execution stays RUNNING
        machine = _repair_stack(REPAIR_DEFINITION)
        status, out, _ = run(capsys, "repair", "--stack-name", STACK_NAME, "--region", REGION, "--timeout", "5")
        execution = _only_execution(machine)

    assert status == 2
    assert execution["status"] == "RUNNING"
    assert json.loads(execution["input"]) == {"cluster": CLUSTER, "mode": "repair", "dryRun": False}
    assert out.splitlines() == [f"started {execution['executionArn']}",
                                "still running; follow it in the Step Functions console"]
    assert clock.sleeps  # it polled (on the fake clock) before giving up


# --------------------------------------------------------------------------- host keys


@pytest.fixture
def keys_stack(region):
    """The keys-mode pieces: the state table (a stack resource) and the host-key secret holding
    template.yaml's placeholder value (moto's CloudFormation cannot create secrets)."""
    with mock_aws():
        arn = boto3.client("secretsmanager").create_secret(
            Name=f"hpops/{CLUSTER}/host-keys",
            SecretString='{"format": "hpops.host-keys.v1", "uninitialized": true}')["ARN"]
        create_stack(
            parameters={"ClusterName": CLUSTER, "HostKeySecret": arn},
            resources={"SyncStateTable": STATE_TABLE},
            outputs={"HostIdentitySecretArn": {"Ref": "HostKeySecret"}, "SyncStateTableName": {"Ref": "SyncStateTable"},
                     "LoadBalancerDnsName": LB_DNS},
        )
        yield arn


def _secret_bundle(arn: str) -> tuple[HostKeyBundle, str]:
    value = boto3.client("secretsmanager").get_secret_value(SecretId=arn)
    return HostKeyBundle.from_secret_json(value["SecretString"]), value["VersionId"]


def _published() -> dict:
    return read_expected(boto3.client("dynamodb"), stack_outputs()["SyncStateTableName"], CLUSTER)


def _printed_fingerprints(out: str) -> dict[str, str]:
    return dict(re.findall(r"^(ssh-ed25519|ecdsa-sha2-nistp256|ssh-rsa)\s+(SHA256:\S+)$", out, re.MULTILINE))


def _fingerprint_of_public_line(line: str, tmp_path: Path) -> str:
    """Independently of hpops: `ssh-keygen -lf`, or SHA256 over the public blob (base64, no padding)."""
    if shutil.which("ssh-keygen"):
        path = tmp_path / f"probe-{hashlib.sha1(line.encode()).hexdigest()}.pub"
        path.write_text(line + "\n")
        return subprocess.run(["ssh-keygen", "-lf", str(path)], capture_output=True, text=True,
                              check=True).stdout.split()[1]
    blob = base64.b64decode(line.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def _independent_fingerprints(bundle: HostKeyBundle, tmp_path: Path) -> dict[str, str]:
    return {pair.public_line.split()[0]: _fingerprint_of_public_line(pair.public_line, tmp_path) for pair in bundle.pairs()}


def _assert_no_private_material(text: str, bundle: HostKeyBundle) -> None:
    assert "PRIVATE KEY" not in text
    for pair in bundle.pairs():
        body = [line for line in pair.private_openssh.splitlines() if line and not line.startswith("-----")]
        # An OpenSSH private key file embeds the public key; a body line made of public bytes only can
        # legitimately equal part of the printed public line. Every other body line must not appear.
        secret_lines = [line for line in body if line not in pair.public_line]
        assert secret_lines and not any(line in text for line in secret_lines), f"{pair.name} private key text leaked"


def test_generate_stores_a_bundle_and_publishes_and_prints_its_fingerprints(keys_stack, capsys, tmp_path):
    status, out, err = run(capsys, "host-keys", "generate", "--stack-name", STACK_NAME, "--region", REGION)

    assert status == 0
    bundle, version = _secret_bundle(keys_stack)
    expected = _independent_fingerprints(bundle, tmp_path)
    assert set(expected) == {"ssh-ed25519", "ecdsa-sha2-nistp256", "ssh-rsa"}
    record = _published()
    assert record == {"mode": "keys", "fingerprints": expected, "version": version}
    assert _printed_fingerprints(out) == expected
    # The known_hosts lines users paste name the stack's load balancer.
    for pair in bundle.pairs():
        assert f"  {LB_DNS} {pair.public_line}" in out.splitlines()
    _assert_no_private_material(out + err, bundle)

    status, shown, err = run(capsys, "host-keys", "show", "--stack-name", STACK_NAME, "--region", REGION)
    assert status == 0 and _printed_fingerprints(shown) == expected
    _assert_no_private_material(shown + err, bundle)


def test_show_before_any_keys_are_installed_says_what_to_run(keys_stack, capsys):
    status, out, _ = run(capsys, "host-keys", "show", "--stack-name", STACK_NAME, "--region", REGION)
    assert status == 1
    assert "hpops host-keys generate" in out and not _printed_fingerprints(out)


def test_show_in_certificate_mode_points_at_ca_show(region, capsys):
    with mock_aws():
        ca_secret = boto3.client("secretsmanager").create_secret(Name=f"hpops/{CLUSTER}/host-ca", SecretString="{}")["ARN"]
        create_stack(parameters={"ClusterName": CLUSTER, "CaSecret": ca_secret},
                     resources={"SyncStateTable": STATE_TABLE},
                     outputs={"HostCertificateAuthoritySecretArn": {"Ref": "CaSecret"},
                              "SyncStateTableName": {"Ref": "SyncStateTable"}})
        assert main(["host-keys", "ca-generate", "--stack-name", STACK_NAME, "--region", REGION]) == 0
        capsys.readouterr()
        status, out, _ = run(capsys, "host-keys", "show", "--stack-name", STACK_NAME, "--region", REGION)

    assert status == 1
    assert f"hpops host-keys ca-show --stack-name {STACK_NAME}" in out and not _printed_fingerprints(out)


def _ssh_host_keys(folder: Path) -> None:
    """A login node's /etc/ssh host keys in OpenSSH format (ssh-keygen, or cryptography if it is absent)."""
    folder.mkdir()
    specs = {"ed25519": ["-t", "ed25519"], "ecdsa": ["-t", "ecdsa", "-b", "256"], "rsa": ["-t", "rsa", "-b", "2048"]}
    if shutil.which("ssh-keygen"):
        for name, spec in specs.items():
            subprocess.run(["ssh-keygen", "-q", "-N", "", "-C", f"root@login-{name}", *spec,
                            "-f", str(folder / f"ssh_host_{name}_key")], check=True)
        return
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

    keys = {"ed25519": ed25519.Ed25519PrivateKey.generate(), "ecdsa": ec.generate_private_key(ec.SECP256R1()),
            "rsa": rsa.generate_private_key(public_exponent=65537, key_size=2048)}
    for name, key in keys.items():
        (folder / f"ssh_host_{name}_key").write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()))
        (folder / f"ssh_host_{name}_key.pub").write_bytes(key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH) + b"\n")


def test_adopt_publishes_exactly_the_fingerprints_of_the_nodes_keys(keys_stack, capsys, tmp_path):
    node_keys = tmp_path / "etc-ssh-of-login-node-1"
    _ssh_host_keys(node_keys)
    expected = {}
    for name in ("ed25519", "ecdsa", "rsa"):
        public_line = (node_keys / f"ssh_host_{name}_key.pub").read_text().strip()
        expected[public_line.split()[0]] = _fingerprint_of_public_line(public_line, tmp_path)

    status, out, err = run(capsys, "host-keys", "adopt", "--stack-name", STACK_NAME, "--region", REGION,
                           "--from-dir", str(node_keys))

    assert status == 0
    bundle, version = _secret_bundle(keys_stack)
    assert _published() == {"mode": "keys", "fingerprints": expected, "version": version}
    assert _printed_fingerprints(out) == expected
    for pair in bundle.pairs():  # OpenSSH files are kept byte for byte
        assert pair.private_openssh == (node_keys / f"ssh_host_{pair.name}_key").read_text()
    _assert_no_private_material(out + err, bundle)


def test_adopt_without_from_dir_exits_2_and_changes_nothing(keys_stack, capsys):
    status, out, _ = run(capsys, "host-keys", "adopt", "--stack-name", STACK_NAME, "--region", REGION)
    assert status == 2 and "--from-dir" in out
    assert "uninitialized" in boto3.client("secretsmanager").get_secret_value(SecretId=keys_stack)["SecretString"]
    assert _published() is None


def test_adopt_from_a_folder_missing_a_key_exits_1_naming_the_file(keys_stack, capsys, tmp_path):
    node_keys = tmp_path / "incomplete"
    _ssh_host_keys(node_keys)
    (node_keys / "ssh_host_rsa_key").unlink()

    status, out, err = run(capsys, "host-keys", "adopt", "--stack-name", STACK_NAME, "--region", REGION,
                           "--from-dir", str(node_keys))

    assert status == 1 and "ssh_host_rsa_key" in out
    assert "PRIVATE KEY" not in out + err
    assert "uninitialized" in boto3.client("secretsmanager").get_secret_value(SecretId=keys_stack)["SecretString"]


def test_rotate_replaces_every_key_and_prints_the_repair_hint(keys_stack, capsys, tmp_path):
    assert main(["host-keys", "generate", "--stack-name", STACK_NAME, "--region", REGION]) == 0
    capsys.readouterr()
    before = _published()["fingerprints"]

    status, out, err = run(capsys, "host-keys", "rotate", "--stack-name", STACK_NAME, "--region", REGION)

    assert status == 0
    bundle, version = _secret_bundle(keys_stack)
    after = _independent_fingerprints(bundle, tmp_path)
    assert _published() == {"mode": "keys", "fingerprints": after, "version": version}
    assert set(after) == set(before) and all(after[k] != before[k] for k in before)
    assert _printed_fingerprints(out) == after
    assert f"now run: hpops repair --stack-name {STACK_NAME} (publishes the new keys" in out
    _assert_no_private_material(out + err, bundle)


# --------------------------------------------------------------------------- lifecycle


def test_lifecycle_configures_the_agent_from_the_stack(region, capsys, tmp_path):
    other = "eu-west-1"  # not the default region: --region must pick both the stack and agent.json's region
    with mock_aws():
        bus = boto3.client("events", region_name=other).create_event_bus(Name=f"{STACK_NAME}-node-reports")["EventBusArn"]
        create_stack(parameters={"ClusterName": CLUSTER, "ReportBus": bus.rsplit("/", 1)[1]},
                     outputs={"NodeReportBusName": {"Ref": "ReportBus"}}, region=other)
        status, out, _ = run(capsys, "lifecycle", "--stack-name", STACK_NAME, "--region", other,
                             "--out", str(tmp_path / "dist"), "--no-vendor")

    assert status == 0
    folder = tmp_path / "dist" / "hpops"
    assert f"wrote {folder}" in out.splitlines()
    assert json.loads((folder / "agent.json").read_text()) == {
        "cluster": CLUSTER, "region": other, "reportBus": f"{STACK_NAME}-node-reports"}
    assert (folder / "install.sh").is_file() and not (folder / "lib").exists()


def test_lifecycle_without_a_stack_or_all_three_values_exits_2(capsys, tmp_path):
    status, out, _ = run(capsys, "lifecycle", "--cluster", CLUSTER, "--out", str(tmp_path))
    assert status == 2 and "--stack-name" in out
    assert not (tmp_path / "hpops").exists()
