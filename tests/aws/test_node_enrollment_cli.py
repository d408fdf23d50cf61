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
from hpops_core.node_channel.enrollment import Enrollment
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
        sim.create_cluster("ml-research", {"login": ("ml.m5.xlarge", 1), "gpu": ("ml.p5.48xlarge", 1),
                                           "controller-machine": ("ml.m5.xlarge", 1)})
        arn = boto3.client("sagemaker", region_name=REGION).describe_cluster(ClusterName="ml-research")["ClusterArn"]
        boto3.client("cloudformation", region_name=REGION).create_stack(
            StackName="hpops-ml", TemplateBody=json.dumps(STACK), Parameters=[
                {"ParameterKey": k, "ParameterValue": v} for k, v in {
                    "ClusterName": "ml-research", "ClusterArn": arn, "LoginGroupName": "login",
                    "ControllerGroupName": "controller-machine"}.items()])
        yield {group: sim.nodes("ml-research", group)[0].instance_id for group in ("login", "gpu", "controller-machine")}


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


STANDING = "SHA256:" + "S" * 43


def stand(instance_id, via, status="enrolled", expect_document=False):
    """The controller's standing enrollment, as NodeChannel stored it."""
    record = Enrollment("ml-research", instance_id, "ssh-ed25519 " + "A" * 68, STANDING, "controller-machine",
                        "controller", "10.1.0.9", status, "2026-11-01T00:00:00Z", via, expect_document=expect_document)
    boto3.client("dynamodb").put_item(TableName="state", Item=enrollment_store.enrollment_item(record))


@pytest.mark.parametrize("via,status,flag,kept,said", [
    ("document", "enrolled", [], True, "stay counted (the standing key"),
    ("approval", "enrolled", [], True, "stay counted (the standing key"),
    ("window", "contested", [], False, "are voided when the agent enrolls"),
    ("window", "enrolled", ["--replaced-key-usage", "keep"], True, "stay counted (as the operator said)"),
    ("document", "enrolled", ["--replaced-key-usage", "discard"], False, "are voided when the agent enrolls"),
])
def test_a_controller_approval_says_whether_the_replaced_keys_usage_stays_counted(nodes, capsys, via, status, flag,
                                                                                   kept, said):
    """Proven by AWS's document or an earlier approval, the standing key was the node's own (a re-image, a
    lost key): its usage stays. A contested key never counted. The operator's word overrides both."""
    controller = nodes["controller-machine"]
    stand(controller, via, status)
    code, out, _ = node(capsys, "approve-enrollment", "--node", controller, "--fingerprint", FINGERPRINT, *flag)
    assert code == 0 and said in out
    approval = enrollment_store.get_approval("state", "ml-research", controller, int(datetime.now().timestamp()))
    assert (approval.fingerprint, approval.keep_usage_of) == (FINGERPRINT, STANDING if kept else "")


@pytest.mark.parametrize("expect_document", [False, True])
def test_a_controller_key_enrolled_by_window_alone_needs_the_operators_word_on_its_usage(nodes, capsys, expect_document):
    """First inside its window and never contested: the node's agent or a user's impostor, the stack cannot
    tell. Guessing keep could hold the wrong user; guessing discard releases every held user for hours:
    the approval is refused, naming the flag, and nothing is written."""
    controller = nodes["controller-machine"]
    stand(controller, "window", expect_document=expect_document)
    code, out, _ = node(capsys, "approve-enrollment", "--node", controller, "--fingerprint", FINGERPRINT)
    line = out.splitlines()[-1]
    assert code == 2 and "--replaced-key-usage keep" in line and "--replaced-key-usage discard" in line
    assert ("likely not the node's agent" in line) == expect_document
    assert enrollment_store.get_approval("state", "ml-research", controller, int(datetime.now().timestamp())) is None
