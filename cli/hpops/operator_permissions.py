"""What each `hpops` command calls on AWS, and the least-privilege policy that allows exactly that.

One row per call: (botocore service id, operation, IAM action, resource). The action is the Service
Authorization Reference's (tests/unit/test_operator_policy.py checks every row against the twin's
own operation table, which the twin enforces, so the two cannot drift). A resource is an ARN
template filled from the stack:

    {region} {account} {stack}     the stack's region, account and name
    {output:Name} {parameter:Name} a stack output or parameter (an ARN, or a table's name)
    {resource:LogicalId}           the physical id of a stack resource (ListStackResources)
    {execution:Output}             every execution of the state machine an output names
    {lifecycle-bucket}             each bucket given with --lifecycle-bucket ("*" for the resource without one)

"*" only where the action has no resource type; WILDCARD_REASONS says why, and is the statement's Sid.
`${aws:username}` and `${aws:userid}` are IAM's policy variables, left for IAM to fill.

Two jobs, two policies (ROLES), each within a managed policy's 6,144 characters: the operator reads
(status, doctor, cost, the enrollments and host identity on record); the administrator changes things
(repair, host-keys, adopt, node approve-enrollment, cost release and subscribe).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Call:
    service: str
    operation: str
    action: str
    resource: str
    leading_keys: tuple[str, ...] = ()  # DynamoDB: the partition keys (patterns) the command reads or writes
    # Further conditions, as (operator, key, value templates): e.g. KMS only through Secrets Manager.
    conditions: tuple[tuple[str, str, tuple[str, ...]], ...] = ()


STACK = "arn:aws:cloudformation:{region}:{account}:stack/{stack}/*"
TABLE = "arn:aws:dynamodb:{region}:{account}:table/{output:SyncStateTableName}"
CLUSTER = "{parameter:ClusterArn}"
SYNC = "{output:LoginNodeSyncStateMachineArn}"
RUN_SHELL = "arn:aws:ssm:{region}:{account}:document/SSM-SessionManagerRunShell"
HOST_KEY = "{resource:HostIdentityKey}"
# The host identity key is used only by Secrets Manager on the operator's behalf (kms:ViaService).
VIA_SECRETS_MANAGER = (("StringEquals", "kms:ViaService", ("secretsmanager.{region}.amazonaws.com",)),)
# Session Manager: adopt's one document (AWS-owned documents have no account in their ARN; "*" matches
# the empty one), and the cluster as the session's target. How StartSession authorizes a
# sagemaker-cluster: target is UNCONFIRMED (none of the reference's resource types: document, instance,
# managed-instance, task, is a HyperPod node); the twin checks the cluster's ARN. If AWS refuses it,
# the AccessDenied names the resource it checked: put that ARN in place of the cluster's.
ADOPT_DOCUMENT = "arn:aws:ssm:{region}:*:document/AWS-StartNonInteractiveCommand"
SESSION_TARGET = "arn:aws:sagemaker:{region}:{account}:cluster/{cluster-id}"
# Without it, a StartSession naming no document opens the default shell with no check on that document.
DOCUMENT_CHECKED = (("BoolIfExists", "ssm:SessionDocumentAccessCheck", ("true",)),)
# The caller's own sessions only (the Session Manager guide's session ID ARN forms: an IAM user's, a
# federated or assumed-role principal's).
OWN_SESSIONS = ("arn:aws:ssm:{region}:{account}:session/${aws:username}-*",
                "arn:aws:ssm:{region}:{account}:session/${aws:userid}-*")

# The state table's item kinds (hpops_core.common.state_table and budget_guard's usage_store and
# alert_state name them; tests/unit/test_operator_policy.py holds these to those modules).
LEASE = ("cluster#{parameter:ClusterName}",)  # the sync lease, with the published host identity
NODE_REPORTS = ("node-report#{parameter:ClusterName}",)
SPEND_ITEMS = ("usage#{parameter:ClusterName}", "usage#{parameter:ClusterName}#*", "budget#{parameter:ClusterName}")
BUDGET_ITEMS = ("budget#{parameter:ClusterName}",)  # a release is a budget item
ENROLLMENTS = ("enroll#{parameter:ClusterName}",)  # the agents' keys: NodeChannel writes them, never an operator
APPROVALS = ("approval#{parameter:ClusterName}",)  # an operator's single-use approvals of one key each
ADMISSION = ("admission#{parameter:ClusterName}",)  # load-aware admission's record

READ_STACK = (Call("cloudformation", "DescribeStacks", "cloudformation:DescribeStacks", STACK),)
SPEND = (
    Call("cloudformation", "DescribeStackResource", "cloudformation:DescribeStackResource", STACK),
    Call("lambda", "GetFunctionConfiguration", "lambda:GetFunctionConfiguration", "{resource:CheckUserSpendFunction}"),
    Call("sagemaker", "DescribeCluster", "sagemaker:DescribeCluster", CLUSTER),
    Call("cost-explorer", "GetCostAndUsage", "ce:GetCostAndUsage", "*"),
    Call("pricing", "GetProducts", "pricing:GetProducts", "*"),
    # Also Cost Explorer's kept answer, which the report reuses (--fresh asks again, and never writes it).
    Call("dynamodb", "GetItem", "dynamodb:GetItem", TABLE, SPEND_ITEMS + ("ce-cache#{parameter:ClusterName}",)),
    Call("dynamodb", "Query", "dynamodb:Query", TABLE, SPEND_ITEMS),
)

COMMANDS: dict[str, tuple[Call, ...]] = {
    "status": READ_STACK + SPEND + (
        Call("dynamodb", "GetItem", "dynamodb:GetItem", TABLE, LEASE),
        Call("dynamodb", "Query", "dynamodb:Query", TABLE, NODE_REPORTS),
        Call("dynamodb", "GetItem", "dynamodb:GetItem", TABLE, ADMISSION),
        Call("dynamodb", "Query", "dynamodb:Query", TABLE, ENROLLMENTS),
        Call("sagemaker", "ListClusterNodes", "sagemaker:ListClusterNodes", CLUSTER),
        Call("sagemaker", "DescribeClusterNode", "sagemaker:DescribeClusterNode", CLUSTER),
        Call("elastic-load-balancing-v2", "DescribeTargetHealth", "elasticloadbalancing:DescribeTargetHealth", "*"),
        Call("sfn", "ListExecutions", "states:ListExecutions", SYNC),
        Call("sfn", "ListExecutions", "states:ListExecutions", "{output:SessionLimitsStateMachineArn}"),
        Call("sfn", "ListExecutions", "states:ListExecutions", "{output:BudgetGuardStateMachineArn}"),
        Call("cloudformation", "ListStackResources", "cloudformation:ListStackResources", STACK),
        # CloudFormation names the stack's alarms <stack>-<LogicalId>-<suffix> (no AlarmName in template.yaml).
        # It shortens a generated name only past the type's limit: 255 for alarms, which a 128-character stack
        # name and this template's logical ids stay under.
        Call("cloudwatch", "DescribeAlarms", "cloudwatch:DescribeAlarms",
             "arn:aws:cloudwatch:{region}:{account}:alarm:{stack}-*"),
        Call("ssm", "DescribeSessions", "ssm:DescribeSessions", "*"),
        Call("ssm", "GetDocument", "ssm:GetDocument", RUN_SHELL),
    ),
    "repair": READ_STACK + (
        Call("sfn", "StartExecution", "states:StartExecution", SYNC),
        Call("sfn", "DescribeExecution", "states:DescribeExecution", "{execution:LoginNodeSyncStateMachineArn}"),
    ),
    "cost": SPEND,
    "cost subscribe": READ_STACK + (
        Call("sns", "Subscribe", "sns:Subscribe", "{output:UserSpendAlertTopicArn}"),
    ),
    # GetCallerIdentity (who released) needs no permission.
    "cost release": READ_STACK + (
        Call("dynamodb", "PutItem", "dynamodb:PutItem", TABLE, BUDGET_ITEMS),
        Call("sfn", "StartExecution", "states:StartExecution", "{output:BudgetGuardStateMachineArn}"),
    ),
    "host-keys generate|adopt|rotate": READ_STACK + (
        Call("secrets-manager", "PutSecretValue", "secretsmanager:PutSecretValue", "{output:HostIdentitySecretArn}"),
        Call("secrets-manager", "PutSecretValue", "kms:GenerateDataKey", HOST_KEY, conditions=VIA_SECRETS_MANAGER),
        Call("dynamodb", "UpdateItem", "dynamodb:UpdateItem", TABLE, LEASE),
    ),
    "host-keys ca-generate": READ_STACK + (
        Call("secrets-manager", "PutSecretValue", "secretsmanager:PutSecretValue",
             "{output:HostCertificateAuthoritySecretArn}"),
        Call("secrets-manager", "PutSecretValue", "kms:GenerateDataKey", HOST_KEY, conditions=VIA_SECRETS_MANAGER),
        Call("dynamodb", "UpdateItem", "dynamodb:UpdateItem", TABLE, LEASE),
    ),
    "host-keys show|ca-show": READ_STACK + (Call("dynamodb", "GetItem", "dynamodb:GetItem", TABLE, LEASE),),
    "lifecycle": READ_STACK,
    "node enrollments": READ_STACK + (Call("dynamodb", "Query", "dynamodb:Query", TABLE, ENROLLMENTS + APPROVALS),),
    # An approval, never an enrollment: the agent's own enroll call uses it (NodeChannel writes the record).
    "node approve-enrollment": READ_STACK + (
        Call("sagemaker", "DescribeClusterNode", "sagemaker:DescribeClusterNode", CLUSTER),
        # The standing enrollment: whose key the approval replaces decides its usage windows' default.
        Call("dynamodb", "GetItem", "dynamodb:GetItem", TABLE, ENROLLMENTS),
        Call("dynamodb", "PutItem", "dynamodb:PutItem", TABLE, APPROVALS),
    ),
    # Session Manager into each running node of the cluster (its one document only: the target's type is
    # UNCONFIRMED, the document's is not), the approval of the key it read there as root, then a repair.
    "adopt": READ_STACK + (
        Call("sagemaker", "DescribeCluster", "sagemaker:DescribeCluster", CLUSTER),
        Call("sagemaker", "ListClusterNodes", "sagemaker:ListClusterNodes", CLUSTER),
        Call("dynamodb", "Query", "dynamodb:Query", TABLE, NODE_REPORTS + ENROLLMENTS),
        Call("ssm", "StartSession", "ssm:StartSession", ADOPT_DOCUMENT, conditions=DOCUMENT_CHECKED),
        Call("ssm", "StartSession", "ssm:StartSession", SESSION_TARGET, conditions=DOCUMENT_CHECKED),
        # The Session Manager plugin ends (and, after a network drop, resumes) the sessions it started.
        *(Call("ssm", operation, f"ssm:{operation}", arn) for operation in ("TerminateSession", "ResumeSession")
          for arn in OWN_SESSIONS),
        # The approval of the key it read as root on each node (never an enrollment: NodeChannel writes those).
        Call("dynamodb", "PutItem", "dynamodb:PutItem", TABLE, APPROVALS),
        # After the repair: which nodes it touched are in the target group.
        Call("elastic-load-balancing-v2", "DescribeTargetHealth", "elasticloadbalancing:DescribeTargetHealth", "*"),
        Call("sfn", "StartExecution", "states:StartExecution", SYNC),
        Call("sfn", "DescribeExecution", "states:DescribeExecution", "{execution:LoginNodeSyncStateMachineArn}"),
    ),
    # doctor.DOCTOR_IAM_ACTIONS, each with what it reads
    "doctor": READ_STACK + (
        Call("cloudformation", "DescribeStackResource", "cloudformation:DescribeStackResource", STACK),
        Call("sagemaker", "DescribeCluster", "sagemaker:DescribeCluster", CLUSTER),
        Call("sagemaker", "ListClusterNodes", "sagemaker:ListClusterNodes", CLUSTER),
        Call("sagemaker", "ListTags", "sagemaker:ListTags", CLUSTER),
        Call("s3", "GetObject", "s3:GetObject", "arn:aws:s3:::{lifecycle-bucket}/*"),
        Call("s3", "ListObjectsV2", "s3:ListBucket", "arn:aws:s3:::{lifecycle-bucket}"),
        Call("iam", "ListAttachedRolePolicies", "iam:ListAttachedRolePolicies",
             "arn:aws:iam::{account}:role/{parameter:ClusterExecutionRoleName}"),
        # imds-exposure: what each instance group's role allows (inline policies, and each attached policy's
        # document: the stack's NodeAgentPolicy, AWS-managed and the account's own policies alike); the
        # cluster names the compute groups' roles, not the stack, so these reads take any role of the account
        Call("iam", "ListAttachedRolePolicies", "iam:ListAttachedRolePolicies", "arn:aws:iam::{account}:role/*"),
        Call("iam", "ListRolePolicies", "iam:ListRolePolicies", "arn:aws:iam::{account}:role/*"),
        Call("iam", "GetRolePolicy", "iam:GetRolePolicy", "arn:aws:iam::{account}:role/*"),
        Call("iam", "GetPolicy", "iam:GetPolicy", "arn:aws:iam::*:policy/*"),
        Call("iam", "GetPolicyVersion", "iam:GetPolicyVersion", "arn:aws:iam::*:policy/*"),
        Call("ec2", "DescribeSubnets", "ec2:DescribeSubnets", "*"),
        Call("ec2", "DescribeRouteTables", "ec2:DescribeRouteTables", "*"),
        Call("ec2", "DescribeVpcEndpoints", "ec2:DescribeVpcEndpoints", "*"),
        # nlb-path: the users' side, through a Client VPN endpoint in the load balancer's VPC
        Call("ec2", "DescribeClientVpnEndpoints", "ec2:DescribeClientVpnEndpoints", "*"),
        # any endpoint of the account: which ones are in the NLB's VPC is only known by reading them
        Call("ec2", "DescribeClientVpnTargetNetworks", "ec2:DescribeClientVpnTargetNetworks",
             "arn:aws:ec2:{region}:{account}:client-vpn-endpoint/*"),
        Call("ec2", "DescribeClientVpnAuthorizationRules", "ec2:DescribeClientVpnAuthorizationRules",
             "arn:aws:ec2:{region}:{account}:client-vpn-endpoint/*"),
        Call("ec2", "DescribeSecurityGroups", "ec2:DescribeSecurityGroups", "*"),
        Call("ec2", "DescribeNetworkAcls", "ec2:DescribeNetworkAcls", "*"),
        Call("elastic-load-balancing-v2", "DescribeTargetGroups", "elasticloadbalancing:DescribeTargetGroups", "*"),
        Call("elastic-load-balancing-v2", "DescribeLoadBalancers", "elasticloadbalancing:DescribeLoadBalancers", "*"),
        # The published host identity, the agents' reports and enrollments, the usage collector's status.
        Call("dynamodb", "GetItem", "dynamodb:GetItem", TABLE, LEASE + ("usage#{parameter:ClusterName}",)),
        Call("dynamodb", "Query", "dynamodb:Query", TABLE, NODE_REPORTS + ENROLLMENTS),
        Call("cloudtrail", "DescribeTrails", "cloudtrail:DescribeTrails", "*"),
        Call("cloudtrail", "GetTrailStatus", "cloudtrail:GetTrailStatus", "arn:aws:cloudtrail:*:{account}:trail/*"),
        Call("cloudtrail", "GetEventSelectors", "cloudtrail:GetEventSelectors", "arn:aws:cloudtrail:*:{account}:trail/*"),
        Call("ssm", "GetDocument", "ssm:GetDocument", RUN_SHELL),
        Call("cost-explorer", "ListCostAllocationTags", "ce:ListCostAllocationTags", "*"),
        Call("sns", "ListSubscriptionsByTopic", "sns:ListSubscriptionsByTopic", "{output:AlertTopicArn}"),
        Call("kms", "GetKeyPolicy", "kms:GetKeyPolicy", HOST_KEY),
    ),
}

# Why a statement's resource is "*" (the Sid says it, in the words IAM allows in a Sid).
WILDCARD_REASONS = {
    # Its one resource type is a billing view, which applies only to a request naming one (ours never do).
    "ce:GetCostAndUsage": "CostExplorerRequestsNameNoBillingView",
    "ce:ListCostAllocationTags": "CostExplorerTagsHaveNoResourceType",
    "pricing:GetProducts": "PriceListHasNoResourceType",
    "elasticloadbalancing:DescribeTargetHealth": "ElbDescribeActionsHaveNoResourceType",
    "elasticloadbalancing:DescribeTargetGroups": "ElbDescribeActionsHaveNoResourceType",
    "elasticloadbalancing:DescribeLoadBalancers": "ElbDescribeActionsHaveNoResourceType",
    "ssm:DescribeSessions": "DescribeSessionsHasNoResourceType",
    "ec2:DescribeSubnets": "Ec2DescribeActionsHaveNoResourceType",
    "ec2:DescribeRouteTables": "Ec2DescribeActionsHaveNoResourceType",
    "ec2:DescribeVpcEndpoints": "Ec2DescribeActionsHaveNoResourceType",
    "ec2:DescribeClientVpnEndpoints": "Ec2DescribeActionsHaveNoResourceType",
    "ec2:DescribeSecurityGroups": "Ec2DescribeActionsHaveNoResourceType",
    "ec2:DescribeNetworkAcls": "Ec2DescribeActionsHaveNoResourceType",
    "cloudtrail:DescribeTrails": "DescribeTrailsHasNoResourceType",
    # The lifecycle bucket is the cluster's (its LifeCycleConfig.SourceS3Uri), not the stack's: without
    # --lifecycle-bucket it is unknown here.
    "s3:GetObject": "LifecycleBucketIsTheClustersNotTheStacks",
    "s3:ListBucket": "LifecycleBucketIsTheClustersNotTheStacks",
}
LIFECYCLE_BUCKET = "{lifecycle-bucket}"

# Who runs which command: the operator reads; the administrator changes things (and attaches the
# operator's policy too, for the reads).
ROLES: dict[str, tuple[str, ...]] = {
    "operator": ("status", "cost", "doctor", "host-keys show|ca-show", "node enrollments", "lifecycle"),
    "administrator": ("repair", "cost subscribe", "cost release", "host-keys generate|adopt|rotate",
                      "host-keys ca-generate", "adopt", "node approve-enrollment"),
}


def role_of(words: Sequence[str]) -> str:
    """The job whose policy allows the command line `words` (e.g. ["host-keys", "rotate"]): the longest
    COMMANDS name it starts with."""
    found = sorted(((len(name.split()), role) for role, names in ROLES.items() for name in names
                    if len(words) >= len(name.split())
                    and all(word in part.split("|") for word, part in zip(words, name.split()))), reverse=True)
    if not found:
        raise KeyError(f"no job runs hpops {' '.join(words)}")
    return found[0][1]


# Outputs a stack has only with some parameters, and why one is missing (the note says it instead).
CONDITIONAL_OUTPUTS = {
    "HostCertificateAuthoritySecretArn": "a stack in keys mode has no host CA (deploy with HostIdentityMode=certificate "
                                         "to use it)",
}


class MissingStackValue(Exception):
    """A resource template names an output, parameter or resource the stack does not have."""


def _filler(stack: Mapping[str, str], outputs: Mapping[str, str], parameters: Mapping[str, str],
            resources: Mapping[str, str]) -> Callable[[str], str]:
    def fill(template: str) -> str:
        def value(match: re.Match) -> str:
            kind, _, name = match.group(1).partition(":")
            if not name:
                if kind not in stack:
                    raise MissingStackValue(kind)
                return stack[kind]
            source = {"output": outputs, "parameter": parameters, "resource": resources,
                      "execution": outputs}[kind]
            found = source.get(name)
            if not found:
                raise MissingStackValue(f"{kind} {name}")
            if kind == "execution":  # arn:...:stateMachine:NAME -> arn:...:execution:NAME:*
                return found.replace(":stateMachine:", ":execution:", 1) + ":*"
            return found
        return re.sub(r"(?<!\$)\{([^}]+)\}", value, template)  # ${aws:...} is IAM's to fill
    return fill


def _resource_arn(action: str, physical_id: str, region: str, account: str) -> str:
    """A stack resource's physical id as the ARN its action names (a function's name, a key's id)."""
    if physical_id.startswith("arn:"):
        return physical_id
    if action.startswith("lambda:"):
        return f"arn:aws:lambda:{region}:{account}:function:{physical_id}"
    if action.startswith("kms:"):
        return f"arn:aws:kms:{region}:{account}:key/{physical_id}"
    raise MissingStackValue(f"an ARN for {physical_id}")


def _sid(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]", "", text.title())


def _templates(call: Call, lifecycle_buckets: Sequence[str]) -> list[str]:
    """The call's resource template, once per lifecycle bucket where it names one ("*" with none)."""
    if LIFECYCLE_BUCKET not in call.resource:
        return [call.resource]
    return [call.resource.replace(LIFECYCLE_BUCKET, b) for b in lifecycle_buckets] or ["*"]


def operator_policy(stack_id: str, outputs: Mapping[str, str], parameters: Mapping[str, str],
                    resources: Mapping[str, str], lifecycle_buckets: Sequence[str] = (),
                    role: str = "operator") -> tuple[dict, list[str]]:
    """The policy document for the commands of one job (ROLES) on this stack, and the notes on what it
    leaves out.

    ``stack_id``: the stack's ARN (its region and account); ``resources``: logical id -> physical id;
    ``lifecycle_buckets``: the buckets of the cluster's lifecycle scripts, which doctor reads."""
    _, _, _, region, account, rest = stack_id.split(":", 5)
    stack = {"region": region, "account": account, "stack": rest.split("/")[1]}
    if parameters.get("ClusterArn"):
        stack["cluster-id"] = parameters["ClusterArn"].rsplit("/", 1)[-1]
    fill = _filler(stack, outputs, parameters, resources)
    statements: dict[str, dict[str, set[str]]] = {}  # Sid -> action -> resources
    conditions: dict[str, set[tuple[str, str, tuple[str, ...]]]] = {}  # action -> its conditions
    notes: list[str] = []
    for command in ROLES[role]:
        for call in COMMANDS[command]:
            for template in _templates(call, lifecycle_buckets):
                try:
                    resource = fill(template)
                    if template.startswith("{resource:"):
                        resource = _resource_arn(call.action, resource, region, account)
                    keys = tuple(fill(key) for key in call.leading_keys)
                    found = {(operator, key, tuple(fill(v) for v in values)) for operator, key, values in call.conditions}
                except MissingStackValue as missing:
                    why = CONDITIONAL_OUTPUTS.get(str(missing).removeprefix("output "))
                    notes.append(f"hpops {command}: {call.action} left out: "
                                 + (why if why else f"the stack has no {missing}"))
                    continue
                if keys:
                    found.add(("ForAllValues:StringLike", "dynamodb:LeadingKeys", keys))
                sid = (WILDCARD_REASONS[call.action] if resource == "*"
                       else _sid(call.action.split(":")[0]) + "OfTheStack")
                statements.setdefault(sid, {}).setdefault(call.action, set()).add(resource)
                conditions.setdefault(call.action, set()).update(found)
    if "doctor" in ROLES[role] and not lifecycle_buckets:
        notes.append("hpops doctor: s3:GetObject and s3:ListBucket on *: pass --lifecycle-bucket B (the bucket of "
                     "the cluster's LifeCycleConfig.SourceS3Uri) to name it")
    document: dict = {"Version": "2012-10-17", "Statement": []}
    for sid, actions in sorted(statements.items()):
        # One statement per distinct resource set and conditions: every action in it applies to every
        # resource in it, under the same conditions.
        groups: dict[tuple, list[str]] = {}
        for action, arns in actions.items():
            groups.setdefault((tuple(sorted(arns)), _condition_block(conditions.get(action, set()))), []).append(action)
        for number, ((arns, condition), names) in enumerate(sorted(groups.items(), key=lambda g: sorted(g[1]))):
            statement = {"Sid": sid if number == 0 else f"{sid}{number + 1}", "Effect": "Allow",
                         "Action": sorted(names), "Resource": list(arns) if len(arns) > 1 else arns[0]}
            if condition:
                statement["Condition"] = json.loads(condition)
            document["Statement"].append(statement)
    return document, notes


def _condition_block(found: set[tuple[str, str, tuple[str, ...]]]) -> str:
    """A statement's Condition as canonical JSON ("" for none): values of one key merged, sorted."""
    block: dict[str, dict[str, set[str]]] = {}
    for operator, key, values in found:
        block.setdefault(operator, {}).setdefault(key, set()).update(values)
    return json.dumps({operator: {key: sorted(values) if len(values) > 1 else next(iter(values))
                                  for key, values in sorted(keys.items())}
                       for operator, keys in sorted(block.items())}) if block else ""


def policy_characters(document: dict) -> int:
    """A policy's size as IAM counts it against its quotas: characters without whitespace."""
    return len("".join(json.dumps(document).split()))


def policy_json(document: dict) -> str:
    return json.dumps(document, indent=2)
