"""RecordUsageReport: where the controller's Slurm usage and holds reports enter (a rule on the node-report bus).

Validate (a named error for anything malformed: EventBridge's retries, then the DLQ and its alarm),
check that DescribeClusterNode places the sender in the controller group, keep the window; with holds
on, a kept report with usage starts the BudgetGuard check at once (usage_check).
"""

from __future__ import annotations

import time

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from hpops_core.common.observability import handler_tools
from hpops_core.budget_guard import usage_check, usage_store
from hpops_core.budget_guard.config import UsageReportConfig
from hpops_core.budget_guard.usage_reports import UsageReportRejected, check_usage_origin, parse_usage_event
from hpops_core.budget_guard.hold_reports import origin_view, parse_holds_event
from hpops_core.budget_guard.hold_state import store_agent_report
from hpops_core.cluster.login_group import describe_node
from hpops_core.node_channel.user_holds import HOLDS_DETAIL_TYPE

logger, tracer, metrics = handler_tools(calls_aws=True)


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics(raise_on_empty_metrics=False)
def record_usage_report(event: dict, context: LambdaContext) -> dict:
    """EventBridge event (detail-type "HyperPod Slurm Usage Report") -> {stored, window, status};
    "HyperPod Slurm Holds Report" -> {stored, version, enforced}."""
    config = UsageReportConfig.from_env()
    if isinstance(event, dict) and event.get("detail-type") == HOLDS_DETAIL_TYPE:
        return _record_holds_report(config, event)
    report = parse_usage_event(event)
    origin = check_usage_origin(report, config.cluster_name, config.controller_group,
                                describe_node(config.cluster_name, report.instance_id))
    if not origin.accepted:
        metrics.add_metric(name="UsageReportRejected", unit=MetricUnit.Count, value=1)
        raise UsageReportRejected(origin.reason)
    stored = usage_store.store_usage(config.state_table, report, int(time.time()))
    metrics.add_metric(name="UsageRecords", unit=MetricUnit.Count, value=len(report.records) if stored["window"] else 0)
    logger.info("usage report recorded", extra={"window": report.window_start, "part": report.part,
                                                "status": report.status, "records": len(report.records), **stored})
    check = usage_check.decide_usage_check(report, bool(stored["window"]), config.hold_action, event.get("time"))
    started = usage_check.start_check(config.budget_state_machine_arn, check) if check.start else False
    logger.info(check.reason, extra={"usageCheck": check.name, "started": started})
    return {"stored": stored, "window": report.window_start, "status": report.status, "checkStarted": started}


def _record_holds_report(config: UsageReportConfig, event: dict) -> dict:
    """The controller agent's holds report: same origin rule as usage; kept only when newer."""
    report = parse_holds_event(event)
    origin = check_usage_origin(origin_view(report), config.cluster_name, config.controller_group,
                                describe_node(config.cluster_name, report["instanceId"]))
    if not origin.accepted:
        metrics.add_metric(name="UsageReportRejected", unit=MetricUnit.Count, value=1)
        raise UsageReportRejected(origin.reason)
    received = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    stored = store_agent_report(config.state_table, report, received)
    logger.info("holds report recorded", extra={"version": report["version"], "enforced": report["enforced"],
                                                "users": len(report["users"]), "stored": stored})
    return {"stored": stored, "version": report["version"], "enforced": report["enforced"]}
