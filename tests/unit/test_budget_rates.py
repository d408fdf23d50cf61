"""Where each hourly rate comes from (billed, list, override), and what the projection does with it. Pure."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal as D
from types import MappingProxyType

import pytest

from hpops_core.budget_guard.projection import decide_alerts, project_month_end, usd_rate
from hpops_core.budget_guard.rates import (
    MIN_BILLED_HOURS,
    BilledMonth,
    BilledUsage,
    billed_rate,
    choose_rates,
    instance_type_of_usage,
    no_billed_month,
)

P5, M5, NEW = "ml.p5.48xlarge", "ml.m5.xlarge", "ml.p6-b200.48xlarge"
UTC = dt.timezone.utc


def billed(other="0", **usage):
    """usage: python-safe type name -> (cost, hours); '_' stands for '.' and '__' for '-'."""
    by_type = {}
    for key, (cost, hours) in usage.items():
        instance_type = key.replace("__", "-").replace("_", ".")
        by_type[instance_type] = BilledUsage(instance_type, D(cost), D(hours), "2026-11-01", "2026-11-22")
    return BilledMonth(MappingProxyType(by_type), D(other), "2026-11-01", "2026-11-22")


# --------------------------------------------------------------------------- usage types


@pytest.mark.parametrize("usage_type, unit, expected", [
    ("USE1-Cluster:ml.p5.48xlarge", "Hrs", P5),
    ("Cluster:ml.m5.xlarge", "Hrs", M5),  # a usage type without a region prefix
    ("EU-Cluster:ml.p6-b200.48xlarge", "Hrs", NEW),
    ("USW2-ReservedCluster:ml.p5.48xlarge", "Hrs", P5),  # same instances, another purchase option
    ("USE1-Cluster:ml.p5.48xlarge", "hours", P5),
    ("USE1-Cluster:VolumeUsage.gp2", "GB-Mo", None),  # the nodes' EBS volumes
    ("USE1-Cluster:ml.p5.48xlarge", "GB-Mo", None),  # not instance time whatever its name
    ("USE1-Cluster:ml.p5.48xlarge", None, None),
    ("USE1-Train:ml.p5.48xlarge", "Hrs", None),  # a training job tagged with the cluster's tag
    ("USE1-Host:ml.m5.xlarge", "Hrs", None),
    ("USE1-Cluster:p5.48xlarge", "Hrs", None),
    ("ml.p5.48xlarge", "Hrs", None),
    ("", "Hrs", None),
])
def test_hyperpod_instance_hours_are_recognised_by_their_usage_type(usage_type, unit, expected):
    assert instance_type_of_usage(usage_type, unit) == expected


# --------------------------------------------------------------------------- the choice


def test_a_billed_rate_is_cost_over_hours_and_says_so():
    choice = choose_rates([P5], billed(ml_p5_48xlarge=("12345.67", "125.6")), {P5: D("98.32")}, {P5: D("1")})
    rate = choice.rates[P5]
    assert (rate.source, rate.usd_per_hour) == ("billed", D("12345.67") / D("125.6"))
    assert rate.detail == "Cost Explorer 2026-11-01..2026-11-22: $12,345.67 over 125.6 h"
    assert choice.missing == () and choice.usd_per_hour(P5) == D("12345.67") / D("125.6")


@pytest.mark.parametrize("cost, hours, why", [
    ("49.16", "0.5", "under an hour"),
    ("0", "400", "no cost: e.g. covered by a Savings Plan, whose negation cancels the unblended cost"),
    ("-3.00", "10", "a credit larger than the usage"),
])
def test_too_little_billed_falls_through_to_the_list_price_and_says_why(cost, hours, why):
    choice = choose_rates([P5], billed(ml_p5_48xlarge=(cost, hours)), {P5: D("98.32")}, {})
    rate = choice.rates[P5]
    assert (rate.source, rate.usd_per_hour) == ("list", D("98.32")), why
    assert "too little to trust" in rate.detail and f"over {D(hours).quantize(D('0.1'))} h" in rate.detail


def test_exactly_the_minimum_is_enough():
    usage = BilledUsage(P5, D("98.32"), MIN_BILLED_HOURS, "2026-11-01", "2026-11-02")
    assert billed_rate(usage) == D("98.32")
    assert billed_rate(None) is None


def test_the_list_price_wins_over_an_override():
    choice = choose_rates([P5], no_billed_month(), {P5: D("98.32")}, {P5: D("55.04")})
    assert (choice.rates[P5].source, choice.usd_per_hour(P5)) == ("list", D("98.32"))


def test_an_override_is_the_last_resort_only():
    choice = choose_rates([P5, NEW, M5], billed(ml_p5_48xlarge=("850", "10")), {M5: D("0.23")},
                          {P5: D("1.00"), NEW: D("113.93"), M5: D("9.99")})
    assert {t: (r.source, r.usd_per_hour) for t, r in choice.rates.items()} == {
        P5: ("billed", D(85)), NEW: ("override", D("113.93")), M5: ("list", D("0.23"))}
    assert "RateOverridesJson" in choice.rates[NEW].detail


def test_a_type_with_no_rate_anywhere_is_missing_once_in_order():
    choice = choose_rates([NEW, P5, NEW, "ml.x9.huge"], no_billed_month(), {P5: D("98.32")}, {})
    assert choice.missing == (NEW, "ml.x9.huge")
    assert list(choice.rates) == [P5]
    assert choice.usd_per_hour(NEW) is None


def test_the_billed_month_adds_up_to_the_clusters_bill():
    month = billed(other="1200.50", ml_p5_48xlarge=("146880", "1728"), ml_m5_xlarge=("99.36", "432"))
    assert month.instance_cost_usd == D("146979.36")
    assert month.total_usd == D("148179.86")
    assert no_billed_month().total_usd == 0 and no_billed_month().start is None


# --------------------------------------------------------------------------- the projection


NOV_28 = dt.datetime(2026, 11, 28, tzinfo=UTC)  # 72 h left in November
GROUPS = [(P5, 8, "gpu"), (M5, 2, "login")]


def test_the_projection_uses_the_billed_rate_where_there_is_one():
    month = billed(other="16.80", ml_p5_48xlarge=("6800", "80"))  # $85.00/h under a Savings Plan
    choice = choose_rates([P5, M5], month, {P5: D("98.32"), M5: D("0.23")}, {})
    p = project_month_end(NOV_28, month.total_usd, GROUPS, choice, month_to_date_source="Cost Explorer 2026-11-01..2026-11-28")

    # 6816.80 + (8 x 85 + 2 x 0.23) x 72 = 6816.80 + 680.46 x 72
    assert p.projected_total == D("6816.80") + D("680.46") * 72 == D("55809.92")
    gpu, login = p.drivers
    assert (gpu.rate_source, gpu.usd_per_hour, gpu.hourly_cost) == ("billed", D(85), D(680))
    assert (login.rate_source, login.usd_per_hour, login.hourly_cost) == ("list", D("0.23"), D("0.46"))
    assert gpu.rate_detail == "Cost Explorer 2026-11-01..2026-11-22: $6,800.00 over 80.0 h"
    assert "month-to-date $6,816.80 (Cost Explorer 2026-11-01..2026-11-28)" in p.reason
    assert "ml.p5.48xlarge $85.00/h billed (Cost Explorer 2026-11-01..2026-11-22: $6,800.00 over 80.0 h)" in p.reason
    assert "ml.m5.xlarge $0.23/h list (AWS Price List" in p.reason

    (alert,) = decide_alerts(p, D("50000"), (100,), set())
    assert alert.summary.endswith("; rates: ml.p5.48xlarge $85.00/h billed, ml.m5.xlarge $0.23/h list")


def test_the_same_cluster_on_list_prices_projects_the_list_dollars():
    choice = choose_rates([P5, M5], no_billed_month(), {P5: D("98.32"), M5: D("0.23")}, {})
    p = project_month_end(NOV_28, D("6816.80"), GROUPS, choice)
    assert p.projected_total == D("6816.80") + (8 * D("98.32") + 2 * D("0.23")) * 72 == D("63482.24")
    assert [d.rate_source for d in p.drivers] == ["list", "list"]


def test_an_override_rate_and_a_missing_type_are_both_named():
    choice = choose_rates([NEW, "ml.x9.huge"], no_billed_month(), {}, {NEW: D("113.93")})
    p = project_month_end(NOV_28, D(0), [(NEW, 2, "gpu"), ("ml.x9.huge", 1, "odd")], choice)
    assert p.projected_total == D("113.93") * 2 * 72
    assert p.missing_prices == ("ml.x9.huge",)
    assert "ml.p6-b200.48xlarge $113.93/h override" in p.reason
    assert "no hourly rate (billed, list or override) for ml.x9.huge" in p.reason


@pytest.mark.parametrize("amount, text", [
    (D("98.32"), "$98.32"), (D("0.922"), "$0.922"), (D("25.91001756"), "$25.91"), (D("0.00005"), "$0.0001"),
    (D("100"), "$100.00"), (D("1234.5"), "$1,234.50"), (D("85") / D("3"), "$28.3333"),
])
def test_rates_are_shown_to_the_cent_or_finer(amount, text):
    assert usd_rate(amount) == text
