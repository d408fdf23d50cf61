"""Budget guardrails against moto (Budgets, Cost Explorer, DynamoDB).

What moto 5.2.1 does here (checked in moto/budgets, moto/ce):
- Budgets stores the Budget dict verbatim, so FilterExpression and Metrics round-trip;
  it also injects default CostTypes on describe (real AWS may not with Metrics).
- Budgets has no UpdateBudget (NotImplementedError), so the update path is tested
  with botocore's Stubber, which still validates the request against the real API model.
- Cost Explorer returns nothing unless results are queued through
  POST /moto-api/static/ce/cost-and-usage-results; it does not validate or filter requests.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal as D

import boto3
import pytest
import requests
from botocore.exceptions import ClientError
from botocore.stub import Stubber
from moto import mock_aws

from hpops_core.budget_guard.alert_state import TTL_ATTRIBUTE, fired_keys, mark_fired
from hpops_core.budget_guard.aws_budgets import (
    AccountMismatch,
    UnexpectedCurrency,
    budgets_client,
    ce_client,
    delete_budget,
    ensure_budget,
    month_to_date_cost,
    month_to_date_costs_by_cluster,
)
from hpops_core.budget_guard.budget_spec import desired_budget
from hpops_core.budget_guard.config import EnsureBudgetsConfig
from hpops_core.budget_guard.guard import ensure_budgets
from hpops_core.budget_guard.pricing import pricing_client, rates_for
from hpops_core.budget_guard.projection import (
    NaiveDatetimeError,
    decide_alerts,
    groups_from_detail,
    project_month_end,
    scale_out_groups,
)

ACCOUNT = "123456789012"  # moto's default account
TOPIC = f"arn:aws:sns:us-east-1:{ACCOUNT}:hpops-budget"
UTC = dt.timezone.utc
NOW = dt.datetime(2026, 11, 28, 0, 0, tzinfo=UTC)
CE_RESULTS_URL = "http://motoapi.amazonaws.com/moto-api/static/ce/cost-and-usage-results"


@pytest.fixture(autouse=True)
def aws_env(monkeypatch):
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    with mock_aws():
        yield


def _all_budgets(client):
    return client.describe_budgets(AccountId=ACCOUNT).get("Budgets", [])


# --------------------------------------------------------------------------- budgets


def test_ensure_creates_once_then_is_a_no_op():
    client = budgets_client()
    spec = desired_budget("lab-a", D("1500"), TOPIC, ACCOUNT)

    first = ensure_budget(client, ACCOUNT, spec)
    second = ensure_budget(client, ACCOUNT, spec)

    assert (first.action, first.budget_name) == ("created", "hpops-lab-a")
    assert second.action == "unchanged"
    assert [b["BudgetName"] for b in _all_budgets(client)] == ["hpops-lab-a"]

    stored = client.describe_budget(AccountId=ACCOUNT, BudgetName="hpops-lab-a")["Budget"]
    assert D(stored["BudgetLimit"]["Amount"]) == D("1500")
    assert stored["TimeUnit"] == "MONTHLY" and stored["BudgetType"] == "COST"
    # moto stores the request verbatim, so the tag filter round-trips.
    assert stored["FilterExpression"] == {
        "Tags": {"Key": "ClusterName", "Values": ["lab-a"], "MatchOptions": ["EQUALS"]}
    }
    assert stored["Metrics"] == ["UnblendedCost"]
    assert "CostFilters" not in stored

    notes = client.describe_notifications_for_budget(AccountId=ACCOUNT, BudgetName="hpops-lab-a")
    assert sorted(
        (n["NotificationType"], n["Threshold"], n["ComparisonOperator"], n["ThresholdType"])
        for n in notes["Notifications"]
    ) == [
        ("ACTUAL", 50.0, "GREATER_THAN", "PERCENTAGE"),
        ("ACTUAL", 80.0, "GREATER_THAN", "PERCENTAGE"),
        ("ACTUAL", 100.0, "GREATER_THAN", "PERCENTAGE"),
        ("FORECASTED", 100.0, "GREATER_THAN", "PERCENTAGE"),
    ]


def _old_user_budget(client, name: str, cluster: str, user: str) -> None:
    """A per-user budget as earlier versions made it: cluster tag AND user tag."""
    spec = desired_budget(cluster, D("100"), TOPIC, ACCOUNT)
    spec["Budget"]["BudgetName"] = name
    spec["Budget"]["FilterExpression"] = {"And": [
        {"Tags": {"Key": "ClusterName", "Values": [cluster], "MatchOptions": ["EQUALS"]}},
        {"Tags": {"Key": "hpops:user", "Values": [user], "MatchOptions": ["EQUALS"]}},
    ]}
    client.create_budget(**spec)


class ClusterTags:
    """ListTags of a cluster tagged ClusterName=lab (moto's ListTags fails on a cluster ARN it did not create)."""

    def list_tags(self, ResourceArn):
        return {"Tags": [{"Key": "ClusterName", "Value": "lab"}]}


def test_ensure_budgets_removes_the_per_user_budgets_earlier_versions_made():
    client = budgets_client()
    sagemaker = ClusterTags()
    _old_user_budget(client, "hpops-lab-u-alice", "lab", "alice")
    _old_user_budget(client, "hpops-lab-u-bob", "lab", "bob")
    # Not ours to delete: the cluster budget of a cluster called "lab-u-gpu" (its name has our
    # prefix, its filter is its own cluster tag alone), and a budget someone made by hand.
    ensure_budget(client, ACCOUNT, desired_budget("lab-u-gpu", D("900"), TOPIC, ACCOUNT))
    ensure_budget(client, ACCOUNT, desired_budget("other", D("50"), TOPIC, ACCOUNT))
    config = EnsureBudgetsConfig("lab", "arn:aws:sagemaker:us-east-1:123456789012:cluster/abcdef012345", ACCOUNT,
                                 TOPIC, D("1000"), False)
    result = ensure_budgets(config, {"ClusterStatus": "InService", "InstanceGroups": []},
                            sagemaker=sagemaker, budgets=client)
    assert sorted(b["BudgetName"] for b in _all_budgets(client)) == ["hpops-lab", "hpops-lab-u-gpu", "hpops-other"]
    removed = [b for b in result["budgets"] if b["action"] == "deleted"]
    assert [b["name"] for b in removed] == ["hpops-lab-u-alice", "hpops-lab-u-bob"]
    assert all("Slurm accounting" in b["reason"] for b in removed)
    again = ensure_budgets(config, {"ClusterStatus": "InService", "InstanceGroups": []},
                           sagemaker=sagemaker, budgets=client)
    assert [b["action"] for b in again["budgets"]] == ["unchanged"]


def test_concurrent_create_converges_on_one_budget():
    """Another invocation creates the budget between our describe and create."""
    real = budgets_client()
    spec = desired_budget("lab", D("1500"), TOPIC, ACCOUNT)

    class RacingClient:
        def __init__(self):
            self.raced = False

        def describe_budget(self, **kwargs):
            try:
                return real.describe_budget(**kwargs)
            except ClientError:
                if not self.raced:  # the winner creates it right after our miss
                    self.raced = True
                    real.create_budget(
                        AccountId=ACCOUNT,
                        Budget=spec["Budget"],
                        NotificationsWithSubscribers=spec["NotificationsWithSubscribers"],
                    )
                raise

        def __getattr__(self, name):
            return getattr(real, name)

    racing = RacingClient()
    result = ensure_budget(racing, ACCOUNT, spec)

    assert racing.raced
    assert result.action == "unchanged"
    assert [b["BudgetName"] for b in _all_budgets(real)] == ["hpops-lab"]


def test_limit_change_updates_budget_keeping_its_period():
    # moto 5.2.1 has no UpdateBudget; the Stubber checks our request against the
    # real Budgets API model instead.
    client = boto3.client("budgets", region_name="us-east-1")
    spec = desired_budget("lab", D("2500"), TOPIC, ACCOUNT)
    period = {"Start": dt.datetime(2026, 11, 1, tzinfo=UTC), "End": dt.datetime(2087, 6, 15, tzinfo=UTC)}
    existing = {**spec["Budget"], "BudgetLimit": {"Amount": "1500.0", "Unit": "USD"}, "TimePeriod": period}

    with Stubber(client) as stub:
        stub.add_response(
            "describe_budget",
            {"Budget": existing},
            {"AccountId": ACCOUNT, "BudgetName": "hpops-lab"},
        )
        stub.add_response(
            "update_budget",
            {},
            {"AccountId": ACCOUNT, "NewBudget": {**spec["Budget"], "TimePeriod": period}},
        )
        result = ensure_budget(client, ACCOUNT, spec)
        stub.assert_no_pending_responses()

    assert result.action == "updated"
    assert "1500.0" in result.reason and "2500.00" in result.reason


def test_same_limit_with_reformatted_amount_is_unchanged():
    client = budgets_client()
    spec = desired_budget("lab", D("1500"), TOPIC, ACCOUNT)
    # Simulate AWS echoing "1500.0" for our "1500.00".
    client.create_budget(
        AccountId=ACCOUNT,
        Budget={**spec["Budget"], "BudgetLimit": {"Amount": "1500.0", "Unit": "USD"}},
    )
    assert ensure_budget(client, ACCOUNT, spec).action == "unchanged"


def test_spec_for_another_account_is_refused():
    spec = desired_budget("lab", D("1"), TOPIC, "999999999999")
    with pytest.raises(AccountMismatch):
        ensure_budget(budgets_client(), ACCOUNT, spec)
    assert _all_budgets(budgets_client()) == []


def test_delete_budget_is_idempotent():
    client = budgets_client()
    ensure_budget(client, ACCOUNT, desired_budget("lab", D("1"), TOPIC, ACCOUNT))
    assert delete_budget(client, ACCOUNT, "hpops-lab") is True
    assert delete_budget(client, ACCOUNT, "hpops-lab") is False
    assert _all_budgets(client) == []


def test_clients_use_standard_retries():
    for client in (budgets_client(), ce_client(), pricing_client()):
        assert client.meta.config.retries["mode"] == "standard"
    # Both are global services; botocore maps budgets to its aws-global endpoint.
    assert ce_client().meta.endpoint_url == "https://ce.us-east-1.amazonaws.com"


# --------------------------------------------------------------------------- cost explorer


def _queue_ce(*results):
    response = requests.post(CE_RESULTS_URL, json={"results": list(results)})
    assert response.status_code == 201


def _capture_requests(client):
    seen = []
    client.meta.events.register(
        "provide-client-params.ce.GetCostAndUsage", lambda params, **_: seen.append(dict(params))
    )
    return seen


def _total(amount, unit="USD", token=None):
    result = {
        "ResultsByTime": [
            {
                "TimePeriod": {"Start": "2026-11-01", "End": "2026-11-28"},
                "Total": {"UnblendedCost": {"Amount": amount, "Unit": unit}},
                "Groups": [],
                "Estimated": True,
            }
        ],
        "DimensionValueAttributes": [],
    }
    if token:
        result["NextPageToken"] = token
    return result


def test_month_to_date_cost_filters_on_cluster_tag():
    _queue_ce(_total("1234.5678"))
    client = ce_client()
    seen = _capture_requests(client)

    assert month_to_date_cost(client, "lab", NOW) == D("1234.5678")
    (req,) = seen
    assert req["TimePeriod"] == {"Start": "2026-11-01", "End": "2026-11-28"}  # End exclusive
    assert req["Granularity"] == "MONTHLY"
    assert req["Metrics"] == ["UnblendedCost"]
    assert req["Filter"] == {
        "Tags": {"Key": "ClusterName", "Values": ["lab"], "MatchOptions": ["EQUALS"]}
    }


def test_month_to_date_cost_uses_utc_dates():
    _queue_ce(_total("1"))
    client = ce_client()
    seen = _capture_requests(client)
    # Dec 1 00:30 in Tokyo is Nov 30 15:30 UTC: still November's bill.
    tokyo = dt.datetime(2026, 12, 1, 0, 30, tzinfo=dt.timezone(dt.timedelta(hours=9)))
    month_to_date_cost(client, "lab", tokyo)
    assert seen[0]["TimePeriod"] == {"Start": "2026-11-01", "End": "2026-11-30"}


def test_month_to_date_cost_follows_pages():
    _queue_ce(_total("10.25", token="page-2"), _total("0.75"))
    client = ce_client()
    seen = _capture_requests(client)
    assert month_to_date_cost(client, "lab", NOW) == D("11.00")
    assert [r.get("NextPageToken") for r in seen] == [None, "page-2"]


def test_first_of_month_is_zero_without_calling_ce():
    client = ce_client()
    seen = _capture_requests(client)
    assert month_to_date_cost(client, "lab", dt.datetime(2026, 12, 1, 18, tzinfo=UTC)) == 0
    assert seen == []


def test_no_cost_data_is_zero():
    assert month_to_date_cost(ce_client(), "lab", NOW) == 0  # nothing queued


def test_non_usd_cost_is_refused():
    _queue_ce(_total("5", unit="EUR"))
    with pytest.raises(UnexpectedCurrency):
        month_to_date_cost(ce_client(), "lab", NOW)


def test_costs_by_cluster_tag_group():
    _queue_ce(
        {
            "ResultsByTime": [
                {
                    "TimePeriod": {"Start": "2026-11-01", "End": "2026-11-28"},
                    "Total": {},
                    "Groups": [
                        {"Keys": ["ClusterName$alpha"], "Metrics": {"UnblendedCost": {"Amount": "100.10", "Unit": "USD"}}},
                        {"Keys": ["ClusterName$beta"], "Metrics": {"UnblendedCost": {"Amount": "2", "Unit": "USD"}}},
                        {"Keys": ["ClusterName$"], "Metrics": {"UnblendedCost": {"Amount": "999", "Unit": "USD"}}},
                    ],
                    "Estimated": True,
                }
            ]
        }
    )
    client = ce_client()
    seen = _capture_requests(client)
    assert month_to_date_costs_by_cluster(client, NOW) == {"alpha": D("100.10"), "beta": D("2")}
    assert seen[0]["GroupBy"] == [{"Type": "TAG", "Key": "ClusterName"}]


# --------------------------------------------------------------------------- alert dedupe


@pytest.fixture
def table():
    ddb = boto3.resource("dynamodb", region_name="us-east-1")
    return ddb.create_table(
        TableName="hpops-state",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"},
        ],
        BillingMode="PAY_PER_REQUEST",
    )


def test_mark_fired_wins_once(table):
    assert mark_fired(table, "lab", "2026-11:projected:100", NOW) is True
    assert mark_fired(table, "lab", "2026-11:projected:100", NOW + dt.timedelta(minutes=1)) is False
    # Other thresholds, months and clusters are independent.
    assert mark_fired(table, "lab", "2026-11:projected:80", NOW) is True
    assert mark_fired(table, "lab", "2026-12:projected:100", NOW) is True
    assert mark_fired(table, "other", "2026-11:projected:100", NOW) is True

    item = table.get_item(Key={"pk": "budget#lab", "sk": "2026-11:projected:100"})["Item"]
    # The losing call did not overwrite the winner's record.
    assert item["fired_at"] == NOW.isoformat()
    assert int(item[TTL_ATTRIBUTE]) == int((NOW + dt.timedelta(days=40)).timestamp())


def test_fired_keys_are_per_cluster_and_month(table):
    for key in ("2026-11:projected:80", "2026-11:projected:100", "2026-12:projected:80"):
        mark_fired(table, "lab", key, NOW)
    mark_fired(table, "other", "2026-11:projected:50", NOW)
    assert fired_keys(table, "lab", "2026-11") == {"2026-11:projected:80", "2026-11:projected:100"}
    assert fired_keys(table, "lab", "2027-01") == set()


def test_mark_fired_validates_inputs(table):
    with pytest.raises(NaiveDatetimeError):
        mark_fired(table, "lab", "2026-11:projected:100", dt.datetime(2026, 11, 28))
    with pytest.raises(ValueError):
        mark_fired(table, "lab;drop", "2026-11:projected:100", NOW)


def test_scale_out_event_alerts_once_across_duplicate_events(table):
    """Event -> scale-out -> rates -> projection -> decision -> dedupe, delivered twice."""
    before = {"ClusterName": "lab", "ClusterStatus": "InService", "InstanceGroups": [
        {"InstanceGroupName": "gpu", "InstanceType": "ml.p5.48xlarge", "CurrentCount": 4, "TargetCount": 4},
    ]}
    after = {"ClusterName": "lab", "ClusterStatus": "Updating", "InstanceGroups": [
        {"InstanceGroupName": "gpu", "InstanceType": "ml.p5.48xlarge", "CurrentCount": 4, "TargetCount": 8},
    ]}
    # The cluster's bill so far: 10 h of p5 at $98.32 and $16.80 of volumes, $1,000 in all.
    _queue_ce({"ResultsByTime": [{"TimePeriod": {"Start": "2026-11-01", "End": "2026-11-28"}, "Total": {}, "Groups": [
        {"Keys": ["USE1-Cluster:ml.p5.48xlarge"], "Metrics": {"UnblendedCost": {"Amount": "983.20", "Unit": "USD"},
                                                               "UsageQuantity": {"Amount": "10", "Unit": "Hrs"}}},
        {"Keys": ["USE1-Cluster:VolumeUsage.gp2"], "Metrics": {"UnblendedCost": {"Amount": "16.80", "Unit": "USD"},
                                                                "UsageQuantity": {"Amount": "160", "Unit": "GB-Mo"}}},
    ], "Estimated": True}]})
    ce = ce_client()
    pricing = pricing_client()
    asked = []
    pricing.meta.events.register("before-call.pricing", lambda **kw: asked.append(kw))

    sent = []
    for _delivery in range(2):  # EventBridge is at-least-once
        scale = scale_out_groups(before, after)
        assert scale
        rates, billed = rates_for(["ml.p5.48xlarge"], ce=ce, pricing=pricing, cluster_name="lab",
                                  region="us-east-1", overrides={}, now=NOW)
        projection = project_month_end(NOW, billed.total_usd, groups_from_detail(after), rates)
        for alert in decide_alerts(
            projection, D("50000"), (80, 100), fired_keys(table, "lab", projection.month),
            scale_outs=scale,
        ):
            if mark_fired(table, "lab", alert.key, NOW):
                sent.append(alert)

    assert [a.key for a in sent] == ["2026-11:projected:80", "2026-11:projected:100"]
    assert sent[1].summary.startswith(
        "scale-out of group 'gpu' to 8 x ml.p5.48xlarge (+4): projected $57,632.32 by 2026-11-30"
    )
    assert sent[1].summary.endswith("; rates: ml.p5.48xlarge $98.32/h billed")
    assert asked == [], "billed rates need no Price List"
