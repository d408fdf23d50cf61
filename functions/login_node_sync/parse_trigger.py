"""LoginNodeSync's first step, ParseTrigger: any execution input validated into a sync request.

A module of its own: it validates with pydantic (hpops_core.login_sync.trigger) and calls no AWS
API, so its cold start loads neither boto3 nor what the other steps use (app.py).
"""

from __future__ import annotations

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from hpops_core.common.observability import handler_tools
from hpops_core.login_sync.config import SyncConfig
from hpops_core.login_sync.trigger import parse_sync_input, require_managed_cluster

logger, tracer, metrics = handler_tools(calls_aws=False)


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def parse_trigger(event: dict, context: LambdaContext) -> dict:
    """{"input": <execution input>} -> {"cluster", "mode", "dryRun", "trigger", "eventId"}; else a named error.

    The state machine wraps its input so that any JSON value (even an array) reaches the parser.
    """
    metrics.add_metric(name="SyncRequests", unit=MetricUnit.Count, value=1)
    config = SyncConfig.from_env()
    raw = event["input"] if isinstance(event, dict) and set(event) == {"input"} else event
    request = require_managed_cluster(parse_sync_input(raw), config.cluster_name)
    logger.info("sync requested", extra={"request": request.to_state()})
    # The state machine branches on the mode and paces its wait for node reports with these.
    return request.to_state() | {
        "hostIdentityMode": config.host_identity_mode,
        "nodeReport": {"pollSeconds": config.node_report_poll_seconds, "maxPolls": config.node_report_max_polls},
    }

