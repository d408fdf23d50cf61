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
    """EventBridge sessions-changed announcement -> {start, started, name, users, reason, read}
    (read: the users whose stored sessions were read, or "every node" when the announcement named none)."""
    config = ReportCheckConfig.from_env()
    node = report_check.announced_node(event, config.cluster_name)
    users = report_check.announced_users(event)
    now = datetime.now(timezone.utc)
    presence = node_sessions.read_node_presence(config.state_table, config.cluster_name, now)
    if users is None:  # too many users to name: every node's whole report
        state = node_sessions.read_cluster_state(config.state_table, config.cluster_name, now, fresh_node=node)
    else:
        state = node_sessions.read_users_state(config.state_table, config.cluster_name, users, now, presence)
    check = report_check.decide_report_check(config.cluster_name, state, config.policy)
    # No custom metric: the checks it starts are SessionLimits executions (AWS/States counts them).
    started = report_check.start_check(config.state_machine_arn, check) if check.start else False
    # The dashboard's spread graph reads this line (a Logs Insights query: no custom metric).
    logger.info("login spread", extra=report_check.login_spread(presence.fresh))
    logger.info("reported sessions checked", extra={"node": node, "users": None if users is None else len(users),
                                                    "start": check.start, "started": started,
                                                    "execution": check.name, "reason": check.reason})
    return {"start": check.start, "started": started, "name": check.name, "users": list(check.users),
            "reason": check.reason, "read": "every node" if users is None else list(users)}
