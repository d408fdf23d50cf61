"""LoginAdmission: where load-aware admission enters (a schedule, every 5 minutes).

Reads the login target group's health, the login nodes' stored reports and the admission record;
the pure decision (hpops_core.login_sync.admission) says which nodes take new connections and why;
the record is written back; when the set out of rotation changed and LoadAwareAdmission is "on",
one LoginNodeSync execution applies it (the sync is the only writer of the target group). In
"dry-run" every move is logged as it would be made, and nothing else changes.
"""

from __future__ import annotations

import time
from dataclasses import replace

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from hpops_core.common.observability import handler_tools
from hpops_core.common.clients import start_named_execution
from hpops_core.login_sync import admission, admission_store, target_group
from hpops_core.login_sync.config import ADMISSION_RECORD_MAX_AGE_SECONDS, AdmissionConfig
from hpops_core.login_sync.target_plan import LEAVING_STATES
from hpops_core.node_channel import report_store

logger, tracer, metrics = handler_tools(calls_aws=True)


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics(raise_on_empty_metrics=False)
def decide_login_admission(event: dict, context: LambdaContext) -> dict:
    """Scheduled event (its content is not used) -> {moves, out, imbalance, syncStarted}."""
    config = AdmissionConfig.from_env()
    now = int(time.time())
    registered = {t.ip: t.state for t in target_group.describe_targets(config.target_group_arn)
                  if t.port == config.ssh_port and t.state not in LEAVING_STATES}
    reports = report_store.cluster_reports(config.state_table, config.cluster_name)
    previous, version = admission_store.read_admission(config.state_table, config.cluster_name)
    nodes = admission.node_loads(reports, registered, previous, now, admission.REPORT_MAX_AGE_SECONDS)
    # Read each run: with ExistingTargetGroupArn the delay is the target group's owner's to change.
    policy = replace(config.policy, max_out_seconds=admission.max_out_for(target_group.deregistration_delay(config.target_group_arn)))
    decision = admission.decide_admission(nodes, previous, policy, now, config.mode)
    admission_store.write_admission(config.state_table, config.cluster_name, decision.state, version)
    verb = "" if config.mode == "on" else "would "
    for move in decision.moves:
        logger.info(f"{verb}{move.action} rotation", extra={"instanceId": move.instance_id, "ip": move.ip,
                                                           "reason": move.reason, "mode": config.mode})
    started = False
    # Also when switched from "on" to "dry-run": the nodes it held out come back now, not at the next sweep.
    changed = admission.rotation_changed(previous, decision.state, ADMISSION_RECORD_MAX_AGE_SECONDS)
    if changed and "on" in (config.mode, previous.mode):
        # The sweep reconciles the whole login group, reading this record: one writer of the target group.
        started = start_named_execution(config.sync_state_machine_arn, f"admission-{now}-{version + 1}",
                                        {"cluster": config.cluster_name, "mode": "sweep", "dryRun": False,
                                         "trigger": "load-aware admission"})
    if decision.imbalance:
        # Non-zero only while a sustained imbalance lasts: the metric is billed only in those hours.
        metrics.add_metric(name="LoginImbalance", unit=MetricUnit.Count, value=1)
    metrics.add_metric(name="AdmissionMoves", unit=MetricUnit.Count, value=len(decision.moves))
    logger.info("login admission", extra={"summary": decision.summary, "mode": config.mode,
                                          "reasons": list(decision.reasons), "imbalance": decision.imbalance,
                                          "figures": dict(decision.figures), "syncStarted": started})
    return {"moves": [{"instanceId": m.instance_id, "ip": m.ip, "action": m.action, "reason": m.reason}
                      for m in decision.moves],
            "out": sorted(decision.state.out), "imbalance": decision.imbalance, "syncStarted": started,
            "mode": config.mode}
