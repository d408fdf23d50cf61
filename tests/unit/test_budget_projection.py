"""Pure tests for budget guardrails: projection arithmetic, UTC billing months,
alert dedupe keys, scale-out detection, budget specs and limit resolution."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal as D

import pytest

from hpops_core.budget_guard import BudgetGuardError
from hpops_core.budget_guard.budget_spec import (
    BUDGET_TAG,
    InvalidAccountId,
    InvalidBudgetLimit,
    InvalidClusterName,
    InvalidTopicArn,
    MalformedBudgetTag,
    NoBudgetLimit,
    budget_changes,
    budget_name_for,
    desired_budget,
    resolve_limit,
    user_budget_prefix,
)
from hpops_core.budget_guard.projection import (
    GroupLoad,
    InvalidGroup,
    InvalidMoney,
    InvalidThreshold,
    NaiveDatetimeError,
    alert_key,
    decide_alerts,
    groups_from_detail,
    month_bounds,
    project_month_end,
    scale_out_groups,
)
from hpops_core.budget_guard.rates import Rate, RateChoice

UTC = dt.timezone.utc
P5 = "ml.p5.48xlarge"
M5 = "ml.m5.xlarge"
PRICES = RateChoice({P5: Rate(P5, D("98.32"), "list", "AWS Price List"), M5: Rate(M5, D("0.23"), "list", "AWS Price List")}, ())
TOPIC = "arn:aws:sns:us-east-1:123456789012:hpops-budget"
ACCOUNT = "123456789012"


def at(*args: int) -> dt.datetime:
    return dt.datetime(*args, tzinfo=UTC)


# --------------------------------------------------------------------------- arithmetic


def test_projection_arithmetic_is_exact():
    # 2026-11-28 00:00Z -> 3 days (72 h) left in November.
    p = project_month_end(at(2026, 11, 28), D("1000.00"), [(P5, 8, "gpu"), (M5, 2)], PRICES)

    assert p.hours_left == D(72)
    assert p.run_rate_per_hour == D("786.56") + D("0.46")
    assert p.projected_total == D("1000.00") + D("787.02") * 72 == D("57665.44")
    assert p.month_to_date == D("1000.00")
    assert p.missing_prices == ()
    # Biggest driver first, with its own cost to month end.
    assert [(d.name, d.instance_type, d.node_count) for d in p.drivers] == [
        ("gpu", P5, 8),
        (None, M5, 2),
    ]
    assert p.drivers[0].hourly_cost == D("786.56")
    assert p.drivers[0].cost_to_month_end == D("56632.32")
    assert p.drivers[1].cost_to_month_end == D("33.12")
    assert "$57,665.44" in p.reason and "72.00 h left" in p.reason


def test_fractional_hours_left_near_month_end():
    p = project_month_end(at(2026, 11, 30, 23, 30), D(0), [(P5, 2)], PRICES)
    assert p.hours_left == D("0.5")
    assert p.projected_total == D("98.32")


def test_no_groups_projects_month_to_date_only():
    p = project_month_end(at(2026, 11, 10), D("12.34"), [], PRICES)
    assert p.run_rate_per_hour == 0
    assert p.projected_total == D("12.34")
    assert p.drivers == ()


def test_zero_nodes_cost_nothing():
    p = project_month_end(at(2026, 11, 10), D(0), [GroupLoad(P5, 0, "gpu")], PRICES)
    assert p.projected_total == 0
    assert p.drivers[0].hourly_cost == 0


# --------------------------------------------------------------------------- month boundaries


def test_first_instant_of_month_counts_whole_month():
    p = project_month_end(at(2026, 11, 1), D(0), [(P5, 1)], PRICES)
    assert p.month_start == at(2026, 11, 1)
    assert p.month_end == at(2026, 12, 1)
    assert p.hours_left == D(30 * 24)
    assert p.month == "2026-11"
    assert p.last_day == dt.date(2026, 11, 30)


def test_last_microsecond_of_month_is_still_that_month():
    p = project_month_end(at(2026, 11, 30, 23, 59, 59, 999999), D(5), [(P5, 1)], PRICES)
    assert p.month == "2026-11"
    assert p.hours_left == D(1) / D(3_600_000_000)
    assert D(5) < p.projected_total < D("5.0001")


def test_december_rolls_into_january_of_next_year():
    p = project_month_end(at(2026, 12, 31, 12), D(0), [(P5, 1)], PRICES)
    assert p.month_start == at(2026, 12, 1)
    assert p.month_end == at(2027, 1, 1)
    assert p.hours_left == D(12)
    assert p.last_day == dt.date(2026, 12, 31)
    assert p.projected_total == D("98.32") * 12


@pytest.mark.parametrize(
    ("year", "hours"),
    [(2028, 29 * 24), (2027, 28 * 24), (2100, 28 * 24), (2000, 29 * 24)],
)
def test_february_length_follows_leap_years(year, hours):
    p = project_month_end(at(year, 2, 1), D(0), [], PRICES)
    assert p.hours_left == D(hours)
    assert p.month_end == at(year, 3, 1)


def test_leap_day_2028_is_in_february():
    p = project_month_end(at(2028, 2, 29, 6), D("100"), [(M5, 10)], PRICES)
    assert p.month == "2028-02"
    assert p.last_day == dt.date(2028, 2, 29)
    assert p.hours_left == D(18)
    assert p.projected_total == D("100") + D("2.30") * 18


def test_non_utc_input_uses_the_utc_billing_month():
    # 23:30 on Nov 30 in Los Angeles (UTC-8) is already 07:30 on Dec 1 UTC:
    # AWS bills that instant to December.
    la = dt.timezone(dt.timedelta(hours=-8))
    p = project_month_end(dt.datetime(2026, 11, 30, 23, 30, tzinfo=la), D(0), [(P5, 1)], PRICES)
    assert p.month == "2026-12"
    assert p.now == at(2026, 12, 1, 7, 30)
    assert p.hours_left == D(31 * 24) - D("7.5")

    # 00:30 on Dec 1 in Tokyo (UTC+9) is still 15:30 on Nov 30 UTC.
    tokyo = dt.timezone(dt.timedelta(hours=9))
    p = project_month_end(dt.datetime(2026, 12, 1, 0, 30, tzinfo=tokyo), D(0), [(P5, 1)], PRICES)
    assert p.month == "2026-11"
    assert p.hours_left == D("8.5")


def test_zoneinfo_time_zone_near_midnight():
    zoneinfo = pytest.importorskip("zoneinfo")
    try:
        la = zoneinfo.ZoneInfo("America/Los_Angeles")
    except zoneinfo.ZoneInfoNotFoundError:
        pytest.skip("no tz database")
    # Jan 31 23:00 PST -> Feb 1 07:00 UTC (2028: leap February).
    start, end = month_bounds(dt.datetime(2028, 1, 31, 23, 0, tzinfo=la))
    assert (start, end) == (at(2028, 2, 1), at(2028, 3, 1))


def test_naive_datetime_is_refused():
    with pytest.raises(NaiveDatetimeError) as err:
        project_month_end(dt.datetime(2026, 11, 28), D(0), [], PRICES)
    assert isinstance(err.value, BudgetGuardError)


# --------------------------------------------------------------------------- input validation


def test_missing_prices_are_reported_not_fatal():
    groups = [(P5, 4, "gpu"), ("ml.new.99xlarge", 3, "new"), ("ml.new.99xlarge", 1), ("ml.idle", 0)]
    p = project_month_end(at(2026, 11, 28), D("10"), groups, PRICES)
    assert p.missing_prices == ("ml.new.99xlarge",)  # once; zero-node group not "missing"
    assert [d.name for d in p.drivers] == ["gpu"]
    assert p.projected_total == D("10") + D("98.32") * 4 * 72
    assert "ml.new.99xlarge" in p.reason and "left out" in p.reason


@pytest.mark.parametrize("bad", [1000.0, -1, D("NaN"), "abc", True, None])
def test_bad_month_to_date_is_refused(bad):
    with pytest.raises(InvalidMoney):
        project_month_end(at(2026, 11, 28), bad, [], PRICES)


def test_float_prices_are_refused():
    with pytest.raises(InvalidMoney):
        project_month_end(at(2026, 11, 28), D(0), [(P5, 1)], RateChoice({P5: Rate(P5, 98.32, "list", "x")}, ()))


@pytest.mark.parametrize("bad", [(P5,), (P5, -1), (P5, 1.5), ("", 1), (P5, True), 7])
def test_bad_groups_are_refused(bad):
    with pytest.raises(InvalidGroup):
        project_month_end(at(2026, 11, 28), D(0), [bad], PRICES)


# --------------------------------------------------------------------------- alerts


def _scaled_projection(now=None):
    # 8 x p5 for 72 h = $56,632.32 + $1,000 month to date = $57,632.32
    return project_month_end(now or at(2026, 11, 28), D("1000"), [(P5, 8, "gpu")], PRICES)


def test_alert_summary_says_what_drove_it():
    p = _scaled_projection()
    scale = scale_out_groups(
        {"InstanceGroups": [{"InstanceGroupName": "gpu", "InstanceType": P5, "TargetCount": 4}]},
        {"InstanceGroups": [{"InstanceGroupName": "gpu", "InstanceType": P5, "TargetCount": 8}]},
    )
    alerts = decide_alerts(p, D("50000"), (80, 100), set(), scale_outs=scale)

    assert [a.key for a in alerts] == ["2026-11:projected:80", "2026-11:projected:100"]
    a = alerts[1]
    assert (a.threshold, a.projected, a.limit) == (D(100), D("57632.32"), D("50000"))
    assert a.percent_of_limit == D("115.3")
    assert a.summary == (
        "scale-out of group 'gpu' to 8 x ml.p5.48xlarge (+4): projected $57,632.32 "
        "by 2026-11-30 vs limit $50,000.00 (115.3%, threshold 100%); rates: ml.p5.48xlarge $98.32/h list"
    )


def test_alert_summary_without_scale_out_names_the_top_driver():
    (a,) = decide_alerts(_scaled_projection(), D("55000"), (100,), set())
    assert a.summary.startswith("run rate $786.56/h, mostly 8 x ml.p5.48xlarge (group 'gpu')")


def test_each_threshold_fires_once_per_month():
    p = _scaled_projection()
    fired: set[str] = set()

    first = decide_alerts(p, D("60000"), (80, 100), fired)
    assert [a.key for a in first] == ["2026-11:projected:80"]  # 96% of limit
    fired |= {a.key for a in first}

    assert decide_alerts(p, D("60000"), (80, 100), fired) == []

    # Later the same month it gets worse: only the new threshold fires.
    worse = project_month_end(at(2026, 11, 28), D("5000"), [(P5, 8, "gpu")], PRICES)
    second = decide_alerts(worse, D("60000"), (80, 100), fired)
    assert [a.key for a in second] == ["2026-11:projected:100"]
    fired |= {a.key for a in second}
    assert decide_alerts(worse, D("60000"), (80, 100), fired) == []


def test_a_new_month_fires_again():
    fired = {"2026-11:projected:80", "2026-11:projected:100"}
    december = project_month_end(at(2026, 12, 2), D("0"), [(P5, 8, "gpu")], PRICES)
    alerts = decide_alerts(december, D("100000"), (80, 100), fired)
    assert [a.key for a in alerts] == ["2026-12:projected:80", "2026-12:projected:100"]
    # 8 x $98.32 x 720 h (Dec 2 -> Jan 1) = $566,323.20
    assert alerts[0].summary.endswith(
        "projected $566,323.20 by 2026-12-31 vs limit $100,000.00 (566.3%, threshold 80%); "
        "rates: ml.p5.48xlarge $98.32/h list"
    )


def test_threshold_is_strictly_greater_than_like_budgets():
    p = project_month_end(at(2026, 11, 28), D("100"), [], PRICES)
    assert decide_alerts(p, D("100"), (100,), set()) == []
    assert [a.key for a in decide_alerts(p, D("99.99"), (100,), set())] == ["2026-11:projected:100"]


def test_equal_thresholds_share_one_key():
    assert alert_key("2026-11", D("100.0")) == "2026-11:projected:100"
    assert alert_key("2026-11", D("12.50")) == "2026-11:projected:12.5"
    alerts = decide_alerts(_scaled_projection(), D("1"), (100, D("100.00")), set())
    assert [a.key for a in alerts] == ["2026-11:projected:100"]


def test_missing_prices_caveat_in_summary():
    p = project_month_end(at(2026, 11, 28), D("1000"), [("ml.unknown", 4)], PRICES)
    (a,) = decide_alerts(p, D("900"), (100,), set())
    assert "excludes unpriced ml.unknown" in a.summary


@pytest.mark.parametrize("limit", [D(0), D(-5), 100.0, "abc", D("Infinity")])
def test_bad_limits_are_refused(limit):
    with pytest.raises(InvalidBudgetLimit):
        decide_alerts(_scaled_projection(), limit, (100,), set())


@pytest.mark.parametrize("threshold", [0, -10, 80.0, "x"])
def test_bad_thresholds_are_refused(threshold):
    with pytest.raises(InvalidThreshold):
        decide_alerts(_scaled_projection(), D(1), (threshold,), set())


# --------------------------------------------------------------------------- scale-out detection


def _detail(status="InService", **targets):
    return {
        "ClusterName": "lab",
        "ClusterStatus": status,
        "InstanceGroups": [
            {
                "InstanceGroupName": name,
                "InstanceType": P5 if name.startswith("gpu") else M5,
                "CurrentCount": cur,
                "TargetCount": tgt,
                "Status": "InService",
            }
            for name, (cur, tgt) in targets.items()
        ],
    }


def test_scale_out_is_target_going_up():
    before = _detail(gpu=(4, 4), ctl=(1, 1))
    after = _detail("Updating", gpu=(4, 8), ctl=(1, 1))
    (s,) = scale_out_groups(before, after)
    assert (s.group_name, s.instance_type, s.previous_target, s.new_target, s.delta) == (
        "gpu", P5, 4, 8, 4,
    )


def test_scale_in_and_no_change_are_not_scale_outs():
    assert scale_out_groups(_detail(gpu=(8, 8)), _detail(gpu=(8, 4))) == []
    assert scale_out_groups(_detail(gpu=(4, 4)), _detail(gpu=(4, 4))) == []


def test_new_group_scales_out_from_zero():
    (s,) = scale_out_groups(_detail(ctl=(1, 1)), _detail(ctl=(1, 1), gpu2=(0, 2)))
    assert (s.group_name, s.previous_target, s.new_target) == ("gpu2", 0, 2)


def test_without_previous_event_current_count_is_the_baseline():
    # Creation: nothing running yet, heading to 4 -> scale-out.
    (s,) = scale_out_groups(None, _detail("Creating", gpu=(0, 4)))
    assert (s.previous_target, s.new_target) == (0, 4)
    # First sighting of a steady cluster: no scale-out, no projection.
    assert scale_out_groups(None, _detail(gpu=(4, 4))) == []


def test_deleting_cluster_never_scales_out():
    assert scale_out_groups(_detail(gpu=(0, 0)), _detail("Deleting", gpu=(0, 8))) == []
    assert groups_from_detail(_detail("Deleting", gpu=(8, 8))) == []


def test_groups_from_detail_use_target_counts():
    assert groups_from_detail(_detail("Updating", gpu=(4, 8), ctl=(1, 1))) == [
        GroupLoad(P5, 8, "gpu"),
        GroupLoad(M5, 1, "ctl"),
    ]


def test_malformed_event_groups_are_ignored():
    detail = {"InstanceGroups": [None, {"TargetCount": 3}, {"InstanceGroupName": "g", "TargetCount": "x"}]}
    assert scale_out_groups(None, detail) == []
    assert scale_out_groups(None, {}) == []


# --------------------------------------------------------------------------- budget specs


def test_desired_budget_shape():
    spec = desired_budget("lab-a", D("1500"), TOPIC, ACCOUNT)
    assert spec["AccountId"] == ACCOUNT
    assert spec["Budget"] == {
        "BudgetName": "hpops-lab-a",
        "BudgetLimit": {"Amount": "1500.00", "Unit": "USD"},
        "TimeUnit": "MONTHLY",
        "BudgetType": "COST",
        "FilterExpression": {
            "Tags": {"Key": "ClusterName", "Values": ["lab-a"], "MatchOptions": ["EQUALS"]}
        },
        "Metrics": ["UnblendedCost"],
    }
    assert "CostFilters" not in spec["Budget"]
    notes = sorted(
        (n["Notification"]["NotificationType"], n["Notification"]["Threshold"])
        for n in spec["NotificationsWithSubscribers"]
    )
    assert notes == [("ACTUAL", 50.0), ("ACTUAL", 80.0), ("ACTUAL", 100.0), ("FORECASTED", 100.0)]
    for n in spec["NotificationsWithSubscribers"]:
        assert n["Notification"]["ComparisonOperator"] == "GREATER_THAN"
        assert n["Notification"]["ThresholdType"] == "PERCENTAGE"
        assert n["Subscribers"] == [{"SubscriptionType": "SNS", "Address": TOPIC}]


@pytest.mark.parametrize(
    "name",
    ["", "-lab", "lab-", "lab_1", "lab\n", "lab\nx", "a" * 64, "lab;rm -rf /", "lab:x",
     "lab/action/x", "../lab", "läb", " lab", None, 42],
)
def test_hostile_cluster_names_are_refused(name):
    with pytest.raises(InvalidClusterName):
        desired_budget(name, D(1), TOPIC, ACCOUNT)


@pytest.mark.parametrize("name", ["a", "A1", "lab--x", "a" * 63])
def test_valid_cluster_names(name):
    assert budget_name_for(name) == f"hpops-{name}"


def test_old_user_budgets_are_found_by_their_prefix():
    assert user_budget_prefix("lab") == "hpops-lab-u-"
    with pytest.raises(InvalidClusterName):
        user_budget_prefix("lab;rm")


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"topic_arn": "arn:aws:sqs:us-east-1:123456789012:q"}, InvalidTopicArn),
        ({"account_id": "12345"}, InvalidAccountId),
        ({"limit_usd": D(0)}, InvalidBudgetLimit),
        ({"limit_usd": 100.5}, InvalidBudgetLimit),
    ],
)
def test_spec_inputs_are_validated(kwargs, error):
    args = {"cluster_name": "lab", "limit_usd": D(1), "topic_arn": TOPIC, "account_id": ACCOUNT}
    with pytest.raises(error):
        desired_budget(**{**args, **kwargs})


# --------------------------------------------------------------------------- limit resolution


def test_tag_overrides_default():
    r = resolve_limit(D("1000"), {BUDGET_TAG: " 2500.5 "})
    assert (r.limit, r.source, r.warnings) == (D("2500.50"), "tag", ())


def test_list_style_tags_are_read():
    r = resolve_limit(None, [{"Key": "Other", "Value": "1"}, {"Key": BUDGET_TAG, "Value": "750"}])
    assert (r.limit, r.source) == (D("750"), "tag")


@pytest.mark.parametrize("value", ["1,500", "$1500", "-5", "0", "1e3", "abc", "", "1500.555"])
def test_malformed_tag_warns_and_falls_back(value):
    r = resolve_limit(D("1000"), {BUDGET_TAG: value})
    assert (r.limit, r.source) == (D("1000"), "default")
    (w,) = r.warnings
    assert isinstance(w, MalformedBudgetTag) and w.value == value
    assert "using the default limit $1000" in r.reason


def test_no_default_and_no_tag_is_a_warning_not_a_crash():
    r = resolve_limit(None, {})
    assert r.limit is None and r.source is None
    (w,) = r.warnings
    assert isinstance(w, NoBudgetLimit)


def test_malformed_tag_and_no_default_gives_both_warnings():
    r = resolve_limit(None, {BUDGET_TAG: "lots"})
    assert r.limit is None
    assert [type(w) for w in r.warnings] == [MalformedBudgetTag, NoBudgetLimit]


def test_no_tag_uses_default():
    r = resolve_limit(D("800"), None)
    assert (r.limit, r.source, r.warnings) == (D("800.00"), "default", ())


# --------------------------------------------------------------------------- budget diff


def test_budget_changes():
    desired = desired_budget("lab", D("1500"), TOPIC, ACCOUNT)

    create = budget_changes(None, desired)
    assert (create.action, create.budget_name, create.new_budget) == ("create", "hpops-lab", None)

    # Budgets echoes amounts reformatted; equal as Decimals -> nothing to do.
    same = budget_changes({"BudgetName": "hpops-lab", "BudgetLimit": {"Amount": "1500.0", "Unit": "USD"}}, desired)
    assert same.action == "none"

    period = {"Start": at(2026, 1, 1), "End": at(2087, 6, 15)}
    existing = {
        "BudgetName": "hpops-lab",
        "BudgetLimit": {"Amount": "1000.0", "Unit": "USD"},
        "TimePeriod": period,
        "CalculatedSpend": {"ActualSpend": {"Amount": "5", "Unit": "USD"}},
    }
    change = budget_changes(existing, desired)
    assert change.action == "update-limit"
    assert (change.current_limit, change.desired_limit) == (D("1000.0"), D("1500.00"))
    assert change.new_budget["BudgetLimit"] == {"Amount": "1500.00", "Unit": "USD"}
    assert change.new_budget["TimePeriod"] == period
    assert "CalculatedSpend" not in change.new_budget
    assert "1000.0" in change.reason and "1500.00" in change.reason
    # The spec itself is not mutated.
    assert "TimePeriod" not in desired["Budget"]
