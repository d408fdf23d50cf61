"""ReleaseLeaseOfEndedSync: a sync execution that timed out, was aborted or failed gives its lease back.

A module of its own, so its cold start loads only what releasing a lease needs.
"""

from __future__ import annotations

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from hpops_core.common.observability import handler_tools
from hpops_core.login_sync import sync_lease
from hpops_core.login_sync.config import EndedSyncConfig
from hpops_core.login_sync.execution_events import lease_to_release

logger, tracer, metrics = handler_tools(calls_aws=True)


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def release_lease_of_ended_sync(event: dict, context: LambdaContext) -> dict:
    """EventBridge "Execution Status Change" of a timed-out, aborted or failed sync -> its lease released."""
    config = EndedSyncConfig.from_env()
    cleanup = lease_to_release(event, config.sync_state_machine_arn)
    released = None
    if cleanup.holder:
        released = sync_lease.abandon(config.state_table, config.cluster_name, cleanup.holder).reason
        metrics.add_metric(name="LeasesReleasedAfterEnd", unit=MetricUnit.Count, value=1)
    logger.info(cleanup.reason, extra={"released": released})
    return {"holder": cleanup.holder, "reason": cleanup.reason, "released": released}
