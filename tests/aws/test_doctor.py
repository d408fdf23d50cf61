"""`hpops doctor` through the CLI against moto: the stack's names, `--stack-name` wiring, `--cluster`
before a deploy (checks that need the stack say so), a fact doctor may not read (one UNKNOWN line, the
others still run), and the exit statuses. What each check catches is in tests/twin/test_doctor_twin.py.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from pathlib import Path

import boto3
import pytest
from moto import mock_aws
from moto.core import DEFAULT_ACCOUNT_ID

from hpops.doctor import DOCTOR_IAM_ACTIONS, NEEDS_STACK
from hpops.doctor_checks import CHECKS
from hpops.main import main
from hpops_twin.hyperpod_sim import HyperPodSimulator
from hpops_twin.template_model import TemplateModel

REGION = "us-east-1"
CLUSTER = "ml-research"
STACK = "hpops-ml"
DOCTOR_SOURCE = Path(__file__).resolve().parents[2] / "cli" / "hpops" / "doctor.py"
NOW = datetime(2026, 11, 20, 12, 0, tzinfo=timezone.utc)


def test_every_output_and_parameter_doctor_reads_exists_in_template_yaml():
    template = TemplateModel().raw
    source = DOCTOR_SOURCE.read_text(encoding="utf-8")
    outputs = set(re.findall(r"""outputs\[["'](\w+)["']\]""", source))
    parameters = set(re.findall(r"""parameters(?:\[|\.get\()["'](\w+)["']""", source))
    assert {"NodeAgentPolicyArn", "NodeReportBusName", "SyncStateTableName", "TargetGroupArn"} <= outputs
    assert {"ClusterName", "LoginGroupName", "ControllerGroupName", "SshPort", "VerifierSecurityGroupIds",
            "VerifierSubnetIds"} <= parameters
    assert outputs <= set(template["Outputs"]) and parameters <= set(template["Parameters"])
    assert not {n for n, o in template["Outputs"].items() if "Condition" in o} & outputs
    # The stack-created verifier group doctor looks up by its logical id.
    assert "VerifierSecurityGroup" in template["Resources"]


def test_the_iam_actions_doctor_needs_are_listed_once_each_and_in_the_guide():
    assert len(DOCTOR_IAM_ACTIONS) == len(set(DOCTOR_IAM_ACTIONS))
    assert all(re.fullmatch(r"[a-z0-9-]+:[A-Za-z]+", action) for action in DOCTOR_IAM_ACTIONS)
    guide = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"`([a-z0-9-]+:[A-Za-z]+)`", guide.split("### What `hpops doctor` needs", 1)[1].split("\n#", 1)[0]))
    assert listed == set(DOCTOR_IAM_ACTIONS)


@pytest.fixture
def cluster(monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setattr("hpops.main._utc_now", lambda: NOW)
    with mock_aws():
        sim = HyperPodSimulator(REGION, DEFAULT_ACCOUNT_ID, clock=lambda: NOW)
        sim.create_cluster(CLUSTER, {"login": ("ml.m5.xlarge", 2), "controller-machine": ("ml.m5.xlarge", 1)})
        yield sim


def _lines(out: str) -> list[tuple[str, str]]:
    """(status, check) of each line, the check without its [group]."""
    return [(m.group(1), m.group(2)) for m in re.finditer(r"^(\w+) ([a-z-]+)(?:\[[^\]]*\])?: ", out, re.MULTILINE)]


def test_before_a_deploy_doctor_runs_the_checks_that_need_no_stack_and_names_the_others(cluster, capsys):
    status = main(["doctor", "--cluster", CLUSTER, "--region", REGION])
    out = capsys.readouterr().out
    lines = _lines(out)
    assert status == 1  # nothing around the cluster is set up in this account
    assert list(dict.fromkeys(check for _, check in lines)) == list(CHECKS)
    assert {check for s, check in lines if s == "SKIPPED"} == set(NEEDS_STACK)
    assert "PROBLEM lifecycle-script[login]: s3://sagemaker-lifecycle-twin/scripts/on_create.sh not found" in out
    assert "PROBLEM cloudtrail: no CloudTrail trail covers us-east-1" in out
    assert "PROBLEM run-as: Run As is off: sessions run as root, per-user limits cannot apply" in out


def test_a_group_the_cluster_lacks_is_named_with_the_groups_it_has(cluster, capsys):
    assert main(["doctor", "--cluster", CLUSTER, "--region", REGION, "--controller-group", "controller"]) == 1
    out = capsys.readouterr().out
    assert ("PROBLEM cluster: cluster ml-research has no controller group controller (its groups: controller-machine, "
            "login). Fix: set the stack's ControllerGroupName to the right group") in out


def test_a_fact_doctor_may_not_read_is_one_unknown_line_and_the_other_checks_still_run(cluster, capsys, monkeypatch):
    from botocore.awsrequest import AWSResponse

    def denied(**_):
        return AWSResponse("https://cloudtrail", 400, {}, None), {"Error": {
            "Code": "AccessDeniedException",
            "Message": "User: arn:aws:iam::123456789012:user/ops is not authorized to perform: cloudtrail:DescribeTrails"}}

    real = boto3.session.Session

    def session(region_name=None):
        made = real(region_name=region_name)
        made.events.register("before-call.cloudtrail.DescribeTrails", denied)
        return made

    monkeypatch.setattr("hpops.main._session", session)
    assert main(["doctor", "--cluster", CLUSTER, "--region", REGION, "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    trail = next(c for c in document["checks"] if c["check"] == "cloudtrail")
    assert trail["status"] == "UNKNOWN"
    assert trail["message"].startswith("could not tell: access denied to cloudtrail:DescribeTrails")
    assert next(c for c in document["checks"] if c["check"] == "run-as")["status"] == "PROBLEM"


def test_with_the_stack_every_check_runs_and_reads_the_stacks_names(cluster, capsys):
    """A stack with template.yaml's names (moto creates the table, target group and verifier group);
    nothing else is set up, so every check runs and finds something, none is skipped."""
    ec2 = boto3.client("ec2")
    vpc = ec2.create_vpc(CidrBlock="10.1.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.1.0.0/24")["Subnet"]["SubnetId"]
    trust = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                     "Principal": {"Service": "sagemaker.amazonaws.com"}}]}
    boto3.client("iam").create_role(RoleName="hyperpod-exec", AssumeRolePolicyDocument=json.dumps(trust))
    bus = boto3.client("events").create_event_bus(Name=f"{STACK}-node-reports")["EventBusArn"]
    template = {
        "Parameters": {name: {"Type": "String"} for name in (
            "ClusterName", "LoginGroupName", "ControllerGroupName", "SshPort", "VerifierSubnetIds",
            "VerifierSecurityGroupIds", "VpcId", "NodeReportBusName")},
        "Resources": {
            "VerifierSecurityGroup": {"Type": "AWS::EC2::SecurityGroup", "Properties": {
                "GroupDescription": "verifier", "VpcId": {"Ref": "VpcId"}}},
            "LoginTargetGroup": {"Type": "AWS::ElasticLoadBalancingV2::TargetGroup", "Properties": {
                "Name": "hpops-login", "Protocol": "TCP", "Port": 22, "TargetType": "ip", "VpcId": {"Ref": "VpcId"}}},
            "SyncStateTable": {"Type": "AWS::DynamoDB::Table", "Properties": {
                "BillingMode": "PAY_PER_REQUEST",
                "AttributeDefinitions": [{"AttributeName": "pk", "AttributeType": "S"},
                                         {"AttributeName": "sk", "AttributeType": "S"}],
                "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}]}},
            "NodeAgentPolicy": {"Type": "AWS::IAM::ManagedPolicy", "Properties": {"PolicyDocument": {
                "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "events:PutEvents", "Resource": bus}]}}},
        },
        "Outputs": {"TargetGroupArn": {"Value": {"Ref": "LoginTargetGroup"}},
                    "SyncStateTableName": {"Value": {"Ref": "SyncStateTable"}},
                    "NodeAgentPolicyArn": {"Value": {"Ref": "NodeAgentPolicy"}},
                    "NodeReportBusName": {"Value": {"Ref": "NodeReportBusName"}}},
    }
    parameters = {"ClusterName": CLUSTER, "LoginGroupName": "login", "ControllerGroupName": "controller-machine",
                  "SshPort": "22", "VerifierSubnetIds": subnet, "VerifierSecurityGroupIds": "", "VpcId": vpc,
                  "NodeReportBusName": f"{STACK}-node-reports"}
    boto3.client("cloudformation").create_stack(
        StackName=STACK, TemplateBody=json.dumps(template),
        Parameters=[{"ParameterKey": k, "ParameterValue": v} for k, v in parameters.items()])
    assert main(["doctor", "--stack-name", STACK]) == 1
    out = capsys.readouterr().out
    lines = _lines(out)
    assert "SKIPPED" not in {status for status, _ in lines}
    assert list(dict.fromkeys(check for _, check in lines)) == list(CHECKS)
    # The verifier group is the stack's own (DescribeStackResource), and the policy the stack's output.
    verifier = boto3.client("cloudformation").describe_stack_resource(
        StackName=STACK, LogicalResourceId="VerifierSecurityGroup")["StackResourceDetail"]["PhysicalResourceId"]
    policy = boto3.client("iam").list_policies(Scope="Local")["Policies"][0]["Arn"]
    assert f"attach-role-policy --role-name hyperpod-exec --policy-arn {policy}" in out
    assert verifier in next(line for line in out.splitlines() if line.startswith(("PROBLEM verifier-path", "UNKNOWN verifier-path")))
    assert "PROBLEM agent-reports[login]: " in out and "never reported" in out
    assert ("PROBLEM slurm-usage[controller-machine]: the controller's agent has never reported Slurm usage" in out)


def test_doctor_without_a_stack_or_a_cluster_and_region_exits_2(capsys):
    assert main(["doctor"]) == 2
    assert capsys.readouterr().out.startswith("hpops doctor: give --stack-name S, or --cluster NAME and --region R (or AWS_REGION)")


def test_before_a_deploy_the_groups_come_from_api_driven_slurm_configuration(monkeypatch, capsys):
    """A cluster created with InstanceGroups[].SlurmConfig.NodeType names its login and controller groups."""
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    with mock_aws():
        sim = HyperPodSimulator(REGION, DEFAULT_ACCOUNT_ID, clock=lambda: NOW)
        sim.create_cluster(CLUSTER, {"users": ("ml.m5.xlarge", 2), "slurmctld": ("ml.m5.xlarge", 1),
                                     "gpu": ("ml.p5.48xlarge", 2)})
        # moto keeps the groups as given; DescribeCluster returns SlurmConfig as SageMaker does.
        for group, node_type in (("users", "Login"), ("slurmctld", "Controller"), ("gpu", "Compute")):
            next(g for g in sim.cluster(CLUSTER).instance_groups if g["InstanceGroupName"] == group)["SlurmConfig"] = {
                "NodeType": node_type}
        assert main(["doctor", "--cluster", CLUSTER, "--region", REGION]) == 1
    out = capsys.readouterr().out
    assert "PROBLEM cluster" not in out
    assert {m for m in re.findall(r"^\w+ node-network\[([^\]]+)\]", out, re.MULTILINE)} == {"users", "slurmctld"}
