"""Every request of the twin's functions, state machines, rules and node agents passes IAM as template.yaml
grants it (hpops_twin/iam): a missing permission fails the twin as it would fail on AWS."""

import boto3
import pytest
from operator_policy import without_action

from hpops_twin.iam.enforce import acting_as
from hpops_twin.iam.evaluate import TwinIamError
from hpops_twin.world import TwinWorld


def without(principal: str, action: str):
    """A policy edit: `principal`'s policies with `action` taken out of every statement."""
    def edit(name: str, policies: dict) -> None:
        if name != principal:
            return
        for document in policies.values():
            without_action(document, action)
    return edit


def test_a_sync_passes_iam_under_each_callers_own_policy(synced_world):
    world = synced_world
    assert world.converged()
    assert world.iam.denials == [] and world.iam.errors == []
    covered = world.iam.principals_covered()
    assert {"function:ResolveLoginNodesFunction", "function:PlanTargetChangesFunction", "function:ApplyTargetChangesFunction",
            "statemachine:LoginNodeSyncStateMachine", "rule:LoginNodeSyncStateMachineSweep", "agent"} <= covered
    exercised = {(p, a) for p, a, _ in world.iam.exercised}
    assert ("statemachine:LoginNodeSyncStateMachine", "lambda:InvokeFunction") in exercised
    assert ("agent", "events:PutEvents") in exercised


def test_one_action_removed_fails_the_sync_with_access_denied_naming_function_action_and_resource():
    edit = without("function:ApplyTargetChangesFunction", "elasticloadbalancing:RegisterTargets")
    with TwinWorld(iam_policy_edit=edit) as world:
        result = world.wait([world.run_schedule()])[0]
        assert result.status == "FAILED"
        target_group = world.target_group_arn()
        (denial, *_) = world.iam.denials
        assert (denial.principal, denial.action, denial.resource) == (
            "function:ApplyTargetChangesFunction", "elasticloadbalancing:RegisterTargets", target_group)
        assert "AccessDenied" in str(denial) and "elasticloadbalancing:RegisterTargets" in (result.cause or "")
        assert world.target_ips() == []  # nothing registered: AWS would have refused the same call


def _apply_retry(world):
    """ApplyTargetChanges as Step Functions runs it on a retry (attempt 1) of a change set."""
    node_ip = world.sim.nodes(world.cluster_name, world.login_group)[0].ip
    return world.dispatcher.invoke(world.resolver.physical_ids["ApplyTargetChangesFunction"],
                                   {"register": [node_ip], "deregister": [], "attempt": 1})


def test_the_retry_of_a_half_applied_change_may_read_target_health(world):
    record = _apply_retry(world)
    assert record.error_type is None, record.error_message
    assert world.target_ips() == [world.sim.nodes(world.cluster_name, world.login_group)[0].ip]
    assert ("function:ApplyTargetChangesFunction", "elasticloadbalancing:DescribeTargetHealth", "*") in world.iam.exercised


def test_without_describe_target_health_the_retry_is_denied():
    edit = without("function:ApplyTargetChangesFunction", "elasticloadbalancing:DescribeTargetHealth")
    with TwinWorld(iam_policy_edit=edit) as world:
        record = _apply_retry(world)
        assert record.error_type is not None and "AccessDenied" in record.error_message
        assert [(d.action, d.resource) for d in world.iam.denials] == [("elasticloadbalancing:DescribeTargetHealth", "*")]
        assert world.target_ips() == []


def test_an_operation_the_mapping_does_not_know_is_an_error_of_the_twin(world):
    with acting_as("function:ResolveLoginNodesFunction"), pytest.raises(TwinIamError, match="sagemaker ListClusters"):
        boto3.client("sagemaker").list_clusters()
    assert world.iam.errors


def test_the_usage_recorder_may_not_write_the_sync_lease(world):
    """dynamodb:LeadingKeys: RecordUsageReport writes usage#<cluster> items only."""
    table = world.resolver.physical_ids["SyncStateTable"]
    ddb = boto3.client("dynamodb")
    lease = world.lease_item()
    with acting_as("function:RecordUsageReportFunction"):
        with pytest.raises(ddb.exceptions.ClientError, match="AccessDeniedException"):
            ddb.put_item(TableName=table, Item={"pk": {"S": f"cluster#{world.cluster_name}"}, "sk": {"S": "sync-lease"}})
        ddb.put_item(TableName=table, Item={"pk": {"S": f"usage#{world.cluster_name}"}, "sk": {"S": "status"}})
    assert world.lease_item() == lease


def test_functions_write_logs_only_to_the_stacks_log_group(synced_world):
    """SAM's AWSLambdaBasicExecutionRole grants logs on "*"; the functions' permissions boundary caps it."""
    from hpops_twin.iam.operations import Check

    iam, group_arn = synced_world.iam, synced_world.resolver.attributes[("FunctionsLogGroup", "Arn")]
    own = Check("logs:PutLogEvents", group_arn.removesuffix("*") + "log-stream:2026/11/24/[$LATEST]abc")
    other = Check("logs:PutLogEvents", "arn:aws:logs:us-east-1:123456789012:log-group:/aws/lambda/other:log-stream:x")
    assert iam.decide("function:ApplyTargetChangesFunction", own).allowed
    refused = iam.decide("function:ApplyTargetChangesFunction", other)
    assert not refused.allowed and "permissions boundary FunctionsPermissionsBoundary" in refused.reason
    assert any(action == "logs:PutLogEvents" for _, action, _ in iam.exercised)  # every invocation's log delivery


@pytest.mark.parametrize("function, own, other", [
    ("RecordNodeReportFunction", "node-report", "cluster"),  # a node's report never overwrites the lease
    ("EnforceSessionLimitsFunction", "session", "node-report"),  # the ledger writer cannot forge a report
    ("GateTargetChangesFunction", "notice", "session"),
])
def test_each_writer_of_the_state_table_writes_only_its_own_item_kind(world, function, own, other):
    """dynamodb:LeadingKeys: every item kind has a partition of its own (state_table.py)."""
    table = world.resolver.physical_ids["SyncStateTable"]
    ddb = boto3.client("dynamodb")
    with acting_as(f"function:{function}"):
        ddb.put_item(TableName=table, Item={"pk": {"S": f"{own}#{world.cluster_name}"}, "sk": {"S": "iam-check"}})
        with pytest.raises(ddb.exceptions.ClientError, match="AccessDeniedException"):
            ddb.put_item(TableName=table, Item={"pk": {"S": f"{other}#{world.cluster_name}"}, "sk": {"S": "iam-check"}})
    table_arn = world.resolver.attributes[("SyncStateTable", "Arn")]
    assert [(d.action, d.resource) for d in world.iam.denials] == [("dynamodb:PutItem", table_arn)]
