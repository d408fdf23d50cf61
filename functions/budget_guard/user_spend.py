"""CheckUserSpend and SendUserAlerts: per-user spend from Slurm accounting, and its alerts.

Steps of the BudgetGuard state machine (statemachines/budget_guard.asl.json), after the cluster's
own budget and projection. The gather/decide/mark order is in hpops_core.budget_guard.spend_check.
"""

from __future__ import annotations

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from hpops_core.common.observability import handler_tools
from hpops_core.common.clients import client
from hpops_core.budget_guard import spend_check
from hpops_core.budget_guard.aws_budgets import ce_client
from hpops_core.budget_guard.config import UserAlertConfig, UserSpendConfig
from hpops_core.budget_guard.pricing import pricing_client
from hpops_core.common.requests import step_field

logger, tracer, metrics = handler_tools(calls_aws=True)


def _field(event: object, key: str, kind: type = dict):
    return step_field(event, key, "user spend", kind)


def log_cost_explorer(outcome: dict) -> None:
    """Where the billed month came from; a kept answer that could not be read is named, not fatal."""
    if outcome.get("problem"):
        logger.warning(outcome["reason"], extra={"warning": outcome["problem"], "costExplorer": outcome})
    else:
        logger.info(f"billed month from {outcome['source']}: {outcome['reason']}", extra={"costExplorer": outcome})


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics(raise_on_empty_metrics=False)
def check_user_spend(event: dict, context: LambdaContext) -> dict:
    """{"request", "cluster", "owner"} -> {users, usersUsd, idleUsd, clusterCostUsd, alertCount, warnings, reason, holds}:
    counts and the first rows only, whatever the number of users (the alerts wait in the outbox)."""
    config = UserSpendConfig.from_env()
    request, observed, owner = _field(event, "request"), _field(event, "cluster"), _field(event, "owner", str)
    result = spend_check.check_user_spend(config, request, observed, ce=ce_client(), pricing=pricing_client(), owner=owner)
    metrics.add_metric(name="UserSpendAlerts", unit=MetricUnit.Count, value=result["alertCount"])
    # Month-to-date dollars (CloudWatch has no currency unit): the dashboard's spend widget.
    for name, key in (("ClusterCostUsd", "clusterCostUsd"), ("UsersUsd", "usersUsd"), ("IdleUsd", "idleUsd")):
        metrics.add_metric(name=name, unit=MetricUnit.NoUnit, value=float(result[key]))
    holds = result["holds"]
    metrics.add_metric(name="UsersHeld", unit=MetricUnit.Count, value=holds["heldCount"])
    for decision in holds["decisions"]:
        logger.info("user hold decision", extra=decision)
    logger.info(holds["reason"], extra={"held": holds["held"], "failed": holds["failed"], "agent": holds["agent"]})
    for summary in result.pop("alertSummaries"):
        logger.warning(summary)
    for row in result.pop("userRows"):
        logger.info("user spend", extra=row)
    for warning in result["warnings"]:
        logger.warning(warning["reason"], extra={"warning": warning["name"]})
    log_cost_explorer(result["costExplorer"])
    logger.info(result["reason"], extra={"usersUsd": result["usersUsd"], "clusterCostUsd": result["clusterCostUsd"]})
    return result


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics(raise_on_empty_metrics=False)
def send_user_alerts(event: dict, context: LambdaContext) -> dict:
    """{} -> {sent, more, reason}: one page of the queued alerts to both topics and as events (the
    state machine loops while more wait); a send that failed leaves its alert queued and is a named error."""
    result = spend_check.send_queued_alerts(UserAlertConfig.from_env(), sns=client("sns"), events=client("events"))
    metrics.add_metric(name="UserSpendAlertsSent", unit=MetricUnit.Count, value=result["sent"])
    logger.info(result["reason"], extra={"sent": result["sent"], "more": result["more"]})
    return result
