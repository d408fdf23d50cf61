"""BudgetGuard's first step, BudgetParseTrigger: a cluster state change event or a budget sweep
validated into a budget request.

A module of its own: it validates with pydantic (hpops_core.budget_guard.trigger) and calls no AWS
API, so its cold start loads neither boto3 nor what the other steps use (app.py).
"""

from __future__ import annotations

from aws_lambda_powertools.utilities.typing import LambdaContext

from hpops_core.common.observability import handler_tools
from hpops_core.budget_guard.config import TriggerConfig
from hpops_core.budget_guard.trigger import parse_budget_input

# It counts nothing (the steps after it do), so it flushes no metrics.
logger, tracer, _ = handler_tools(calls_aws=False)


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def parse_budget_trigger(event: dict, context: LambdaContext) -> dict:
    """{"input": <execution input>, "startTime"} -> {"cluster", "mode", "now", "trigger", "eventId", "observed"}.

    "now" is the event's time, or the execution's start time for a sweep: time is an input."""
    config = TriggerConfig.from_env()
    raw = event.get("input") if isinstance(event, dict) else event
    request = parse_budget_input(raw, event.get("startTime") if isinstance(event, dict) else None, config.cluster_name)
    logger.info("budget check requested", extra={"request": request.to_state()})
    return request.to_state()
