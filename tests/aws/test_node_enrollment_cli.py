"""`hpops node approve-enrollment | enrollments` against a (moto) stack with the real output and parameter
names, under the operator policy `hpops iam-policy` prints (the twin enforces it)."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import boto3
import pytest
from moto import mock_aws

from hpops.main import main
from hpops_core.node_channel import enrollment_store
from hpops_twin.hyperpod_sim import HyperPodSimulator
from operator_policy import run_as_operator

REGION = "us-east-1"
FINGERPRINT = "SHA256:" + "Q" * 43
STACK = {
    "Resources": {"Table": {"Type": "AWS::DynamoDB::Table", "Properties": {
        "TableName": "state", "BillingMode": "PAY_PER_REQUEST",
        "AttributeDefinitions": [{"AttributeName": "pk", "AttributeType": "S"}, {"AttributeName": "sk", "AttributeType": "S"}],
        "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}]}}},
    "Parameters": {name: {"Type": "String"} for name in ("ClusterName", "ClusterArn", "LoginGroupName", "ControllerGroupName")},
    "Outputs": {"SyncStateTableName": {"Value": {"Ref": "Table"}}},
}


@pytest.fixture
def nodes(monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    with mock_aws():
        sim = HyperPodSimulator(REGION, "123456789012", clock=lambda: datetime.now(timezone.utc))
        sim.create_cluster("ml-research", {"login": ("ml.m5.xlarge", 1), "gpu": ("ml.p5.48xlarge", 1)})
        arn = boto3.client("sagemaker", region_name=REGION).describe_cluster(ClusterName="ml-research")["ClusterArn"]
        boto3.client("cloudformation", region_name=REGION).create_stack(
            StackName="hpops-ml", TemplateBody=json.dumps(STACK), Parameters=[
                {"ParameterKey": k, "ParameterValue": v} for k, v in {
                    "ClusterName": "ml-research", "ClusterArn": arn, "LoginGroupName": "login",
                    "ControllerGroupName": "controller-machine"}.items()])
        yield {group: sim.nodes("ml-research", group)[0].instance_id for group in ("login", "gpu")}


def node(capsys, *argv):
    return run_as_operator(capsys, main, "node", *argv, "--stack-name", "hpops-ml", "--region", REGION)


def test_the_operator_approves_one_key_for_one_login_node_and_sees_it_pending(nodes, capsys):
    status, out, _ = node(capsys, "approve-enrollment", "--node", nodes["login"], "--fingerprint", FINGERPRINT)
    assert status == 0 and f"approved {FINGERPRINT} for {nodes['login']} (group login)" in out
    approval = enrollment_store.get_approval("state", "ml-research", nodes["login"], int(datetime.now().timestamp()))
    assert approval.fingerprint == FINGERPRINT
    status, out, _ = node(capsys, "enrollments")
    assert status == 0 and f"{nodes['login']}  approval pending for {FINGERPRINT}" in out


@pytest.mark.parametrize("which,fingerprint,why", [
    ("gpu", FINGERPRINT, "only the login (login) and controller (controller-machine) groups' agents enroll"),
    ("login", "MD5:aa:bb", "not an OpenSSH SHA256 fingerprint (it starts with SHA256:)"),
    ("none", FINGERPRINT, "is not a node of cluster ml-research"),
])
def test_what_cannot_enroll_is_refused_in_one_line_and_nothing_is_written(nodes, capsys, which, fingerprint, why):
    instance = nodes.get(which, "i-0fedcba9876543210")
    status, out, _ = node(capsys, "approve-enrollment", "--node", instance, "--fingerprint", fingerprint)
    assert status == 2 and why in out.splitlines()[-1]
    assert enrollment_store.list_enrollments("state", "ml-research") == ([], [])
