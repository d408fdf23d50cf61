"""SessionLimits Lambda handlers: per-user limits on Session Manager sessions to the login nodes.

Thin, like functions/login_node_sync/app.py: parse, read config, delegate to
hpops_core.session_limits (pure decision + enforcement core), then do the side effects in order.
Step order, retries and error routing live in statemachines/session_limits.asl.json.

    ParseSessionTrigger   {"input": <CloudTrail StartSession event | sweep input>} -> request
    EnforceSessionLimits  {"request", "now"} -> list, decide, terminate the excess, record the ended
                          ids, notify (SNS), metrics -> a compact JSON report
    PublishLoginLimits    {"request", "now"} (sweeps only) -> the same limits published for the login
                          nodes' agents (pam_limits maxlogins), and which nodes report them applied
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext
from botocore.exceptions import BotoCoreError, ClientError

from hpops_core.common.clients import THROTTLING_CODES, client, transient_errors_named
from hpops_core.common.errors import HpopsError, MalformedEventError, TransientAwsError, UnknownClusterError
from hpops_core.session_limits import ledger
from hpops_core.session_limits.config import LoginLimitsConfig, SessionLimitsConfig, SessionTriggerConfig
from hpops_core.session_limits.login_limits import publish_and_check
from hpops_core.session_limits.directories import OwnerScopedDirectory, SnapshotDirectory
from hpops_core.session_limits.enforce import EnforcementReport, Notification, enforce
from hpops_core.session_limits.models import login_target_prefix
from hpops_core.session_limits.session_api import (
    Boto3SessionDirectory,
    RunAsPreferencesUnavailable,
    SessionListingFailed,
)
from hpops_core.session_limits.trigger import SessionLimitsRequest, parse_session_input

logger = Logger()
tracer = Tracer()
metrics = Metrics()

SNS_MESSAGE_MAX_BYTES = 250_000  # SNS allows 256 KiB; keep a margin for the envelope
OUTPUT_LIST_MAX = 100  # keep the state (256 KiB limit) small however big a sweep is


class SessionTerminationFailed(HpopsError):
    """TerminateSession failed for some sessions (named in the notification); the next run retries them."""


class SessionReportFailed(HpopsError):
    """Sessions were ended but recording them or notifying failed. Not retried: a rerun would find
    nothing left to end and so could not send the notification either; the alarm and logs carry it."""


# Survives warm invocations, and with it the run-as tag cache (IAM is the costly part of a sweep).
# Rebuilt when the cached boto3 clients change (a new twin world resets them).
_DIRECTORY: Boto3SessionDirectory | None = None


def _session_directory(config: SessionLimitsConfig, context: LambdaContext) -> Boto3SessionDirectory:
    global _DIRECTORY
    ssm, iam = client("ssm"), client("iam")
    if _DIRECTORY is None or _DIRECTORY.ssm is not ssm or _DIRECTORY.iam is not iam:
        account = str(getattr(context, "invoked_function_arn", "")).split(":")
        _DIRECTORY = Boto3SessionDirectory(
            ssm, iam, account_id=account[4] if len(account) > 4 else None, tag_ttl_seconds=config.tag_cache_seconds
        )
    return _DIRECTORY


@contextmanager
def _listing_errors() -> Iterator[None]:
    """Throttling/5xx that outlived botocore's retries (listing sessions, reading the Run As
    preferences) -> TransientAwsError (the state machine retries with backoff); anything else
    (AccessDenied...) keeps its own name and fails the run."""
    try:
        yield
    except (SessionListingFailed, RunAsPreferencesUnavailable) as exc:
        cause = exc.__cause__
        if isinstance(cause, ClientError):
            code = cause.response.get("Error", {}).get("Code", "")
            status = cause.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            if code in THROTTLING_CODES or status >= 500:
                raise TransientAwsError(str(exc)) from exc
        elif isinstance(cause, BotoCoreError):
            raise TransientAwsError(str(exc)) from exc
        raise


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


def _now(value: Any) -> datetime:
    if value is None:
        return datetime.now(timezone.utc)
    try:
        parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        raise MalformedEventError("now must be an ISO 8601 timestamp") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def _enforce(directory: Any, config: SessionLimitsConfig, request: SessionLimitsRequest, now: datetime,
             dry_run: bool, done: frozenset[str]) -> EnforcementReport:
    return enforce(
        directory, config.cluster_id, config.login_group, config.policy, config.identity, now,
        dry_run=dry_run, already_terminated=done, trigger=request.trigger, trigger_session_id=request.session_id,
    )


def _publish(config: SessionLimitsConfig, notification: Notification) -> None:
    message = notification.message
    if len(message.encode()) > SNS_MESSAGE_MAX_BYTES:
        message = notification.text.encode()[: SNS_MESSAGE_MAX_BYTES - 200].decode(errors="ignore")
        message += "\n\n(details omitted: too large for SNS; see the execution output and the function logs)"
    with transient_errors_named("sns:Publish"):
        client("sns").publish(TopicArn=config.topic_arn, Subject=notification.subject, Message=message)


def _output(report: EnforcementReport, request: SessionLimitsRequest, scope: str, notified: bool,
            recorded: int, calls: Counter) -> dict:
    def ended(s: Any) -> dict:
        return {"sessionId": s.session_id, "user": s.posix_user, "target": s.target,
                "startDate": s.start_date.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")}

    over = report.users_over_limit
    return {
        "cluster": request.cluster,
        "clusterId": report.cluster_id,
        "loginGroup": report.login_group,
        "mode": request.mode,
        "scope": scope,  # "owner": only the starting principal's sessions were listed; "all": every session
        "dryRun": report.dry_run,
        "trigger": report.trigger,
        "checkedAt": report.checked_at.astimezone(timezone.utc).isoformat().replace("+00:00", "Z"),
        "loginSessionsListed": report.login_sessions_listed,
        "triggerSessionListed": report.trigger_session_listed,
        "usersOverLimit": [
            {"user": v.user, "limit": v.limit, "activeCount": v.active_count, "toTerminate": list(v.to_terminate),
             "reason": v.reason}
            for v in over[:OUTPUT_LIST_MAX]
        ],
        "usersOverLimitCount": len(over),
        "planned": list(report.planned_ids[:OUTPUT_LIST_MAX]),
        "plannedCount": len(report.planned),
        "ended": [ended(s) for s in report.ended[:OUTPUT_LIST_MAX]],
        "endedCount": len(report.ended),
        "failed": [{"sessionId": f.session_id, "user": f.posix_user, "error": f.error} for f in report.failed[:OUTPUT_LIST_MAX]],
        "failedCount": len(report.failed),
        "unresolvedCount": len(report.unresolved),
        # Listed under the login prefix but never counted: each with its reason in the logs.
        "notOnLoginNodesCount": len(report.not_on_login_nodes),
        "notShellsCount": len(report.not_shells),
        "runAs": report.run_as,
        "recorded": recorded,
        "notified": notified,
        "note": report.note,
        "apiCalls": {k: v for k, v in sorted(calls.items()) if v > 0},
    }


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def enforce_session_limits(event: dict, context: LambdaContext) -> dict:
    """{"request": <ParseSessionTrigger output>, "now": ISO time} -> what was ended and why."""
    config = SessionLimitsConfig.from_env()
    request = SessionLimitsRequest.from_state(event.get("request") if isinstance(event, dict) else None)
    if request.cluster != config.cluster_name:
        raise UnknownClusterError(f"cluster {request.cluster} is not managed by this stack ({config.cluster_name})")
    now = _now(event.get("now"))
    dry_run = request.dry_run or config.dry_run
    base = _session_directory(config, context)
    calls_before = Counter(base.calls)
    prefix = login_target_prefix(config.cluster_id, config.login_group)

    with _listing_errors():
        # An event is checked against the starting principal's own sessions (one call however big
        # the account). Unless that listing shows a session of this owner, list everything.
        scope, directory = "all", SnapshotDirectory(base)
        if request.mode == "event" and request.owner:
            scoped = SnapshotDirectory(OwnerScopedDirectory(base, request.owner))
            list(scoped.active_sessions(prefix))
            if request.session_id in scoped.listed(prefix, "SessionId") or request.owner in scoped.listed(prefix, "Owner"):
                scope, directory = "owner", scoped
        # Plan first without the ledger: if nothing would be ended, the ledger is never read.
        report = _enforce(directory, config, request, now, dry_run=True, done=frozenset())
        recorded: dict[str, str] = {}
        if report.planned:
            recorded = ledger.recorded_sessions(config.state_table, config.cluster_name, now)
            done = frozenset(sid for sid, kind in recorded.items() if kind == ledger.ENDED)
            report = _enforce(directory, config, request, now, dry_run=dry_run, done=done)
        else:
            report = replace(report, dry_run=dry_run)

    # The report's call counts cover both planning passes (SSM and IAM; DynamoDB/SNS come below).
    calls = Counter(base.calls)
    calls.subtract(calls_before)
    report = replace(report, api_calls={k: v for k, v in sorted(calls.items()) if v > 0})

    # Side effects, in an order that never loses the notification: record, then notify, then raise.
    problems: list[str] = []
    written = 0
    notification = report.notification()
    try:
        if report.ended:
            written = ledger.record_sessions(
                config.state_table, config.cluster_name,
                [ledger.RecordedSession(s.session_id, s.posix_user) for s in report.ended], ledger.ENDED, now,
            )
        elif dry_run and report.planned:
            # A dry run reports each would-be-ended session once, not on every sweep.
            new = [s for s in report.planned if s.session_id not in recorded]
            if not new:
                notification = None
            else:
                written = ledger.record_sessions(
                    config.state_table, config.cluster_name,
                    [ledger.RecordedSession(s.session_id, s.posix_user) for s in new], ledger.DRY_RUN_REPORTED, now,
                )
    except (HpopsError, ClientError, BotoCoreError) as exc:
        problems.append(f"recording ended sessions failed: {type(exc).__name__}: {exc}")
    notified = False
    if notification is not None:
        try:
            _publish(config, notification)
            notified = True
        except (HpopsError, ClientError, BotoCoreError) as exc:
            problems.append(f"SNS notification failed: {type(exc).__name__}: {exc}")

    for name, value in report.metrics().items():
        metrics.add_metric(name=name, unit=MetricUnit.Count, value=value)
    output = _output(report, request, scope, notified, written, calls)
    logger.info(
        f"{len(report.ended)} ended, {len(report.planned)} planned, {len(report.users_over_limit)} user(s) over limit",
        extra={"report": output},
    )
    skipped = [{"sessionId": u.session_id, "reason": u.reason}
               for u in (*report.not_on_login_nodes, *report.not_shells)][:OUTPUT_LIST_MAX]
    if skipped:
        logger.info("sessions under the login prefix that were not counted", extra={"skipped": skipped})
    if problems:
        logger.error("session limits: side effects failed", extra={"problems": problems, "report": output})
        raise SessionReportFailed("; ".join(problems))
    if report.failed:
        raise SessionTerminationFailed(
            f"{len(report.failed)} TerminateSession call(s) failed: "
            + ", ".join(f.session_id for f in report.failed[:10])
        )
    return output


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def publish_login_limits(event: dict, context: LambdaContext) -> dict:
    """{"request", "now"} -> {version, published, applied, pending, failed}: maxlogins for the login nodes.

    Only the sweep runs this (the state machine's IsSweep choice). A node that has not applied the
    limits within the grace period is counted (LoginLimitsPushFailed); it does not fail the run.
    """
    config = LoginLimitsConfig.from_env()
    request = SessionLimitsRequest.from_state(event.get("request") if isinstance(event, dict) else None)
    if request.cluster != config.cluster_name:
        raise UnknownClusterError(f"cluster {request.cluster} is not managed by this stack ({config.cluster_name})")
    dry_run = request.dry_run or config.dry_run
    result = publish_and_check(config.cluster_name, config.login_group, config.state_table, config.limits,
                               _now(event.get("now")), dry_run=dry_run)
    applied, pending, failed = result.of("applied"), result.of("pending"), result.of("failed")
    output = {
        "version": result.version, "published": result.published,
        "applied": [n.instance_id for n in applied][:OUTPUT_LIST_MAX],
        "pending": [n.instance_id for n in pending][:OUTPUT_LIST_MAX],
        "failed": [{"instanceId": n.instance_id, "reason": n.reason} for n in failed][:OUTPUT_LIST_MAX],
        "appliedCount": len(applied), "pendingCount": len(pending), "failedCount": len(failed),
    }
    if dry_run:  # nothing published, so no node is judged and no metric could page anyone
        output |= {"dryRun": True, "wouldPublish": result.would_publish,
                   "skipped": "dry run: login node limits are not changed"}
        logger.info("login node limits: dry run", extra={"report": output})
        return output
    metrics.add_metric(name="LoginLimitsApplied", unit=MetricUnit.Count, value=len(applied))
    metrics.add_metric(name="LoginLimitsPending", unit=MetricUnit.Count, value=len(pending))
    metrics.add_metric(name="LoginLimitsPushFailed", unit=MetricUnit.Count, value=len(failed))  # alarmed
    (logger.warning if failed else logger.info)("login node limits checked", extra={"report": output})
    return output
