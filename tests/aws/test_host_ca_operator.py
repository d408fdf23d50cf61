"""`hpops host-keys ca-generate | ca-show` against a (moto) CloudFormation stack with the real output names."""

from __future__ import annotations

import json

import boto3
import pytest
from moto import mock_aws

from hpops_core.host_identity.keys import HostCA
from hpops.main import main
from hpops_twin.template_model import TemplateModel

# The outputs the CLI reads, defined here by the same logical names template.yaml uses.
STACK = {
    "Resources": {
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
        arn = boto3.client("secretsmanager", region_name="us-east-1").create_secret(Name="ca", SecretString="{}")["ARN"]
        boto3.client("cloudformation", region_name="us-east-1").create_stack(
            StackName="hpops-ml", TemplateBody=json.dumps(STACK),
            Parameters=[{"ParameterKey": "ClusterName", "ParameterValue": "ml-research"},
                        {"ParameterKey": "HostCertificatePrincipals", "ParameterValue": "login.hpc.example.edu"},
                        {"ParameterKey": "CaSecretArn", "ParameterValue": arn}],
        )
        yield


def test_ca_show_before_generate_says_what_to_run(stack, capsys):
    assert main(["host-keys", "ca-show", "--stack-name", "hpops-ml", "--region", "us-east-1"]) == 1
    assert "hpops host-keys ca-generate" in capsys.readouterr().out


def test_ca_generate_stores_the_ca_and_prints_the_one_line_users_trust(stack, capsys):
    assert main(["host-keys", "ca-generate", "--stack-name", "hpops-ml", "--region", "us-east-1"]) == 0
    generated = capsys.readouterr().out
    secret = boto3.client("secretsmanager", region_name="us-east-1").get_secret_value(SecretId="ca")["SecretString"]
    ca = HostCA.from_secret_json(secret)
    line = f"@cert-authority login-nlb.elb.us-east-1.amazonaws.com,login.hpc.example.edu {ca.public_line}"
    assert line in generated
    assert "PRIVATE KEY" not in generated and ca.private_openssh.splitlines()[1] not in generated

    assert main(["host-keys", "ca-show", "--stack-name", "hpops-ml", "--region", "us-east-1"]) == 0
    shown = capsys.readouterr().out
    assert line in shown and ca.fingerprint() in shown
