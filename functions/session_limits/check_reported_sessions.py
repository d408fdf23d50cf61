"""CheckReportedSessions: a login node's session list changed (RecordNodeReport's announcement, after
its origin check) -> the stored reports (one eventually consistent Query, the announcing node's read strongly) and
the ledger; when someone is over their limit cluster-wide,
start a SessionLimits execution at once (hpops_core.session_limits.report_check says when and why). It also logs
how evenly the login nodes carry sessions ("login spread"), which the dashboard graphs.
"""

from __future__ import annotations

from datetime import datetime, timezone

from aws_lambda_powertools.utilities.typing import LambdaContext

from hpops_core.common.observability import handler_tools
from hpops_core.session_limits import node_sessions, report_check
from hpops_core.session_limits.config import ReportCheckConfig

logger, tracer, metrics = handler_tools(calls_aws=True)


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics(raise_on_empty_metrics=False)
def check_reported_sessions(event: dict, context: LambdaContext) -> dict:
    """EventBridge sessions-changed announcement -> {start, started, name, users, reason}."""
    config = ReportCheckConfig.from_env()
    node = report_check.announced_node(event, config.cluster_name)
    state = node_sessions.read_cluster_state(config.state_table, config.cluster_name, datetime.now(timezone.utc),
                                             fresh_node=node)
    check = report_check.decide_report_check(config.cluster_name, state, config.policy)
    # No custom metric: the checks it starts are SessionLimits executions (AWS/States counts them).
    started = report_check.start_check(config.state_machine_arn, check) if check.start else False
    # The dashboard's spread graph reads this line (a Logs Insights query: no custom metric).
    logger.info("login spread", extra=report_check.login_spread(state.nodes))
    logger.info("reported sessions checked", extra={"node": node, "start": check.start, "started": started,
                                                    "execution": check.name, "reason": check.reason})
    return {"start": check.start, "started": started, "name": check.name, "users": list(check.users),
            "reason": check.reason}
