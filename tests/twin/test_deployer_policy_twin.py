"""The deployer's policy (docs/deployer-policy.json, generated from template.yaml) is enough to deploy the
stack: the twin provisions every resource as the deployer, under the twin's IAM enforcement."""

import pytest
from botocore.exceptions import ClientError
from operator_policy import without_action

from hpops_twin.iam.enforce import DEPLOYER
from hpops_twin.world import TwinWorld


def test_the_whole_stack_deploys_under_the_deployer_policy_with_zero_denials():
    with TwinWorld() as world:
        assert world.iam.denials == [] and world.iam.errors == []
        deployed = {action for principal, action, _ in world.iam.exercised if principal == DEPLOYER}
        # every kind of resource the template creates went through the deployer's policy
        assert {"dynamodb:CreateTable", "dynamodb:UpdateTimeToLive", "kms:CreateKey", "secretsmanager:CreateSecret",
                "kms:GenerateDataKey", "kms:Decrypt", "events:CreateEventBus", "events:PutRule",
                "ec2:CreateSecurityGroup", "ec2:AuthorizeSecurityGroupIngress", "ec2:AuthorizeSecurityGroupEgress",
                "sqs:CreateQueue", "sqs:GetQueueAttributes", "sns:CreateTopic", "logs:CreateLogGroup",
                "logs:PutRetentionPolicy", "elasticloadbalancing:CreateLoadBalancer",
                "elasticloadbalancing:CreateTargetGroup", "elasticloadbalancing:ModifyTargetGroupAttributes",
                "elasticloadbalancing:CreateListener", "elasticloadbalancing:ModifyListenerAttributes",
                "ssm:PutParameter", "iam:GetRole", "iam:CreateRole", "iam:PassRole", "lambda:CreateFunction",
                "states:CreateStateMachine"} <= deployed
        assert world.run_schedule()  # and the deployed stack runs
        assert world.wait_for_all()[0].status == "SUCCEEDED"


def test_one_action_removed_from_the_deployer_policy_fails_the_deploy_naming_it():
    def edit(principal: str, policies: dict) -> None:
        if principal == DEPLOYER:
            for document in policies.values():
                without_action(document, "states:CreateStateMachine")

    world = TwinWorld(iam_policy_edit=edit)
    with pytest.raises(ClientError, match="states:CreateStateMachine") as refused:
        world.__enter__()
    assert refused.value.response["Error"]["Code"] == "AccessDeniedException"
    ((principal, action, resource),) = [(d.principal, d.action, d.resource) for d in world.iam.denials]
    assert (principal, action) == (DEPLOYER, "states:CreateStateMachine")
    assert resource.startswith("arn:aws:states:us-east-1:123456789012:stateMachine:hpops-twin-")
