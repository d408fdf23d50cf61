"""Where node agents' reports enter: an EventBridge rule on the stack's node-report bus.

Validate (a named error for anything malformed: EventBridge's retries, then the DLQ and its
alarm), check AWS's own record of the instance, keep the latest report per node. Waiting state
machines read it from there (CheckNodeReport); reports never admit a node by themselves. Only
after all that, a changed session list is announced (node_channel/session_changes.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from hpops_core.common.observability import handler_tools
from hpops_core.cluster.login_group import describe_node
from hpops_core.node_channel import enrollment_store, report_store, session_changes, user_sessions
from hpops_core.node_channel.config import NodeReportConfig
from hpops_core.node_channel.enrollment import NodeChannelError
from hpops_core.node_channel.node_proof import NodeProofError
from hpops_core.node_channel.report_proof import check_signed_report, unsigned_event
from hpops_core.node_channel.reports import NodeReportRejected, check_report_origin, parse_report_event

logger, tracer, metrics = handler_tools(calls_aws=True)


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics(raise_on_empty_metrics=False)
def record_node_report(event: dict, context: LambdaContext) -> dict:
    """EventBridge event (source hpops.node) -> {recorded, instanceId}; a named error otherwise."""
    config = NodeReportConfig.from_env()
    stripped, _ = unsigned_event(event)
    report = parse_report_event(stripped)
    sequence = _signed_sequence(config, event, report)
    check = check_report_origin(report, config.cluster_name, config.login_group,
                                describe_node(config.cluster_name, report.instanceId))
    if not check.accepted:
        metrics.add_metric(name="NodeReportRejected", unit=MetricUnit.Count, value=1)
        raise NodeReportRejected(check.reason)
    received_at = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    event_id = str(event.get("id") or "")[:128] or None
    with _counted_refusal(report.instanceId):
        previous = report_store.store_report(config.state_table, config.cluster_name, report, received_at,
                                             int(time.time()), event_id, sequence)
    sync = user_sessions.keep_user_sessions(config.state_table, config.cluster_name, report, previous, received_at,
                                            int(time.time()), event_id, sequence)
    change = session_changes.sessions_change(previous, report, event_id, sync.grew)
    if change.changed:
        # No metric of its own (one more custom metric a month): the log line below carries it.
        session_changes.announce(session_changes.announcement(config.cluster_name, report, received_at,
                                                              user_sessions.announced_users(sync)))
    identity = report.hostIdentity
    metrics.add_metric(name="NodeReports", unit=MetricUnit.Count, value=1)
    if identity is not None and identity.result == "failed":
        metrics.add_metric(name="NodeApplyFailed", unit=MetricUnit.Count, value=1)
    logger.info("node report recorded", extra={"instanceId": report.instanceId, "trigger": report.trigger,
                                               "hostIdentity": identity.result if identity else None,
                                               "reason": identity.reason if identity else None,
                                               "sessionsChanged": change.changed, "sessionsReason": change.reason,
                                               "usersReason": sync.reason})
    return {"recorded": True, "instanceId": report.instanceId, "sessionsChanged": change.changed}


@contextmanager
def _counted_refusal(instance_id: str) -> Iterator[None]:
    """A report refused as not the enrolled agent's is counted (alarmed) and logged, then raised."""
    try:
        yield
    except (NodeChannelError, NodeProofError) as error:
        metrics.add_metric(name="SignedReportRefused", unit=MetricUnit.Count, value=1)
        logger.warning("node report refused", extra={"instanceId": instance_id, "error": type(error).__name__,
                                                     "reason": str(error)})
        raise


def _signed_sequence(config: NodeReportConfig, event: dict, report) -> int:
    """Only the enrolled agent's signed, fresh report counts: the role's credentials are not enough."""
    with _counted_refusal(report.instanceId):
        return check_signed_report(
            event["detail"], enrollment_store.get_enrollment(config.state_table, config.cluster_name, report.instanceId),
            config.cluster_name, report.instanceId, "login", datetime.now(timezone.utc), [report.reportedAt])
