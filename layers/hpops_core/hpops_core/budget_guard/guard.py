"""The budget guard's steps: the glue between the pure decisions and the AWS adapters.

Each function below is one Step Functions task of statemachines/budget_guard.asl.json (the
thin handlers in functions/budget_guard/app.py parse their input, read their config and call
one of these). Clients and tables are passed in; time is passed in.

    ensure_budgets   the cluster budget exists with the right limit, or is removed/kept when
                     the cluster is deleted; per-user budgets of earlier versions are deleted
                     (per-user spend is spend_check's); named warnings instead of crashes
    project_spend    on a scale-out since the last state seen: month-to-date (Cost Explorer)
                     + rate x nodes x hours left, each rate billed, list or override (pricing,
                     rates); which thresholds fire (once per month)
    publish_alert    one SNS message (human summary + structured JSON) and one EventBridge
                     event on the default bus per projected-overrun alert
    remember_state   the state just seen becomes the next baseline

Warnings are plain dicts ``{"warning": <name>, "reason": <text>}``; the names are stable so
operators can search logs for them: NoBudgetLimit, MalformedBudgetTag, ClusterTagMissing,
MissingHourlyPrice.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from botocore.exceptions import ClientError

from hpops_core.cluster.login_group import not_found
from hpops_core.common.clients import transient_errors_named
from hpops_core.budget_guard.alert_state import fired_keys, mark_fired
from hpops_core.budget_guard.aws_budgets import delete_budget, old_user_budget_names, ensure_budget
from hpops_core.budget_guard.budget_spec import (
    CLUSTER_TAG,
    budget_name_for,
    cluster_tag_filter,
    desired_budget,
    resolve_limit,
    user_budget_prefix,
)
from hpops_core.budget_guard.cluster_state import load_last_seen, save_last_seen
from hpops_core.budget_guard.config import AlertConfig, EnsureBudgetsConfig, ProjectionConfig
from hpops_core.budget_guard.ce_cache import billed_month_cached
from hpops_core.budget_guard.pricing import rates_for
from hpops_core.budget_guard.projection import (
    Alert,
    Projection,
    ScaleOut,
    decide_alerts,
    describe_groups,
    groups_from_detail,
    observed_from_describe,
    project_month_end,
    scale_out_groups,
    usd_rate,
)
from hpops_core.budget_guard.rates import BilledMonth
from hpops_core.common.errors import HpopsError, TransientAwsError

__all__ = [
    "ALERT_DETAIL_TYPE",
    "ALERT_SOURCE",
    "AlertDeliveryError",
    "alert_email_text",
    "alert_subject",
    "ensure_budgets",
    "observe_cluster",
    "project_spend",
    "publish_alert",
    "remember_state",
]

ALERT_SOURCE = "hpops.budget-guard"
ALERT_DETAIL_TYPE = "HyperPod Budget Projection Alert"
# A cluster in these states is going away: its budgets are removed or kept (parameter).
GONE_STATUSES = frozenset({"Deleting", "NotFound"})
_CENT = Decimal("0.01")


class AlertDeliveryError(HpopsError):
    """EventBridge refused the alert event (PutEvents FailedEntryCount > 0, not throttling)."""


def _warning(name: str, reason: str) -> dict[str, str]:
    return {"warning": name, "reason": reason}


def _usd(amount: Decimal) -> str:
    return f"${amount.quantize(_CENT, rounding=ROUND_HALF_UP):,.2f}"


def _number(amount: Decimal, places: str = "0.01") -> float:
    """Money and percentages in event/message JSON: numbers (so EventBridge rules can use
    numeric matching), rounded for display; the exact text is in the summary."""
    return float(amount.quantize(Decimal(places), rounding=ROUND_HALF_UP))


# --------------------------------------------------------------------------- observe


def observe_cluster(sagemaker: Any, cluster_name: str) -> dict[str, Any]:
    """DescribeCluster -> compact state; a cluster that no longer exists is "NotFound"."""
    try:
        with transient_errors_named("sagemaker:DescribeCluster"):
            described = sagemaker.describe_cluster(ClusterName=cluster_name)
    except ClientError as error:
        if not_found(error):
            return {"ClusterStatus": "NotFound", "InstanceGroups": []}
        raise
    return observed_from_describe(described)


def _cluster_tags(sagemaker: Any, cluster_arn: str) -> list[dict[str, str]]:
    # DescribeCluster carries no tags; ListTags on the cluster ARN does.
    tags: list[dict[str, str]] = []
    request: dict[str, Any] = {"ResourceArn": cluster_arn}
    while True:
        with transient_errors_named("sagemaker:ListTags"):
            page = sagemaker.list_tags(**request)
        tags.extend(t for t in page.get("Tags", []) if isinstance(t, dict))
        token = page.get("NextToken")
        if not token:
            return tags
        request["NextToken"] = token


# --------------------------------------------------------------------------- budgets


def _ensure(budgets: Any, account_id: str, spec: dict[str, Any]) -> dict[str, str]:
    with transient_errors_named("budgets"):
        result = ensure_budget(budgets, account_id, spec)
    return {"name": result.budget_name, "action": result.action, "reason": result.reason}


# Earlier versions made an AWS Budget per user, filtered on a per-user cost-allocation tag. Nothing
# on a HyperPod cluster carries such a tag, so those budgets read $0 forever; per-user spend now
# comes from Slurm accounting (user_spend). Every sweep removes what is left of them.
USER_BUDGET_REMOVED = ("per-user AWS Budgets never see cost (nothing on the cluster is billed per user); "
                       "per-user spend now comes from Slurm accounting: removed")


def _remove_user_budgets(config: EnsureBudgetsConfig, budgets: Any) -> list[dict[str, str]]:
    with transient_errors_named("budgets:DescribeBudgets"):
        names = old_user_budget_names(budgets, config.account_id, user_budget_prefix(config.cluster_name),
                                      cluster_tag_filter(config.cluster_name))
    removed = []
    for name in names:
        with transient_errors_named("budgets:DeleteBudget"):
            deleted = delete_budget(budgets, config.account_id, name)
        removed.append({"name": name, "action": "deleted" if deleted else "absent", "reason": USER_BUDGET_REMOVED})
    return removed


def ensure_budgets(
    config: EnsureBudgetsConfig, observed: dict[str, Any], *, sagemaker: Any, budgets: Any
) -> dict[str, Any]:
    """Make the cluster's budget (and its users') match the configuration and tags."""
    status = observed.get("ClusterStatus")
    warnings: list[dict[str, str]] = []
    name = budget_name_for(config.cluster_name)
    removed_user_budgets = _remove_user_budgets(config, budgets)

    if status in GONE_STATUSES:
        if not config.delete_with_cluster:
            return {
                "limit": None, "limitSource": None, "warnings": warnings, "cluster": observed,
                "budgets": [{"name": name, "action": "kept",
                             "reason": f"cluster is {status}; DeleteBudgetsWithCluster is false, so {name} is kept for the record"}]
                           + removed_user_budgets,
            }
        with transient_errors_named("budgets:DeleteBudget"):
            deleted = delete_budget(budgets, config.account_id, name)
        change = {"name": name, "action": "deleted" if deleted else "absent",
                  "reason": f"cluster is {status}; " + ("budget deleted" if deleted else "no such budget")}
        return {"limit": None, "limitSource": None, "warnings": warnings, "cluster": observed,
                "budgets": [change] + removed_user_budgets}

    tags = _cluster_tags(sagemaker, config.cluster_arn)
    if not any(t.get("Key") == CLUSTER_TAG and t.get("Value") == config.cluster_name for t in tags):
        warnings.append(_warning(
            "ClusterTagMissing",
            f"the cluster has no tag {CLUSTER_TAG}={config.cluster_name}: the budget and the month-to-date cost "
            "only count resources carrying it (and it must be an activated cost allocation tag)",
        ))
    resolution = resolve_limit(config.default_limit, tags)
    warnings.extend(_warning(type(w).__name__, w.reason) for w in resolution.warnings)

    changes = []
    if resolution.limit is not None:
        spec = desired_budget(config.cluster_name, resolution.limit, config.alert_topic_arn, config.account_id)
        changes.append(_ensure(budgets, config.account_id, spec))
    changes.extend(removed_user_budgets)

    return {
        "limit": format(resolution.limit, "f") if resolution.limit is not None else None,
        "limitSource": resolution.source,
        "limitReason": resolution.reason,
        "budgets": changes,
        "warnings": warnings,
        "cluster": observed,
    }


# --------------------------------------------------------------------------- projection


def _scale_out_state(s: ScaleOut) -> dict[str, Any]:
    return {"group": s.group_name, "instanceType": s.instance_type, "from": s.previous_target, "to": s.new_target}


def _projection_state(p: Projection, billed: BilledMonth) -> dict[str, Any]:
    return {
        "month": p.month,
        "monthEnd": p.last_day.isoformat(),
        "monthToDateUsd": _number(p.month_to_date),
        "monthToDateSource": p.month_to_date_source,
        # The parts of the month-to-date bill, so a report adds up to what Cost Explorer shows.
        "billed": {
            "start": billed.start, "end": billed.end,
            "instancesUsd": _number(billed.instance_cost_usd), "otherUsd": _number(billed.other_cost_usd),
            "byInstanceType": {t: {"usd": _number(u.cost_usd), "hours": _number(u.hours)}
                               for t, u in billed.by_instance_type.items()},
        },
        "runRatePerHourUsd": _number(p.run_rate_per_hour),
        "hoursLeft": _number(p.hours_left),
        "projectedUsd": _number(p.projected_total),
        "drivers": [
            {"group": d.name, "instanceType": d.instance_type, "nodes": d.node_count,
             "usdPerHour": _number(d.usd_per_hour, "0.0001"), "rateSource": d.rate_source, "rateDetail": d.rate_detail,
             "hourlyUsd": _number(d.hourly_cost), "toMonthEndUsd": _number(d.cost_to_month_end)}
            for d in p.drivers
        ],
        "missingPrices": list(p.missing_prices),
        "reason": p.reason,
    }


def _alert_document(
    cluster: str, now: dt.datetime, request: Mapping[str, Any], projection: Projection, state: dict[str, Any],
    alerts: list[Alert], scale_outs: list[ScaleOut], limit: Decimal,
) -> dict[str, Any]:
    """One alert per execution, for the highest threshold crossed; every crossed key is listed."""
    top = max(alerts, key=lambda a: a.threshold)
    return {
        "cluster": cluster,
        "month": projection.month,
        "thresholdPercent": _number(top.threshold, "0.1"),
        "thresholdsCrossed": [_number(a.threshold, "0.1") for a in sorted(alerts, key=lambda a: a.threshold)],
        "alertKeys": [a.key for a in alerts],
        "projectedUsd": _number(projection.projected_total),
        "limitUsd": _number(limit),
        "percentOfLimit": _number(top.percent_of_limit, "0.1"),
        "summary": top.summary,
        "scaleOuts": [_scale_out_state(s) for s in scale_outs],
        "projection": state,
        "observedAt": now.isoformat(),
        "trigger": request.get("trigger"),
        "eventId": request.get("eventId"),
    }


def _month_to_date_source(billed: BilledMonth) -> str:
    if billed.start is None:
        return "nothing billed yet: no complete day this month"
    return f"Cost Explorer {billed.start}..{billed.end}, tag {CLUSTER_TAG}"


def project_spend(
    config: ProjectionConfig, request: Mapping[str, Any], observed: dict[str, Any], limit: str | None,
    *, table: Any, ce: Any, pricing: Any, owner: str,
) -> dict[str, Any]:
    """Scale-out since the last state seen -> rates -> projection -> alerts not yet fired this month.

    One Cost Explorer request (by usage type) gives both the month-to-date cost and the billed
    rates; the Price List is asked only for types without a billed rate. Marks the alerts fired
    (conditional put, one winner per cluster-month-threshold) before returning them;
    PublishAlert then sends them, with the state machine's retries."""
    now = dt.datetime.fromisoformat(request["now"])
    previous = load_last_seen(table, config.cluster_name)
    scale_outs = scale_out_groups(previous, observed)
    out: dict[str, Any] = {"scaleOuts": [_scale_out_state(s) for s in scale_outs], "projection": None,
                           "alert": None, "warnings": []}
    if not scale_outs:
        groups = describe_groups(observed)
        out["reason"] = "no instance group's TargetCount went up since the last state seen" + (f" ({groups})" if groups else "")
        return out
    if limit is None:
        out["reason"] = "scale-out seen, but the cluster has no budget limit to project against (see the NoBudgetLimit warning)"
        return out

    groups = groups_from_detail(observed)
    # The month-to-date total comes from the same response as the billed rates (instance time +
    # other cost), so there is no separate month-to-date request: CE charges per request. A scale-out
    # is rare and its alert is the early warning, so it asks afresh; the hourly sweep reuses the answer.
    billed, cost_explorer = billed_month_cached(ce, config.state_table, config.cluster_name, now, 24, fresh=True)
    out["costExplorer"] = cost_explorer.as_dict()
    rates, billed = rates_for(
        [g.instance_type for g in groups if g.node_count > 0], billed=billed, pricing=pricing,
        cluster_name=config.cluster_name, region=config.region, overrides=config.rate_overrides, now=now,
    )
    projection = project_month_end(now, billed.total_usd, groups, rates, month_to_date_source=_month_to_date_source(billed))
    state = _projection_state(projection, billed)
    out["projection"] = state
    for instance_type in projection.missing_prices:
        nodes = sum(g.node_count for g in groups if g.instance_type == instance_type)
        out["warnings"].append(_warning(
            "MissingHourlyPrice",
            f"no hourly rate for {instance_type}: not billed to this cluster this month (Cost Explorer), "
            f"not in the AWS Price List for {config.region}, not in RateOverridesJson; its {nodes} node(s) "
            "are left out of the projection, which is therefore low (add it to RateOverridesJson)",
        ))

    budget_limit = Decimal(limit)
    with transient_errors_named("dynamodb:Query"):
        already = fired_keys(table, config.cluster_name, projection.month)
    alerts = decide_alerts(projection, budget_limit, config.thresholds, already, scale_outs=scale_outs)
    won = []
    for alert in alerts:
        with transient_errors_named("dynamodb:PutItem"):
            if mark_fired(table, config.cluster_name, alert.key, now, owner=owner):
                won.append(alert)
    if won:
        out["alert"] = _alert_document(config.cluster_name, now, request, projection, state, won, scale_outs, budget_limit)
        out["reason"] = won[-1].summary
    else:
        percent = (projection.projected_total * 100 / budget_limit).quantize(Decimal("0.1"))
        out["reason"] = (
            f"projected {_usd(projection.projected_total)} = {percent}% of {_usd(budget_limit)}: "
            + ("every threshold it crosses already alerted this month" if alerts or already else "below every threshold")
        )
    out["firedKeys"] = [a.key for a in won]
    return out


def remember_state(config: ProjectionConfig, observed: dict[str, Any], now_iso: str, *, table: Any) -> dict[str, Any]:
    now = dt.datetime.fromisoformat(now_iso)
    with transient_errors_named("dynamodb:PutItem"):
        saved = save_last_seen(table, config.cluster_name, observed, now)
    return {"saved": saved, "reason": "baseline for the next scale-out check saved" if saved
            else "a newer cluster state is already stored (events out of order); kept it"}


# --------------------------------------------------------------------------- alert delivery


def alert_subject(alert: Mapping[str, Any]) -> str:
    text = (f"[hpops] {alert['cluster']}: projected {alert['percentOfLimit']:g}% of its "
            f"monthly budget by {alert['projection']['monthEnd']}")
    return text[:100]  # SNS subject limit


def _lines(items: Iterable[str]) -> str:
    return "\n".join(f"  - {item}" for item in items)


def alert_email_text(alert: Mapping[str, Any]) -> str:
    projection = alert["projection"]
    drivers = [f"{d['group'] or '?'}: {d['nodes']} x {d['instanceType']} at {usd_rate(Decimal(str(d['usdPerHour'])))}/h "
               f"= ${d['hourlyUsd']:,.2f}/h; rate {d['rateSource']}: {d['rateDetail']}"
               for d in projection["drivers"]]
    text = [
        f"HyperPod cluster {alert['cluster']} is projected to overrun its monthly budget.",
        "",
        alert["summary"],
        "",
        f"How: {projection['reason']}.",
        f"Month to date: ${projection['monthToDateUsd']:,.2f} ({projection['monthToDateSource']}).",
        f"Thresholds crossed: {', '.join(f'{t:g}%' for t in alert['thresholdsCrossed'])} "
        "(each alerts once per cluster per month).",
        "Running cost by group:",
        _lines(drivers) or "  (none priced)",
    ]
    if projection["missingPrices"]:
        text.append(f"Not priced (left out, so the projection is low): {', '.join(projection['missingPrices'])}.")
    text += [
        "",
        f"Trigger: {alert.get('trigger')}. AWS Budgets' own alerts follow hours later.",
        "",
        f"Structured (also on EventBridge: source {ALERT_SOURCE}, detail-type \"{ALERT_DETAIL_TYPE}\"):",
        json.dumps(alert, indent=2, sort_keys=True),
    ]
    return "\n".join(text)


def publish_alert(config: AlertConfig, alert: Mapping[str, Any], *, sns: Any, events: Any) -> dict[str, Any]:
    """One SNS message (e-mail gets the human text, everything else the JSON document, which
    has the summary too) and one custom event on the event bus for other teams' rules."""
    document = json.dumps(alert, sort_keys=True)
    with transient_errors_named("sns:Publish"):
        message = sns.publish(
            TopicArn=config.alert_topic_arn,
            Subject=alert_subject(alert),
            MessageStructure="json",
            Message=json.dumps({"default": document, "email": alert_email_text(alert)}),
            MessageAttributes={
                "kind": {"DataType": "String", "StringValue": "budget-projection-alert"},
                "cluster": {"DataType": "String", "StringValue": config.cluster_name},
            },
        )
    with transient_errors_named("events:PutEvents"):
        response = events.put_events(Entries=[{
            "Source": ALERT_SOURCE,
            "DetailType": ALERT_DETAIL_TYPE,
            "Detail": document,
            "Resources": [config.cluster_arn],
            "Time": dt.datetime.fromisoformat(alert["observedAt"]),
            "EventBusName": config.event_bus,
        }])
    entry = (response.get("Entries") or [{}])[0]
    if response.get("FailedEntryCount"):
        code = entry.get("ErrorCode", "unknown")
        if code in ("ThrottlingException", "InternalFailure"):
            raise TransientAwsError(f"events:PutEvents: {code}")
        raise AlertDeliveryError(f"events:PutEvents refused the alert: {code}")
    return {"messageId": message.get("MessageId"), "eventId": entry.get("EventId"), "summary": alert["summary"]}
