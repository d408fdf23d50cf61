"""Where an operator sees each alarm and each named error of docs/troubleshooting.md, now that only
alarmed metrics are published (the other figures are log lines the dashboard queries): every alarm
watches a metric that is still sent, pages AlertTopic and is on the dashboard or in `hpops status`;
every named error reaches an alarm through the failure it causes."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from hpops_core.common.observability import ALARMED_METRICS
from hpops_twin.cost_model import emitted_metrics, per_month
from hpops_twin.template_model import REPO_ROOT, TemplateModel

sys.path.insert(0, str(Path(__file__).parent))
from test_dashboard import alarm_names, figures_queried, substituted  # noqa: E402

TEMPLATE = TemplateModel()
ALARMS = {name: r for name, r in TEMPLATE.raw["Resources"].items() if r["Type"] == "AWS::CloudWatch::Alarm"}
PAGE = (REPO_ROOT / "docs" / "troubleshooting.md").read_text(encoding="utf-8")
# AWS's own metrics, free: a failed or timed-out execution, an event EventBridge could not deliver.
FREE_NAMESPACES = {"AWS/States", "AWS/SQS", "AWS/Lambda", "AWS/Events"}

# Each error section of the page, and the alarms its errors reach: a Lambda task's error fails its
# execution (ExecutionsFailed, the error name and cause in the execution); an EventBridge target's
# refusal sends the event to the DLQ. `hpops status` lists every alarm of the stack with its state.
SEEN_THROUGH = {
    "Errors of the login-node sync and the node channel": {"SyncExecutionsFailedAlarm", "SafetyGuardAlarm",
                                                           "EventDeliveryDLQAlarm"},
    "Errors of host identity": {"SyncExecutionsFailedAlarm", "HostIdentityRejectedAlarm",
                                "HostCertificateRenewalFailedAlarm"},
    "Errors of session limits": {"SessionLimitsExecutionsFailedAlarm", "LoginLimitsPushFailedAlarm"},
    "Errors of the budget guard and holds": {"BudgetGuardExecutionsFailedAlarm", "EventDeliveryDLQAlarm"},
}
# What the dashboard graphed as custom metrics before they became log lines: still shown, from the logs.
GRAPHED_BEFORE = {"LoginNodesServing", "TargetsRegistered", "TargetsDeregistered", "HostIdentityVerified",
                  "HostIdentityRejected", "SafetyGuardTripped", "SessionsEnded", "SshSessionsEnded",
                  "LoginLimitsPushFailed", "NodeReportRejected", "ClusterBudgetUsd", "BudgetProjectionAlerts",
                  "ClusterCostUsd", "UsersUsd", "IdleUsd", "UsersHeld", "UserSpendAlerts"}


def sections() -> dict[str, set[str]]:
    """Section heading -> the error names its table lists."""
    found = {}
    for block in re.split(r"^## ", PAGE, flags=re.M)[1:]:
        heading, _, body = block.partition("\n")
        rows = [line for line in body.splitlines() if line.startswith("| `")]
        found[heading.strip()] = {name for row in rows for name in re.findall(r"`(\w+)`", row.split("|")[1])}
    return found


def test_only_alarmed_metrics_are_published_and_every_alarm_on_ours_is_in_the_list():
    ours = {r["Properties"]["MetricName"] for r in ALARMS.values()
            if r["Properties"].get("Namespace") == "HyperPodLoginAutopilot"}
    assert ours == ALARMED_METRICS, "an alarm on a metric observability.ALARMED_METRICS does not publish never fires"


def test_every_alarm_watches_a_metric_that_is_sent_and_pages_the_alert_topic():
    emitted = set(emitted_metrics())
    for name, resource in ALARMS.items():
        alarm = resource["Properties"]
        assert alarm["AlarmActions"] == [{"Ref": "AlertTopic"}], name
        if alarm["Namespace"] in FREE_NAMESPACES:
            continue
        service = next(d["Value"] for d in alarm["Dimensions"] if d["Name"] == "service")
        assert (service, alarm["MetricName"]) in emitted, f"{name}: no {service} handler counts {alarm['MetricName']}"
        # Sent only when non-zero: a quiet period is missing data, which must mean what a zero meant.
        assert alarm["TreatMissingData"] == "notBreaching", name
        assert alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold" and alarm["Threshold"] >= 1, name


def test_every_alarm_is_on_the_dashboard_or_exists_only_with_its_feature():
    shown = set(alarm_names())
    for name, resource in ALARMS.items():
        assert name in shown or resource.get("Condition"), f"{name} is neither on the dashboard nor conditional"
        assert f"`{name}`" in PAGE, f"{name} is not explained in docs/troubleshooting.md"


def test_the_push_failure_alarm_counts_session_sweeps():
    alarm = ALARMS["LoginLimitsPushFailedAlarm"]["Properties"]
    sweep_seconds = 730 * 3600 / per_month(TEMPLATE.parameter_defaults()["SessionSweepSchedule"])
    assert alarm["Period"] == sweep_seconds and alarm["EvaluationPeriods"] == alarm["DatapointsToAlarm"] == 3


def test_every_named_error_reaches_an_alarm():
    found = sections()
    assert set(SEEN_THROUGH) == {h for h in found if h.startswith("Errors of")}
    for heading, alarms in SEEN_THROUGH.items():
        assert found[heading], heading
        assert alarms <= set(ALARMS), f"{heading}: {sorted(alarms - set(ALARMS))} are not alarms of the template"
    named = [e for h in SEEN_THROUGH for e in found[h]]
    assert len(named) == len(set(named)), "an error is listed in two sections"
    assert {"EmptyListingGuardError", "HostUnreachable", "TerminateFailed", "HoldsTooLarge"} <= set(named)


def test_what_the_dashboard_graphed_as_metrics_it_still_shows_from_the_logs():
    assert GRAPHED_BEFORE <= figures_queried(substituted(True)["widgets"])
