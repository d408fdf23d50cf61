"""Budget guardrails: the real BudgetGuard state machine and handlers in the twin.

Each test asserts what an operator would see: the budgets in the account (moto's Budgets), the
messages on the AlertTopic (an SQS queue subscribed to it), the events another team's rule on
the default bus receives, and the guard's DynamoDB items. "Now" is the event's time, so the
tests set it (time is an input).
"""

import datetime as dt
import json
from decimal import Decimal

import pytest

from hpops_twin.budget_twin import VOLUME_USAGE, at
from hpops_twin.world import TwinWorld

UTC = dt.timezone.utc
NOV_10 = dt.datetime(2026, 11, 10, 12, 0, tzinfo=UTC)
BUDGET_TAG = "hpops:monthly-budget-usd"


def succeeded(results):
    failed = [(r.name, r.error, r.cause, r.output) for r in results if r.status != "SUCCEEDED"]
    assert not failed, failed
    assert results, "no BudgetGuard execution started"
    return results


def state_change(world, when):
    return at(world.sim.state_change_event(world.cluster_name), when)


def scale(world, group, count, when):
    return [at(e, when) for e in world.sim.scale_group(world.cluster_name, group, count)]


@pytest.fixture
def guarded(world):
    """A cluster tagged with a $750,000 monthly budget, $200,000 spent this month (none of it
    instance hours, so rates come from the Price List), first seen (InService, 8 gpu nodes) on
    Nov 10: the budget exists and the baseline is stored."""
    world.budget.tag_cluster(BUDGET_TAG, "750000")
    world.budget.set_month_to_date_cost("200000")
    succeeded(world.budget.run(world.publish([state_change(world, NOV_10)])))
    return world


# --------------------------------------------------------------------------- budgets follow the cluster


def test_the_cluster_gets_one_budget_with_alerts_to_the_topic(world):
    world.budget.tag_cluster(BUDGET_TAG, "750000")
    event = state_change(world, NOV_10)

    first = succeeded(world.budget.run(world.publish([event])))[0]
    second = succeeded(world.budget.run(world.publish([event])))[0]

    assert [b["action"] for b in first.output["budgets"]["budgets"]] == ["created"]
    assert [b["action"] for b in second.output["budgets"]["budgets"]] == ["unchanged"]
    budgets = world.budget.budgets()
    assert list(budgets) == ["hpops-ml-research"], "one budget, however many events"
    budget = budgets["hpops-ml-research"]
    assert Decimal(budget["BudgetLimit"]["Amount"]) == Decimal("750000")
    assert budget["FilterExpression"] == {
        "Tags": {"Key": "ClusterName", "Values": ["ml-research"], "MatchOptions": ["EQUALS"]}
    }
    notifications = sorted((n["NotificationType"], n["Threshold"]) for n in world.budget.notifications("hpops-ml-research"))
    assert notifications == [("ACTUAL", 50.0), ("ACTUAL", 80.0), ("ACTUAL", 100.0), ("FORECASTED", 100.0)]
    assert world.counter.calls["budgets.CreateBudget"] == 1


def test_a_new_limit_in_the_cluster_tag_updates_the_budget(guarded):
    world = guarded
    world.budget.tag_cluster(BUDGET_TAG, "900000.50")

    result = succeeded(world.budget.run([world.budget.sweep()]))[0]

    assert result.output["budgets"]["budgets"][0]["action"] == "updated"
    assert result.output["budgets"]["limitSource"] == "tag"
    budget = world.budget.budgets()["hpops-ml-research"]
    assert Decimal(budget["BudgetLimit"]["Amount"]) == Decimal("900000.50")
    assert len(world.budget.notifications("hpops-ml-research")) == 4, "notifications are left as they were"
    # The sweep also runs LoginNodeSync, whose ResolveLoginNodes checks the login group the same way.
    budget_calls = world.counter.calls["sagemaker.DescribeCluster"] - world.counter.calls_of(
        {"ResolveLoginNodesFunction"})["sagemaker.DescribeCluster"]
    assert budget_calls == 1, "a sweep reads the cluster's state itself"


def test_per_user_budgets_of_earlier_versions_are_removed_and_the_cluster_budget_stays():
    with TwinWorld() as world:
        budgets = world.aws.client("budgets", region_name="us-east-1")
        for user in ("alice", "bob"):
            budgets.create_budget(AccountId=world.budget.world_account, Budget={
                "BudgetName": f"hpops-ml-research-u-{user}", "BudgetLimit": {"Amount": "500", "Unit": "USD"},
                "TimeUnit": "MONTHLY", "BudgetType": "COST", "Metrics": ["UnblendedCost"],
                "FilterExpression": {"And": [
                    {"Tags": {"Key": "ClusterName", "Values": ["ml-research"], "MatchOptions": ["EQUALS"]}},
                    {"Tags": {"Key": "hpops:user", "Values": [user], "MatchOptions": ["EQUALS"]}}]}})
        world.budget.tag_cluster(BUDGET_TAG, "750000")
        result = succeeded(world.budget.run(world.publish([state_change(world, NOV_10)])))[0]
        assert sorted(world.budget.budgets()) == ["hpops-ml-research"]
        removed = [b["name"] for b in result.output["budgets"]["budgets"] if b["action"] == "deleted"]
        assert removed == ["hpops-ml-research-u-alice", "hpops-ml-research-u-bob"]


@pytest.mark.parametrize("delete, left", [("false", ["hpops-ml-research"]), ("true", [])])
def test_deleting_the_cluster_keeps_or_removes_its_budgets(delete, left):
    with TwinWorld(parameters={"DeleteBudgetsWithCluster": delete}) as world:
        world.budget.tag_cluster(BUDGET_TAG, "750000")
        succeeded(world.budget.run(world.publish([state_change(world, NOV_10)])))
        world.sim.cluster(world.cluster_name).status = "Deleting"
        result = succeeded(world.budget.run(world.publish([state_change(world, NOV_10 + dt.timedelta(hours=1))])))[0]
        assert list(world.budget.budgets()) == left
        assert result.output["budgets"]["budgets"][0]["action"] == ("deleted" if delete == "true" else "kept")


# --------------------------------------------------------------------------- early alerts on scale-out


def test_a_scale_out_that_overruns_alerts_once_saying_why(guarded):
    world = guarded
    result = succeeded(world.budget.run(world.publish(scale(world, "gpu", 16, NOV_10 + dt.timedelta(minutes=5)))))[0]

    (alert,) = world.budget.alerts()
    (event,) = world.budget.alert_events()
    assert alert["summary"].startswith(
        "scale-out of group 'gpu' to 16 x ml.p5.48xlarge (+8): projected $975,"
    ), alert["summary"]
    assert "by 2026-11-30 vs limit $750,000.00" in alert["summary"]
    assert alert["thresholdsCrossed"] == [80.0, 100.0] and alert["thresholdPercent"] == 100.0
    assert alert["scaleOuts"] == [{"group": "gpu", "instanceType": "ml.p5.48xlarge", "from": 8, "to": 16}]
    assert alert["projection"]["monthToDateUsd"] == 200000.0
    # Nothing billed as instance hours yet: both types are priced from the Price List, and say so.
    assert [(d["instanceType"], d["usdPerHour"], d["rateSource"]) for d in alert["projection"]["drivers"]] == [
        ("ml.p5.48xlarge", 98.32, "list"), ("ml.m5.4xlarge", 0.922, "list")]
    assert alert["summary"].endswith("; rates: ml.p5.48xlarge $98.32/h list, ml.m5.4xlarge $0.922/h list")
    projecting = world.counter.calls_of({"ProjectSpendFunction"})
    assert projecting["cost-explorer.GetCostAndUsage"] == 1, "month to date and billed rates: one request"
    assert projecting["pricing.GetProducts"] == 2, "one Price List query per unbilled instance type"
    assert alert["_subject"] == "[hpops] ml-research: projected 130% of its monthly budget by 2026-11-30"
    assert event["source"] == "hpops.budget-guard" and event["detail-type"] == "HyperPod Budget Projection Alert"
    assert event["detail"]["summary"] == alert["summary"]
    assert event["resources"] == [world.resolver.parameters["ClusterArn"]]
    assert event["time"] == "2026-11-10T12:05:00Z", "the event's time is the alert's time"

    items = world.budget.state_items()
    assert {"2026-11:projected:80", "2026-11:projected:100"} <= set(items)
    assert int(items["2026-11:projected:100"]["ttl"]["N"]) > int(NOV_10.timestamp()), "the table's TTL attribute"
    assert json.loads(items["last-seen"]["observed"]["S"])["InstanceGroups"][1]["TargetCount"] == 16
    assert result.output["published"]["summary"] == alert["summary"]


def test_the_same_event_again_does_not_alert_again(guarded):
    world = guarded
    events = scale(world, "gpu", 16, NOV_10 + dt.timedelta(minutes=5))
    succeeded(world.budget.run(world.publish(events)))
    world.counter.reset()

    again = succeeded(world.budget.run(world.publish(events)))[0]

    assert len(world.budget.alerts()) == 1 and len(world.budget.alert_events()) == 1
    assert again.output["projection"]["alert"] is None
    assert "no instance group's TargetCount went up" in again.output["projection"]["reason"]
    assert world.counter.calls["cost-explorer.GetCostAndUsage"] == 0, "no scale-out, no Cost Explorer call"


def test_each_threshold_fires_once_a_month_and_again_next_month(guarded):
    world = guarded
    succeeded(world.budget.run(world.publish(scale(world, "gpu", 16, NOV_10 + dt.timedelta(minutes=5)))))
    # Later in November, another scale-out: both thresholds already alerted this month.
    later = succeeded(world.budget.run(world.publish(scale(world, "gpu", 20, NOV_10 + dt.timedelta(days=2)))))[0]
    assert later.output["projection"]["alert"] is None
    assert "already alerted this month" in later.output["projection"]["reason"]
    assert len(world.budget.alerts()) == 1

    # December: a new billing month, same limit; the next scale-out alerts again.
    dec_3 = dt.datetime(2026, 12, 3, 9, 0, tzinfo=UTC)
    world.budget.set_month_to_date_cost("150000")
    succeeded(world.budget.run(world.publish(scale(world, "gpu", 24, dec_3))))
    alerts = world.budget.alerts()
    assert [a["month"] for a in alerts] == ["2026-11", "2026-12"]
    assert alerts[1]["summary"].startswith("scale-out of group 'gpu' to 24 x ml.p5.48xlarge (+4)")
    assert "by 2026-12-31" in alerts[1]["summary"]
    assert {"2026-12:projected:80", "2026-12:projected:100"} <= set(world.budget.state_items())


def test_a_scale_out_missed_by_events_is_caught_by_the_sweep(guarded):
    world = guarded
    world.sim.scale_group(world.cluster_name, "gpu", 16)  # the event is lost (EventBridge is best effort)
    # A sweep's "now" is its execution's start (today): with $700,000 already spent the projection
    # is over 80% of $750,000 whatever day of the month this runs.
    world.budget.set_month_to_date_cost("700000")
    result = succeeded(world.budget.run([world.budget.sweep()]))[0]
    assert result.output["projection"]["scaleOuts"] == [{"group": "gpu", "instanceType": "ml.p5.48xlarge", "from": 8, "to": 16}]
    assert len(world.budget.alerts()) == 1


def test_a_billed_rate_prices_the_scale_out_at_what_the_cluster_pays(guarded):
    world = guarded
    # Nov 1-9: 8 gpu nodes x 216 h billed at $85.00/h (a Savings Plan, say) and $1,200 of volumes.
    world.budget.set_billed_usage({"ml.p5.48xlarge": ("146880.00", "1728")}, other={VOLUME_USAGE: "1200.00"})
    world.counter.reset()
    when = NOV_10 + dt.timedelta(minutes=5)

    result = succeeded(world.budget.run(world.publish(scale(world, "gpu", 16, when))))[0]

    (alert,) = world.budget.alerts()
    projection = alert["projection"]
    assert projection["monthToDateUsd"] == 148080.0, "instance hours + other cost, one Cost Explorer answer"
    assert projection["billed"]["instancesUsd"] == 146880.0 and projection["billed"]["otherUsd"] == 1200.0
    gpu, login = projection["drivers"]
    assert (gpu["usdPerHour"], gpu["rateSource"]) == (85.0, "billed")
    assert gpu["rateDetail"] == "Cost Explorer 2026-11-01..2026-11-10: $146,880.00 over 1728.0 h"
    assert (login["usdPerHour"], login["rateSource"]) == (0.922, "list"), "the login type was not billed: list price"
    hours_left = (dt.datetime(2026, 12, 1, tzinfo=UTC) - when) / dt.timedelta(hours=1)
    expected = Decimal("148080") + (16 * Decimal(85) + 3 * Decimal("0.922")) * Decimal(str(hours_left))
    assert alert["projectedUsd"] == pytest.approx(float(expected), abs=0.01)
    assert alert["summary"].endswith("; rates: ml.p5.48xlarge $85.00/h billed, ml.m5.4xlarge $0.922/h list")
    assert "month-to-date $148,080.00 (Cost Explorer 2026-11-01..2026-11-10, tag ClusterName)" in projection["reason"]
    projecting = world.counter.calls_of({"ProjectSpendFunction"})
    assert projecting["cost-explorer.GetCostAndUsage"] == 1
    assert projecting["pricing.GetProducts"] == 1, "only the unbilled login type is looked up"
    assert [body["Filters"][1]["Value"] for sender, body in world.budget.price_list.requests
            if (sender or "").endswith("ProjectSpendFunction")] == ["ml.m5.4xlarge-Cluster"]
    assert result.output["projection"]["warnings"] == []


def test_an_override_prices_a_type_nobody_else_does():
    with TwinWorld(parameters={"RateOverridesJson": '{"ml.p6-b200.48xlarge": "113.93", "ml.p5.48xlarge": "1"}'}) as world:
        world.budget.tag_cluster(BUDGET_TAG, "750000")
        world.budget.set_month_to_date_cost("200000")
        succeeded(world.budget.run(world.publish([state_change(world, NOV_10)])))
        gpu = next(g for g in world.sim.cluster(world.cluster_name).instance_groups if g["InstanceGroupName"] == "gpu")
        gpu["InstanceType"] = "ml.p6-b200.48xlarge"

        result = succeeded(world.budget.run(world.publish(scale(world, "gpu", 16, NOV_10 + dt.timedelta(minutes=5)))))[0]

        projection = result.output["projection"]
        assert projection["warnings"] == [] and projection["projection"]["missingPrices"] == []
        assert [(d["instanceType"], d["usdPerHour"], d["rateSource"]) for d in projection["projection"]["drivers"]] == [
            ("ml.p6-b200.48xlarge", 113.93, "override"), ("ml.m5.4xlarge", 0.922, "list")]
        # The override for p5 is not used anywhere: there is no p5 group left, and it is the last resort anyway.
        assert "ml.p5.48xlarge" not in projection["projection"]["reason"]


# --------------------------------------------------------------------------- warnings, not crashes


def test_an_instance_type_without_a_price_is_a_named_warning(guarded):
    world = guarded
    gpu = next(g for g in world.sim.cluster(world.cluster_name).instance_groups if g["InstanceGroupName"] == "gpu")
    gpu["InstanceType"] = "ml.p6-b200.48xlarge"  # not billed yet, not in the Price List, no override

    result = succeeded(world.budget.run(world.publish(scale(world, "gpu", 16, NOV_10 + dt.timedelta(minutes=5)))))[0]

    warnings = result.output["projection"]["warnings"]
    assert [w["warning"] for w in warnings] == ["MissingHourlyPrice"]
    assert "ml.p6-b200.48xlarge" in warnings[0]["reason"] and "16 node(s)" in warnings[0]["reason"]
    assert all(source in warnings[0]["reason"] for source in ("Cost Explorer", "AWS Price List for us-east-1",
                                                               "RateOverridesJson"))
    assert result.output["projection"]["projection"]["missingPrices"] == ["ml.p6-b200.48xlarge"]
    ensure_logs = [i.logs for i in world.dispatcher.invocations if i.function.endswith("ProjectSpendFunction")][-2]
    assert '"warning":"MissingHourlyPrice"' in ensure_logs.replace(" ", "")


def test_a_cluster_without_a_limit_gets_no_budget_and_a_named_warning(world):
    result = succeeded(world.budget.run(world.publish([state_change(world, NOV_10)])))[0]
    assert [w["warning"] for w in result.output["budgets"]["warnings"]] == ["NoBudgetLimit"]
    assert world.budget.budgets() == {}
    # and a scale-out is noticed but not projected (nothing to compare against)
    later = succeeded(world.budget.run(world.publish(scale(world, "gpu", 16, NOV_10 + dt.timedelta(minutes=5)))))[0]
    assert "no budget limit" in later.output["projection"]["reason"]
    assert world.budget.alerts() == []


def test_a_malformed_budget_tag_falls_back_with_a_named_warning():
    with TwinWorld(parameters={"MonthlyBudgetUsd": "1000"}) as world:
        world.budget.tag_cluster(BUDGET_TAG, "lots")
        result = succeeded(world.budget.run(world.publish([state_change(world, NOV_10)])))[0]
        assert [w["warning"] for w in result.output["budgets"]["warnings"]] == ["MalformedBudgetTag"]
        assert Decimal(world.budget.budgets()["hpops-ml-research"]["BudgetLimit"]["Amount"]) == Decimal("1000")


def test_broken_rate_overrides_fail_the_execution_with_a_named_error():
    with TwinWorld(parameters={"RateOverridesJson": '{"ml.p5.48xlarge": "cheap"}'}) as world:
        result = world.budget.run(world.publish([state_change(world, NOV_10)]))[0]
        assert (result.status, result.error) == ("FAILED", "ConfigurationError")
        assert "RATE_OVERRIDES_JSON" in result.cause


def test_without_per_user_spend_the_sweep_keeps_the_cluster_budget_and_checks_no_user():
    from hpops_twin.world import TwinWorld

    with TwinWorld(parameters={"UserSpendEnabled": "false"}) as world:
        world.budget.tag_cluster(BUDGET_TAG, "750000")
        world.budget.set_month_to_date_cost("700000")
        succeeded(world.budget.run(world.publish([state_change(world, NOV_10)])))
        world.sim.scale_group(world.cluster_name, "gpu", 16)  # a scale-out only the sweep sees
        world.counter.reset()
        result = succeeded(world.budget.run([world.budget.sweep()]))[0]

        assert "userSpend" not in result.output and result.output["userSpendEnabled"] == "false"
        assert list(world.budget.budgets()) == [f"hpops-{world.cluster_name}"]
        assert len(world.budget.alerts()) == 1, "the cluster's projection still alerts"
        # The scale-out's projection is the only Cost Explorer request; no usage item is read.
        assert world.counter.calls["cost-explorer.GetCostAndUsage"] == 1
        switch = world.aws.client("ssm").get_parameter(Name=f"/hpops/{world.cluster_name}/node/user-spend")
        assert switch["Parameter"]["Value"] == "off", "the controller's agent stops collecting usage"
        assert "UserSpendAlertTopic" not in world.resolver.physical_ids
        assert "RecordUsageReportFunction" not in world.resolver.physical_ids
