"""RecordUsageReport: where the controller's Slurm usage and holds reports enter (a rule on the node-report bus).

Validate (a named error for anything malformed: EventBridge's retries, then the DLQ and its alarm),
check that DescribeClusterNode places the sender in the controller group, keep the window; with holds
on, a kept report with usage starts the BudgetGuard check at once (usage_check).
"""

from __future__ import annotations

import time
from datetime import datetime, timezone

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from hpops_core.common.observability import handler_tools
from hpops_core.budget_guard import usage_check, usage_store
from hpops_core.budget_guard.config import UsageReportConfig
from hpops_core.budget_guard.usage_reports import UsageReportRejected, check_usage_origin, parse_usage_event
from hpops_core.budget_guard.hold_reports import origin_view, parse_holds_event
from hpops_core.budget_guard.hold_state import store_agent_report
from hpops_core.budget_guard.usage_capacity import UsageExceedsCapacityError, check_capacity
from hpops_core.cluster.login_group import describe_node
from hpops_core.common.clients import client, transient_errors_named
from hpops_core.node_channel import enrollment_store
from hpops_core.node_channel.enrollment import NodeChannelError
from hpops_core.node_channel.node_proof import NodeProofError
from hpops_core.node_channel.report_proof import check_signed_report, unsigned_event
from hpops_core.node_channel.user_holds import HOLDS_DETAIL_TYPE

logger, tracer, metrics = handler_tools(calls_aws=True)


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics(raise_on_empty_metrics=False)
def record_usage_report(event: dict, context: LambdaContext) -> dict:
    """EventBridge event (detail-type "HyperPod Slurm Usage Report") -> {stored, window, status};
    "HyperPod Slurm Holds Report" -> {stored, version, enforced}."""
    config = UsageReportConfig.from_env()
    stripped, _ = unsigned_event(event)
    if isinstance(event, dict) and event.get("detail-type") == HOLDS_DETAIL_TYPE:
        return _record_holds_report(config, event, parse_holds_event(stripped))
    report = parse_usage_event(stripped)
    # An open window's end lies ahead by design (the agent reports it while it runs); a final one has ended.
    ended = [report.window_end] if report.final else []
    sequence, writer = _signed(config, event, report.instance_id, [report.window_start, report.collected_at] + ended)
    origin = check_usage_origin(report, config.cluster_name, config.controller_group,
                                describe_node(config.cluster_name, report.instance_id))
    if not origin.accepted:
        metrics.add_metric(name="UsageReportRejected", unit=MetricUnit.Count, value=1)
        raise UsageReportRejected(origin.reason)
    try:
        # The part on its own, then (as it is stored) the sum of its window's parts.
        instance_groups = _instance_groups(config.cluster_name)
        check_capacity(report, instance_groups)
        stored = usage_store.store_usage(config.state_table, report, int(time.time()), instance_groups, sequence,
                                         writer)
    except (UsageExceedsCapacityError, NodeChannelError):
        metrics.add_metric(name="SignedReportRefused", unit=MetricUnit.Count, value=1)
        raise
    metrics.add_metric(name="UsageRecords", unit=MetricUnit.Count, value=len(report.records) if stored["window"] else 0)
    logger.info("usage report recorded", extra={"window": report.window_start, "part": report.part,
                                                "status": report.status, "records": len(report.records), **stored})
    check = usage_check.decide_usage_check(report, bool(stored["window"]), config.hold_action, event.get("time"))
    started = usage_check.start_check(config.budget_state_machine_arn, check) if check.start else False
    logger.info(check.reason, extra={"usageCheck": check.name, "started": started})
    return {"stored": stored, "window": report.window_start, "status": report.status, "checkStarted": started}


def _signed(config: UsageReportConfig, event: dict, instance_id: str, times: list[str]) -> tuple[int, str]:
    """(the report's sequence, the signing key's fingerprint) if the enrolled controller agent signed it;
    counted and refused otherwise."""
    enrollment = enrollment_store.get_enrollment(config.state_table, config.cluster_name, instance_id)
    try:
        sequence = check_signed_report(event["detail"], enrollment, config.cluster_name, instance_id, "controller",
                                       datetime.now(timezone.utc), times)
        return sequence, enrollment.fingerprint
    except (NodeChannelError, NodeProofError) as error:
        metrics.add_metric(name="SignedReportRefused", unit=MetricUnit.Count, value=1)
        logger.warning("controller report refused", extra={"instanceId": instance_id, "error": type(error).__name__,
                                                           "reason": str(error)})
        raise


def _instance_groups(cluster: str) -> list[dict]:
    with transient_errors_named("sagemaker:DescribeCluster"):
        return client("sagemaker").describe_cluster(ClusterName=cluster).get("InstanceGroups") or []


def _record_holds_report(config: UsageReportConfig, event: dict, report: dict) -> dict:
    """The controller agent's holds report: same origin rule as usage; kept only when newer."""
    sequence, _ = _signed(config, event, report["instanceId"], [report["reportedAt"]])
    origin = check_usage_origin(origin_view(report), config.cluster_name, config.controller_group,
                                describe_node(config.cluster_name, report["instanceId"]))
    if not origin.accepted:
        metrics.add_metric(name="UsageReportRejected", unit=MetricUnit.Count, value=1)
        raise UsageReportRejected(origin.reason)
    received = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    try:
        stored = store_agent_report(config.state_table, report, received, sequence)
    except NodeChannelError:
        metrics.add_metric(name="SignedReportRefused", unit=MetricUnit.Count, value=1)
        raise
    logger.info("holds report recorded", extra={"version": report["version"], "enforced": report["enforced"],
                                                "users": len(report["users"]), "stored": stored})
    return {"stored": stored, "version": report["version"], "enforced": report["enforced"]}
