"""Per-user spend, step by step: gather (usage, rates, the bill) -> decide (user_spend) -> queue -> mark -> send.

CheckUserSpend gathers and decides, queues each new alert as an item (alert_outbox) and then marks
it fired (once per user, kind, threshold and month); SendUserAlerts sends the queued alerts a page
at a time, each deleted only after it was sent. A send that fails leaves its alert queued and fails
the execution (its alarm fires); the next sweep sends it: an alert is never dropped after it was marked.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from typing import Any

from hpops_core.budget_guard import alert_outbox, hold_state, usage_store
from hpops_core.budget_guard.guard import AlertDeliveryError
from hpops_core.budget_guard.alert_state import TTL, TTL_ATTRIBUTE, alert_table, fired_keys, partition_key
from hpops_core.budget_guard.ce_cache import CacheOutcome, billed_month_cached
from hpops_core.budget_guard.pricing import rates_for
from hpops_core.budget_guard.user_spend import (SpendReport, UserAlert, decide_user_alerts, report_document,
                                                 spend_report, user_document)
from hpops_core.common.clients import transient_errors_named
from hpops_core.common.paged_items import batch_write

USER_ALERT_SOURCE = "hpops.budget-guard"
USER_ALERT_DETAIL_TYPE = "HyperPod User Spend Alert"
# SNS message attribute a user's subscription filters on ({"user": ["alice"]}): each user gets their own.
USER_ATTRIBUTE = "user"
# The highest spenders logged one line each (the dashboard's per-user table reads them); the rest
# are in `hpops cost`. Bounded so the state stays far below Step Functions' 256 KB.
MAX_USER_ROWS = 200
# Step output stays a few KB whatever the count: the first alerts' summaries, the first warnings.
MAX_ALERT_SUMMARIES = 10
MAX_WARNINGS = 20
SEND_BATCH = 10  # SNS PublishBatch and EventBridge PutEvents take at most 10 entries a call
# Alerts queued and marked fired this many at a time: the step holds one chunk's items, not every user's.
QUEUE_CHUNK = 500
# Sent alerts are deleted every 50 (two BatchWriteItem calls): a send that dies resends at most these.
DELETE_EVERY = 50


def gather_report(config: Any, observed: Mapping[str, Any], now: dt.datetime, *, ce: Any, pricing: Any,
                  dynamodb: Any = None, items: dict[str, dict[str, Any]] | None = None,
                  fresh: bool = False, keep: bool = True, writer: str = "") -> tuple[SpendReport, CacheOutcome]:
    """Everything the report needs, read once: the month's usage, the collector's status, rates; and
    where the billed month came from (Cost Explorer's answer is kept up to ``ce_max_age_hours``).

    ``items``: usage_store.cluster_items() when the caller read them (the collector's status is one).
    ``fresh``: ask Cost Explorer whatever is kept (`hpops cost --fresh`); ``keep``: store a new answer and
    the month's running total (usage_store.month_totals); ``writer``: who keeps them (the execution)."""
    month = f"{now.astimezone(dt.timezone.utc):%Y-%m}"
    usage, _ = usage_store.month_totals(config.state_table, config.cluster_name, month, now, writer, keep, dynamodb)
    collector = usage_store.collector_status(config.state_table, config.cluster_name, dynamodb, items)
    groups = observed.get("InstanceGroups") or []
    types = sorted({g["InstanceType"] for g in groups if isinstance(g.get("InstanceType"), str)})
    billed, outcome = billed_month_cached(ce, config.state_table, config.cluster_name, now, config.ce_max_age_hours,
                                          fresh=fresh, keep=keep, dynamodb=dynamodb)
    rates, billed = rates_for(types, billed=billed, pricing=pricing, cluster_name=config.cluster_name,
                              region=config.region, overrides=config.rate_overrides, now=now)
    return spend_report(config.cluster_name, now, usage, groups, rates, billed, config.limits, collector), outcome


def check_user_spend(config: Any, request: Mapping[str, Any], observed: Mapping[str, Any], *, ce: Any, pricing: Any,
                     owner: str) -> dict[str, Any]:
    """The month so far per user -> the alerts not sent yet, queued (alert_outbox) and then marked
    fired. Returns counts, never the alerts: Step Functions state is capped at 256 KB and any number
    of users can cross at once; SendUserAlerts sends what is queued."""
    now = dt.datetime.fromisoformat(request["now"])
    items = usage_store.cluster_items(config.state_table, config.cluster_name)
    report, cost_explorer = gather_report(config, observed, now, ce=ce, pricing=pricing, items=items, writer=owner)
    table = alert_table(config.state_table)
    with transient_errors_named("dynamodb:Query"):
        already = fired_keys(table, config.cluster_name, report.month)
    decided = decide_user_alerts(report, config.thresholds, already)
    queued = queue_and_mark(config, report, decided, now, owner)
    # Holds are decided from the same report, after the spend alerts (their alerts are queued with them).
    holds = hold_state.check_holds(config, report, now, owner, config.stack_name, items)
    hold_alerts = holds.pop("alerts")
    document = report_document(report, max_users=MAX_USER_ROWS)
    top = ", ".join(f"{u['user']} ${u['usd']}" for u in document["users"][:3])
    rows = [{k: u[k] for k in ("user", "nodeHours", "gpuHours", "usd", "percentOfLimit", "projectedUsd")}
            for u in document["users"]]
    count = queued["count"] + hold_alerts
    return {
        "userRows": rows, "alertSummaries": queued["summaries"],
        "users": len(report.users), "usersUsd": document["usersUsd"], "idleUsd": document["idle"]["usd"],
        "clusterCostUsd": document["clusterCost"]["usd"], "warnings": document["warnings"][:MAX_WARNINGS],
        "alertCount": count, "spendAlerts": queued["count"], "holdAlerts": hold_alerts,
        "reason": (f"{len(report.users)} user(s) this month, top: {top or 'none'}; {count} new alert(s) queued"),
        "holds": holds,
        "costExplorer": cost_explorer.as_dict(),
    }


def queue_and_mark(config: Any, report: SpendReport, decided: list[UserAlert], now: dt.datetime,
                   owner: str) -> dict[str, Any]:
    """Each decided alert queued (alert_outbox), then its keys marked fired, QUEUE_CHUNK alerts at a
    time: memory stays a chunk's whatever the count. A failure between the two queues the same items
    again next time (the same keys): never marked before queued."""
    spend_of = {u.user: u for u in report.users}
    for start in range(0, len(decided), QUEUE_CHUNK):
        chunk = decided[start:start + QUEUE_CHUNK]
        alert_outbox.queue(config.state_table, config.cluster_name, (
            {"cluster": report.cluster, "month": report.month, "asOf": report.as_of, "user": alert.user,
             "kind": alert.kind, "thresholdPercent": f"{alert.threshold.normalize():f}", "key": alert.key,
             "summary": alert.summary, "spend": user_document(spend_of[alert.user])} for alert in chunk), now)
        mark_all_fired(config.state_table, config.cluster_name, [key for a in chunk for key in a.crossed], now, owner)
    return {"count": len(decided), "summaries": [a.summary for a in decided[:MAX_ALERT_SUMMARIES]]}


def send_queued_alerts(config: Any, *, sns: Any, events: Any, dynamodb: Any = None,
                       limit: int = alert_outbox.PAGE_SIZE) -> dict[str, Any]:
    """One page of queued alerts sent, each deleted once both topics and the event took it. Raises
    AlertDeliveryError after the page when any failed (theirs stay queued: the next try sends them)."""
    queued, more = alert_outbox.page(config.state_table, config.cluster_name, limit, dynamodb)
    sent: list[str] = []
    failed: dict[str, str] = {}
    for start in range(0, len(queued), DELETE_EVERY):
        chunk = queued[start:start + DELETE_EVERY]
        for first in range(0, len(chunk), SEND_BATCH):
            failed.update(_send_batch(config, chunk[first:first + SEND_BATCH], sns, events))
        done = [key for key, _ in chunk if key not in failed]
        alert_outbox.remove(config.state_table, config.cluster_name, done, dynamodb)
        sent += done
    if failed:
        first = sorted(failed.items())[0]
        raise AlertDeliveryError(f"{len(failed)} of {len(queued)} queued alert(s) not sent (they stay queued), "
                                 f"first {first[0].removeprefix(alert_outbox.PREFIX)}: {first[1]}")
    return {"sent": len(sent), "more": more, "reason": f"{len(sent)} alert(s) sent{'; more queued' if more else ''}"}


def _send_batch(config: Any, batch: list[tuple[str, dict]], sns: Any, events: Any) -> dict[str, str]:
    """Up to 10 alerts: one PublishBatch per topic, one PutEvents; -> {outbox key: why} of those not sent."""
    failed: dict[str, str] = {}
    ids = {f"a{index}": key for index, (key, _) in enumerate(batch)}
    entries = [dict(Id=f"a{index}", **_message(alert)) for index, (_, alert) in enumerate(batch)]
    for topic in [config.alert_topic_arn] + ([config.user_topic_arn] if config.user_topic_arn else []):
        with transient_errors_named("sns:PublishBatch"):
            answer = sns.publish_batch(TopicArn=topic, PublishBatchRequestEntries=entries)
        for entry in answer.get("Failed") or []:
            failed.setdefault(ids[entry["Id"]], f"sns:PublishBatch {entry.get('Code')}")
    with transient_errors_named("events:PutEvents"):
        answer = events.put_events(Entries=[{
            "Source": USER_ALERT_SOURCE, "DetailType": USER_ALERT_DETAIL_TYPE, "EventBusName": "default",
            "Detail": json.dumps(alert, sort_keys=True)} for _, alert in batch])
    for (key, _), entry in zip(batch, answer.get("Entries") or []):
        if entry.get("ErrorCode"):
            failed.setdefault(key, f"events:PutEvents {entry['ErrorCode']}")
    return failed


def mark_all_fired(table: str, cluster: str, keys: list[str], now: dt.datetime, owner: str) -> None:
    """Every alert key marked fired (the items alert_state.mark_fired writes), 25 a call: their
    alerts are queued already, and the consistent read before deciding skipped the fired ones."""
    ttl = int((now.astimezone(dt.timezone.utc) + TTL).timestamp())
    batch_write(table, [{"PutRequest": {"Item": {
        "pk": {"S": partition_key(cluster)}, "sk": {"S": key}, "fired_at": {"S": now.astimezone(dt.timezone.utc).isoformat()},
        TTL_ATTRIBUTE: {"N": str(ttl)}, "fired_by": {"S": owner}}}} for key in dict.fromkeys(keys)])


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


def _message(alert: Mapping[str, Any]) -> dict[str, Any]:
    """Subject, text and attributes of one alert: the user attribute is what a user's subscription filters on."""
    if alert.get("kind") == "hold":  # a Slurm hold's transition: held, released, could not apply
        subject = f"[hpops] {alert['cluster']}: {alert['user']} {alert['transition']}"[:100]
        text, kind = alert["text"], "user-hold"
    else:
        subject = f"[hpops] {alert['cluster']}: {alert['user']} at {alert['thresholdPercent']}% ({alert['kind']})"[:100]
        text, kind = user_alert_text(alert), "user-spend"
    return {"Subject": subject, "Message": text, "MessageAttributes": {
        USER_ATTRIBUTE: {"DataType": "String", "StringValue": alert["user"]},
        "kind": {"DataType": "String", "StringValue": kind}}}
