"""Budget guard inputs without AWS: the rate overrides, each function's config, the trigger parser."""

import datetime as dt
from decimal import Decimal

import pytest

from hpops_core.budget_guard import BudgetGuardError
from hpops_core.budget_guard.config import (
    AlertConfig,
    EnsureBudgetsConfig,
    ProjectionConfig,
    TriggerConfig,
    UsageReportConfig,
    UserAlertConfig,
    UserSpendConfig,
)
from hpops_core.budget_guard.rate_overrides import InvalidRateOverrides, rate_overrides
from hpops_core.budget_guard.trigger import observed_from_describe, parse_budget_input
from hpops_core.common.errors import ConfigurationError, MalformedEventError, UnknownClusterError
from hpops_core.common.requests import step_field

ARN = "arn:aws:sagemaker:us-east-1:123456789012:cluster/abcdef012345"
ENV = {
    "CLUSTER_NAME": "ml-research",
    "CLUSTER_ARN": ARN,
    "ACCOUNT_ID": "123456789012",
    "ALERT_TOPIC_ARN": "arn:aws:sns:us-east-1:123456789012:alerts",
    "STATE_TABLE_NAME": "state",
    "MONTHLY_BUDGET_USD": "",
    "USER_MONTHLY_BUDGET_USD": "500",
    "USER_BUDGET_OVERRIDES": "alice=2000,j.doe=250.50",
    "USER_THRESHOLDS_PERCENT": "80,100",
    "CONTROLLER_GROUP_NAME": "controller-machine",
    "USER_ALERT_TOPIC_ARN": "arn:aws:sns:us-east-1:123456789012:user-spend",
    "DELETE_BUDGETS_WITH_CLUSTER": "false",
    "PROJECTION_THRESHOLDS_PERCENT": "100,80",
    "RATE_OVERRIDES_JSON": "{}",
    "AWS_REGION": "us-east-1",
}


def event(**detail):
    return {
        "version": "0", "id": "e-1", "detail-type": "SageMaker HyperPod Cluster State Change",
        "source": "aws.sagemaker", "account": "123456789012", "time": "2026-11-10T12:00:00Z",
        "region": "us-east-1", "resources": [ARN],
        "detail": {"ClusterArn": ARN, "ClusterName": "ml-research", "ClusterStatus": "Updating",
                   "InstanceGroups": [{"InstanceGroupName": "gpu", "InstanceType": "ml.p5.48xlarge",
                                       "CurrentCount": 8, "TargetCount": 16, "ExecutionRole": "x"}]} | detail,
    }


# --------------------------------------------------------------------------- rate overrides


def test_overrides_are_exactly_what_the_operator_wrote_as_decimals():
    rates = rate_overrides('{"ml.p5.48xlarge": 55.04, "ml.p6-b200.48xlarge": "113.93", "ml.t3.medium": 0}')
    assert rates == {"ml.p5.48xlarge": Decimal("55.04"), "ml.p6-b200.48xlarge": Decimal("113.93"),
                     "ml.t3.medium": Decimal(0)}
    assert all(type(v) is Decimal for v in rates.values()), "never float"
    # No built-in table any more: nothing configured means no override at all.
    assert rate_overrides("") == {} == rate_overrides("{}") == rate_overrides(None) == rate_overrides("  ")


@pytest.mark.parametrize("text, says", [
    ("{", "not valid JSON"),
    ("[]", "JSON object"),
    ('{"p5": 1}', "not a SageMaker instance type"),
    ('{"ml.p5.48xlarge": -1}', "non-negative"),
    ('{"ml.p5.48xlarge": true}', "must be a number"),
    ('{"ml.p5.48xlarge": "NaN"}', "non-negative"),
    ('{"ml.p5.48xlarge": "Infinity"}', "non-negative"),
    ('{"ml.p5.48xlarge": null}', "non-negative"),
    ('{"ml.p5.48xlarge": "cheap"}', "non-negative"),
    ('{"ml.p5.48xlarge": [1]}', "non-negative"),
    ("{" + ",".join(f'"ml.t{i}.large": 1' for i in range(201)) + "}", "at most 200"),
])
def test_bad_overrides_are_refused_with_a_named_error(text, says):
    with pytest.raises(InvalidRateOverrides, match=says) as error:
        rate_overrides(text)
    assert isinstance(error.value, BudgetGuardError)


# --------------------------------------------------------------------------- config


def test_each_function_reads_only_what_it_needs():
    ensure = EnsureBudgetsConfig.from_env(ENV)
    assert ensure.default_limit is None and ensure.delete_with_cluster is False
    projection = ProjectionConfig.from_env(ENV)
    assert projection.thresholds == (Decimal(80), Decimal(100))
    assert projection.region == "us-east-1" and projection.rate_overrides == {}
    overridden = ProjectionConfig.from_env(ENV | {"RATE_OVERRIDES_JSON": '{"ml.p6-b200.48xlarge": "113.93"}'})
    assert overridden.rate_overrides == {"ml.p6-b200.48xlarge": Decimal("113.93")}
    assert AlertConfig.from_env(ENV).event_bus == "default"
    assert TriggerConfig.from_env({"CLUSTER_NAME": "ml-research"}).cluster_name == "ml-research"
    spend = UserSpendConfig.from_env(ENV)
    assert spend.limits.of("alice") == (Decimal("2000"), "override")
    assert spend.limits.of("j.doe") == (Decimal("250.50"), "override")
    assert spend.limits.of("bob") == (Decimal("500"), "default")
    assert spend.thresholds == (Decimal(80), Decimal(100))
    assert UserSpendConfig.from_env(ENV | {"USER_MONTHLY_BUDGET_USD": ""}).limits.of("bob") == (None, None)
    assert UsageReportConfig.from_env(ENV).controller_group == "controller-machine"
    assert UserAlertConfig.from_env(ENV).user_topic_arn.endswith(":user-spend")


@pytest.mark.parametrize(
    "cls, name, value",
    [
        (EnsureBudgetsConfig, "ACCOUNT_ID", "12345"),
        (EnsureBudgetsConfig, "MONTHLY_BUDGET_USD", "1e6"),
        (UserSpendConfig, "USER_BUDGET_OVERRIDES", "alice=500,Bob;rm=1"),
        (UserSpendConfig, "USER_BUDGET_OVERRIDES", "alice"),
        (UserSpendConfig, "USER_BUDGET_OVERRIDES", "alice=-5"),
        (UserSpendConfig, "USER_THRESHOLDS_PERCENT", "80,lots"),
        (UsageReportConfig, "CONTROLLER_GROUP_NAME", "controller;rm"),
        (EnsureBudgetsConfig, "DELETE_BUDGETS_WITH_CLUSTER", "yes"),
        (ProjectionConfig, "PROJECTION_THRESHOLDS_PERCENT", "80,lots"),
        (ProjectionConfig, "PROJECTION_THRESHOLDS_PERCENT", "0"),
        (ProjectionConfig, "RATE_OVERRIDES_JSON", "{bad"),
        (ProjectionConfig, "RATE_OVERRIDES_JSON", '{"ml.p5.48xlarge": "cheap"}'),
        (ProjectionConfig, "AWS_REGION", ""),
        (ProjectionConfig, "AWS_REGION", "us-east-1; rm"),
        (AlertConfig, "ALERT_TOPIC_ARN", ""),
    ],
)
def test_bad_configuration_names_the_variable(cls, name, value):
    with pytest.raises(ConfigurationError, match=name):
        cls.from_env(ENV | {name: value})


# --------------------------------------------------------------------------- trigger


def test_a_state_change_event_gives_its_time_and_compact_state():
    request = parse_budget_input(event(), "2026-11-22T03:00:00Z", "ml-research")
    assert request.mode == "event" and request.event_id == "e-1"
    assert request.now == dt.datetime(2026, 11, 10, 12, tzinfo=dt.timezone.utc), "now is the event's time"
    assert request.observed == {"ClusterStatus": "Updating", "InstanceGroups": [
        {"InstanceGroupName": "gpu", "InstanceType": "ml.p5.48xlarge", "CurrentCount": 8, "TargetCount": 16}]}
    assert request.trigger == "cluster state Updating (gpu 8/16)"


def test_a_cluster_status_aws_adds_later_is_accepted_as_data():
    # SystemUpdating arrived after the first releases; the next new status must not fail the guard.
    request = parse_budget_input(event(ClusterStatus="Maintaining"), "2026-11-22T03:00:00Z", "ml-research")
    assert request.observed["ClusterStatus"] == "Maintaining"
    assert request.trigger.startswith("cluster state Maintaining")


def test_a_sweep_uses_the_execution_start_time():
    request = parse_budget_input({"cluster": "ml-research", "mode": "sweep"}, "2026-11-22T03:10:47.123Z", "ml-research")
    assert request.mode == "sweep" and request.observed is None
    assert request.now == dt.datetime(2026, 11, 22, 3, 10, 47, 123000, tzinfo=dt.timezone.utc)


@pytest.mark.parametrize(
    "raw, start, error",
    [
        ("text", "2026-11-22T03:00:00Z", MalformedEventError),
        ({"cluster": "ml-research", "mode": "sweep"}, None, MalformedEventError),
        ({"cluster": "ml-research", "mode": "sweep"}, "yesterday", MalformedEventError),
        ({"cluster": "ml-research", "mode": "repair"}, "2026-11-22T03:00:00Z", MalformedEventError),
        (event(ClusterStatus="Exploding; rm -rf /"), None, MalformedEventError),
        (event(ClusterStatus=["InService"]), None, MalformedEventError),
        (event(time=None) | {"time": "2026-11-10T12:00:00"}, None, MalformedEventError),
        (event() | {"detail-type": "SageMaker HyperPod Cluster Event"}, None, MalformedEventError),
        (event(ClusterName="other-cluster"), None, UnknownClusterError),
        ({"cluster": "other", "mode": "sweep"}, "2026-11-22T03:00:00Z", UnknownClusterError),
    ],
)
def test_anything_else_is_a_named_error(raw, start, error):
    with pytest.raises(error):
        parse_budget_input(raw, start, "ml-research")


def test_describe_cluster_gives_the_same_compact_state():
    described = {"ClusterStatus": "InService", "ClusterName": "ml-research", "InstanceGroups": [
        {"InstanceGroupName": "gpu", "InstanceType": "ml.p5.48xlarge", "CurrentCount": 8, "TargetCount": 8,
         "LifeCycleConfig": {}}]}
    assert observed_from_describe(described) == {"ClusterStatus": "InService", "InstanceGroups": [
        {"InstanceGroupName": "gpu", "InstanceType": "ml.p5.48xlarge", "CurrentCount": 8, "TargetCount": 8}]}


@pytest.mark.parametrize("event, key, kind, may_be_empty", [
    (None, "request", dict, False), ([], "request", dict, False), ({}, "request", dict, False),
    ({"request": "x"}, "request", dict, False), ({"request": {}}, "request", dict, False),
    ({"owner": ""}, "owner", str, False), ({"owner": 7}, "owner", str, False), ({"cluster": []}, "cluster", dict, True),
])
def test_a_step_input_without_its_field_is_a_named_error_naming_step_and_field(event, key, kind, may_be_empty):
    with pytest.raises(MalformedEventError, match=f"user spend step input needs .*'{key}'"):
        step_field(event, key, "user spend", kind, may_be_empty)


def test_a_step_input_field_is_returned_as_it_is():
    assert step_field({"request": {"cluster": "c"}}, "request", "budget guard") == {"cluster": "c"}
    assert step_field({"cluster": {}}, "cluster", "budget guard", may_be_empty=True) == {}
    assert step_field({"owner": "exec-1"}, "owner", "user spend", str) == "exec-1"
