"""Enforcement in one call, and its report: gather -> decide -> apply (gather.py, decide.py, apply.py).

:func:`enforce` runs the three steps against one :class:`~.session_api.SessionDirectory` for callers
that keep no ledger (unit tests, the twin's checks). The Lambda's run (run.py) calls the steps
itself, because it reads the ended-session ledger between deciding and applying. Either way the
:class:`EnforcementReport` is the outcome: ``notification()`` for SNS, ``metrics()`` for CloudWatch,
``ended_ids`` for the next run's ``already_ended``.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from .apply import ApplyOutcome, FailedTermination, apply
from .decide import SessionToEnd, TerminationPlan, decide
from .gather import SessionSnapshot, UnresolvedSession, gather
from .identity import IdentityConfig, IdentityResolution
from .policy import LimitPolicy, UserVerdict
from .session_api import SessionDirectory
from .targets import login_target_matches

if TYPE_CHECKING:
    from .models import StartSessionEvent

SNS_SUBJECT_MAX = 100  # SNS rejects longer subjects


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
    planned: tuple[SessionToEnd, ...]  # what the decision picked (ended unless dry run / failure)
    ended: tuple[SessionToEnd, ...]
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

    @classmethod
    def of(
        cls, snapshot: SessionSnapshot, plan: TerminationPlan, outcome: ApplyOutcome, *, dry_run: bool, trigger: str
    ) -> EnforcementReport:
        """The report of one run: what was gathered, decided and applied. ``api_calls`` covers
        gathering and applying (SSM and IAM; the ledger and SNS are the caller's)."""
        calls = Counter(snapshot.api_calls) + Counter(outcome.api_calls)
        return cls(
            cluster_id=snapshot.cluster_id,
            login_group=snapshot.login_group,
            checked_at=plan.checked_at,
            dry_run=dry_run,
            trigger=trigger,
            login_sessions_listed=len(snapshot.sessions),
            verdicts=plan.verdicts,
            planned=plan.to_end,
            ended=outcome.ended,
            failed=outcome.failed,
            unresolved=plan.unresolved,
            identities=plan.identities,
            api_calls=MappingProxyType(dict(sorted(calls.items()))),
            note=plan.note,
            trigger_session_listed=snapshot.trigger_session_listed,
            skipped=tuple((s.session_id, s.reason) for s in plan.skipped),
            not_on_login_nodes=snapshot.not_on_login_nodes,
            not_shells=snapshot.not_shells,
            run_as=snapshot.run_as.describe() if snapshot.run_as is not None and plan.identities else "",
        )

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
        def ended(s: SessionToEnd) -> dict[str, Any]:
            return {
                "session_id": s.session_id,
                "posix_user": s.posix_user,
                "owner": s.owner,
                "target": s.target,
                "start_date": _iso(s.start_date),
                "reason": s.reason,
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

    def notification(self, cluster_name: str = "") -> Notification | None:
        """SNS-ready summary, or None when nothing worth telling anyone happened. ``cluster_name``: how
        people know the cluster (the id, what session targets carry, otherwise)."""
        if not self.planned and not self.failed:
            return None
        verb = "would end" if self.dry_run else "ended"
        count = len(self.planned) if self.dry_run else len(self.ended)
        users = ", ".join(v.user for v in self.users_over_limit)
        name = cluster_name or self.cluster_id
        subject = f"HyperPod {name}: {verb} {count} login session(s) over limit ({users})"
        if self.failed:
            subject = f"HyperPod {name}: {len(self.failed)} session termination(s) FAILED"
        subject = _sns_subject(subject)

        planned_by_id = {s.session_id: s for s in self.planned}
        ended_ids = set(self.ended_ids)
        failed_by_id = {f.session_id: f for f in self.failed}
        lines = [
            f"Login-node session limit on HyperPod cluster {name}"
            f"{f' (id {self.cluster_id})' if name != self.cluster_id else ''} "
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
    """Bring one cluster's login group within limits and report what happened: gather, decide, apply.

    Raises only for what makes any decision unsafe (bad cluster/group names, a listing or Run As
    preferences failure). Per-principal tag lookup failures and per-session termination failures
    are in the report instead, so one bad principal does not block everyone else.
    """
    snapshot = gather(directory, cluster_id, login_group, policy, identity_config, trigger_session_id=trigger_session_id)
    plan = decide(snapshot, policy, identity_config, now, already_terminated)
    return EnforcementReport.of(snapshot, plan, apply(directory, plan, dry_run), dry_run=dry_run, trigger=trigger)


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
    # Parsing a raw event needs the pydantic model; the Lambda gets requests ParseSessionTrigger
    # already parsed, so enforcement loads without it.
    from .models import parse_start_session

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
