"""NodeChannel: the node agent's authenticated line to the stack (lambda:InvokeFunction, synchronous).

The answer goes back over the invoke response to the caller only; nothing secret is logged. Each
action is a thin step: parse, verify the proof, decide (pure, node_channel/*), then write. A
refused request gets a named error answer ({"ok": false, "error": <class name>, "message"}) and
changes nothing; enrollment conflicts are counted and sent to the AlertTopic (enrollment_alert.py).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from hpops_core.common.observability import handler_tools
from hpops_core.budget_guard import hold_state, usage_store
from hpops_core.cluster.login_group import describe_node
from hpops_core.common.errors import HpopsError, TransientAwsError
from hpops_core.node_channel import (
    enrollment_alert,
    enrollment_store,
    fetch_serve,
    instance_identity,
    node_proof,
    report_store,
    user_sessions,
)
from hpops_core.node_channel.config import NodeChannelConfig
from hpops_core.node_channel.contract import USAGE_RECOLLECT_MAX_WINDOWS, USAGE_WINDOW_SECONDS
from hpops_core.node_channel.enrollment import (
    DOCUMENT,
    EnrollmentConflictError,
    EnrollmentRefusedError,
    MalformedNodeChannelRequest,
    decide_enrollment,
    parse_statement,
    precheck,
    replacing,
    signed_document,
)

logger, tracer, metrics = handler_tools(calls_aws=True)
MAX_REQUEST_CHARS = 16 * 1024


def enroll(config: NodeChannelConfig, request: dict, now: datetime) -> dict:
    """{"action": "enroll", "statement": {...}, "proof": SSHSIG} -> {"ok", "status", "fingerprint", "role", "via"}."""
    statement = parse_statement(request.get("statement"))
    body = {"statement": request.get("statement")}
    node_proof.verify(request.get("proof"), statement.public_key, node_proof.namespace("enroll", config.cluster_name),
                      node_proof.canonical(body))
    fingerprint = node_proof.fingerprint(statement.public_key)
    existing = enrollment_store.get_enrollment(config.state_table, config.cluster_name, statement.instance_id)
    approval = enrollment_store.get_approval(config.state_table, config.cluster_name, statement.instance_id,
                                             int(now.timestamp()))
    decision = precheck(statement, fingerprint, existing, approval, now)
    if decision is None:
        signed = signed_document(statement)
        # A document that does not verify is refused by name (instance_identity.py), never read.
        document = instance_identity.verify(*signed) if signed else None
        seen = document is not None or enrollment_store.documents_seen(config.state_table, config.cluster_name)
        decision = decide_enrollment(
            statement, fingerprint, describe_node(config.cluster_name, statement.instance_id), existing, approval,
            now, config.cluster_name, config.login_group, config.controller_group,
            timedelta(minutes=config.enrollment_window_minutes), document, config.region, seen)
    if decision.resets and existing is not None and existing.fingerprint != decision.record.fingerprint:
        # Stored with the record: if this call fails before the old key's leftovers are gone, the agent's
        # next enroll call ("already") finishes the discard.
        decision = replace(decision, record=replacing(decision.record, existing,
                                                      approval if decision.outcome == "re-enroll" else None))
    log = {"instanceId": statement.instance_id, "fingerprint": fingerprint, "outcome": decision.outcome,
           "reason": decision.reason}
    if decision.outcome == "enroll" and not enrollment_store.put_first(config.state_table, decision.record):
        # Another presenter won between our read and write: decide again against what it stored.
        return enroll(config, request, now)
    if decision.outcome == "displace" and not enrollment_store.put_displacing(config.state_table, decision.record,
                                                                              existing):
        return enroll(config, request, now)
    if decision.outcome == "re-enroll":
        try:
            if not enrollment_store.put_approved(config.state_table, decision.record,
                                                 existing.fingerprint if existing else None):
                raise EnrollmentRefusedError(f"the operator's approval for {statement.instance_id} was used or replaced")
        except enrollment_store.StandingKeyChangedError:
            return enroll(config, request, now)  # what the approval replaces changed: decide again
    if decision.outcome == "contest" and not enrollment_store.mark_contested(
            config.state_table, config.cluster_name, statement.instance_id, fingerprint):
        decision = replace(decision, outcome="conflict")  # the contest records were full meanwhile
    if decision.outcome in ("contest", "conflict", "displace"):
        # Counted in the log line, and the team told (once an hour per node): the attempt is the signal.
        metrics.add_metric(name="EnrollmentConflict", unit=MetricUnit.Count, value=1)
        log["alerted"] = enrollment_alert.alert_conflict(
            config.alert_topic_arn, config.state_table, config.cluster_name, statement.instance_id, decision.outcome,
            fingerprint, existing.fingerprint if existing else None, int(now.timestamp()))
        logger.warning("enrollment conflict", extra=log)
        if decision.outcome != "displace":
            raise EnrollmentConflictError(decision.reason)
    if decision.outcome == "await-approval":
        logger.info("enrollment awaits an operator approval", extra=log)
        raise EnrollmentRefusedError(decision.reason)
    if not decision.accepted:
        raise EnrollmentRefusedError(decision.reason)
    record = decision.record
    if record.replaced_key:
        record = discard_replaced(config, record, now)
        log["recollectFrom"] = record.recollect_from
    if record.via == DOCUMENT and decision.outcome != "already":
        enrollment_store.record_documents_seen(config.state_table, config.cluster_name, record.enrolled_at)
    logger.info("enrolled", extra=log)
    answer = {"ok": True, "status": record.status, "instanceId": record.instance_id, "fingerprint": record.fingerprint,
              "role": record.role, "group": record.group, "via": record.via}
    if record.recollect_from:  # asked again every ENROLL_RECHECK_SECONDS: the agent pulls it like desired state
        answer["recollectFrom"] = record.recollect_from
    return answer


def discard_replaced(config: NodeChannelConfig, record, now: datetime):
    """Whatever the key ``record.replaced_key`` left counts for nothing: its stored report (and
    sequence) goes with the node's per-user session items. On a controller, unless the operator's
    approval said that key was the node's own (``replaced_usage_kept``), its usage windows from the
    first it wrote (at most USAGE_RECOLLECT_MAX_WINDOWS back) are voided (one write every sweep reads),
    as are those of any earlier replaced key whose discard had not finished, its holds report goes, and
    the new key's agent is told to re-collect those hours from Slurm accounting. Every step can run
    again: the record keeps replaced_key until the last one is done, so a call that fails half way is
    finished by the agent's next enroll call; a retry at most drops a report the new key sent meanwhile
    (sent again at its next poll). Returns the record with replaced_key cleared and recollect_from set
    when there is anything to re-collect."""
    dropped = report_store.forget_report(config.state_table, config.cluster_name, record.instance_id)
    user_sessions.forget_node(config.state_table, config.cluster_name, record.instance_id, dropped)
    firsts = []
    if record.role == "controller" and record.keys_to_void:
        since = now - timedelta(seconds=USAGE_WINDOW_SECONDS * USAGE_RECOLLECT_MAX_WINDOWS)
        for key in record.keys_to_void:
            first = usage_store.first_window_written(config.state_table, config.cluster_name, key, since, now)
            if first is not None:
                usage_store.void_writer(config.state_table, config.cluster_name, key, first, int(now.timestamp()))
                firsts.append(first)
        hold_state.forget_agent_report(config.state_table, config.cluster_name)
    first = min(firsts, default="")
    if not enrollment_store.finish_replacement(config.state_table, config.cluster_name, record.instance_id,
                                               record.fingerprint, first):
        return record  # another key was enrolled meanwhile: its own call answers for it
    return replace(record, replaced_key="", replaced_usage_kept=False, earlier_replaced_keys=(),
                   recollect_from=first or record.recollect_from)


# action -> handler(config, request, now) -> answer
ACTIONS = {"enroll": enroll, "fetch": fetch_serve.serve}


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics(raise_on_empty_metrics=False)
def handle(event: dict, context: LambdaContext) -> dict:
    """A node agent's request -> an answer; a refused request is a named error answer, nothing changed."""
    config = NodeChannelConfig.from_env()
    now = datetime.now(timezone.utc).replace(microsecond=0)
    action = event.get("action") if isinstance(event, dict) else None
    try:
        if not isinstance(event, dict) or len(str(event)) > MAX_REQUEST_CHARS or action not in ACTIONS:
            raise MalformedNodeChannelRequest("expected {\"action\": one of " + ", ".join(sorted(ACTIONS)) + ", ...}")
        return ACTIONS[action](config, event, now)
    except TransientAwsError:
        raise  # AWS trouble, not a refusal: the invoke reports a function error and the agent retries
    except HpopsError as error:
        # Logged, not counted: conflicts (the attack that matters) have their metric and alarm above.
        logger.warning("node channel request refused", extra={"action": str(action)[:32],
                                                              "error": type(error).__name__, "reason": str(error)})
        return {"ok": False, "error": type(error).__name__, "message": str(error)}
