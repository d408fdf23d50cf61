"""What one EnforceSessionLimits invocation does, minus the Lambda plumbing.

The handler (functions/session_limits/enforce_session_limits.py) reads the configuration and the
task input, calls :func:`enforce_limits`, emits the metrics and log lines it gets back and returns
the output (or raises the named error). Everything in between lives here:

    gather (SSM, IAM) -> decide -> [ledger read, decide again] -> apply (TerminateSession)
        -> record the ended ids (DynamoDB) -> notify (SNS) -> metrics, log lines, output

Side effects run in an order that never loses the notification: record, then notify, then fail
the task by name (SessionReportFailed before SessionTerminationFailed).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from hpops_core.common.clients import THROTTLING_CODES, client, transient_errors_named
from hpops_core.common.errors import HpopsError, TransientAwsError

from . import ledger, node_sessions
from .apply import apply
from .cluster_sessions import SSH_KEY_PREFIX, SshSessionToEnd
from .config import SessionLimitsConfig
from .decide import TerminationPlan, decide
from .enforce import EnforcementReport, Notification
from .errors import SessionLimitError
from .gather import gather
from .identity import RUN_AS_OFF_REASON, RunAsPreferences
from .request import SessionLimitsRequest
from .session_api import Boto3SessionDirectory, RunAsPreferencesUnavailable, SessionListingFailed
from .task_result import OUTPUT_LIST_MAX, LogLine, TaskResult

SNS_MESSAGE_MAX_BYTES = 250_000  # SNS allows 256 KiB; keep a margin for the envelope


class SessionTerminationFailed(SessionLimitError):
    """TerminateSession failed for some sessions (named in the notification); the next run retries them."""


class SessionReportFailed(SessionLimitError):
    """Sessions were ended but recording them or notifying failed. Not retried: a rerun would find
    nothing left to end and so could not send the notification either; the alarm and logs carry it."""


# Survives warm invocations, and with it the run-as tag cache (IAM is the costly part of a sweep).
# Rebuilt when the cached boto3 clients change (a new twin world resets them).
_DIRECTORY: Boto3SessionDirectory | None = None


def session_directory(invoked_function_arn: str, tag_cache_seconds: int) -> Boto3SessionDirectory:
    """The invocation's session directory on the shared SSM and IAM clients. Tag lookups are
    limited to this function's own account (the fifth field of its ARN)."""
    global _DIRECTORY
    ssm, iam = client("ssm"), client("iam")
    if _DIRECTORY is None or _DIRECTORY.ssm is not ssm or _DIRECTORY.iam is not iam:
        account = str(invoked_function_arn or "").split(":")
        _DIRECTORY = Boto3SessionDirectory(
            ssm, iam, account_id=account[4] if len(account) > 4 else None, tag_ttl_seconds=tag_cache_seconds
        )
    return _DIRECTORY


@contextmanager
def listing_errors() -> Iterator[None]:
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


def enforce_limits(
    config: SessionLimitsConfig, request: SessionLimitsRequest, now: datetime, directory: Boto3SessionDirectory
) -> TaskResult:
    """One check of the login nodes' sessions, end to end: what ended and why, as a TaskResult.

    An event is checked against the starting principal's own sessions first (one call however big
    the account). Two Queries read the cluster's state first: the login nodes' reported SSH
    sessions (counted with the shells); the ledger of sessions already ended with the Run As state.
    Raises only before anything was ended (state read, listing, preferences).
    """
    dry_run = request.dry_run or config.dry_run
    owner_listing = directory.owner_scoped(request.owner) if request.mode == "event" and request.owner else None
    # The login nodes' own lists: SSH sessions count with the shells, one limit per user cluster-wide.
    state = node_sessions.read_cluster_state(config.state_table, config.cluster_name, now)
    nodes, recorded = state.nodes, dict(state.recorded)
    with listing_errors():
        snapshot = gather(directory, config.cluster_id, config.login_group, config.policy, config.identity,
                          trigger_session_id=request.session_id, owner_listing=owner_listing,
                          other_sessions=len(nodes.ssh) + sum(sum(c.values()) for c in nodes.unlisted.values()))
    ended_before = {sid for sid, kind in recorded.items() if kind == ledger.ENDED}
    plan = decide(snapshot, config.policy, config.identity, now, ended_before, ssh_sessions=nodes.ssh,
                  ssh_unlisted=nodes.unlisted)
    outcome = apply(directory, plan, dry_run)
    report = EnforcementReport.of(snapshot, plan, outcome, dry_run=dry_run, trigger=request.trigger)

    instructed, ssh_problems = _instruct_nodes(config, plan, nodes, recorded, dry_run, now)
    written, notified, problems = _record_and_notify(config, report, recorded, now)
    problems = ssh_problems + problems
    run_as_alerted = _alert_run_as_change(config, snapshot.run_as, state.run_as, now, problems)
    output = enforcement_output(report, request, snapshot.scope, notified=notified, recorded=written)
    if snapshot.run_as is not None:
        output["limitsApply"] = snapshot.run_as.enabled
        output["runAsAlerted"] = run_as_alerted
    if snapshot.run_as is not None and not snapshot.run_as.enabled:
        output["note"] = RUN_AS_OFF_REASON
    output["ssh"] = ssh_output(plan, nodes, instructed, dry_run)
    log = [LogLine("info", f"{len(report.ended)} ended, {len(report.planned)} planned, "
                           f"{len(report.users_over_limit)} user(s) over limit", {"report": output})]
    skipped = [{"sessionId": u.session_id, "reason": u.reason}
               for u in (*report.not_on_login_nodes, *report.not_shells)][:OUTPUT_LIST_MAX]
    if skipped:
        log.append(LogLine("info", "sessions under the login prefix that were not counted", {"skipped": skipped}))
    error: HpopsError | None = None
    if problems:
        log.append(LogLine("error", "session limits: side effects failed",
                           {"problems": problems, "report": output}))
        error = SessionReportFailed("; ".join(problems))
    elif report.failed:
        error = SessionTerminationFailed(
            f"{len(report.failed)} TerminateSession call(s) failed: " + ", ".join(f.session_id for f in report.failed[:10])
        )
    # Sessions ended by path: SessionsEnded (Session Manager, TerminateSession), SshSessionsEnded (SSH,
    # the holding node told to end it; its agent's next report says it did).
    metrics = report.metrics() | {"SshSessionsEnded": len(plan.ssh_to_end) if instructed else 0,
                                  "SshSessionsReported": len(nodes.ssh)}
    return TaskResult(output, metrics, tuple(log), error)


def _record_and_notify(
    config: SessionLimitsConfig, report: EnforcementReport, recorded: Mapping[str, str], now: datetime
) -> tuple[int, bool, list[str]]:
    """Record the ended ids (in a dry run: the newly reported ones), then notify.
    Returns (records written, whether SNS took the notification, what failed)."""
    problems: list[str] = []
    written = 0
    notification = report.notification(config.cluster_name)
    try:
        if report.ended:
            written = ledger.record_sessions(
                config.state_table, config.cluster_name,
                [ledger.RecordedSession(s.session_id, s.posix_user) for s in report.ended], ledger.ENDED, now,
            )
        elif report.dry_run and report.planned:
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
            _publish(config.topic_arn, notification)
            notified = True
        except (HpopsError, ClientError, BotoCoreError) as exc:
            problems.append(f"SNS notification failed: {type(exc).__name__}: {exc}")
    return written, notified, problems


def _ssh_key(session: SshSessionToEnd) -> str:
    return f"{SSH_KEY_PREFIX}{session.instance_id}/{session.handle}"


def _instruct_nodes(config: SessionLimitsConfig, plan: TerminationPlan, nodes: node_sessions.ReportedSessions,
                    recorded: Mapping[str, str], dry_run: bool, now: datetime) -> tuple[dict[str, int], list[str]]:
    """Tell each node holding an SSH session to end which one (its end-sessions parameter), record
    the sessions so the next run neither counts nor picks them while the node's report still lists
    them, and tell the AlertTopic. A dry run tells no node, and reports each session once."""
    if not plan.ssh_to_end:
        return {}, []
    new = [s for s in plan.ssh_to_end if _ssh_key(s) not in recorded]
    instructed: dict[str, int] = {}
    try:
        if dry_run:
            ledger.record_sessions(config.state_table, config.cluster_name,
                                   [ledger.RecordedSession(_ssh_key(s), s.user) for s in new], ledger.DRY_RUN_REPORTED, now)
        else:
            earlier = [k for k, kind in recorded.items() if kind == ledger.ENDED and k.startswith(SSH_KEY_PREFIX)]
            instructed = node_sessions.instruct_nodes(config.cluster_name, plan.ssh_to_end, nodes.ssh, earlier)
            ledger.record_sessions(config.state_table, config.cluster_name,
                                   [ledger.RecordedSession(_ssh_key(s), s.user) for s in plan.ssh_to_end], ledger.ENDED, now)
    except (HpopsError, ClientError, BotoCoreError) as exc:
        return {}, [f"telling login nodes to end SSH sessions failed: {type(exc).__name__}: {exc}"]
    told = new if dry_run else list(plan.ssh_to_end)
    if not told:
        return instructed, []
    verb = "would end" if dry_run else "told the login nodes to end"
    users = ", ".join(sorted({s.user for s in told}))
    lines = [f"Login-node session limit on HyperPod cluster {config.cluster_name}: {verb} {len(told)} SSH "
             "session(s) over the cluster-wide limit (SSH and Session Manager on all login nodes together)."]
    lines += [f"  - {s.user} on {s.instance_id}, session {s.handle}: {s.reason}" for s in told[:OUTPUT_LIST_MAX]]
    try:
        _publish(config.topic_arn, Notification(
            subject=f"HyperPod {config.cluster_name}: {verb} {len(told)} SSH session(s) ({users})"[:100],
            text="\n".join(lines), data={"ssh": [{"node": s.instance_id, "handle": s.handle, "user": s.user}
                                                 for s in told[:OUTPUT_LIST_MAX]], "dryRun": dry_run}))
    except (HpopsError, ClientError, BotoCoreError) as exc:
        return instructed, [f"SNS notification of SSH sessions failed: {type(exc).__name__}: {exc}"]
    return instructed, []


def ssh_output(plan: TerminationPlan, nodes: node_sessions.ReportedSessions, instructed: Mapping[str, int],
               dry_run: bool) -> dict[str, Any]:
    """The SSH half of the cluster-wide limit in the task output: what the nodes reported, which
    sessions their agents are told to end, what they said they did, and each user by path and node."""
    return {
        "nodesReporting": list(nodes.nodes[:OUTPUT_LIST_MAX]),
        "staleReports": list(nodes.stale[:OUTPUT_LIST_MAX]),
        "sessionsReported": len(nodes.ssh),
        "omittedByNodes": nodes.omitted,
        "toEnd": [{"node": s.instance_id, "handle": s.handle, "user": s.user, "reason": s.reason}
                  for s in plan.ssh_to_end[:OUTPUT_LIST_MAX]],
        "toEndCount": len(plan.ssh_to_end),
        "nodesTold": {} if dry_run else dict(instructed),
        "endedByNodes": [dict(outcome) for outcome in list(nodes.ended.values())[:OUTPUT_LIST_MAX]],
        "byUser": {user: {path: dict(n) for path, n in paths.items()}
                   for user, paths in list(plan.by_user.items())[:OUTPUT_LIST_MAX]},
    }


def _alert_run_as_change(config: SessionLimitsConfig, run_as: RunAsPreferences | None, last_seen: str | None,
                         now: datetime, problems: list[str]) -> bool:
    """One alert when Run As turns off (nobody can be limited) and one when it is back on; not on
    every run. Read only when someone could be over a limit, which is when it matters. Written only
    when it differs from what the run read (never recorded counts as on)."""
    if run_as is None:
        return False
    state = ledger.RUN_AS_ON if run_as.enabled else ledger.RUN_AS_OFF
    if state == (last_seen or ledger.RUN_AS_ON):
        return False
    try:
        if not ledger.record_run_as_state(config.state_table, config.cluster_name, state, now):
            return False
        if run_as.enabled:
            subject = f"HyperPod {config.cluster_name}: Session Manager Run As is on again; per-user limits apply"
            text = f"{subject}.\nSession Manager preferences: {run_as.describe()}."
        else:
            subject = f"HyperPod {config.cluster_name}: Run As is off; session limits cannot apply"
            text = (f"{RUN_AS_OFF_REASON}.\nOn HyperPod nodes a Session Manager session with Run As off connects "
                    "as root, which is never limited, so no Session Manager shell is counted or ended until Run As "
                    f"is turned on.\nSession Manager preferences: {run_as.describe()}.")
        _publish(config.topic_arn, Notification(subject=subject[:100], text=text,
                                                data={"cluster": config.cluster_name, "runAs": state}))
        return True
    except (HpopsError, ClientError, BotoCoreError) as exc:
        problems.append(f"Run As alert failed: {type(exc).__name__}: {exc}")
        return False


def _publish(topic_arn: str, notification: Notification) -> None:
    message = notification.message
    if len(message.encode()) > SNS_MESSAGE_MAX_BYTES:
        message = notification.text.encode()[: SNS_MESSAGE_MAX_BYTES - 200].decode(errors="ignore")
        message += "\n\n(details omitted: too large for SNS; see the execution output and the function logs)"
    with transient_errors_named("sns:Publish"):
        client("sns").publish(TopicArn=topic_arn, Subject=notification.subject, Message=message)


def _iso(value: datetime) -> str:
    return value.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def enforcement_output(report: EnforcementReport, request: SessionLimitsRequest, scope: str,
                       notified: bool, recorded: int) -> dict[str, Any]:
    """The task output (``$.enforcement.report``): compact, lists capped at OUTPUT_LIST_MAX."""
    over = report.users_over_limit
    return {
        "cluster": request.cluster,
        "clusterId": report.cluster_id,
        "loginGroup": report.login_group,
        "mode": request.mode,
        "scope": scope,  # "owner": only the starting principal's sessions were listed; "all": every session
        "dryRun": report.dry_run,
        "trigger": report.trigger,
        "checkedAt": _iso(report.checked_at),
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
        "ended": [{"sessionId": s.session_id, "user": s.posix_user, "target": s.target, "startDate": _iso(s.start_date)}
                  for s in report.ended[:OUTPUT_LIST_MAX]],
        "endedCount": len(report.ended),
        "failed": [{"sessionId": f.session_id, "user": f.posix_user, "error": f.error}
                   for f in report.failed[:OUTPUT_LIST_MAX]],
        "failedCount": len(report.failed),
        "unresolvedCount": len(report.unresolved),
        # Listed under the login prefix but never counted: each with its reason in the logs.
        "notOnLoginNodesCount": len(report.not_on_login_nodes),
        "notShellsCount": len(report.not_shells),
        "runAs": report.run_as,
        "recorded": recorded,
        "notified": notified,
        "note": report.note,
        "apiCalls": dict(report.api_calls),  # SSM and IAM: gathering and TerminateSession
    }
