"""Operator CLI tests under the operator's policy: what `hpops iam-policy` prints for the test's stack,
enforced by the twin's IAM model (its operation table and evaluator), so a call the policy lacks
fails as AccessDenied naming the action, as it would on AWS."""

from __future__ import annotations

import json
import os
from collections.abc import Callable

import boto3
from botocore.exceptions import ClientError
from moto.core import DEFAULT_ACCOUNT_ID

from hpops_twin.iam.enforce import moto_lookup, policy_enforced
from hpops_twin.iam.operations import Lookup


def _region(region: str | None) -> str:
    return region or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"


def operator_policy_of(capsys, stack_name: str, region: str | None, main: Callable | None = None,
                       role: str = "operator") -> dict | None:
    """What `hpops iam-policy --role ROLE` prints for the stack (None: there is no such stack to write one for)."""
    if main is None:
        from hpops.main import main
    status = main(["iam-policy", "--stack-name", stack_name, "--role", role] + (["--region", region] if region else []))
    out = capsys.readouterr().out
    return json.loads(out) if status == 0 else None


def without_action(document: dict, action: str) -> dict:
    """`document` with `action` taken out of every statement (in place; returned for convenience)."""
    for statement in document["Statement"]:
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        statement["Action"] = [a for a in actions if a != action] or ["none:Nothing"]
    return document


def operator_lookup(stack_name: str, region: str | None) -> Lookup:
    """The twin's ARN lookup: the cluster's ARN is the stack's ClusterArn parameter, as template.yaml has it."""
    region = _region(region)
    stack = boto3.client("cloudformation", region_name=region).describe_stacks(StackName=stack_name)["Stacks"][0]
    parameters = {p["ParameterKey"]: p.get("ParameterValue", "") for p in stack.get("Parameters", [])}

    def cluster_arn(name: str) -> str:
        if name.startswith("arn:"):
            return name
        assert name == parameters.get("ClusterName") and parameters.get("ClusterArn"), f"no ARN for cluster {name}"
        return parameters["ClusterArn"]

    return moto_lookup(region, DEFAULT_ACCOUNT_ID, cluster_arn)


def run_as_operator(capsys, main: Callable, *argv: str) -> tuple[int, str, str]:
    """`main(argv)`; with --stack-name, under that stack's policy for the job that runs the command (the
    read-only operator's or the administrator's, and nothing of the other's). Returns (status, out, err)."""
    from hpops.operator_permissions import role_of

    args = list(argv)
    policy = None
    if "--stack-name" in args:
        stack_name = args[args.index("--stack-name") + 1]
        region = args[args.index("--region") + 1] if "--region" in args else None
        words = [a for a in args[:args.index("--stack-name")] if not a.startswith("-")]
        policy = operator_policy_of(capsys, stack_name, region, main, role_of(words))
        if policy is None:  # only for a stack that does not exist: there is nothing to write a policy for
            try:
                boto3.client("cloudformation", region_name=_region(region)).describe_stacks(StackName=stack_name)
            except ClientError as error:
                assert "does not exist" in str(error), error
            else:
                raise AssertionError(f"hpops iam-policy failed for the existing stack {stack_name}")
    if policy is None:
        status = main(args)
    else:
        with policy_enforced("operator", {"HpopsOperator": policy}, operator_lookup(stack_name, region)) as denials:
            status = main(args)
        assert not denials, f"the operator policy lacks what the command calls: {denials[0]}"
    captured = capsys.readouterr()
    return status, captured.out, captured.err
