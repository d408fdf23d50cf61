"""`hpops host-keys ca-generate | ca-show` against a (moto) CloudFormation stack with the real output names."""

from __future__ import annotations

import json

import boto3
import pytest
from moto import mock_aws

from hpops_core.host_identity.keys import HostCA
from hpops.main import main
from hpops_twin.template_model import TemplateModel
from operator_policy import run_as_operator

# The outputs the CLI reads, defined here by the same logical names template.yaml uses.
STACK = {
    "Resources": {
        "HostIdentityKey": {"Type": "AWS::KMS::Key", "Properties": {"KeyPolicy": {"Version": "2012-10-17", "Statement": []}}},
        "Table": {"Type": "AWS::DynamoDB::Table", "Properties": {
            "TableName": "state", "BillingMode": "PAY_PER_REQUEST",
            "AttributeDefinitions": [{"AttributeName": "pk", "AttributeType": "S"}, {"AttributeName": "sk", "AttributeType": "S"}],
            "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}]}},
    },
    # moto's CloudFormation cannot create secrets: the test creates it and passes its ARN in.
    "Parameters": {"ClusterName": {"Type": "String"}, "HostCertificatePrincipals": {"Type": "String"},
                   "CaSecretArn": {"Type": "String"}},
    "Outputs": {
        "HostCertificateAuthoritySecretArn": {"Value": {"Ref": "CaSecretArn"}},
        "SyncStateTableName": {"Value": {"Ref": "Table"}},
        "LoadBalancerDnsName": {"Value": "login-nlb.elb.us-east-1.amazonaws.com"},
    },
}


def test_the_outputs_the_cli_reads_exist_in_template_yaml():
    outputs = TemplateModel().raw["Outputs"]
    assert {"HostCertificateAuthoritySecretArn", "SyncStateTableName", "LoadBalancerDnsName"} <= set(outputs)


@pytest.fixture
def stack(monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with mock_aws():
        cloudformation = boto3.client("cloudformation", region_name="us-east-1")
        cloudformation.create_stack(
            StackName="hpops-ml", TemplateBody=json.dumps(STACK),
            Parameters=[{"ParameterKey": "ClusterName", "ParameterValue": "ml-research"},
                        {"ParameterKey": "HostCertificatePrincipals", "ParameterValue": "login.hpc.example.edu"},
                        {"ParameterKey": "CaSecretArn", "ParameterValue": "set below"}],
        )
        # The secret under the stack's own key, as template.yaml has it: PutSecretValue also needs kms:GenerateDataKey.
        key = cloudformation.describe_stack_resource(StackName="hpops-ml", LogicalResourceId="HostIdentityKey")[
            "StackResourceDetail"]["PhysicalResourceId"]
        arn = boto3.client("secretsmanager", region_name="us-east-1").create_secret(
            Name="ca", SecretString="{}", KmsKeyId=key)["ARN"]
        cloudformation.update_stack(
            StackName="hpops-ml", TemplateBody=json.dumps(STACK),
            Parameters=[{"ParameterKey": "ClusterName", "UsePreviousValue": True},
                        {"ParameterKey": "HostCertificatePrincipals", "UsePreviousValue": True},
                        {"ParameterKey": "CaSecretArn", "ParameterValue": arn}])
        yield


def test_ca_show_before_generate_says_what_to_run(stack, capsys):
    status, out, _ = run_as_operator(capsys, main, "host-keys", "ca-show", "--stack-name", "hpops-ml", "--region", "us-east-1")
    assert status == 1
    assert "hpops host-keys ca-generate" in out


def test_ca_generate_stores_the_ca_and_prints_the_one_line_users_trust(stack, capsys):
    status, generated, _ = run_as_operator(
        capsys, main, "host-keys", "ca-generate", "--stack-name", "hpops-ml", "--region", "us-east-1")
    assert status == 0
    secret = boto3.client("secretsmanager", region_name="us-east-1").get_secret_value(SecretId="ca")["SecretString"]
    ca = HostCA.from_secret_json(secret)
    line = f"@cert-authority login-nlb.elb.us-east-1.amazonaws.com,login.hpc.example.edu {ca.public_line}"
    assert line in generated
    assert "PRIVATE KEY" not in generated and ca.private_openssh.splitlines()[1] not in generated

    status, shown, _ = run_as_operator(capsys, main, "host-keys", "ca-show", "--stack-name", "hpops-ml", "--region", "us-east-1")
    assert status == 0
    assert line in shown and ca.fingerprint() in shown


@pytest.fixture
def keys_mode_stack(monkeypatch):
    """A stack deployed with HostIdentityMode=keys (the default): no CA secret, so no output naming one."""
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    keys_mode = json.loads(json.dumps(STACK))
    del keys_mode["Outputs"]["HostCertificateAuthoritySecretArn"]
    keys_mode["Parameters"].pop("CaSecretArn")
    with mock_aws():
        boto3.client("cloudformation", region_name="us-east-1").create_stack(
            StackName="hpops-ml", TemplateBody=json.dumps(keys_mode),
            Parameters=[{"ParameterKey": "ClusterName", "ParameterValue": "ml-research"},
                        {"ParameterKey": "HostCertificatePrincipals", "ParameterValue": "login.hpc.example.edu"}])
        yield


@pytest.mark.parametrize("action", ["ca-generate", "ca-show"])
def test_a_ca_command_on_a_keys_mode_stack_says_to_deploy_certificate_mode_first_and_writes_nothing(
        keys_mode_stack, capsys, action):
    status, out, _ = run_as_operator(capsys, main, "host-keys", action, "--stack-name", "hpops-ml", "--region", "us-east-1")
    assert status != 0
    assert "is not in certificate mode" in out and "HostIdentityMode=certificate first" in out
    assert "@cert-authority" not in out
    assert boto3.client("secretsmanager", region_name="us-east-1").list_secrets()["SecretList"] == []
    assert boto3.client("dynamodb", region_name="us-east-1").scan(TableName="state")["Items"] == []
