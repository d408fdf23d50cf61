"""ParseSessionTrigger: {"input": <CloudTrail StartSession event | sweep input>} -> the request.

The only SessionLimits function that parses raw events, so the only one that loads pydantic
(Powertools' parser). Step order, retries and error routing: statemachines/session_limits.asl.json.
"""

from __future__ import annotations

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from hpops_core.common.observability import handler_tools
from hpops_core.session_limits.config import SessionTriggerConfig
from hpops_core.session_limits.trigger import parse_session_input

logger, tracer, metrics = handler_tools(calls_aws=False)


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def parse_session_trigger(event: dict, context: LambdaContext) -> dict:
    """{"input": <StartSession event | sweep input>} -> request; else MalformedEventError / UnknownClusterError."""
    metrics.add_metric(name="SessionLimitChecks", unit=MetricUnit.Count, value=1)
    config = SessionTriggerConfig.from_env()
    raw = event["input"] if isinstance(event, dict) and set(event) == {"input"} else event
    request = parse_session_input(raw, config)
    logger.info("session limit check requested", extra={"request": request.to_state()})
    return request.to_state()
