"""IP targets outside the target group's VPC are named with AvailabilityZone=all, as ELBv2 requires.

moto accepts and ignores AvailabilityZone (its DescribeTargetHealth never returns it), so what AWS
would receive is read from the requests themselves, with a botocore hook on our client.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import boto3
import pytest
from moto import mock_aws

from hpops_core.common import clients
from hpops_core.login_sync.target_plan import availability_zone_for

REGION = "us-east-1"
APP = Path(__file__).resolve().parents[2] / "functions" / "login_node_sync" / "app.py"
CONTEXT = SimpleNamespace(function_name="ApplyTargetChanges", memory_limit_in_mb=256, aws_request_id="r",
                          invoked_function_arn="arn:aws:lambda:us-east-1:123456789012:function:ApplyTargetChanges")
INSIDE, PEERED = "10.0.3.4", "172.31.5.6"


# ---------------------------------------------------------------- the pure rule

def test_an_ip_in_the_vpc_is_left_to_aws_and_one_outside_is_named_all():
    cidrs = ("10.0.0.0/16",)
    assert availability_zone_for(INSIDE, cidrs) is None
    assert availability_zone_for(PEERED, cidrs) == "all"
    assert availability_zone_for("10.1.0.1", cidrs) == "all", "the next /16 is outside"


def test_a_secondary_cidr_of_the_vpc_counts_as_inside():
    assert availability_zone_for("100.64.7.8", ("10.0.0.0/16", "100.64.0.0/16")) is None


def test_ipv6_is_not_judged_against_ipv4_blocks():
    assert availability_zone_for("fd00::5", ("10.0.0.0/16",)) is None


# ---------------------------------------------------------------- the handler against moto

@pytest.fixture
def aws(monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    with mock_aws():
        clients.reset_clients()
        ec2 = boto3.client("ec2", region_name=REGION)
        vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
        elbv2 = boto3.client("elbv2", region_name=REGION)
        arn = elbv2.create_target_group(Name="login", Protocol="TCP", Port=22, VpcId=vpc, TargetType="ip")[
            "TargetGroups"][0]["TargetGroupArn"]
        sent: dict[str, list[list[dict]]] = {"RegisterTargets": [], "DeregisterTargets": []}
        calls: list[str] = []
        ours = clients.client("elbv2")
        for operation in sent:
            ours.meta.events.register(f"provide-client-params.elastic-load-balancing-v2.{operation}",
                                      lambda params, _op=operation, **_: sent[_op].append(params["Targets"]))
        for client in (ours, clients.client("ec2")):
            client.meta.events.register("before-call", lambda event_name, **_: calls.append(event_name.split(".", 2)[2]))
        yield SimpleNamespace(elbv2=elbv2, arn=arn, vpc=vpc, sent=sent, calls=calls)
        clients.reset_clients()


@pytest.fixture
def app(monkeypatch, aws):
    env = {"CLUSTER_NAME": "ml-research", "CLUSTER_ARN": "arn:aws:sagemaker:us-east-1:123456789012:cluster/abcdef012345",
           "LOGIN_GROUP_NAME": "login", "TARGET_GROUP_ARN": aws.arn, "SSH_PORT": "22", "STATE_TABLE_NAME": "t",
           "LEASE_SECONDS": "3060", "HOST_IDENTITY_MODE": "keys", "NODE_REPORT_POLL_SECONDS": "10",
           "NODE_REPORT_MAX_POLLS": "18", "POWERTOOLS_SERVICE_NAME": "login-node-sync",
           "POWERTOOLS_METRICS_NAMESPACE": "HyperPodLoginAutopilot", "POWERTOOLS_TRACE_DISABLED": "true"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    spec = importlib.util.spec_from_file_location("login_node_sync_app_under_test", APP)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def registered(aws) -> list[str]:
    described = aws.elbv2.describe_target_health(TargetGroupArn=aws.arn)["TargetHealthDescriptions"]
    return sorted(d["Target"]["Id"] for d in described)


def test_a_node_in_a_peered_vpc_is_registered_with_availability_zone_all(aws, app):
    output = app.apply_target_changes({"register": [INSIDE, PEERED], "deregister": []}, CONTEXT)

    assert output["registered"] == [INSIDE, PEERED]
    assert registered(aws) == [INSIDE, PEERED]
    assert aws.sent["RegisterTargets"] == [[{"Id": INSIDE, "Port": 22}, {"Id": PEERED, "Port": 22, "AvailabilityZone": "all"}]]
    # What it costs: the VPC's CIDRs are read once per applying pass, for both calls.
    assert aws.calls == ["DescribeTargetGroups", "DescribeVpcs", "RegisterTargets"]


def test_a_peered_node_is_deregistered_with_availability_zone_all_too(aws, app):
    app.apply_target_changes({"register": [INSIDE, PEERED], "deregister": []}, CONTEXT)

    app.apply_target_changes({"register": [], "deregister": [INSIDE, PEERED]}, CONTEXT)

    assert registered(aws) == []
    assert aws.sent["DeregisterTargets"] == [[{"Id": INSIDE, "Port": 22}, {"Id": PEERED, "Port": 22, "AvailabilityZone": "all"}]]


def test_a_secondary_vpc_cidr_is_inside(aws, app):
    boto3.client("ec2", region_name=REGION).associate_vpc_cidr_block(VpcId=aws.vpc, CidrBlock="10.2.0.0/16")

    app.apply_target_changes({"register": ["10.2.0.9"], "deregister": []}, CONTEXT)

    assert registered(aws) == ["10.2.0.9"]
    assert aws.sent["RegisterTargets"] == [[{"Id": "10.2.0.9", "Port": 22}]]


def test_a_target_group_the_stack_created_costs_no_describe_target_groups(aws, app, monkeypatch):
    # The stack created the target group in VpcId, so only the VPC's CIDRs are read.
    monkeypatch.setenv("TARGET_GROUP_VPC_ID", aws.vpc)

    app.apply_target_changes({"register": [INSIDE, PEERED], "deregister": []}, CONTEXT)

    assert registered(aws) == [INSIDE, PEERED]
    assert aws.sent["RegisterTargets"][0][1] == {"Id": PEERED, "Port": 22, "AvailabilityZone": "all"}
    assert aws.calls == ["DescribeVpcs", "RegisterTargets"]
