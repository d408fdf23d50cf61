"""The budget guard's DynamoDB state against moto: retry-safe alert marks, ordered last-seen state."""

import datetime as dt

import boto3
import pytest
from moto import mock_aws

from hpops_core.budget_guard.alert_state import mark_fired
from hpops_core.budget_guard.cluster_state import load_last_seen, save_last_seen

NOW = dt.datetime(2026, 11, 10, 12, tzinfo=dt.timezone.utc)
STATE = {"ClusterStatus": "InService", "InstanceGroups": [
    {"InstanceGroupName": "gpu", "InstanceType": "ml.p5.48xlarge", "CurrentCount": 8, "TargetCount": 8}]}


@pytest.fixture
def table(monkeypatch):
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    with mock_aws():
        yield boto3.resource("dynamodb", region_name="us-east-1").create_table(
            TableName="state",
            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
            AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"},
                                  {"AttributeName": "sk", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )


def test_a_retried_task_wins_its_own_alert_again_but_nobody_else_does(table):
    key = "2026-11:projected:100"
    assert mark_fired(table, "lab", key, NOW, owner="exec-1") is True
    assert mark_fired(table, "lab", key, NOW, owner="exec-1") is True, "the same execution, retried"
    assert mark_fired(table, "lab", key, NOW, owner="exec-2") is False
    assert mark_fired(table, "lab", key, NOW) is False
    item = table.get_item(Key={"pk": "budget#lab", "sk": key})["Item"]
    assert item["fired_by"] == "exec-1" and "ttl" in item


def test_last_seen_round_trips_with_int_counts(table):
    assert load_last_seen(table, "lab") is None
    assert save_last_seen(table, "lab", STATE, NOW) is True
    loaded = load_last_seen(table, "lab")
    assert loaded == STATE and type(loaded["InstanceGroups"][0]["TargetCount"]) is int


def test_an_older_state_never_replaces_a_newer_one(table):
    newer = {**STATE, "InstanceGroups": [{**STATE["InstanceGroups"][0], "TargetCount": 16}]}
    assert save_last_seen(table, "lab", newer, NOW) is True
    assert save_last_seen(table, "lab", STATE, NOW - dt.timedelta(minutes=1)) is False, "late, older event"
    assert load_last_seen(table, "lab") == newer
    assert save_last_seen(table, "lab", STATE, NOW + dt.timedelta(minutes=1)) is True
