"""Budget guard inputs without AWS: the price table, each function's config, the trigger parser."""

import datetime as dt
from decimal import Decimal

import pytest

from hpops_core.budget_guard.config import AlertConfig, EnsureBudgetsConfig, ProjectionConfig, TriggerConfig
from hpops_core.budget_guard.prices import DEFAULT_HOURLY_PRICES_USD, InvalidPriceTable, hourly_prices
from hpops_core.budget_guard.trigger import observed_from_describe, parse_budget_input
from hpops_core.common.errors import ConfigurationError, MalformedEventError, UnknownClusterError

ARN = "arn:aws:sagemaker:us-east-1:123456789012:cluster/abcdef012345"
ENV = {
    "CLUSTER_NAME": "ml-research",
    "CLUSTER_ARN": ARN,
    "ACCOUNT_ID": "123456789012",
    "ALERT_TOPIC_ARN": "arn:aws:sns:us-east-1:123456789012:alerts",
    "STATE_TABLE_NAME": "state",
    "MONTHLY_BUDGET_USD": "",
    "BUDGET_USERS": "alice, bob,alice",
    "USER_MONTHLY_BUDGET_USD": "500",
    "BUDGET_USER_TAG_KEY": "hpops:user",
    "DELETE_BUDGETS_WITH_CLUSTER": "false",
    "PROJECTION_THRESHOLDS_PERCENT": "100,80",
    "HOURLY_PRICES_JSON": "{}",
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


# --------------------------------------------------------------------------- prices


def test_override_extends_and_replaces_the_default_table_with_decimals():
    prices = hourly_prices('{"ml.p5.48xlarge": 55.04, "ml.p6-b200.48xlarge": "113.93"}')
    assert prices["ml.p5.48xlarge"] == Decimal("55.04") and isinstance(prices["ml.p5.48xlarge"], Decimal)
    assert prices["ml.p6-b200.48xlarge"] == Decimal("113.93")
    assert prices["ml.m5.4xlarge"] == DEFAULT_HOURLY_PRICES_USD["ml.m5.4xlarge"]
    assert hourly_prices("") == dict(DEFAULT_HOURLY_PRICES_USD) == hourly_prices("{}")


@pytest.mark.parametrize("text", ["{", "[]", '{"p5": 1}', '{"ml.p5.48xlarge": -1}', '{"ml.p5.48xlarge": true}',
                                  '{"ml.p5.48xlarge": "NaN"}', '{"ml.p5.48xlarge": null}'])
def test_a_bad_price_table_is_refused(text):
    with pytest.raises(InvalidPriceTable):
        hourly_prices(text)


# --------------------------------------------------------------------------- config


def test_each_function_reads_only_what_it_needs():
    ensure = EnsureBudgetsConfig.from_env(ENV)
    assert ensure.users == ("alice", "bob") and ensure.user_limit == Decimal("500")
    assert ensure.default_limit is None and ensure.delete_with_cluster is False
    projection = ProjectionConfig.from_env(ENV)
    assert projection.thresholds == (Decimal(80), Decimal(100))
    assert AlertConfig.from_env(ENV).event_bus == "default"
    assert TriggerConfig.from_env({"CLUSTER_NAME": "ml-research"}).cluster_name == "ml-research"


@pytest.mark.parametrize(
    "cls, name, value",
    [
        (EnsureBudgetsConfig, "ACCOUNT_ID", "12345"),
        (EnsureBudgetsConfig, "MONTHLY_BUDGET_USD", "1e6"),
        (EnsureBudgetsConfig, "BUDGET_USERS", "alice,Bob;rm"),
        (EnsureBudgetsConfig, "DELETE_BUDGETS_WITH_CLUSTER", "yes"),
        (EnsureBudgetsConfig, "BUDGET_USER_TAG_KEY", "aws:reserved"),
        (ProjectionConfig, "PROJECTION_THRESHOLDS_PERCENT", "80,lots"),
        (ProjectionConfig, "PROJECTION_THRESHOLDS_PERCENT", "0"),
        (ProjectionConfig, "HOURLY_PRICES_JSON", "{bad"),
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
