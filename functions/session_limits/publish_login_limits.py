"""PublishLoginLimits (sweeps only): {"request", "now"} -> the per-user limits published for the
login nodes' agents (pam_limits maxlogins), and which nodes report them applied.

What a run does lives in hpops_core.session_limits.login_limits; step order, retries and error
routing in statemachines/session_limits.asl.json.
"""

from __future__ import annotations

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from hpops_core.common.observability import handler_tools
from hpops_core.session_limits.config import LoginLimitsConfig
from hpops_core.session_limits.login_limits import publish_task
from hpops_core.session_limits.request import read_task_input

logger, tracer, metrics = handler_tools(calls_aws=True)


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def publish_login_limits(event: dict, context: LambdaContext) -> dict:
    """{"request", "now"} -> {version, published, applied, pending, failed}: maxlogins for the login nodes.

    Only the sweep runs this (the state machine's IsSweep choice). A node that has not applied the
    limits within the grace period is counted (LoginLimitsPushFailed); it does not fail the run.
    """
    config = LoginLimitsConfig.from_env()
    request, now = read_task_input(event, config.cluster_name)
    result = publish_task(config, request, now)
    if not result.output.get("dryRun"):  # a dry run publishes nothing, so no node is judged
        metrics.add_metric(name="LoginLimitsApplied", unit=MetricUnit.Count, value=result.output["appliedCount"])
        metrics.add_metric(name="LoginLimitsPending", unit=MetricUnit.Count, value=result.output["pendingCount"])
        # Alarmed (LoginLimitsPushFailedAlarm); named here so tests/unit/test_template.py sees it emitted.
        metrics.add_metric(name="LoginLimitsPushFailed", unit=MetricUnit.Count, value=result.output["failedCount"])
    result.emit(metrics, logger)
    return result.output_or_raise()
