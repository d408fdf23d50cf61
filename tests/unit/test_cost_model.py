"""The monthly cost model: schedules, metric counting, and the parts a parameter switches off."""

import json

import pytest

from hpops_twin.cost_model import REPO_ROOT, cost_table, emitted_metrics, per_month
from hpops_twin.template_model import TemplateModel

BENCH = json.loads((REPO_ROOT / "docs" / "bench.json").read_text(encoding="utf-8"))


def test_schedules_per_730_hour_month():
    assert per_month("rate(10 minutes)") == 4380
    assert per_month("rate(1 hour)") == 730
    assert per_month("rate(1 day)") == pytest.approx(730 / 24)
    with pytest.raises(ValueError):
        per_month("cron(0 * * * ? *)")


def test_every_alarmed_metric_is_one_the_model_counts():
    counted = set(emitted_metrics())
    alarms = [a["Properties"] for a in TemplateModel().of_type("AWS::CloudWatch::Alarm").values()
              if a["Properties"].get("Namespace") == "HyperPodLoginAutopilot"]
    assert alarms
    for alarm in alarms:
        service = next(d["Value"] for d in alarm["Dimensions"] if d["Name"] == "service")
        assert (service, alarm["MetricName"]) in counted, alarm["MetricName"]


def lines(table: dict) -> dict[str, dict]:
    return {line["item"]: line for line in table["lines"]}


def test_the_dashboard_and_load_balancer_are_switched_off_by_parameter():
    defaults = cost_table(BENCH)
    lean = cost_table(BENCH, {"CreateDashboard": "false"})
    assert lines(defaults)["CloudWatch dashboard"]["usd"] == 3.00 and lines(lean)["CloudWatch dashboard"]["usd"] == 0
    assert defaults["automation_usd"] - lean["automation_usd"] == pytest.approx(3.00)
    existing = cost_table(BENCH, {"ExistingTargetGroupArn": "arn:aws:elasticloadbalancing:us-east-1:123456789012:targetgroup/x/1"})
    assert existing["with_load_balancer_usd"] == existing["automation_usd"] == defaults["automation_usd"]


def test_cost_explorer_line_follows_the_measured_day_of_sweeps():
    bench = json.loads(json.dumps(BENCH))
    day = next(r for r in bench["budget_guard"] if r["scenario"].startswith("day of hourly sweeps"))
    assert day["calls"]["cost-explorer.GetCostAndUsage"] == 1, "the kept answer serves a day of sweeps"
    assert lines(cost_table(BENCH))["Cost Explorer requests"]["usd"] == 0.30  # was 7.30: one request a sweep
    # A shorter max age asks proportionally more often, never more than once a sweep.
    assert lines(cost_table(BENCH, {"CostExplorerMaxAgeHours": "6"}))["Cost Explorer requests"]["usd"] == 1.22
    assert lines(cost_table(BENCH, {"CostExplorerMaxAgeHours": "1"}))["Cost Explorer requests"]["usd"] == 7.30
    day["calls"]["cost-explorer.GetCostAndUsage"] = 24  # had every sweep asked
    assert lines(cost_table(bench))["Cost Explorer requests"]["usd"] == 7.30


def test_refreshing_the_cost_changes_only_its_key(tmp_path, capsys):
    from hpops_twin.cost_model import main

    stale = json.loads(json.dumps(BENCH))
    stale["cost"] = {"defaults": {"automation_usd": 0}}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(stale, indent=2) + "\n", encoding="utf-8")
    assert main([str(path)]) == 0
    refreshed = json.loads(path.read_text(encoding="utf-8"))
    assert {k: v for k, v in refreshed.items() if k != "cost"} == {k: v for k, v in BENCH.items() if k != "cost"}
    assert refreshed["cost"] == BENCH["cost"]
    assert f"{BENCH['cost']['defaults']['automation_usd']:.2f}" in capsys.readouterr().out


def test_without_per_user_spend_its_metrics_usage_reports_and_cost_explorer_requests_go():
    defaults, off = cost_table(BENCH), cost_table(BENCH, {"UserSpendEnabled": "false"})
    on_lines, off_lines = lines(defaults), lines(off)
    assert off_lines["Cost Explorer requests"]["quantity"] == 0
    gone = set(defaults["metrics"]) - set(off["metrics"])
    assert {"budget-guard/UsersUsd", "budget-guard/UserSpendAlerts", "budget-guard/UsageRecords"} <= gone
    assert not any(m.startswith("budget-guard/Budget") for m in gone), "the cluster budget's metrics stay"
    # The controller ships no usage: only the login nodes' reports remain on the bus.
    assert off_lines["EventBridge custom-bus events"]["quantity"] == 4 * 730 * 6
    assert off_lines["Step Functions standard state transitions"]["quantity"] < on_lines["Step Functions standard state transitions"]["quantity"]
    assert off["automation_usd"] < defaults["automation_usd"]
    both = cost_table(BENCH, {"UserSpendEnabled": "false", "CreateDashboard": "false"})
    assert both["automation_usd"] == pytest.approx(off["automation_usd"] - 3.00)


def test_the_goals_hold_at_the_defaults_with_every_feature_on_and_with_the_optional_parts_off():
    from hpops_twin.cost_model import EVERY_FEATURE, GOAL_EVERY_FEATURE_USD, GOAL_LEAN_USD, LEAN

    assert cost_table(BENCH)["automation_usd"] <= GOAL_EVERY_FEATURE_USD
    assert cost_table(BENCH, EVERY_FEATURE)["automation_usd"] <= GOAL_EVERY_FEATURE_USD
    assert cost_table(BENCH, LEAN)["automation_usd"] <= GOAL_LEAN_USD


def test_only_the_metrics_an_alarm_of_the_stack_watches_are_billed_and_a_healthy_month_sends_no_failure_metric():
    keys, certificate = cost_table(BENCH), cost_table(BENCH, {"HostIdentityMode": "certificate"})
    admission_off = cost_table(BENCH, {"LoadAwareAdmission": "off"})
    notices_off = cost_table(BENCH, {"LeaveNoticeMinutes": "off"})
    # The upper bound, every alarm's metric sent all month: renewals cannot fail outside certificate mode;
    # LoginImbalance exists only with load-aware admission, LeaveNoticesFailed only with leave notices on.
    assert [t["every_alarm_all_month"]["metrics"] for t in (keys, certificate, admission_off, notices_off)] == [5, 6, 4, 4]
    # A healthy month: only LoginImbalance (admission's dry-run reports imbalance in normal operation), all month.
    healthy = [lines(t)["CloudWatch custom metrics"] for t in (keys, certificate, admission_off, notices_off)]
    assert [line["quantity"] for line in healthy] == [1, 1, 0, 1]
    assert [line["usd"] for line in healthy] == [0.30, 0.30, 0.0, 0.30]
    assert "LoginImbalance all month" in healthy[0]["how"] and "$1.50" in healthy[0]["how"]
    # The two totals differ by exactly the failure metrics priced all month ($0.30 each).
    for table, failures in ((keys, 4), (certificate, 5), (admission_off, 4), (notices_off, 3)):
        assert table["every_alarm_all_month"]["automation_usd"] == pytest.approx(table["automation_usd"] + 0.30 * failures)
    assert len(keys["metrics"]) > 40, "every figure a handler counts is still listed, as a log line"


def test_every_alarmed_metric_is_priced_as_normal_operation_or_as_a_failure():
    from hpops_core.common.observability import ALARMED_METRICS
    from hpops_twin.cost_model import SENT_IN_A_HEALTHY_MONTH, SENT_ONLY_ON_FAILURE

    assert SENT_IN_A_HEALTHY_MONTH | SENT_ONLY_ON_FAILURE == ALARMED_METRICS
    assert not SENT_IN_A_HEALTHY_MONTH & SENT_ONLY_ON_FAILURE


def test_each_line_shows_its_figure_before_the_cost_work():
    from hpops_twin.cost_model import cost_section, render

    defaults = cost_section(BENCH)["defaults"]
    assert lines(defaults)["CloudWatch custom metrics"]["before_usd"] == 13.80
    assert defaults["before_automation_usd"] == 24.69 and defaults["automation_usd"] < defaults["before_automation_usd"]
    assert "24.69" in render(defaults) and f"{defaults['automation_usd']:.2f}" in render(defaults)


def test_the_key_rotates_yearly_by_default_and_its_price_by_year_is_the_models():
    """A yearly rotation (what audits expect) by default, its price stated per year for both choices as the
    cost model computes it for the defaults with 100 users logged in (docs/bench.json, scale_sessions)."""
    import re

    template = TemplateModel()
    assert template.raw["Resources"]["HostIdentityKey"]["Properties"]["RotationPeriodInDays"] == {"Ref": "KeyRotationPeriodDays"}
    assert str(template.parameter_defaults()["KeyRotationPeriodDays"]) == "365"
    by_rotation = next(r for r in BENCH["scale_sessions"]["rows"] if r["login_nodes"] == 4)["cost"]["automation_by_rotation_usd"]
    text = " ".join((REPO_ROOT / "docs" / "security.md").read_text(encoding="utf-8").split())
    yearly = re.search(r"from \$([\d.]+) a month in year 1 to \$([\d.]+) in year 2 and \$([\d.]+) from year 3", text).groups()
    assert [float(q) for q in yearly] == [by_rotation["365"][y] for y in ("1", "2", "3")]
    longest = re.search(r"sets 2,560 \(.*?: \$([\d.]+) a month through year 7\)", text).group(1)
    assert float(longest) == by_rotation["2560"]["3"] == by_rotation["2560"]["1"]
    paged = next(r for r in BENCH["scale_sessions"]["rows"] if r["login_nodes"] == 4)["cost"]["every_alarm_all_month_by_year_usd"]
    upper = re.search(r"a month of pages\) the same years cost \$(\d+\.\d\d), \$(\d+\.\d\d) and \$(\d+\.\d\d)", text).groups()
    assert [float(q) for q in upper] == [paged[y] for y in ("1", "2", "3")]


def test_the_goals_at_a_real_clusters_size_hold_in_a_healthy_month_from_the_keys_third_year():
    """At most $10 at the defaults with 100 users logged in and $20 at 12 login nodes and 2,000 users, the key's
    two yearly rotations counted, in a healthy month; the upper bound (every alarm all month) is its month plus
    the failure metrics, and stays beside it."""
    from hpops_twin.cost_model import GOAL_100_USERS_USD, GOAL_2000_USERS_USD

    rows = {r["logged_in"]: r["cost"] for r in BENCH["scale_sessions"]["rows"]}
    assert rows[100]["automation_by_year_usd"]["3"] <= GOAL_100_USERS_USD == 10.0
    assert rows[500]["automation_by_year_usd"]["3"] <= GOAL_2000_USERS_USD == 20.0
    failures = BENCH["cost"]["defaults"]["every_alarm_all_month"]["automation_usd"] - BENCH["cost"]["defaults"]["automation_usd"]
    for cost in rows.values():
        for year, healthy in cost["automation_by_year_usd"].items():
            assert cost["every_alarm_all_month_by_year_usd"][year] == pytest.approx(healthy + failures, abs=0.011)


def test_each_scale_size_is_priced_from_the_figures_it_stored():
    """The sessions-at-scale section's month is the cost model's for the figures that section measured, so
    `python -m hpops_twin.cost_model` refreshes it without measuring again (the section takes minutes)."""
    from hpops_twin.cost_model import scale_row_cost

    rows = BENCH["scale_sessions"]["rows"]
    assert [r["login_nodes"] for r in rows] == [4, 12, 50]
    for row in rows:
        priced = json.loads(json.dumps(scale_row_cost(row, BENCH)))
        assert row["cost"] == priced, f"{row['login_nodes']} login nodes: stale: python -m hpops_twin.cost_model"
        assert row["monthly_usd"] == priced["automation_usd"]
    # More login nodes and users cost more, by their heartbeats and session changes.
    assert rows[0]["monthly_usd"] < rows[1]["monthly_usd"] < rows[2]["monthly_usd"]


def test_keys_mode_has_one_secret_and_certificate_mode_adds_the_cas():
    keys, certificate = cost_table(BENCH), cost_table(BENCH, {"HostIdentityMode": "certificate"})
    assert lines(keys)["Secrets Manager"]["quantity"] == 1 and lines(keys)["Secrets Manager"]["usd"] == 0.40
    assert lines(certificate)["Secrets Manager"]["quantity"] == 2 and lines(certificate)["Secrets Manager"]["usd"] == 0.80
