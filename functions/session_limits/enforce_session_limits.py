"""EnforceSessionLimits: {"request", "now"} -> gather the login nodes' sessions, decide, end each
user's excess, record the ended ids, notify (SNS) -> a compact JSON report.

What a run does lives in hpops_core.session_limits.run; step order, retries and error routing in
statemachines/session_limits.asl.json.
"""

from __future__ import annotations

from aws_lambda_powertools.utilities.typing import LambdaContext

from hpops_core.common.observability import handler_tools
from hpops_core.session_limits.config import SessionLimitsConfig
from hpops_core.session_limits.request import read_task_input
from hpops_core.session_limits.run import enforce_limits, session_directory

logger, tracer, metrics = handler_tools(calls_aws=True)


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def enforce_session_limits(event: dict, context: LambdaContext) -> dict:
    """{"request": <ParseSessionTrigger output>, "now": ISO time} -> what was ended and why.

    Fails by name once metrics and logs are out: SessionReportFailed (recording or notifying
    failed), SessionTerminationFailed (a TerminateSession failed; the next run retries it).
    """
    config = SessionLimitsConfig.from_env()
    request, now = read_task_input(event, config.cluster_name)
    directory = session_directory(getattr(context, "invoked_function_arn", ""), config.tag_cache_seconds)
    result = enforce_limits(config, request, now, directory)
    result.emit(metrics, logger)
    return result.output_or_raise()
