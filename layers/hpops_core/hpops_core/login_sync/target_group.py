"""Elastic Load Balancing v2: read and change the login target group (IP targets)."""

from __future__ import annotations

from collections.abc import Sequence

from hpops_core.common.clients import client, transient_errors_named
from hpops_core.login_sync.target_plan import Target, availability_zone_for


def describe_targets(target_group_arn: str) -> list[Target]:
    # DescribeTargetHealth is not paginated: it returns every registered (and draining) target.
    with transient_errors_named("elbv2:DescribeTargetHealth"):
        response = client("elbv2").describe_target_health(TargetGroupArn=target_group_arn)
    return [
        Target(
            ip=d["Target"]["Id"],
            port=int(d["Target"].get("Port", 0)),
            state=d.get("TargetHealth", {}).get("State", "unknown"),
        )
        for d in response.get("TargetHealthDescriptions", [])
    ]


def deregistration_delay(target_group_arn: str) -> int:
    """The target group's deregistration delay (seconds): how long a deregistered target's connections are
    sure to be left alone."""
    with transient_errors_named("elbv2:DescribeTargetGroupAttributes"):
        attributes = client("elbv2").describe_target_group_attributes(TargetGroupArn=target_group_arn)["Attributes"]
    return int(next((a["Value"] for a in attributes if a["Key"] == "deregistration_delay.timeout_seconds"), "300"))


def vpc_cidrs(target_group_arn: str, vpc_id: str = "") -> tuple[str, ...]:
    """The IPv4 CIDR blocks of the target group's VPC (primary and associated secondary ones).

    `vpc_id` is known when the stack created the target group; only an existing target group's
    VPC is looked up. Read when targets change, not cached across invocations: a secondary CIDR
    can be associated at any time, and a stale list would name an in-VPC node with
    AvailabilityZone=all.
    """
    if not vpc_id:
        with transient_errors_named("elbv2:DescribeTargetGroups"):
            vpc_id = client("elbv2").describe_target_groups(TargetGroupArns=[target_group_arn])["TargetGroups"][0]["VpcId"]
    with transient_errors_named("ec2:DescribeVpcs"):
        vpc = client("ec2").describe_vpcs(VpcIds=[vpc_id])["Vpcs"][0]
    associated = {
        a["CidrBlock"] for a in vpc.get("CidrBlockAssociationSet", [])
        if a.get("CidrBlockState", {}).get("State") == "associated"
    }
    return tuple(sorted(associated | {vpc["CidrBlock"]}))


def _descriptions(ips: Sequence[str], port: int, cidrs: Sequence[str]) -> list[dict]:
    # The same description for both calls: AWS requires AvailabilityZone=all to deregister an
    # outside-VPC IP as well as to register it.
    descriptions = []
    for ip in ips:
        zone = availability_zone_for(ip, cidrs)
        descriptions.append({"Id": ip, "Port": port} | ({"AvailabilityZone": zone} if zone else {}))
    return descriptions


def register_ips(target_group_arn: str, ips: Sequence[str], port: int, cidrs: Sequence[str]) -> None:
    """`cidrs`: the target group's VPC CIDRs (vpc_cidrs), which decide each target's AvailabilityZone."""
    if not ips:
        return
    with transient_errors_named("elbv2:RegisterTargets"):
        client("elbv2").register_targets(TargetGroupArn=target_group_arn, Targets=_descriptions(ips, port, cidrs))


def deregister_ips(target_group_arn: str, ips: Sequence[str], port: int, cidrs: Sequence[str]) -> None:
    if not ips:
        return
    with transient_errors_named("elbv2:DeregisterTargets"):
        client("elbv2").deregister_targets(TargetGroupArn=target_group_arn, Targets=_descriptions(ips, port, cidrs))
