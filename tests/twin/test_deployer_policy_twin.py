"""`sam deploy --role-arn` under the policies of docs/deployer-role.json, in one twin world: the deployer
(CloudFormation on the stack, the artifacts bucket, PassRole on the service role) creates, updates and
deletes the stack, whose resources the CloudFormation service role makes, changes and removes; a second
creation fails and is rolled back by that role. Zero denials throughout; taking one action out of either
policy fails the deploy naming it."""

import boto3
import pytest
from botocore.exceptions import ClientError
from operator_policy import without_action

from hpops_twin.iam.enforce import DEPLOYER, SERVICE_ROLE
from hpops_twin.iam.evaluate import decide
from hpops_twin.stack_deploy import StackRolledBack
from hpops_twin.world import TwinWorld


def _done(world, principal):
    return {action for who, action, _ in world.iam.exercised if who == principal}


def _stack_resources(world):
    """What of the stack is left in the account (by the stack's names, as CloudFormation generates them)."""
    prefix = world.stack_name + "-"
    lambda_client, sfn = world.aws.client("lambda"), world.aws.client("stepfunctions")
    return sorted(
        [f["FunctionName"] for f in lambda_client.list_functions()["Functions"] if f["FunctionName"].startswith(prefix)]
        + [m["name"] for m in sfn.list_state_machines()["stateMachines"] if m["name"].startswith(prefix)]
        + [t for t in world.aws.client("dynamodb").list_tables()["TableNames"] if t.startswith(prefix)]
        + [q for q in world.aws.client("sqs").list_queues().get("QueueUrls", []) if f"/{prefix}" in q]
        + [b["Name"] for b in world.aws.client("events").list_event_buses()["EventBuses"] if b["Name"].startswith(prefix)]
        + [g["logGroupName"] for g in world.aws.client("logs").describe_log_groups()["logGroups"]
           if g["logGroupName"].startswith(prefix)])


def test_deploy_update_delete_and_a_rolled_back_creation_with_the_two_policies_only():
    with TwinWorld() as world:
        # Created: sam's own calls as the deployer, every resource as the service role.
        assert {"cloudformation:CreateChangeSet", "cloudformation:ExecuteChangeSet", "iam:PassRole", "s3:CreateBucket",
                "s3:PutBucketPolicy", "s3:PutObject"} <= _done(world, DEPLOYER)
        assert not {a for a in _done(world, DEPLOYER) if a.split(":")[0] not in ("cloudformation", "s3", "iam")}
        assert {"dynamodb:CreateTable", "kms:CreateKey", "secretsmanager:CreateSecret", "kms:GenerateDataKey",
                "events:CreateEventBus", "events:PutRule", "ec2:CreateSecurityGroup", "sqs:CreateQueue",
                "sns:CreateTopic", "logs:CreateLogGroup", "elasticloadbalancing:CreateLoadBalancer",
                "elasticloadbalancing:CreateTargetGroup", "elasticloadbalancing:CreateListener", "ssm:PutParameter",
                "iam:CreateRole", "iam:PassRole", "lambda:CreateFunction", "s3:GetObject",
                "states:CreateStateMachine"} <= _done(world, SERVICE_ROLE)
        assert world.wait([world.run_schedule()])[0].status == "SUCCEEDED"  # and the stack runs

        world.stack.update()
        assert {"lambda:UpdateFunctionCode", "lambda:UpdateFunctionConfiguration",
                "states:UpdateStateMachine"} <= _done(world, SERVICE_ROLE)
        assert world.wait([world.run_schedule()])[0].status == "SUCCEEDED"

        world.stack.delete()
        assert _stack_resources(world) == []
        assert {"lambda:DeleteFunction", "states:DeleteStateMachine", "dynamodb:DeleteTable", "kms:ScheduleKeyDeletion",
                "secretsmanager:DeleteSecret", "events:DeleteRule", "events:DeleteEventBus", "iam:DeleteRole",
                "elasticloadbalancing:DeleteLoadBalancer", "ec2:DeleteSecurityGroup"} <= _done(world, SERVICE_ROLE)
        assert "cloudformation:DeleteStack" in _done(world, DEPLOYER)

        # A creation that fails (the bus's custom name is taken) is rolled back by the service role.
        boto3.client("events", region_name=world.region).create_event_bus(Name=f"{world.stack_name}-node-reports")
        with pytest.raises(StackRolledBack, match="node-reports"):
            world.stack.create()
        assert _stack_resources(world) == [f"{world.stack_name}-node-reports"]  # only the bus it did not make
        world.stack.delete()  # what sam delete does with a ROLLBACK_COMPLETE stack

        assert world.iam.denials == [] and world.iam.errors == []

        # Every action either principal used is needed: without it, the request is refused.
        policies = world.iam._deployer()
        for principal, action, resource in sorted(world.iam.exercised):
            if principal not in (DEPLOYER, SERVICE_ROLE):
                continue
            stripped = {name: without_action({"Statement": [dict(s) for s in d["Statement"]]}, action)
                        for name, d in policies[principal].items()}
            context = {"iam:passedtoservice": ("lambda.amazonaws.com", "states.amazonaws.com",
                                               "cloudformation.amazonaws.com"),
                       "kms:viaservice": (f"secretsmanager.{world.region}.amazonaws.com",),
                       "cloudformation:rolearn": (world.deployer_names.service_role,)}
            assert not decide(stripped, action, resource, context).allowed, (principal, action)


@pytest.mark.parametrize("principal,action", [(SERVICE_ROLE, "states:CreateStateMachine"),
                                              (DEPLOYER, "iam:PassRole")])
def test_one_action_removed_fails_the_deploy_naming_it(principal, action):
    def edit(who: str, policies: dict) -> None:
        if who == principal:
            for document in policies.values():
                without_action(document, action)

    world = TwinWorld(iam_policy_edit=edit)
    with pytest.raises((ClientError, StackRolledBack), match=action) as refused:
        world.__enter__()
    denied = [(d.principal, d.action) for d in world.iam.denials]
    assert denied == [(principal, action)]
    if principal == SERVICE_ROLE:  # CloudFormation rolled the creation back, as the same role, refused nothing else
        cause = refused.value.__cause__
        assert isinstance(cause, ClientError) and cause.response["Error"]["Code"] == "AccessDeniedException"
        assert world.iam.denials[0].resource.startswith("arn:aws:states:us-east-1:123456789012:stateMachine:hpops-twin-")
        assert {"lambda:DeleteFunction", "dynamodb:DeleteTable"} <= _done(world, SERVICE_ROLE)
    else:  # the deployer may not hand the role to CloudFormation: nothing was created
        assert refused.value.response["Error"]["Code"] == "AccessDenied"
        assert not _done(world, SERVICE_ROLE)
