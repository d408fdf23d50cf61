"""Elastic Load Balancing v2: read and change the login target group (IP targets)."""

from __future__ import annotations

from collections.abc import Sequence

from hpops_core.aws.clients import client, transient_errors_named
from hpops_core.target_plan import Target


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


def register_ips(target_group_arn: str, ips: Sequence[str], port: int) -> None:
    if not ips:
        return
    with transient_errors_named("elbv2:RegisterTargets"):
        client("elbv2").register_targets(
            TargetGroupArn=target_group_arn, Targets=[{"Id": ip, "Port": port} for ip in ips]
        )


def deregister_ips(target_group_arn: str, ips: Sequence[str], port: int) -> None:
    if not ips:
        return
    with transient_errors_named("elbv2:DeregisterTargets"):
        client("elbv2").deregister_targets(
            TargetGroupArn=target_group_arn, Targets=[{"Id": ip, "Port": port} for ip in ips]
        )
