"""BudgetGuard Lambda handlers: where the budget guard's inputs enter and effects are triggered.

Each handler is thin: read its config (one frozen dataclass per function, at call time),
call one step in hpops_core.budget_guard.guard, log and count what happened, return plain JSON
for the next state. The order of the steps, retries and error routing live in
statemachines/budget_guard.asl.json.

Warnings (NoBudgetLimit, MissingHourlyPrice, ...) are returned in the output, logged at
WARNING level and counted (BudgetWarnings); they never fail the execution. Errors do, with
their class name as the Step Functions error name.

BudgetParseTrigger, the one step that validates events with pydantic, is parse_budget_trigger.py,
so that the steps here never load pydantic on a cold start.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from hpops_core.common.observability import handler_tools
from hpops_core.common.clients import client
from hpops_core.budget_guard import guard
from hpops_core.budget_guard.alert_state import alert_table
from hpops_core.budget_guard.aws_budgets import budgets_client, ce_client
from hpops_core.budget_guard.config import AlertConfig, EnsureBudgetsConfig, ProjectionConfig
from hpops_core.budget_guard.pricing import pricing_client
from hpops_core.common.errors import MalformedEventError
from hpops_core.common.requests import step_field

logger, tracer, metrics = handler_tools(calls_aws=True)


def _report_warnings(warnings: list[dict[str, str]]) -> None:
    for item in warnings:
        logger.warning(item["reason"], extra={"warning": item["warning"]})
    metrics.add_metric(name="BudgetWarnings", unit=MetricUnit.Count, value=len(warnings))


def _state(event: Any, key: str) -> dict[str, Any]:
    return step_field(event, key, "budget guard", may_be_empty=True)


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def ensure_budgets(event: dict, context: LambdaContext) -> dict:
    """{"request"} -> the cluster budget created/updated/unchanged (or removed/kept for a deleted
    cluster), old per-user budgets deleted, the limit in force, the cluster state (DescribeCluster for a sweep)."""
    config = EnsureBudgetsConfig.from_env()
    request = _state(event, "request")
    sagemaker = client("sagemaker")
    observed = request.get("observed") or guard.observe_cluster(sagemaker, config.cluster_name)
    result = guard.ensure_budgets(config, observed, sagemaker=sagemaker, budgets=budgets_client())
    changed = [b for b in result["budgets"] if b["action"] not in ("unchanged", "kept", "absent")]
    metrics.add_metric(name="BudgetsChanged", unit=MetricUnit.Count, value=len(changed))
    if result["limit"] is not None:  # the limit in force, beside the month's cost on the dashboard
        metrics.add_metric(name="ClusterBudgetUsd", unit=MetricUnit.NoUnit, value=float(result["limit"]))
    for budget in result["budgets"]:
        logger.info(budget["reason"], extra={"budget": budget["name"], "action": budget["action"]})
    _report_warnings(result["warnings"])
    return result


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def project_spend(event: dict, context: LambdaContext) -> dict:
    """{"action": "project", "request", "cluster", "limit", "owner"} -> scale-outs, projection, the alert to send;
    {"action": "remember", "cluster", "now"} -> the state seen becomes the next baseline."""
    config = ProjectionConfig.from_env()
    action = event.get("action") if isinstance(event, dict) else None
    table = alert_table(config.state_table)
    if action == "remember":
        now = event.get("now")
        if not isinstance(now, str):
            raise MalformedEventError("remember needs 'now'")
        result = guard.remember_state(config, _state(event, "cluster"), now, table=table)
        logger.info(result["reason"])
        return result
    if action != "project":
        raise MalformedEventError("action must be project or remember")
    owner = event.get("owner")
    if not isinstance(owner, str) or not owner:
        raise MalformedEventError("project needs an owner (the execution id)")
    limit = event.get("limit")
    result = guard.project_spend(
        config, _state(event, "request"), _state(event, "cluster"), limit if isinstance(limit, str) else None,
        table=table, ce=ce_client(), pricing=pricing_client(), owner=owner,
    )
    metrics.add_metric(name="BudgetScaleOuts", unit=MetricUnit.Count, value=1 if result["scaleOuts"] else 0)
    logger.info(result["reason"], extra={"scaleOuts": result["scaleOuts"], "firedKeys": result.get("firedKeys", [])})
    if "costExplorer" in result:
        logger.info(f"billed month from {result['costExplorer']['source']}: {result['costExplorer']['reason']}")
    _report_warnings(result["warnings"])
    return result


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def publish_alert(event: dict, context: LambdaContext) -> dict:
    """{"alert"} -> one SNS message and one EventBridge event."""
    config = AlertConfig.from_env()
    alert = _state(event, "alert")
    result = guard.publish_alert(config, alert, sns=client("sns"), events=client("events"))
    metrics.add_metric(name="BudgetProjectionAlerts", unit=MetricUnit.Count, value=1)
    logger.warning(alert.get("summary", "budget projection alert"), extra={"alert": alert})
    return result
