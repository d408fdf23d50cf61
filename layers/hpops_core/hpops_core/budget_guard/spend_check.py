"""Per-user spend, step by step: gather (usage, rates, the bill) -> decide (user_spend) -> mark -> send.

CheckUserSpend gathers and decides and marks each alert fired (a conditional put, once per user,
kind, threshold and month); PublishUserSpendAlert sends one, with the state machine's retries. A
send that fails for good fails the execution, and its alarm fires: an alert is never dropped
after it was marked.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from typing import Any

from hpops_core.budget_guard import hold_state, usage_store
from hpops_core.budget_guard.guard import AlertDeliveryError
from hpops_core.budget_guard.alert_state import alert_table, fired_keys, mark_fired
from hpops_core.budget_guard.ce_cache import CacheOutcome, billed_month_cached
from hpops_core.budget_guard.pricing import rates_for
from hpops_core.budget_guard.user_spend import SpendReport, decide_user_alerts, report_document, spend_report
from hpops_core.common.clients import transient_errors_named

USER_ALERT_SOURCE = "hpops.budget-guard"
USER_ALERT_DETAIL_TYPE = "HyperPod User Spend Alert"
# SNS message attribute a user's subscription filters on ({"user": ["alice"]}): each user gets their own.
USER_ATTRIBUTE = "user"
# The highest spenders logged one line each (the dashboard's per-user table reads them); the rest
# are in `hpops cost`. Bounded so the state stays far below Step Functions' 256 KB.
MAX_USER_ROWS = 200


def gather_report(config: Any, observed: Mapping[str, Any], now: dt.datetime, *, ce: Any, pricing: Any,
                  dynamodb: Any = None, items: dict[str, dict[str, Any]] | None = None,
                  fresh: bool = False, keep: bool = True) -> tuple[SpendReport, CacheOutcome]:
    """Everything the report needs, read once: the month's usage, the collector's status, rates; and
    where the billed month came from (Cost Explorer's answer is kept up to ``ce_max_age_hours``).

    ``items``: usage_store.cluster_items() when the caller read them (the collector's status is one).
    ``fresh``: ask Cost Explorer whatever is kept (`hpops cost --fresh`); ``keep``: store a new answer."""
    month = f"{now.astimezone(dt.timezone.utc):%Y-%m}"
    windows = usage_store.month_usage(config.state_table, config.cluster_name, month, dynamodb)
    collector = usage_store.collector_status(config.state_table, config.cluster_name, dynamodb, items)
    groups = observed.get("InstanceGroups") or []
    types = sorted({g["InstanceType"] for g in groups if isinstance(g.get("InstanceType"), str)})
    billed, outcome = billed_month_cached(ce, config.state_table, config.cluster_name, now, config.ce_max_age_hours,
                                          fresh=fresh, keep=keep, dynamodb=dynamodb)
    rates, billed = rates_for(types, billed=billed, pricing=pricing, cluster_name=config.cluster_name,
                              region=config.region, overrides=config.rate_overrides, now=now)
    return spend_report(config.cluster_name, now, windows, groups, rates, billed, config.limits, collector), outcome


def check_user_spend(config: Any, request: Mapping[str, Any], observed: Mapping[str, Any], *, ce: Any, pricing: Any,
                     owner: str) -> dict[str, Any]:
    """The month so far per user -> the alerts not sent yet, marked fired. Returns a summary, not the
    whole report: Step Functions state is capped at 256 KB and a cluster can have hundreds of users."""
    now = dt.datetime.fromisoformat(request["now"])
    items = usage_store.cluster_items(config.state_table, config.cluster_name)
    report, cost_explorer = gather_report(config, observed, now, ce=ce, pricing=pricing, items=items)
    table = alert_table(config.state_table)
    with transient_errors_named("dynamodb:Query"):
        already = fired_keys(table, config.cluster_name, report.month)
    document = report_document(report)
    spend_of = {u["user"]: u for u in document["users"]}
    alerts = []
    for alert in decide_user_alerts(report, config.thresholds, already):
        with transient_errors_named("dynamodb:PutItem"):
            won = mark_fired(table, config.cluster_name, alert.key, now, owner=owner)
            for lower in alert.crossed:
                if lower != alert.key:
                    mark_fired(table, config.cluster_name, lower, now, owner=owner)
        if won:
            alerts.append({"cluster": report.cluster, "month": report.month, "asOf": report.as_of, "user": alert.user,
                           "kind": alert.kind, "thresholdPercent": f"{alert.threshold.normalize():f}",
                           "summary": alert.summary, "spend": spend_of[alert.user]})
    # Holds are decided from the same report, after the spend alerts (their alerts go out with them).
    holds = hold_state.check_holds(config, report, now, owner, config.stack_name, items)
    alerts += holds.pop("alerts")
    top = ", ".join(f"{u['user']} ${u['usd']}" for u in document["users"][:3])
    rows = [{k: u[k] for k in ("user", "nodeHours", "gpuHours", "usd", "percentOfLimit", "projectedUsd")}
            for u in document["users"][:MAX_USER_ROWS]]
    return {
        "userRows": rows,
        "users": len(report.users), "usersUsd": document["usersUsd"], "idleUsd": document["idle"]["usd"],
        "clusterCostUsd": document["clusterCost"]["usd"], "warnings": document["warnings"], "alerts": alerts, "alertCount": len(alerts),
        "reason": (f"{len(report.users)} user(s) this month, top: {top or 'none'}; {len(alerts)} new alert(s)"),
        "holds": holds,
        "costExplorer": cost_explorer.as_dict(),
    }


def user_alert_text(alert: Mapping[str, Any]) -> str:
    spend = alert["spend"]
    return "\n".join([
        alert["summary"],
        "",
        f"Month so far ({alert['month']}, as of {alert['asOf']}): ${spend['usd']} for {spend['nodeHours']} node-hours "
        f"({spend['gpuHours']} GPU-hours, {spend['jobs']} job(s)); rates from {', '.join(spend['rateSources']) or 'none'}.",
        f"Run-rate over the last 24 h: ${spend['runRateUsdPerHour']}/h; projected month end: ${spend['projectedUsd']}.",
        f"Limit: ${spend['limitUsd']} ({spend['limitSource']}). Each threshold alerts once per month.",
        "",
        "From Slurm accounting on the cluster's controller (sacct), priced per instance type; "
        "`hpops cost` shows every user.",
    ])


def publish_user_alert(config: Any, alert: Mapping[str, Any], *, sns: Any, events: Any) -> dict[str, Any]:
    """To the platform team's topic, to the users' topic with the user as a message attribute (a
    user's e-mail subscription filters on it), and as an event on the default bus."""
    if alert.get("kind") == "hold":  # a Slurm hold's transition: held, released, could not apply
        subject = f"[hpops] {alert['cluster']}: {alert['user']} {alert['transition']}"[:100]
        text, kind = alert["text"], "user-hold"
    else:
        subject = f"[hpops] {alert['cluster']}: {alert['user']} at {alert['thresholdPercent']}% ({alert['kind']})"[:100]
        text, kind = user_alert_text(alert), "user-spend"
    attributes = {USER_ATTRIBUTE: {"DataType": "String", "StringValue": alert["user"]},
                  "kind": {"DataType": "String", "StringValue": kind}}
    ids = {}
    with transient_errors_named("sns:Publish"):
        ids["platformMessageId"] = sns.publish(TopicArn=config.alert_topic_arn, Subject=subject, Message=text,
                                               MessageAttributes=attributes)["MessageId"]
        if config.user_topic_arn:
            ids["userMessageId"] = sns.publish(TopicArn=config.user_topic_arn, Subject=subject, Message=text,
                                               MessageAttributes=attributes)["MessageId"]
    with transient_errors_named("events:PutEvents"):
        response = events.put_events(Entries=[{"Source": USER_ALERT_SOURCE, "DetailType": USER_ALERT_DETAIL_TYPE,
                                               "Detail": json.dumps(alert, sort_keys=True), "EventBusName": "default"}])
    if response.get("FailedEntryCount"):
        raise AlertDeliveryError("events:PutEvents refused the user spend alert")
    return {**ids, "summary": alert["summary"]}
