"""The operator CLI against a (moto) deployment: `status`, `repair`, `host-keys generate|adopt|rotate|show`
and `lifecycle`, each reading a CloudFormation stack that carries template.yaml's output and parameter
names and points at real moto resources (target group, state machines, table, alarms, secret, event bus).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shutil
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path

import boto3
import pytest
from moto import mock_aws
from moto.core import DEFAULT_ACCOUNT_ID

from hpops.main import main
from hpops.output import top_spenders
from hpops_core.host_identity.identity_record import publish_expected, read_expected
from hpops_core.host_identity.keys import HostKeyBundle
from hpops_core.node_channel import contract
from hpops_core.node_channel.report_store import report_item
from hpops_core.node_channel.reports import parse_report_event
from hpops_twin.hyperpod_sim import HyperPodSimulator
from hpops_twin.iam.enforce import policy_enforced
from hpops_twin.template_model import TemplateModel
from operator_policy import operator_lookup, operator_policy_of, run_as_operator

REGION = "us-east-1"
STACK_NAME = "hpops-ml"
CLUSTER = "ml-research"
LB_DNS = "login-nlb-0123456789.elb.us-east-1.amazonaws.com"
ROLE_ARN = f"arn:aws:iam::{DEFAULT_ACCOUNT_ID}:role/hpops-login-sync"
CLI_SOURCE = Path(__file__).resolve().parents[2] / "cli" / "hpops" / "main.py"
EXECUTING = {"stepfunctions": {"execute_state_machine": True}}
NOW = datetime(2026, 11, 20, 12, 0, tzinfo=timezone.utc)  # status's clock (report ages)
DASHBOARD = "hpops-ml-operator"
ALARMS = ("hpops-ml-SyncExecutionsFailed", "hpops-ml-EventDeliveryDlqNotEmpty", "hpops-ml-HostIdentityRejected")

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
    return run_as_operator(capsys, main, *argv)


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
            "NodeReportBusName"} <= outputs_required
    assert {"LoadBalancerDnsName", "HostCertificateAuthoritySecretArn"} <= outputs_optional  # certificate mode only
    assert {"DashboardName", "SessionLimitsStateMachineArn", "BudgetGuardStateMachineArn"} <= outputs_optional
    assert {"ClusterName"} <= parameters_required and {"LoginGroupName", "HostCertificatePrincipals"} <= parameters_optional
    assert outputs_required | outputs_optional <= set(template["Outputs"])
    assert parameters_required | parameters_optional <= set(template["Parameters"])
    # An output that exists only under a condition (no load balancer created) must be read with .get().
    conditional = {name for name, output in template["Outputs"].items() if "Condition" in output}
    assert not conditional & outputs_required, f"read {conditional & outputs_required} with .get(): they can be absent"


# --------------------------------------------------------------------------- status


def _alarm(name: str) -> dict:
    return {"AlarmName": name, "Namespace": "HyperPodLoginAutopilot", "MetricName": name.rsplit("-", 1)[1],
            "Statistic": "Sum", "Period": 300, "EvaluationPeriods": 1, "Threshold": 1,
            "ComparisonOperator": "GreaterThanOrEqualToThreshold"}


def _state_machine(name: str) -> dict:
    return {"Type": "AWS::StepFunctions::StateMachine", "Properties": {
        "StateMachineName": name, "RoleArn": ROLE_ARN, "DefinitionString": json.dumps(REPAIR_DEFINITION)}}


class SessionHooks:
    """The CLI's boto3 sessions (hpops.main._session), with botocore event hooks added: the answers
    moto cannot give. Every call without a hook goes to moto."""

    def __init__(self, monkeypatch) -> None:
        self.hooks: list[tuple[str, object]] = []
        monkeypatch.setattr("hpops.main._session", self.session)

    def session(self, region_name=None):
        made = boto3.session.Session(region_name=region_name)
        for event, handler in self.hooks:
            made.events.register(event, handler)
        return made

    def answer(self, service: str, operation: str, response: dict) -> None:
        """The operation answers ``response`` (HTTP 200) without reaching moto."""
        from botocore.awsrequest import AWSResponse

        self.hooks.append((f"before-call.{service}.{operation}", lambda **_: (
            AWSResponse(f"https://{service}", 200, {}, None), response | {"ResponseMetadata": {"HTTPStatusCode": 200}})))


@pytest.fixture
def session_hooks(monkeypatch) -> SessionHooks:
    return SessionHooks(monkeypatch)


@pytest.fixture
def deployment(region, monkeypatch, session_hooks):
    """A HyperPod cluster (moto, nodes with IPs via the twin's simulator) and a stack with a real
    IP target group, two of the three state machines (no BudgetGuard output, as in a stack from
    before it), the state table, three alarms and the dashboard's name. Login group `login`: 3
    nodes, one of them being replaced (old ShuttingDown, new Pending); group `login-staging` (its
    name contains "login") and `gpu`. An alarm outside the stack is in ALARM all along.

    moto's CloudFormation cannot create alarms: they are made with PutMetricAlarm, and added to
    the stack's ListStackResources answer as CloudFormation would list them."""
    monkeypatch.setattr("hpops.main._utc_now", lambda: NOW)

    def list_alarms_too(parsed, **_):
        if "NextToken" not in parsed:
            parsed["StackResourceSummaries"] += [
                {"LogicalResourceId": f"Alarm{number}", "PhysicalResourceId": name, "ResourceType": "AWS::CloudWatch::Alarm",
                 "ResourceStatus": "CREATE_COMPLETE", "LastUpdatedTimestamp": NOW} for number, name in enumerate(ALARMS)]

    session_hooks.hooks.append(("after-call.cloudformation.ListStackResources", list_alarms_too))
    with mock_aws():
        sim = HyperPodSimulator(REGION, DEFAULT_ACCOUNT_ID, clock=lambda: datetime.now(timezone.utc))
        sim.create_cluster(CLUSTER, {"login": ("ml.m5.xlarge", 3), "login-staging": ("ml.m5.xlarge", 1),
                                     "gpu": ("ml.p5.48xlarge", 2)})
        login = sorted(sim.nodes(CLUSTER, "login"), key=lambda n: n.ip)
        sim.replace_node(CLUSTER, login[0].instance_id)
        create_stack(
            parameters={"ClusterName": CLUSTER, "ClusterArn": sim.cluster(CLUSTER).arn, "LoginGroupName": "login",
                        "LoadAwareAdmission": "on"},
            resources={
                "Vpc": {"Type": "AWS::EC2::VPC", "Properties": {"CidrBlock": "10.1.0.0/16"}},
                "LoginTargetGroup": {"Type": "AWS::ElasticLoadBalancingV2::TargetGroup", "Properties": {
                    "Name": "hpops-login", "Protocol": "TCP", "Port": 22, "TargetType": "ip", "VpcId": {"Ref": "Vpc"}}},
                "LoginNodeSyncStateMachine": _state_machine("hpops-login-sync"),
                "SessionLimitsStateMachine": _state_machine("hpops-session-limits"),
                "SyncStateTable": STATE_TABLE,
            },
            outputs={"TargetGroupArn": {"Ref": "LoginTargetGroup"},
                     "LoginNodeSyncStateMachineArn": {"Ref": "LoginNodeSyncStateMachine"},
                     "SessionLimitsStateMachineArn": {"Ref": "SessionLimitsStateMachine"},
                     "SyncStateTableName": {"Ref": "SyncStateTable"}, "DashboardName": DASHBOARD},
        )
        cloudwatch = boto3.client("cloudwatch")
        for name in (*ALARMS, "other-stack-Failed"):
            cloudwatch.put_metric_alarm(**_alarm(name))
        cloudwatch.set_alarm_state(AlarmName="other-stack-Failed", StateValue="ALARM", StateReason="not this stack's")
        yield sim


def _by_status(sim: HyperPodSimulator, group: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for node in sim.nodes(CLUSTER, group):
        found.setdefault(node.status, []).append(node.ip)
    return {status: sorted(ips) for status, ips in found.items()}


def _running_login(sim: HyperPodSimulator) -> list[tuple[str, str]]:
    """(instance id, ip) of the Running login nodes, by IP."""
    return sorted(((n.instance_id, n.ip) for n in sim.nodes(CLUSTER, "login") if n.status == "Running"),
                  key=lambda node: [int(part) for part in node[1].split(".")])


def _register(ips: list[str]) -> None:
    boto3.client("elbv2").register_targets(TargetGroupArn=stack_outputs()["TargetGroupArn"],
                                           Targets=[{"Id": ip, "Port": 22} for ip in ips])


def _report(instance_id: str, ip: str, result: str, version: str, reason: str = "", minutes_ago: int = 2,
            **sections: dict) -> None:
    """What RecordNodeReport stores for a report the agent sent ``minutes_ago`` before NOW."""
    detail = {"format": contract.REPORT_FORMAT, "cluster": CLUSTER, "instanceId": instance_id, "ip": ip,
              "role": "login", "agentVersion": "1.4.0", "reportedAt": "2026-11-20T11:58:00Z", "trigger": "change",
              "hostIdentity": {"mode": "keys", "result": result, "version": version, "reason": reason}, **sections}
    report = parse_report_event({"source": contract.REPORT_SOURCE, "detail-type": contract.REPORT_DETAIL_TYPE,
                                 "detail": detail})
    received = (NOW - timedelta(minutes=minutes_ago)).strftime("%Y-%m-%dT%H:%M:%S.000Z")
    boto3.client("dynamodb").put_item(TableName=stack_outputs()["SyncStateTableName"],
                                      Item=report_item(CLUSTER, report, received, int(NOW.timestamp())))


def _publish(version: str) -> None:
    publish_expected(boto3.client("dynamodb"), stack_outputs()["SyncStateTableName"], CLUSTER,
                     {"ssh-ed25519": "SHA256:" + "A" * 43}, version)


def _node_rows(out: str) -> dict[str, list[str]]:
    """The status table's rows by IP: [instance, target, host identity, version...]."""
    rows = {}
    for line in out.splitlines():
        fields = line.split()
        if len(fields) >= 3 and re.fullmatch(r"\d+\.\d+\.\d+\.\d+", fields[1]):
            rows[fields[1]] = [fields[0], *fields[2:]]
    return rows


def _section(out: str, title: str) -> list[str]:
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    end = next((i for i in range(start + 1, len(lines)) if not lines[i]), len(lines))
    return lines[start:end]


def test_status_in_sync_shows_each_node_its_host_identity_the_last_executions_and_exits_0(deployment, capsys):
    (first_id, first_ip), (second_id, second_ip) = _running_login(deployment)
    _register([first_ip, second_ip])
    _publish("v2")
    _report(first_id, first_ip, "unchanged", "v2")
    _report(second_id, second_ip, "changed", "v2", minutes_ago=15)
    sfn = boto3.client("stepfunctions")
    machine = stack_outputs()["LoginNodeSyncStateMachineArn"]
    sfn.start_execution(stateMachineArn=machine, name="sweep-0001", input="{}")
    latest = sfn.start_execution(stateMachineArn=machine, name="repair-0002", input="{}")["executionArn"]
    sfn.stop_execution(executionArn=latest)

    status, out, err = run(capsys, "status", "--stack-name", STACK_NAME, "--region", REGION)

    assert (status, err) == (0, ""), out
    lines = out.splitlines()
    assert lines[1] == "OK: targets in sync, no alarm in ALARM (exit 0)"
    assert "login nodes: 2 Running, 2 registered targets: in sync" in lines
    # Only the exact login group's Running nodes: not the Pending/ShuttingDown ones, not login-staging or gpu.
    assert _node_rows(out) == {first_ip: [first_id, "healthy", "unchanged", "v2", "(current)", "2", "min", "ago"],
                               second_ip: [second_id, "healthy", "changed", "v2", "(current)", "15", "min", "ago"]}
    assert "  host identity published: keys, version v2" in lines
    executions = _section(out, "last executions:")
    url = f"https://{REGION}.console.aws.amazon.com/states/home?region={REGION}#/v2/executions/details/{latest}"
    assert re.fullmatch(rf"  LoginNodeSync  ABORTED    \d{{4}}-\d\d-\d\d \d\d:\d\d:\d\dZ  {re.escape(url)}", executions[1])
    assert executions[2:] == ["  SessionLimits  none yet", "  BudgetGuard    not in this stack's outputs"]
    assert "sweep-0001" not in out  # the last execution only
    # The other stack's alarm is in ALARM; this stack's three are not.
    assert _section(out, "alarms:") == [
        "alarms: 0 of 3 in ALARM",
        f"dashboard: {DASHBOARD}  https://{REGION}.console.aws.amazon.com/cloudwatch/home?region={REGION}"
        f"#dashboards/dashboard/{DASHBOARD}"]


def test_status_out_of_sync_names_the_extra_and_missing_ips_and_exits_1(deployment, capsys):
    login = _by_status(deployment, "login")
    (_, kept), (missing_id, missing) = _running_login(deployment)
    extra = login["ShuttingDown"][0]
    _register(sorted([kept, extra]))

    status, out, _ = run(capsys, "status", "--stack-name", STACK_NAME, "--region", REGION)

    assert status == 1
    assert out.splitlines()[1] == "PROBLEM: OUT OF SYNC (exit 1)"
    assert (f"login nodes: 2 Running, 2 registered targets: OUT OF SYNC (extra {extra}; missing {missing}): "
            f"run hpops repair --stack-name {STACK_NAME}") in out.splitlines()
    rows = _node_rows(out)
    assert rows[missing][:4] == [missing_id, "not", "registered", "no"]  # "not registered", "no report"
    assert rows[extra] == ["-", "healthy", "extra:", "no", "Running", "login", "node", "has", "this", "IP"]
    assert "  host identity published: none yet (hpops host-keys generate|adopt, or ca-generate)" in out.splitlines()


def test_status_shows_a_failed_and_a_behind_host_identity_per_node(deployment, capsys):
    (first_id, first_ip), (second_id, second_ip) = _running_login(deployment)
    _register([first_ip, second_ip])
    new_version = "3f1c9a2e-5d4b-4c1a-9e8f-0a1b2c3d4e5f"  # a secret version id: shown by its first 8 characters
    _publish(new_version)
    _report(first_id, first_ip, "changed", new_version)
    _report(second_id, second_ip, "failed", "v1", reason="sshd -t rejected the new host keys", minutes_ago=1)

    status, out, _ = run(capsys, "status", "--stack-name", STACK_NAME, "--region", REGION)

    assert status == 0  # in sync and no alarm: a node's identity is shown, the sync decides who serves
    rows = _node_rows(out)
    assert rows[first_ip][:5] == [first_id, "healthy", "changed", "3f1c9a2e…", "(current)"]
    assert rows[second_ip][:5] == [second_id, "healthy", "failed", "v1", "(behind)"]
    lines = out.splitlines()
    assert lines[lines.index(next(line for line in lines if line.startswith(f"  {second_id}"))) + 1] == \
        "      host identity failed: sshd -t rejected the new host keys"
    assert f"  host identity published: keys, version {new_version}" in lines


def test_status_exits_1_when_one_of_the_stacks_alarms_is_in_alarm(deployment, capsys):
    _register([ip for _, ip in _running_login(deployment)])
    boto3.client("cloudwatch").set_alarm_state(AlarmName=ALARMS[0], StateValue="ALARM",
                                               StateReason="Threshold Crossed: 1 datapoint [2.0] >= 1.0")

    status, out, _ = run(capsys, "status", "--stack-name", STACK_NAME, "--region", REGION)

    assert status == 1
    assert out.splitlines()[1] == "PROBLEM: 1 alarm in ALARM (exit 1)"
    alarms = _section(out, "alarms:")
    assert alarms[0] == "alarms: 1 of 3 in ALARM"
    assert re.fullmatch(rf"  ALARM {ALARMS[0]} since \d{{4}}-\d\d-\d\d \d\d:\d\d:\d\dZ: "
                        r"Threshold Crossed: 1 datapoint \[2\.0\] >= 1\.0", alarms[1])
    assert "other-stack-Failed" not in out


def test_status_json_is_one_document_with_the_same_facts(deployment, capsys):
    (first_id, first_ip), (second_id, second_ip) = _running_login(deployment)
    _register([first_ip])
    _publish("v2")
    _report(first_id, first_ip, "unchanged", "v2")
    boto3.client("cloudwatch").set_alarm_state(AlarmName=ALARMS[1], StateValue="ALARM", StateReason="1 message")
    machine = stack_outputs()["SessionLimitsStateMachineArn"]
    execution = boto3.client("stepfunctions").start_execution(stateMachineArn=machine, name="limits-1")["executionArn"]

    status, out, err = run(capsys, "status", "--stack-name", STACK_NAME, "--region", REGION, "--json")

    assert (status, err) == (1, "")
    document = json.loads(out)
    assert document["format"] == "hpops.status.v1" and document["exitStatus"] == 1
    assert (document["stack"], document["region"], document["cluster"], document["loginGroup"], document["asOf"]) == (
        STACK_NAME, REGION, CLUSTER, "login", "2026-11-20T12:00:00Z")
    assert document["problems"] == ["OUT OF SYNC", "1 alarm in ALARM"]
    assert document["sync"] == {"inSync": False, "extra": [], "missing": [second_ip], "runningLoginNodes": 2,
                                "registeredTargets": 1}
    assert document["loginNodes"] == [
        {"instanceId": first_id, "ip": first_ip, "target": {"state": "healthy", "reason": None},
         "hostIdentity": {"mode": "keys", "result": "unchanged", "version": "v2", "reason": "", "current": True},
         "agentVersion": "1.4.0", "receivedAt": "2026-11-20T11:58:00.000Z"},
        {"instanceId": second_id, "ip": second_ip, "target": None, "hostIdentity": None, "agentVersion": None,
         "receivedAt": None}]
    assert document["hostIdentity"] == {"mode": "keys", "version": "v2"}
    assert document["executions"]["LoginNodeSync"] == {"present": True, "last": None}
    assert document["executions"]["BudgetGuard"] == {"present": False, "last": None}
    last = document["executions"]["SessionLimits"]["last"]
    assert (last["name"], last["status"], last["executionArn"]) == ("limits-1", "RUNNING", execution)
    assert last["consoleUrl"].endswith(f"#/v2/executions/details/{execution}")
    assert document["alarms"]["total"] == 3
    assert [a["name"] for a in document["alarms"]["inAlarm"]] == [ALARMS[1]]
    assert document["dashboard"]["name"] == DASHBOARD
    assert document["sessions"]["available"] is False and document["spend"]["available"] is False


def test_status_says_why_sessions_and_spend_are_unavailable_and_still_answers(deployment, capsys):
    _register([ip for _, ip in _running_login(deployment)])

    status, out, _ = run(capsys, "status", "--stack-name", STACK_NAME, "--region", REGION)

    assert status == 0
    # moto implements no DescribeSessions; this stack has no CheckUserSpendFunction.
    assert ("sessions: unavailable (NotImplementedError: The describe_sessions action has not been implemented)"
            in out.splitlines())
    assert (f"spend: unavailable (stack {STACK_NAME} has no CheckUserSpendFunction: it was deployed with "
            "UserSpendEnabled=false (the cluster budget only) or before per-user spend; update it with "
            "UserSpendEnabled=true for per-user figures)") in out.splitlines()


def test_status_counts_active_sessions_on_the_login_nodes_per_principal(deployment, session_hooks, capsys):
    (first_id, first_ip), (second_id, second_ip) = _running_login(deployment)
    _register([first_ip, second_ip])
    staging = next(n.instance_id for n in deployment.nodes(CLUSTER, "login-staging"))
    owner = f"arn:aws:sts::{DEFAULT_ACCOUNT_ID}:assumed-role/Researchers/"
    sessions = [{"SessionId": f"{user}-0{n}", "Target": f"sagemaker-cluster:abc123def456_{group}-{node}",
                 "Status": "Connected", "Owner": owner + user}
                for n, (user, group, node) in enumerate([
                    ("alice", "login", first_id), ("alice", "login", second_id), ("bob", "login", first_id),
                    ("carol", "login-staging", staging)])]  # not a login node: not counted
    session_hooks.answer("ssm", "DescribeSessions", {"Sessions": sessions})

    status, out, _ = run(capsys, "status", "--stack-name", STACK_NAME, "--region", REGION)

    assert status == 0
    assert "sessions: 3 active on login nodes; by IAM principal: alice 2, bob 1" in out.splitlines()
    # No Session Manager preferences saved: HyperPod runs every shell as root.
    assert ("  Session Manager: Run As is off: sessions run as root, per-user limits cannot apply "
            "(no SSM-SessionManagerRunShell document: Session Manager's defaults)") in out.splitlines()


def test_status_shows_each_users_sessions_by_path_and_node_against_the_limit(deployment, capsys):
    (first_id, first_ip), (second_id, second_ip) = _running_login(deployment)
    _register([first_ip, second_ip])

    def entry(pid, user, path="ssh"):
        extra = {"sessionId": f"{user}-0a1b2c3d4e5f6a7b8"} if path == "ssm" else {}
        return {"handle": f"5eed0b07:{pid}:{pid * 10}", "user": user, "path": path, "tty": path == "ssm",
                "startedAt": "2026-11-20T11:00:00Z", **extra}

    _report(first_id, first_ip, "unchanged", "v1", sessions={"list": [entry(100, "alice"), entry(101, "bob"),
                                                                      entry(102, "alice", "ssm")]},
            userCaps={"result": "unchanged", "reason": "per-user caps MemoryMax=8G; 0 override(s), 0 exempt",
                      "atCap": [{"user": "alice", "caps": ["memory"]}]})
    _report(second_id, second_ip, "unchanged", "v1", sessions={"list": [entry(200, "alice")]})

    status, out, _ = run(capsys, "status", "--stack-name", STACK_NAME, "--region", REGION)

    assert status == 0
    assert _section(out, "sessions the login nodes report")[:5] == [
        "sessions the login nodes report (SSH and Session Manager together, per user): 2 user(s)",
        f"  alice            3 of limit 2  OVER  ssh: {', '.join(f'{n} 1' for n in sorted((first_id, second_id)))}; "
        f"ssm: {first_id} 1",
        f"  bob              1 of limit 2  ssh: {first_id} 1; ssm: none",
        f"  caps on {first_id}: unchanged: per-user caps MemoryMax=8G; 0 override(s), 0 exempt",
        f"  at a cap: alice ({first_id}: memory)"]
    # The spread: 3 sessions of 2 users on one node, 1 on the other: mean 2, busiest 1.5x.
    assert _section(out, "spread:")[:3] == [
        "spread: 4 sessions on 2 reporting login node(s), 2 per node, busiest 1.50x the mean",
        *sorted([f"  {first_id:<21} 3 sessions, 2 users", f"  {second_id:<21} 1 sessions, 1 users"],
                key=lambda line: line.split()[0])]


def test_status_shows_which_nodes_load_aware_admission_keeps_out_of_rotation_and_why(deployment, capsys):
    (first_id, first_ip), (second_id, second_ip) = _running_login(deployment)
    _register([second_ip])
    key = {"pk": {"S": f"admission#{CLUSTER}"}, "sk": {"S": "login-admission"}}
    table = stack_outputs()["SyncStateTableName"]
    _, out, _ = run(capsys, "status", "--stack-name", STACK_NAME, "--region", REGION)
    assert _section(out, "admission")[0] == ("admission (on): never ran: the sync keeps every login node in rotation "
                                             "(look for LoginAdmission's errors and EventDeliveryDLQAlarm)")
    since = int(NOW.timestamp()) - 720
    state = {"out": {first_id: {"ip": first_ip, "since": since, "reason": "pressure 80% against the tier's mean 22%"}},
             "hotSince": {}, "imbalanceSince": None, "mode": "on", "decidedAt": int(NOW.timestamp()) - 120}
    boto3.client("dynamodb").put_item(TableName=table, Item=key | {"state": {"S": json.dumps(state)}, "version": {"N": "3"}})

    _, out, _ = run(capsys, "status", "--stack-name", STACK_NAME, "--region", REGION)
    assert _section(out, "admission")[:2] == [
        "admission (on):",
        f"  {first_id:<21} out of rotation for new connections since 2026-11-20 11:48:00Z: "
        "pressure 80% against the tier's mean 22%"]
    _, out, _ = run(capsys, "status", "--stack-name", STACK_NAME, "--region", REGION, "--json")
    assert json.loads(out)["admission"] == {"mode": "on", "lastRunSecondsAgo": 120, "stale": False, "out": [
        {"instanceId": first_id, "ip": first_ip, "since": "2026-11-20T11:48:00Z",
         "reason": "pressure 80% against the tier's mean 22%"}]}


def test_status_lists_the_months_top_spenders_from_the_cost_report(deployment, capsys, monkeypatch):
    """The figures are `hpops cost`'s (tests/aws/test_cost_cli.py computes them against a deployment);
    here, that status shows the five highest of them."""
    _register([ip for _, ip in _running_login(deployment)])
    users = [{"user": name, "usd": usd, "limitUsd": limit, "percentOfLimit": pct, "projectedUsd": usd}
             for name, usd, limit, pct in [("bob", "12.50", None, None), ("alice", "5120.00", "10000.00", "51.2"),
                                           ("carol", "0.00", "1000.00", "0.0")]]
    asked = []

    def cost_document(session, stack_name, now):
        asked.append((session.region_name, stack_name, now))
        return {"month": "2026-11", "asOf": "2026-11-20T12:00:00Z", "users": users, "warnings": []}

    monkeypatch.setattr("hpops.main._spend_document", cost_document)

    status, out, _ = run(capsys, "status", "--stack-name", STACK_NAME, "--region", REGION)

    assert status == 0 and asked == [(REGION, STACK_NAME, NOW)]
    assert _section(out, "spend 2026-11") == [
        f"spend 2026-11, top 3 of 3 users (all: hpops cost --stack-name {STACK_NAME}):",
        "  alice                5,120.00 USD  51.2 % of 10,000.00",
        "  bob                     12.50 USD",
        "  carol                    0.00 USD  0.0 % of 1,000.00"]


def test_top_spenders_are_the_five_highest_with_their_limits():
    users = [{"user": name, "usd": usd, "limitUsd": "1000.00", "percentOfLimit": pct, "projectedUsd": usd}
             for name, usd, pct in [("ann", "10.00", "1.0"), ("bob", "900.50", "90.1"), ("cy", "0.00", "0.0"),
                                    ("dee", "45.25", "4.5"), ("eve", "1200.00", "120.0"), ("fay", "45.25", "4.5"),
                                    ("gus", "3.10", "0.3")]]
    section = top_spenders({"month": "2026-11", "asOf": "2026-11-20T12:00:00Z", "users": users, "warnings": []})

    assert [u["user"] for u in section["topUsers"]] == ["eve", "bob", "dee", "fay", "ann"]
    assert section["users"] == 7 and section["available"] is True
    assert section["topUsers"][0] == {"user": "eve", "usd": "1200.00", "limitUsd": "1000.00", "percentOfLimit": "120.0",
                                      "projectedUsd": "1200.00"}


def test_status_json_with_the_twin_is_refused_in_one_line(capsys):
    status, out, err = run(capsys, "status", "--twin", "--json")
    assert status == 2 and err == "" and out.count("\n") == 1 and "--json needs --stack-name" in out


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


def test_repair_under_a_policy_without_one_of_its_actions_is_denied_naming_it(region, clock, capsys):
    with mock_aws(config=EXECUTING):
        machine = _repair_stack(REPAIR_DEFINITION)
        policy = operator_policy_of(capsys, STACK_NAME, REGION, role="administrator")
        for statement in policy["Statement"]:
            statement["Action"] = [a for a in statement["Action"] if a != "states:DescribeExecution"]
        with policy_enforced("operator", {"HpopsOperator": policy}, operator_lookup(STACK_NAME, REGION)) as denials:
            status = main(["repair", "--stack-name", STACK_NAME, "--region", REGION])
        out = capsys.readouterr().out

    assert status == 2
    started = out.splitlines()[0].removeprefix("started ")
    assert started.startswith(machine.replace(":stateMachine:", ":execution:") + ":")
    assert [(d.action, d.resource) for d in denials] == [("states:DescribeExecution", started)]
    assert out.splitlines()[-1].startswith("hpops repair: ") and "states:DescribeExecution" in out.splitlines()[-1]


def test_iam_policy_names_the_stacks_resources_and_says_what_it_leaves_out(deployment, capsys):
    granted, errors = set(), []
    for role in ("operator", "administrator"):
        status = main(["iam-policy", "--stack-name", STACK_NAME, "--role", role])
        captured = capsys.readouterr()
        policy = json.loads(captured.out)
        assert status == 0
        granted |= {(action, resource) for s in policy["Statement"] for action in s["Action"]
                    for resource in ([s["Resource"]] if isinstance(s["Resource"], str) else s["Resource"])}
        errors += captured.err.splitlines()
        # The read-only operator changes nothing: no write, start or subscribe.
        if role == "operator":
            assert not {a for a, _ in granted if a.split(":")[1].startswith(
                ("Put", "Update", "Start", "Subscribe", "Terminate", "Resume", "Delete"))}, sorted(granted)
    outputs = stack_outputs()
    table = f"arn:aws:dynamodb:{REGION}:{DEFAULT_ACCOUNT_ID}:table/{outputs['SyncStateTableName']}"
    assert {("states:ListExecutions", outputs["LoginNodeSyncStateMachineArn"]),
            ("states:ListExecutions", outputs["SessionLimitsStateMachineArn"]),
            ("states:StartExecution", outputs["LoginNodeSyncStateMachineArn"]),
            ("sagemaker:ListClusterNodes", deployment.cluster(CLUSTER).arn),
            ("dynamodb:Query", table), ("dynamodb:GetItem", table)} <= granted
    assert not any(action.startswith(("states:", "dynamodb:", "sagemaker:", "sns:")) and resource == "*"
                   for action, resource in granted)
    # This stack has no BudgetGuard state machine or user alert topic: what needs them is not granted, and said.
    assert "hpops cost subscribe: sns:Subscribe left out: the stack has no output UserSpendAlertTopicArn" in errors
    assert not any(action == "sns:Subscribe" for action, _ in granted)


def test_iam_policy_of_a_stack_that_does_not_exist_is_one_line(region, capsys):
    with mock_aws():
        status = main(["iam-policy", "--stack-name", "no-such-stack"])
    out = capsys.readouterr().out

    assert status == 2
    assert len(out.splitlines()) == 1 and out.startswith("hpops iam-policy: ") and "no-such-stack" in out


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
    assert status == 2 and out.count("\n") == 1 and "--from-dir" in out
    assert "uninitialized" in boto3.client("secretsmanager").get_secret_value(SecretId=keys_stack)["SecretString"]
    assert _published() is None


def test_adopt_from_a_folder_missing_a_key_exits_2_naming_the_file(keys_stack, capsys, tmp_path):
    node_keys = tmp_path / "incomplete"
    _ssh_host_keys(node_keys)
    (node_keys / "ssh_host_rsa_key").unlink()

    status, out, err = run(capsys, "host-keys", "adopt", "--stack-name", STACK_NAME, "--region", REGION,
                           "--from-dir", str(node_keys))

    assert status == 2 and out.count("\n") == 1
    assert out.startswith("hpops host-keys adopt: missing host key files: ssh_host_rsa_key")
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
        create_stack(parameters={"ClusterName": CLUSTER, "ReportBus": bus.rsplit("/", 1)[1],
                                 "Channel": f"{STACK_NAME}-NodeChannelFunction-1AB"},
                     outputs={"NodeReportBusName": {"Ref": "ReportBus"}, "NodeChannelFunctionName": {"Ref": "Channel"}},
                     region=other)
        status, out, _ = run(capsys, "lifecycle", "--stack-name", STACK_NAME, "--region", other,
                             "--out", str(tmp_path / "dist"), "--no-vendor")

    assert status == 0
    folder = tmp_path / "dist" / "hpops"
    assert f"wrote {folder}" in out.splitlines()
    assert json.loads((folder / "agent.json").read_text()) == {
        "cluster": CLUSTER, "region": other, "reportBus": f"{STACK_NAME}-node-reports",
        "nodeChannel": f"{STACK_NAME}-NodeChannelFunction-1AB",
        # the stack's ImdsLockdown (off by default, or a stack from before it), and the probe every node runs
        "imdsLockdown": "off", "imdsAllowedGroups": "", "imdsProbe": "169.254.169.254"}
    assert (folder / "install.sh").is_file() and not (folder / "lib").exists()


def test_lifecycle_without_a_stack_or_all_three_values_exits_2(capsys, tmp_path):
    status, out, _ = run(capsys, "lifecycle", "--cluster", CLUSTER, "--out", str(tmp_path))
    assert status == 2 and "--stack-name" in out
    assert not (tmp_path / "hpops").exists()


# AWS's reference on_create.sh ends like this (awsome-distributed-training, base-config): our own
# copy of its shape, not its text.
REFERENCE_SHAPED_ON_CREATE = """#!/bin/bash
set -ex
python3 -u lifecycle_script.py -rc "$SAGEMAKER_RESOURCE_CONFIG_PATH" -pp provisioning_parameters.json
exit_code=$?
exit $exit_code
"""


def test_lifecycle_patch_enrolls_first_and_installs_before_the_final_exit_once(capsys, tmp_path):
    from hpops import lifecycle_script

    script = tmp_path / "on_create.sh"
    script.write_text(REFERENCE_SHAPED_ON_CREATE)
    script.chmod(0o755)
    status, out, _ = run(capsys, "lifecycle", "--patch", str(script))
    assert status == 0 and "inserted before the final exit" in out and "enroll line put first" in out
    lines = script.read_text().splitlines()
    install = lines.index('bash "$(dirname "$0")/hpops/install.sh"')
    assert install < lines.index("exit $exit_code") and install > lines.index("exit_code=$?")
    # The key is enrolled before anything of the user's setup runs: the first command after the shebang.
    commands = [line for line in lines[1:] if line.strip() and not line.startswith("#")]
    assert commands[0] == 'bash "$(dirname "$0")/hpops/install.sh" --enroll-first'
    assert lifecycle_script.check(script.read_text()).enrolls_first
    assert script.stat().st_mode & 0o777 == 0o755
    status, out, _ = run(capsys, "lifecycle", "--patch", str(script))
    assert status == 0 and "unchanged" in out
    assert script.read_text().count("hpops/install.sh") == 2


def test_lifecycle_patch_keeps_the_exit_status_the_script_passes_on(tmp_path):
    from hpops import lifecycle_script

    script = tmp_path / "on_create.sh"
    script.write_text(lifecycle_script.patch("#!/bin/bash\nfalse\nexit $?\n")[0])
    (tmp_path / "hpops").mkdir()
    (tmp_path / "hpops" / "install.sh").write_text("exit 0\n")
    # The command before the exit failed: the patched script must still fail, as it did before.
    assert subprocess.run(["bash", str(script)], capture_output=True).returncode == 1


def test_lifecycle_patch_refuses_a_line_that_never_runs(capsys, tmp_path):
    script = tmp_path / "on_create.sh"
    text = REFERENCE_SHAPED_ON_CREATE + "bash ./hpops/install.sh\n"
    script.write_text(text)
    status, out, _ = run(capsys, "lifecycle", "--patch", str(script))
    assert status == 2 and "never runs" in out and "move it above that exit" in out
    assert script.read_text() == text


def test_lifecycle_says_exactly_where_the_line_goes(region, capsys, tmp_path):
    status, out, _ = run(capsys, "lifecycle", "--cluster", CLUSTER, "--report-bus", "bus", "--region", "us-east-1",
                         "--out", str(tmp_path / "dist"), "--no-vendor")
    assert status == 0
    assert "before the script's final exit" in out and 'bash "$(dirname "$0")/hpops/install.sh"' in out
