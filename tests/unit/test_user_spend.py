"""Per-user dollars from Slurm usage windows x hourly rates, and the per-user alerts. Pure.

Every figure below is computed by hand in the comments next to it. The month: November 2026,
now 2026-11-20T12:00Z, so 10.5 days (252 h) are left and the run-rate window starts at
2026-11-19T12:00Z.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal as D
from types import MappingProxyType

import pytest

from hpops_core.budget_guard.rates import BilledMonth, BilledUsage, choose_rates, no_billed_month
from hpops_core.budget_guard.usage_reports import UsageRecord
from hpops_core.budget_guard.usage_store import CollectorStatus, StoredWindow
from hpops_core.budget_guard.user_spend import (
    UserLimits,
    decide_user_alerts,
    report_document,
    spend_report,
    user_alert_key,
)

UTC = dt.timezone.utc
NOW = dt.datetime(2026, 11, 20, 12, tzinfo=UTC)
P5, M5, TRN = "ml.p5.48xlarge", "ml.m5.xlarge", "ml.trn1.32xlarge"
GROUPS = {"gpu": "gpu-workers", "cpu": "cpu-workers"}
OBSERVED = [
    {"InstanceGroupName": "gpu-workers", "InstanceType": P5, "CurrentCount": 2},
    {"InstanceGroupName": "cpu-workers", "InstanceType": M5, "CurrentCount": 4},
]
# p5: $45,600 billed over 912 h (2 nodes x 19 days) -> $50/h, billed. m5: not billed yet -> list $0.25/h.
BILLED = BilledMonth(MappingProxyType({P5: BilledUsage(P5, D("45600"), D("912"), "2026-11-01", "2026-11-20")}),
                     other_cost_usd=D("123.45"), start="2026-11-01", end="2026-11-20")
RATES = choose_rates([P5, M5], BILLED, listed={P5: D("55.04"), M5: D("0.25")}, overrides={})
THRESHOLDS = [D(50), D(80), D(100)]


def record(user: str, partition: str, node_seconds: int, gpu_per_node: int = 0, jobs: int = 1) -> UsageRecord:
    return UsageRecord(user, partition, node_seconds, node_seconds * 8, node_seconds * gpu_per_node, jobs)


def window(start: str, *records: UsageRecord, groups=GROUPS) -> StoredWindow:
    return StoredWindow(start, start.replace(":00:00Z", ":55:00Z"), True, "ok", records, dict(groups))


WINDOWS = [
    # alice: 2 p5 node-h = $100, 4 m5 node-h = $1.00
    window("2026-11-05T10:00:00Z", record("alice", "gpu", 7200, gpu_per_node=8), record("alice", "cpu", 14400)),
    # bob: 4 m5 node-h = $1.00
    window("2026-11-10T00:00:00Z", record("bob", "cpu", 14400)),
    # bob: 1 p5 node-h = $50, one hour before the run-rate window starts
    window("2026-11-19T11:00:00Z", record("bob", "gpu", 3600, gpu_per_node=8)),
    # bob: 0.48 p5 node-h = $24, the first window of the last 24 h
    window("2026-11-19T12:00:00Z", record("bob", "gpu", 1728, gpu_per_node=8)),
    # alice: 1.44 p5 node-h = $72, recent
    window("2026-11-20T09:00:00Z", record("alice", "gpu", 5184, gpu_per_node=8, jobs=2)),
]
# alice $173, run rate $72 / 24 h = $3/h, projected 173 + 3 x 252 = $929.
# bob $75, run rate $24 / 24 h = $1/h, projected 75 + 252 = $327.
# Cluster: billed $45,600 + since 2026-11-20T00:00 (12 h) 2 x 12 x $50 + 4 x 12 x $0.25 = $1,212 -> $46,812
# of instances; + $123.45 other = $46,935.45; idle = 46,812 - 248 = $46,564.


# The controller's collector, reporting a few minutes before NOW (the normal case).
FRESH = CollectorStatus("ok", "", "2026-11-20T11:55:00Z", "2026-11-20T11:00:00Z", "i-0123456789abcdef0")


def report(windows=WINDOWS, limits=UserLimits(), collector=FRESH, rates=RATES, billed=BILLED, observed=OBSERVED,
           now=NOW):
    return spend_report("lab", now, windows, observed, rates, billed, limits, collector)


def by_user(spend) -> dict:
    return {u.user: u for u in spend.users}


# --------------------------------------------------------------------------- dollars


def test_each_users_dollars_are_their_node_hours_times_their_partitions_rate():
    spend = report()
    users = by_user(spend)
    assert [u.user for u in spend.users] == ["alice", "bob"], "highest spend first"
    assert users["alice"].usd == D("173")
    assert users["alice"].sources == ("billed", "list")
    assert users["alice"].node_hours == D("7.44")  # 2 + 4 + 1.44
    assert users["alice"].gpu_hours == D("27.52")  # 8 GPUs x 3.44 p5 node-h
    assert users["alice"].jobs == 4
    assert users["bob"].usd == D("75")
    assert users["bob"].sources == ("billed", "list")
    assert users["alice"].unpriced_node_hours == users["bob"].unpriced_node_hours == 0


def test_users_idle_and_other_add_up_to_the_clusters_cost_exactly():
    spend = report()
    assert spend.cluster_cost.usd == D("46935.45")
    assert spend.idle.usd == D("46564") == D("46812") - spend.users_usd
    assert spend.other.usd == D("123.45")
    assert sum((u.usd for u in spend.users), D(0)) + spend.idle.usd + spend.other.usd == spend.cluster_cost.usd
    assert spend.warnings == ()


def test_the_lines_add_up_exactly_when_the_billed_rate_does_not_divide_evenly():
    # $45,524.88 over 909 h is $50.0823762376... an hour, which no decimal writes out: the lines
    # must still add up to the cluster's cost, not to within a rounding digit.
    billed = BilledMonth(MappingProxyType({P5: BilledUsage(P5, D("45524.88"), D("909"), "2026-11-01", "2026-11-20")}),
                         other_cost_usd=D("123.45"), start="2026-11-01", end="2026-11-20")
    rates = choose_rates([P5, M5], billed, listed={M5: D("0.25")}, overrides={})
    spend = report([window("2026-11-05T10:00:00Z", record("alice", "gpu", 1903))], rates=rates, billed=billed)
    assert sum((u.usd for u in spend.users), D(0)) + spend.idle.usd + spend.other.usd == spend.cluster_cost.usd


def test_the_documents_lines_add_up_to_its_cluster_cost_in_cents():
    # What `hpops cost --json` shows: users + idle + other must be the cluster's cost as printed.
    # One m5 node up 4 h at $0.25 = $1.00; alice used 72 s of it = $0.005, idle $0.995.
    now = dt.datetime(2026, 11, 1, 4, tzinfo=UTC)
    observed = [{"InstanceGroupName": "cpu-workers", "InstanceType": M5, "CurrentCount": 1}]
    rates = choose_rates([M5], no_billed_month(), listed={M5: D("0.25")}, overrides={})
    spend = report([window("2026-11-01T02:00:00Z", record("alice", "cpu", 72))], rates=rates,
                   billed=no_billed_month(), observed=observed, now=now)
    assert spend.users_usd + spend.idle.usd + spend.other.usd == spend.cluster_cost.usd == D("1.00")
    document = report_document(spend)
    lines = D(document["usersUsd"]) + D(document["idle"]["usd"]) + D(document["other"]["usd"])
    assert lines == D(document["clusterCost"]["usd"]), (
        f'usersUsd {document["usersUsd"]} + idle {document["idle"]["usd"]} + other {document["other"]["usd"]} '
        f'!= clusterCost {document["clusterCost"]["usd"]}')


def test_a_partition_without_an_instance_group_shows_hours_but_charges_nothing():
    windows = [*WINDOWS, window("2026-11-20T10:00:00Z", record("alice", "debug", 5400), record("carol", "debug", 1800))]
    spend = report(windows)
    users = by_user(spend)
    assert users["alice"].usd == D("173"), "unchanged: debug has no rate"
    assert users["alice"].unpriced_node_hours == D("1.5")
    assert users["alice"].node_hours == D("8.94")
    assert users["carol"].usd == 0 and users["carol"].unpriced_node_hours == D("0.5") and users["carol"].sources == ()
    warning = [w for w in spend.warnings if w["name"] == "UnpricedPartition"]
    assert len(warning) == 1 and "debug" in warning[0]["reason"]
    # The unpriced hours are still paid for by the cluster: they land in idle, and the lines still add up.
    assert spend.idle.usd == D("46564")
    assert spend.users_usd + spend.idle.usd + spend.other.usd == spend.cluster_cost.usd


def test_a_partition_whose_instance_type_has_no_rate_is_named_with_its_type():
    observed = [*OBSERVED, {"InstanceGroupName": "trn-workers", "InstanceType": TRN, "CurrentCount": 0}]
    windows = [window("2026-11-20T10:00:00Z", record("dave", "trn", 3600),
                      groups={**GROUPS, "trn": "trn-workers"})]
    spend = report(windows, observed=observed)
    assert by_user(spend)["dave"].usd == 0 and by_user(spend)["dave"].unpriced_node_hours == 1
    reason = next(w["reason"] for w in spend.warnings if w["name"] == "UnpricedPartition")
    assert f"trn ({TRN})" in reason


def test_the_newest_windows_partition_mapping_prices_the_whole_month():
    # The gpu partition was moved from the p5 group to the m5 group: the newest window says so.
    moved = {**GROUPS, "gpu": "cpu-workers"}
    windows = [window("2026-11-05T10:00:00Z", record("alice", "gpu", 7200)),
               window("2026-11-06T10:00:00Z", record("alice", "gpu", 3600), groups=moved)]
    assert by_user(report(windows))["alice"].usd == D("0.75")  # 3 node-h x $0.25


def test_before_the_first_billed_day_the_cluster_cost_is_the_nodes_up_times_their_rate():
    now = dt.datetime(2026, 11, 1, 6, tzinfo=UTC)
    rates = choose_rates([P5, M5], no_billed_month(), listed={P5: D("55"), M5: D("0.25")}, overrides={})
    windows = [window("2026-11-01T02:00:00Z", record("alice", "gpu", 3600))]
    spend = report(windows, rates=rates, billed=no_billed_month(), now=now)
    # 6 h since midnight: 2 x 6 x $55 + 4 x 6 x $0.25 = $666
    assert spend.cluster_cost.usd == D("666") and spend.idle.usd == D("611")
    assert by_user(spend)["alice"].sources == ("list",)


# --------------------------------------------------------------------------- run rate and projection


def test_run_rate_counts_only_the_last_24_hours_and_projects_to_month_end():
    users = by_user(report())
    assert users["alice"].run_rate_usd_per_hour == D("3")
    assert users["alice"].projected_usd == D("929")  # 173 + 3 x 252
    # bob's $50 window at 11:00 yesterday is before the run-rate window; the 12:00 one is in it.
    assert users["bob"].run_rate_usd_per_hour == D("1")
    assert users["bob"].projected_usd == D("327")


def test_a_user_with_nothing_recent_is_projected_at_what_they_spent():
    windows = WINDOWS[:2]
    users = by_user(report(windows))
    assert users["alice"].run_rate_usd_per_hour == 0 and users["alice"].projected_usd == users["alice"].usd == 101


def test_on_the_last_hour_of_the_month_the_projection_adds_one_hour():
    now = dt.datetime(2026, 11, 30, 23, tzinfo=UTC)
    windows = [window("2026-11-30T22:00:00Z", record("alice", "gpu", 7200))]
    users = by_user(report(windows, now=now))
    # $100 in the last 24 h -> $100/24 per hour, one hour left
    assert users["alice"].usd == D("100")
    assert users["alice"].projected_usd.quantize(D("0.01")) == D("104.17")


# --------------------------------------------------------------------------- limits and alerts


def test_limits_default_override_and_none():
    users = by_user(report(limits=UserLimits(default=D("500"), overrides={"alice": D("1000")})))
    assert (users["alice"].limit_usd, users["alice"].limit_source) == (D("1000"), "override")
    assert (users["bob"].limit_usd, users["bob"].limit_source) == (D("500"), "default")
    assert users["alice"].percent(users["alice"].usd) == D("17.3")
    assert users["bob"].percent(users["bob"].projected_usd) == D("65.4")

    only_alice = by_user(report(limits=UserLimits(overrides={"alice": D("1000")})))
    assert (only_alice["bob"].limit_usd, only_alice["bob"].limit_source) == (None, None)
    assert only_alice["bob"].percent(only_alice["bob"].usd) is None


def test_no_limit_means_no_alerts_whatever_the_spend():
    assert decide_user_alerts(report(limits=UserLimits()), THRESHOLDS, set()) == []


def test_crossing_80_percent_projected_sends_one_projected_alert_once():
    spend = report(limits=UserLimits(overrides={"alice": D("1000")}))
    # alice: actual 17.3 %, projected 92.9 %; bob has no limit
    alerts = decide_user_alerts(spend, [D(80), D(100)], set())
    assert len(alerts) == 1
    alert = alerts[0]
    assert (alert.user, alert.kind, alert.threshold) == ("alice", "projected", D(80))
    assert alert.key == "2026-11:user:alice:projected:80" and alert.crossed == (alert.key,)
    assert "$929.00" in alert.summary and "92.9%" in alert.summary and "$1,000.00" in alert.summary
    assert decide_user_alerts(spend, [D(80), D(100)], {"2026-11:user:alice:projected:80"}) == []


def test_a_jump_from_50_to_120_percent_sends_one_alert_covering_both_thresholds():
    spend = report(limits=UserLimits(overrides={"alice": D("144")}))
    # alice actual 173 / 144 = 120.1 %; she was at 50 % before, which already alerted.
    fired = {"2026-11:user:alice:actual:50", "2026-11:user:alice:projected:50"}
    alerts = {a.kind: a for a in decide_user_alerts(spend, THRESHOLDS, fired)}
    actual = alerts["actual"]
    assert actual.threshold == D(100) and actual.key == "2026-11:user:alice:actual:100"
    assert actual.crossed == ("2026-11:user:alice:actual:80", "2026-11:user:alice:actual:100")
    assert "120.1%" in actual.summary and "has spent $173.00" in actual.summary


def test_actual_and_projected_alerts_are_kept_apart():
    spend = report(limits=UserLimits(overrides={"alice": D("144")}))
    alerts = decide_user_alerts(spend, THRESHOLDS, set())
    assert sorted((a.kind, a.key) for a in alerts) == [
        ("actual", "2026-11:user:alice:actual:100"), ("projected", "2026-11:user:alice:projected:100")]
    # The actual alert having fired does not silence the projected one, and the other way round.
    actual_fired = set(next(a for a in alerts if a.kind == "actual").crossed)
    assert [a.kind for a in decide_user_alerts(spend, THRESHOLDS, actual_fired)] == ["projected"]
    projected_fired = set(next(a for a in alerts if a.kind == "projected").crossed)
    assert [a.kind for a in decide_user_alerts(spend, THRESHOLDS, projected_fired)] == ["actual"]
    assert decide_user_alerts(spend, THRESHOLDS, actual_fired | projected_fired) == []


def test_alert_keys_are_the_same_however_the_threshold_is_written():
    assert user_alert_key("2026-11", "alice", "projected", D("80")) == "2026-11:user:alice:projected:80"
    assert user_alert_key("2026-11", "alice", "projected", D("80.0")) == "2026-11:user:alice:projected:80"
    assert user_alert_key("2026-11", "alice", "actual", D("100")) == "2026-11:user:alice:actual:100"
    assert user_alert_key("2026-11", "alice", "actual", D("87.5")) == "2026-11:user:alice:actual:87.5"


# --------------------------------------------------------------------------- the document


def test_the_document_shows_money_with_two_decimals():
    spend = report(limits=UserLimits(default=D("500"), overrides={"alice": D("1000")}))
    document = report_document(spend, THRESHOLDS)
    alice, bob = document["users"]
    assert alice == {
        "user": "alice", "nodeHours": "7.44", "gpuHours": "27.52", "jobs": 4, "usd": "173.00",
        "unpricedNodeHours": "0.00", "runRateUsdPerHour": "3.00", "projectedUsd": "929.00",
        "limitUsd": "1000.00", "limitSource": "override", "percentOfLimit": "17.3",
        "projectedPercentOfLimit": "92.9", "rateSources": ["billed", "list"],
    }
    assert (bob["usd"], bob["projectedUsd"], bob["limitUsd"], bob["limitSource"]) == (
        "75.00", "327.00", "500.00", "default")
    assert document["usersUsd"] == "248.00"
    assert document["idle"]["usd"] == "46564.00"
    assert document["other"]["usd"] == "123.45"
    assert document["clusterCost"]["usd"] == "46935.45"
    assert (document["cluster"], document["month"], document["asOf"]) == ("lab", "2026-11", "2026-11-20T12:00:00Z")
    assert document["thresholdsPercent"] == ["50", "80", "100"]
    assert {r["instanceType"]: (r["usdPerHour"], r["source"]) for r in document["rates"]} == {
        P5: ("50", "billed"), M5: ("0.25", "list")}
    assert document["collector"]["status"] == "ok"


def test_the_document_rounds_half_a_cent_up():
    windows = [window("2026-11-01T10:00:00Z", record("alice", "cpu", 72))]  # 0.02 m5 node-h x $0.25 = $0.005
    spend = report(windows)
    assert by_user(spend)["alice"].usd == D("0.005")
    alice = report_document(spend)["users"][0]
    assert alice["usd"] == "0.01" and alice["nodeHours"] == "0.02" and alice["limitUsd"] is None


def test_a_collector_that_did_not_read_sacct_is_a_warning_in_the_report():
    collector = CollectorStatus("sacct failed", "Problem talking to the database: Connection refused",
                                "2026-11-20T11:55:00Z", "2026-11-20T11:00:00Z", "i-0123456789abcdef0")
    spend = report(collector=collector)
    warnings = {w["name"]: w["reason"] for w in spend.warnings}
    assert "UsageNotCollected" in warnings
    assert "sacct failed" in warnings["UsageNotCollected"] and "Connection refused" in warnings["UsageNotCollected"]
    assert report_document(spend)["collector"] == {
        "status": "sacct failed", "reason": "Problem talking to the database: Connection refused",
        "collectedAt": "2026-11-20T11:55:00Z", "windowStart": "2026-11-20T11:00:00Z"}
    # The figures up to the last window read are still there.
    assert by_user(spend)["alice"].usd == D("173")


def test_a_collector_that_reads_sacct_adds_no_warning():
    collector = CollectorStatus("ok", "", "2026-11-20T11:55:00Z", "2026-11-20T11:00:00Z", "i-0123456789abcdef0")
    spend = report(collector=collector)
    assert spend.warnings == () and report_document(spend)["collector"]["status"] == "ok"


def test_users_above_the_clusters_cost_are_flagged_not_hidden():
    # Today's bill is not in yet and the nodes left: users' allocations exceed what the cluster cost.
    observed = [{**g, "CurrentCount": 0} for g in OBSERVED]
    windows = [window("2026-11-20T10:00:00Z", record("alice", "gpu", 7200))]
    billed = BilledMonth(MappingProxyType({P5: BilledUsage(P5, D("50"), D("1"), "2026-11-01", "2026-11-20")}),
                         other_cost_usd=D(0), start="2026-11-01", end="2026-11-20")
    spend = report(windows, billed=billed, observed=observed)
    assert spend.idle.usd == D("-50")
    assert [w["name"] for w in spend.warnings] == ["AllocatedAboveCapacity"]
    assert spend.users_usd + spend.idle.usd + spend.other.usd == spend.cluster_cost.usd


def test_now_must_carry_a_time_zone():
    with pytest.raises(ValueError):
        report(now=dt.datetime(2026, 11, 20, 12))


def test_a_collector_note_such_as_untracked_gpus_is_shown_with_an_ok_status():
    collector = CollectorStatus("ok", "GPU-seconds are not tracked: AccountingStorageTRES lacks gres/gpu",
                                "2026-11-20T11:55:00Z", "2026-11-20T11:00:00Z", "i-0123456789abcdef0")
    warnings = {w["name"]: w["reason"] for w in report(collector=collector).warnings}
    assert "gres/gpu" in warnings["UsageNote"] and "UsageNotCollected" not in warnings
    assert "UsageNote" not in {w["name"] for w in report(collector=collector.__class__(
        "ok", "", "2026-11-20T11:55:00Z", "2026-11-20T11:00:00Z", "i-0123456789abcdef0")).warnings}


def test_no_report_yet_or_a_collector_that_stopped_is_a_warning_not_silence():
    assert "NoUsageReport" in {w["name"] for w in report(collector=None).warnings}
    stopped = CollectorStatus("ok", "", "2026-11-20T09:30:00Z", "2026-11-20T09:00:00Z", "i-0123456789abcdef0")
    warnings = {w["name"]: w["reason"] for w in report(collector=stopped).warnings}  # NOW is 12:00
    assert "2 h ago" in warnings["UsageReportsStale"]
    assert "UsageReportsStale" not in {w["name"] for w in report().warnings}
