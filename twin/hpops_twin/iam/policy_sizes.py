"""The longest names a stack can have, for measuring its policies against IAM's size quotas: a 64-character
stack name, a 63-character cluster name, a 64-character role name, the longest region name, and every
physical name CloudFormation generates as <stack>-<LogicalId>-<13 characters> cut to its type's limit."""

from __future__ import annotations

from hpops.operator_permissions import COMMANDS, ROLES, operator_policy, policy_characters  # noqa: F401 (re-exported)

REGION = "ap-southeast-2"
ACCOUNT = "123456789012"
STACK = "hpops-" + "x" * 58  # 64 characters
CLUSTER = "c" * 63
CLUSTER_ID = "a1b2c3d4e5f6"
ROLE = "r" * 64
BUCKET = "sagemaker-lifecycle-" + "b" * 43  # 63 characters
MANAGED_POLICY_LIMIT = 6144


def generated(logical_id: str, limit: int) -> str:
    return f"{STACK}-{logical_id}-ABCDEFGHIJKLM"[:limit]


def longest_stack() -> tuple[str, dict, dict, dict]:
    """(stack id, outputs, parameters, resources) of the longest-named stack."""
    stack_id = f"arn:aws:cloudformation:{REGION}:{ACCOUNT}:stack/{STACK}/0f1e2d3c-aaaa-bbbb-cccc-000011112222"
    states = f"arn:aws:states:{REGION}:{ACCOUNT}:stateMachine:"
    outputs = {
        "SyncStateTableName": generated("SyncStateTable", 255),
        "LoginNodeSyncStateMachineArn": states + generated("LoginNodeSyncStateMachine", 80),
        "SessionLimitsStateMachineArn": states + generated("SessionLimitsStateMachine", 80),
        "BudgetGuardStateMachineArn": states + generated("BudgetGuardStateMachine", 80),
        "UserSpendAlertTopicArn": f"arn:aws:sns:{REGION}:{ACCOUNT}:" + generated("UserSpendAlertTopic", 256),
        "AlertTopicArn": f"arn:aws:sns:{REGION}:{ACCOUNT}:" + generated("AlertTopic", 256),
        "HostIdentitySecretArn": f"arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:"
                                 + generated("HostIdentitySecret", 512) + "-AbCdEf",
        "HostCertificateAuthoritySecretArn": f"arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:"
                                             + generated("HostCertificateAuthoritySecret", 512) + "-AbCdEf",
    }
    parameters = {"ClusterName": CLUSTER, "ClusterArn": f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:cluster/{CLUSTER_ID}",
                  "ClusterExecutionRoleName": ROLE}
    resources = {"CheckUserSpendFunction": generated("CheckUserSpendFunction", 64),
                 "HostIdentityKey": "0f1e2d3c-1111-2222-3333-444455556666"}
    return stack_id, outputs, parameters, resources


def operator_policies() -> dict[str, dict]:
    """Each job's policy for the longest-named stack, every output present, doctor's bucket named."""
    stack_id, outputs, parameters, resources = longest_stack()
    found = {}
    for role in ROLES:
        document, notes = operator_policy(stack_id, outputs, parameters, resources, [BUCKET], role=role)
        assert not notes, notes  # nothing left out: the measure is of the whole policy
        found[f"hpops iam-policy --role {role}"] = document
    assert {c for names in ROLES.values() for c in names} == set(COMMANDS)
    return found

