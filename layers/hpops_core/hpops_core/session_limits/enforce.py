"""Orchestration: list -> resolve identities -> decide -> terminate -> report.

No boto3 here: AWS is reached only through a :class:`SessionDirectory`, so the same code runs in
Lambda (``Boto3SessionDirectory``), in unit tests and in the local twin (in-memory directory).
The caller owns side effects beyond sessions: it publishes ``report.notification()`` to SNS,
emits ``report.metrics()``, and persists ``report.ended_ids`` as the next run's
``already_terminated`` (Step Functions state or a table), which is what makes duplicate events
harmless.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from types import MappingProxyType
from typing import Any

from hpops_core.common import validation

from .documents import session_kind
from .identity import (
    IdentityConfig,
    IdentityResolution,
    RunAsPreferences,
    needs_principal_tags,
    normalize_owner,
    resolve_posix_user,
)
from .models import (
    SessionLimitError,
    StartSessionEvent,
    login_target_matches,
    login_target_prefix,
    parse_start_session,
    target_mismatch,
)
from .policy import COUNTED_STATUSES, ActiveSession, Decision, LimitPolicy, UserVerdict, decide_terminations
from .session_api import SessionDirectory

SNS_SUBJECT_MAX = 100  # SNS rejects longer subjects


@dataclass(frozen=True)
class EndedSession:
    session_id: str
    posix_user: str
    owner: str
    target: str
    start_date: datetime


@dataclass(frozen=True)
class FailedTermination:
    session_id: str
    posix_user: str
    error: str


@dataclass(frozen=True)
class UnresolvedSession:
    """A listed session that is neither counted nor ended, and why."""

    session_id: str
    owner: str | None
    reason: str


@dataclass(frozen=True)
class Notification:
    subject: str
    text: str
    data: Mapping[str, Any]

    @property
    def message(self) -> str:
        """SNS ``Message``: readable text first (email subscribers), then the JSON for machines."""
        return f"{self.text}\n\n--- details (JSON) ---\n{json.dumps(self.data, indent=2, sort_keys=True)}"


@dataclass(frozen=True)
class EnforcementReport:
    cluster_id: str
    login_group: str
    checked_at: datetime
    dry_run: bool
    trigger: str
    login_sessions_listed: int
    verdicts: tuple[UserVerdict, ...]
    planned: tuple[EndedSession, ...]  # what the decision picked (ended unless dry run / failure)
    ended: tuple[EndedSession, ...]
    failed: tuple[FailedTermination, ...]
    unresolved: tuple[UnresolvedSession, ...]
    identities: Mapping[str, IdentityResolution]  # owner ARN -> resolution, for audit
    api_calls: Mapping[str, int]
    note: str = ""
    trigger_session_listed: bool | None = None  # None for sweeps
    skipped: tuple[tuple[str, str], ...] = field(default=())
    # Listed under the login prefix but not counted, each with its reason: a target that is not
    # exactly this cluster's login group (e.g. group "login-2"), or a session that is no shell.
    not_on_login_nodes: tuple[UnresolvedSession, ...] = ()
    not_shells: tuple[UnresolvedSession, ...] = ()
    run_as: str = ""  # the Run As preferences identities were resolved with; "" when none were needed

    @property
    def ended_ids(self) -> tuple[str, ...]:
        return tuple(s.session_id for s in self.ended)

    @property
    def planned_ids(self) -> tuple[str, ...]:
        return tuple(s.session_id for s in self.planned)

    @property
    def users_over_limit(self) -> tuple[UserVerdict, ...]:
        return tuple(v for v in self.verdicts if v.to_terminate)

    @property
    def total_api_calls(self) -> int:
        return sum(self.api_calls.values())

    def metrics(self) -> dict[str, int]:
        """Counts for CloudWatch (the caller picks the namespace and dimensions)."""
        return {
            "SessionsEnded": len(self.ended),
            "SessionsPlanned": len(self.planned),
            "UsersOverLimit": len(self.users_over_limit),
            "TerminationFailures": len(self.failed),
            "UnresolvedSessions": len(self.unresolved),
            "LoginSessionsListed": self.login_sessions_listed,
            "SessionsNotOnLoginNodes": len(self.not_on_login_nodes),
            "SessionsNotShells": len(self.not_shells),
        }

    def to_dict(self) -> dict[str, Any]:
        def ended(s: EndedSession) -> dict[str, Any]:
            return {
                "session_id": s.session_id,
                "posix_user": s.posix_user,
                "owner": s.owner,
                "target": s.target,
                "start_date": _iso(s.start_date),
            }

        return {
            "cluster_id": self.cluster_id,
            "login_group": self.login_group,
            "checked_at": _iso(self.checked_at),
            "dry_run": self.dry_run,
            "trigger": self.trigger,
            "note": self.note,
            "login_sessions_listed": self.login_sessions_listed,
            "users_over_limit": [
                {
                    "user": v.user,
                    "limit": v.limit,
                    "active_count": v.active_count,
                    "to_terminate": list(v.to_terminate),
                    "reason": v.reason,
                }
                for v in self.users_over_limit
            ],
            "planned": [ended(s) for s in self.planned],
            "ended": [ended(s) for s in self.ended],
            "failed": [{"session_id": f.session_id, "posix_user": f.posix_user, "error": f.error} for f in self.failed],
            "unresolved": [{"session_id": u.session_id, "owner": u.owner, "reason": u.reason} for u in self.unresolved],
            "not_on_login_nodes": [{"session_id": u.session_id, "reason": u.reason} for u in self.not_on_login_nodes],
            "not_shells": [{"session_id": u.session_id, "reason": u.reason} for u in self.not_shells],
            "run_as": self.run_as,
            "api_calls": dict(self.api_calls),
        }

    def notification(self) -> Notification | None:
        """SNS-ready summary, or None when nothing worth telling anyone happened."""
        if not self.planned and not self.failed:
            return None
        verb = "would end" if self.dry_run else "ended"
        count = len(self.planned) if self.dry_run else len(self.ended)
        users = ", ".join(v.user for v in self.users_over_limit)
        subject = f"HyperPod {self.cluster_id}: {verb} {count} login session(s) over limit ({users})"
        if self.failed:
            subject = f"HyperPod {self.cluster_id}: {len(self.failed)} session termination(s) FAILED"
        subject = _sns_subject(subject)

        planned_by_id = {s.session_id: s for s in self.planned}
        ended_ids = set(self.ended_ids)
        failed_by_id = {f.session_id: f for f in self.failed}
        lines = [
            f"Login-node session limit on HyperPod cluster {self.cluster_id} "
            f"(instance group '{self.login_group}') checked at {_iso(self.checked_at)} ({self.trigger}).",
        ]
        if self.dry_run:
            lines.append("DRY RUN: no session was terminated; this is what enforcement would do.")
        if self.run_as:
            lines.append(f"Session Manager preferences: {self.run_as}.")
        for verdict in self.users_over_limit:
            lines.append("")
            lines.append(
                f"User {verdict.user}: limit {verdict.limit}, {verdict.active_count} active session(s); "
                f"{verb} {len(verdict.to_terminate)}:"
            )
            for session_id in verdict.to_terminate:
                s = planned_by_id[session_id]
                if self.dry_run:
                    state = "would be terminated"
                elif session_id in ended_ids:
                    state = "terminated"
                else:
                    state = f"TERMINATION FAILED ({failed_by_id[session_id].error})" if session_id in failed_by_id else "not terminated"
                lines.append(
                    f"  - {session_id} on {s.target.rsplit('_', 1)[-1]}, started {_iso(s.start_date)}, "
                    f"owner {s.owner}: {state}"
                )
        if self.unresolved:
            lines.append("")
            lines.append(f"{len(self.unresolved)} session(s) could not be attributed to a POSIX user and were left alone.")
        return Notification(subject=subject, text="\n".join(lines), data=self.to_dict())


def _iso(value: datetime) -> str:
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def _sns_subject(subject: str) -> str:
    # SNS subjects: printable ASCII, no line breaks, <= 100 chars. Inputs are validated, but be sure.
    cleaned = "".join(ch if 32 <= ord(ch) < 127 else "?" for ch in subject)
    return cleaned if len(cleaned) <= SNS_SUBJECT_MAX else cleaned[: SNS_SUBJECT_MAX - 3] + "..."


def _call_counts(directory: SessionDirectory) -> Counter[str]:
    calls = getattr(directory, "calls", None)
    return Counter(calls) if isinstance(calls, Mapping) else Counter()


_COUNTED, _NOT_ON_LOGIN_NODES, _NOT_SHELL, _UNUSABLE = "counted", "not on login nodes", "not a shell", "unusable"


def _session_from_record(record: Any, cluster_id: str, login_group: str) -> tuple[dict[str, Any] | None, str, str]:
    """Check one DescribeSessions record. Pure: (clean fields, "counted", "") or (None, category, reason)."""
    if not isinstance(record, Mapping):
        return None, _UNUSABLE, "record is not an object"
    session_id = record.get("SessionId")
    if not validation.is_session_id(session_id):
        return None, _UNUSABLE, "missing or unsafe SessionId"
    target = record.get("Target")
    mismatch = target_mismatch(target, cluster_id, login_group)
    if mismatch:
        # Prefix filtering lets "login-2" through for group "login"; this is the exact check.
        return None, _NOT_ON_LOGIN_NODES, mismatch
    kind = session_kind(record.get("DocumentName"))
    if not kind.counted:
        return None, _NOT_SHELL, f"not an interactive shell: {kind.reason}"
    owner = record.get("Owner")
    if not isinstance(owner, str) or not owner:
        return None, _UNUSABLE, "missing Owner"
    start = record.get("StartDate")
    if not isinstance(start, datetime):
        return None, _UNUSABLE, "missing StartDate (cannot order it, so never ended)"
    status = record.get("Status")
    if not isinstance(status, str):
        return None, _UNUSABLE, "missing Status"
    return {"session_id": session_id, "target": target, "owner": owner, "start_date": start, "status": status}, _COUNTED, ""


def enforce(
    directory: SessionDirectory,
    cluster_id: str,
    login_group: str,
    policy: LimitPolicy,
    identity_config: IdentityConfig,
    now: datetime,
    dry_run: bool = False,
    already_terminated: Iterable[str] = frozenset(),
    trigger: str = "sweep",
    trigger_session_id: str | None = None,
) -> EnforcementReport:
    """Bring one cluster's login group within limits and report what happened.

    Raises only for things that make any decision unsafe (bad cluster/group names, listing
    failure). Per-principal tag lookup failures and per-session termination failures are
    recorded in the report instead, so one bad principal does not block everyone else.
    """
    prefix = login_target_prefix(cluster_id, login_group)  # validates both names
    done = frozenset(already_terminated)
    calls_before = _call_counts(directory)

    unresolved: list[UnresolvedSession] = []
    not_on_login_nodes: list[UnresolvedSession] = []
    not_shells: list[UnresolvedSession] = []
    records: list[dict[str, Any]] = []
    seen_ids: set[str] = set()
    listed = 0
    for raw in directory.active_sessions(prefix):
        clean, category, why = _session_from_record(raw, cluster_id, login_group)
        if clean is None:
            sid = raw.get("SessionId") if isinstance(raw, Mapping) else None
            sid = sid if validation.is_session_id(sid) else "<invalid>"
            owner = raw.get("Owner") if isinstance(raw, Mapping) and isinstance(raw.get("Owner"), str) else None
            {_NOT_ON_LOGIN_NODES: not_on_login_nodes, _NOT_SHELL: not_shells}.get(category, unresolved).append(
                UnresolvedSession(sid, owner, why)
            )
            continue
        if clean["session_id"] in seen_ids:  # paging can repeat a record while the set changes
            continue
        seen_ids.add(clean["session_id"])
        listed += 1
        records.append(clean)

    # Cheap exit: if the sessions that could count are no more than the smallest limit anyone has,
    # nobody can be over, so skip every identity (IAM) lookup. Keeps the common event at one call.
    candidates = [
        r
        for r in records
        if r["status"] in COUNTED_STATUSES
        and r["session_id"] not in done
        and policy.principal_exempt(r["owner"]) is None
    ]
    identities: dict[str, IdentityResolution] = {}
    note = ""
    run_as = ""
    if len(candidates) <= policy.min_limit():
        note = f"{len(candidates)} countable session(s) <= smallest limit {policy.min_limit()}; no identity lookups needed"
        decision = Decision(verdicts=(), to_terminate=())
    else:
        # Whose session it is depends first on the account's Run As settings; without them no
        # decision is safe, so a failure to read them (RunAsPreferencesUnavailable) stops the run.
        preferences = directory.run_as_preferences()
        run_as = preferences.describe()
        tag_cache: dict[str, dict[str, str] | None] = {}
        for r in candidates:
            owner = r["owner"]
            if owner in identities:
                continue
            identities[owner] = _resolve(directory, owner, identity_config, preferences, tag_cache)
        sessions = []
        for r in candidates:
            resolution = identities[r["owner"]]
            if resolution.posix_user is None:
                unresolved.append(UnresolvedSession(r["session_id"], r["owner"], resolution.reason))
            sessions.append(ActiveSession(posix_user=resolution.posix_user, **r))
        decision = decide_terminations(sessions, policy, done)

    by_id = {r["session_id"]: r for r in records}
    user_of = {sid: v.user for v in decision.verdicts for sid in v.to_terminate}
    planned = tuple(
        EndedSession(sid, user_of[sid], by_id[sid]["owner"], by_id[sid]["target"], by_id[sid]["start_date"])
        for sid in decision.to_terminate
    )

    ended: list[EndedSession] = []
    failed: list[FailedTermination] = []
    if not dry_run:
        for session in planned:
            try:
                directory.terminate(session.session_id)
            except SessionLimitError as exc:  # TerminateFailed and friends; keep going for the rest
                failed.append(FailedTermination(session.session_id, session.posix_user, str(exc)))
            else:
                ended.append(session)

    calls = _call_counts(directory)
    calls.subtract(calls_before)
    api_calls = {k: v for k, v in sorted(calls.items()) if v > 0}

    return EnforcementReport(
        cluster_id=cluster_id,
        login_group=login_group,
        checked_at=now,
        dry_run=dry_run,
        trigger=trigger,
        login_sessions_listed=listed,
        verdicts=decision.verdicts,
        planned=planned,
        ended=tuple(ended),
        failed=tuple(failed),
        unresolved=tuple(unresolved),
        identities=MappingProxyType(identities),
        api_calls=MappingProxyType(api_calls),
        note=note,
        trigger_session_listed=None if trigger_session_id is None else trigger_session_id in by_id,
        skipped=tuple((s.session_id, s.reason) for s in decision.skipped),
        not_on_login_nodes=tuple(not_on_login_nodes),
        not_shells=tuple(not_shells),
        run_as=run_as,
    )


def _resolve(
    directory: SessionDirectory,
    owner: str,
    config: IdentityConfig,
    preferences: RunAsPreferences,
    tag_cache: dict[str, dict[str, str] | None],
) -> IdentityResolution:
    tags: dict[str, str] | None = None
    iam_arn = normalize_owner(owner) if needs_principal_tags(owner, preferences, config) else None
    if iam_arn is not None:
        # Many sessions share one role (assumed-role/Researchers/alice, .../bob): one lookup each run.
        if iam_arn not in tag_cache:
            try:
                tag_cache[iam_arn] = directory.principal_tags(iam_arn)
            except SessionLimitError as exc:
                tag_cache[iam_arn] = None
                # The tag outranks the default user; guessing without it could end the wrong
                # person's session, so such principals are left uncounted this run.
                return IdentityResolution(None, "unmapped", f"run-as tag lookup failed ({exc}); not counted")
        tags = tag_cache[iam_arn]
        if tags is None:
            return IdentityResolution(None, "unmapped", "run-as tag lookup failed earlier this run; not counted")
    return resolve_posix_user(owner, preferences, tags, config.mapping_rules, config.unmapped_policy)


def enforce_for_event(
    event: Mapping[str, Any] | StartSessionEvent,
    directory: SessionDirectory,
    cluster_id: str,
    login_group: str,
    policy: LimitPolicy,
    identity_config: IdentityConfig,
    now: datetime,
    dry_run: bool = False,
    already_terminated: Iterable[str] = frozenset(),
) -> EnforcementReport | None:
    """Handle one StartSession event. Malformed events raise before any AWS call; events for
    other clusters/groups return None. The event only *triggers* a full check: the decision
    uses the current session list, so event order and duplicates do not matter. A session the
    listing does not show yet (``trigger_session_listed`` False) is caught by the next sweep.
    """
    parsed = parse_start_session(event)
    if not login_target_matches(parsed.target, cluster_id, login_group):
        return None
    return enforce(
        directory,
        cluster_id,
        login_group,
        policy,
        identity_config,
        now,
        dry_run=dry_run,
        already_terminated=already_terminated,
        trigger=f"StartSession event {parsed.event_id} for session {parsed.session_id}",
        trigger_session_id=parsed.session_id,
    )
