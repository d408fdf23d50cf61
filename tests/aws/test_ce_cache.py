"""Cost Explorer's answer kept in the state table (moto DynamoDB): one request a day serves 24 sweeps.

Cost Explorer is a counting fake that answers like the API (grouped by usage type), so each test
can say how many $0.01 requests a run of sweeps made.
"""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal as D

import boto3
import pytest
from moto import mock_aws

from hpops_core.budget_guard.ce_cache import (
    SORT_KEY,
    TICK_SLACK,
    UNREADABLE,
    billed_month_cached,
    cache_key,
    kept_answer,
    query_of,
)
from hpops_core.budget_guard.config import UserSpendConfig
from hpops_core.budget_guard.pricing import billed_request
from hpops_core.common import clients
from hpops_core.common.errors import ConfigurationError

UTC = dt.timezone.utc
TABLE, CLUSTER = "state", "lab"
NOV_22 = dt.datetime(2026, 11, 22, 0, 5, tzinfo=UTC)


class CountingCostExplorer:
    """GetCostAndUsage: ml.p5.48xlarge 10 h for $982.40 and $12.50 of volumes, whatever is asked."""

    def __init__(self) -> None:
        self.requests: list[dict] = []

    def get_cost_and_usage(self, **request):
        self.requests.append(request)
        groups = [{"Keys": ["USE1-Cluster:ml.p5.48xlarge"],
                   "Metrics": {"UnblendedCost": {"Amount": "982.40", "Unit": "USD"},
                               "UsageQuantity": {"Amount": "10", "Unit": "Hrs"}}},
                  {"Keys": ["USE1-Cluster:VolumeUsage.gp2"],
                   "Metrics": {"UnblendedCost": {"Amount": "12.50", "Unit": "USD"},
                               "UsageQuantity": {"Amount": "1", "Unit": "N/A"}}}]
        return {"ResultsByTime": [{"TimePeriod": request["TimePeriod"], "Groups": groups}]}


@pytest.fixture
def dynamodb(monkeypatch):
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    with mock_aws():
        clients.reset_clients()
        client = boto3.client("dynamodb")
        client.create_table(  # template.yaml's SyncStateTable keys
            TableName=TABLE,
            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
            AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"},
                                  {"AttributeName": "sk", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        yield client
        clients.reset_clients()


@pytest.fixture
def ce():
    return CountingCostExplorer()


def billed(ce, now, max_age=24, **options):
    return billed_month_cached(ce, TABLE, CLUSTER, now, max_age, **options)


def kept_item(dynamodb):
    return dynamodb.get_item(TableName=TABLE, Key={"pk": {"S": cache_key(CLUSTER)}, "sk": {"S": SORT_KEY}}).get("Item")


def test_the_first_sweep_of_the_day_asks_and_the_next_23_reuse_its_answer(dynamodb, ce):
    outcomes = [billed(ce, NOV_22 + dt.timedelta(hours=h))[1] for h in range(24)]
    assert len(ce.requests) == 1
    assert [o.source for o in outcomes] == ["cost-explorer"] + ["cache"] * 23
    assert outcomes[0].reason == "no kept answer yet"
    assert outcomes[23].reason == "kept answer fetched at 2026-11-22T00:05:00Z, 23.0 h old (max 24 h)"
    # The 25th hourly sweep, 24 h after the request: a new day's answer.
    month, outcome = billed(ce, NOV_22 + dt.timedelta(hours=24))
    assert len(ce.requests) == 2 and outcome.source == "cost-explorer"
    assert "24.0 h old (max 24 h)" in outcome.reason
    assert (month.start, month.end, month.fetched_at) == ("2026-11-01", "2026-11-23", "2026-11-23T00:05:00Z")


def test_a_kept_answer_gives_the_same_bill_and_says_when_it_was_asked(dynamodb, ce):
    fetched, _ = billed(ce, NOV_22)
    kept, outcome = billed(ce, NOV_22 + dt.timedelta(hours=5))
    assert kept == fetched and outcome.fetched_at == kept.fetched_at == "2026-11-22T00:05:00Z"
    assert kept.by_instance_type["ml.p5.48xlarge"].cost_usd == D("982.40")
    assert kept.by_instance_type["ml.p5.48xlarge"].hours == D("10")
    assert kept.total_usd == D("994.90")
    # The kept answer covers the days it was asked about; the spend report estimates the hours after them.
    assert (kept.start, kept.end) == ("2026-11-01", "2026-11-22")
    item = kept_item(dynamodb)
    assert json.loads(item["query"]["S"])["TimePeriod"] == {"Start": "2026-11-01"}
    assert int(item["ttl"]["N"]) > NOV_22.timestamp()


def test_a_shorter_max_age_asks_again_sooner(dynamodb, ce):
    for hour in range(13):
        billed(ce, NOV_22 + dt.timedelta(hours=hour), max_age=6)
    assert len(ce.requests) == 3  # at 0, 6 and 12 h


def test_a_sweep_a_few_seconds_early_still_refreshes(dynamodb, ce):
    billed(ce, NOV_22)
    billed(ce, NOV_22 + dt.timedelta(hours=24) - TICK_SLACK + dt.timedelta(seconds=1))
    assert len(ce.requests) == 2


def test_the_month_turning_asks_for_the_new_month(dynamodb, ce):
    billed(ce, dt.datetime(2026, 11, 30, 22, 0, tzinfo=UTC))
    month, outcome = billed(ce, dt.datetime(2026, 12, 1, 5, 0, tzinfo=UTC))
    assert (outcome.source, month.total_usd, len(ce.requests)) == ("none", 0, 1)  # the 1st: no complete day
    month, outcome = billed(ce, dt.datetime(2026, 12, 2, 0, 5, tzinfo=UTC))
    assert outcome.reason == "the kept answer is for another month"
    assert (month.start, month.end, len(ce.requests)) == ("2026-12-01", "2026-12-02", 2)


def test_another_request_is_not_answered_from_the_kept_one(dynamodb, ce):
    billed(ce, NOV_22)
    item = kept_item(dynamodb)
    query = json.loads(item["query"]["S"])
    query["Filter"]["Tags"]["Values"] = ["another-cluster"]
    item["query"]["S"] = json.dumps(query)
    dynamodb.put_item(TableName=TABLE, Item=item)
    _, outcome = billed(ce, NOV_22 + dt.timedelta(hours=1))
    assert outcome.source == "cost-explorer" and "another request" in outcome.reason
    assert len(ce.requests) == 2


@pytest.mark.parametrize("damage", [
    lambda item: item.pop("result"),
    lambda item: item.update(result={"S": "{not json"}),
    lambda item: item.update(result={"S": json.dumps({"start": "2026-11-01", "end": "2026-11-22", "otherUsd": "NaN",
                                                      "byType": {}})}),
    lambda item: item.update(fetchedAt={"S": "yesterday"}),
    lambda item: item.update(fetchedAt={"N": "1"}),
])
def test_a_kept_answer_that_cannot_be_read_is_named_and_asked_again(dynamodb, ce, damage):
    billed(ce, NOV_22)
    item = kept_item(dynamodb)
    damage(item)
    dynamodb.put_item(TableName=TABLE, Item=item)
    month, outcome = billed(ce, NOV_22 + dt.timedelta(hours=1))
    assert (outcome.source, outcome.problem) == ("cost-explorer", UNREADABLE)
    assert outcome.reason.startswith("the kept answer cannot be read")
    assert month.total_usd == D("994.90") and len(ce.requests) == 2
    # Replaced by the new answer, so the next sweep reads it again.
    assert billed(ce, NOV_22 + dt.timedelta(hours=2))[1].source == "cache"


def test_of_two_concurrent_fetches_the_later_answer_stays(dynamodb, ce):
    later = NOV_22 + dt.timedelta(minutes=2)
    billed(ce, later, fresh=True)
    # A sweep that asked earlier finishes last: its answer serves it once and is not kept.
    month, outcome = billed(ce, NOV_22, fresh=True)
    assert month.fetched_at == "2026-11-22T00:05:00Z"
    assert outcome.reason.endswith("a newer answer is kept already, so this one is used once and not kept")
    assert kept_item(dynamodb)["fetchedAt"]["S"] == "2026-11-22T00:07:00Z"


def test_an_answer_kept_after_now_is_not_used(dynamodb, ce):
    billed(ce, NOV_22 + dt.timedelta(hours=3))
    _, outcome = billed(ce, NOV_22)
    assert outcome.source == "cost-explorer" and "after now" in outcome.reason


def test_fresh_asks_whatever_is_kept_and_keep_false_writes_nothing(dynamodb, ce):
    billed(ce, NOV_22, keep=False)
    assert kept_item(dynamodb) is None
    billed(ce, NOV_22)
    _, outcome = billed(ce, NOV_22 + dt.timedelta(hours=1), fresh=True)
    assert (outcome.source, outcome.reason, len(ce.requests)) == ("cost-explorer", "a fresh answer was asked for", 3)


def test_the_kept_query_leaves_out_only_the_moving_end():
    request = billed_request(CLUSTER, NOV_22)
    later = billed_request(CLUSTER, NOV_22 + dt.timedelta(days=3))
    assert request["TimePeriod"]["End"] != later["TimePeriod"]["End"]
    assert query_of(request) == query_of(later)
    assert kept_answer(None, query_of(request), NOV_22, dt.timedelta(hours=24)) == (None, "no kept answer yet", None)


@pytest.mark.parametrize("raw, hours", [("", 24), ("1", 1), ("24", 24)])
def test_the_max_age_is_read_from_the_environment(raw, hours):
    env = {"CLUSTER_NAME": CLUSTER, "STATE_TABLE_NAME": TABLE, "PROJECTION_THRESHOLDS_PERCENT": "80",
           "USER_THRESHOLDS_PERCENT": "80", "AWS_REGION": "us-east-1", "COST_EXPLORER_MAX_AGE_HOURS": raw}
    assert UserSpendConfig.from_env(env).ce_max_age_hours == hours


@pytest.mark.parametrize("raw", ["0", "25", "1.5", "day"])
def test_a_max_age_outside_1_to_24_hours_is_a_configuration_error(raw):
    env = {"CLUSTER_NAME": CLUSTER, "STATE_TABLE_NAME": TABLE, "PROJECTION_THRESHOLDS_PERCENT": "80",
           "USER_THRESHOLDS_PERCENT": "80", "AWS_REGION": "us-east-1", "COST_EXPLORER_MAX_AGE_HOURS": raw}
    with pytest.raises(ConfigurationError, match="COST_EXPLORER_MAX_AGE_HOURS"):
        UserSpendConfig.from_env(env)


def test_a_fresh_answer_replaces_a_kept_item_whose_time_is_not_text(dynamodb, ce):
    billed(ce, NOV_22)
    item = kept_item(dynamodb)
    item["fetchedAt"] = {"N": "99999999999"}
    dynamodb.put_item(TableName=TABLE, Item=item)
    billed(ce, NOV_22 + dt.timedelta(hours=1), fresh=True)
    assert kept_item(dynamodb)["fetchedAt"] == {"S": "2026-11-22T01:05:00Z"}
