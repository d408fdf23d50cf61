"""Step 1 of enforcement, gather: every AWS read a decision needs, into one immutable snapshot.

Reads go through a :class:`~.session_api.SessionDirectory` only (DescribeSessions, the Session
Manager preferences document, IAM role/user tags), so the same code runs in Lambda, in unit tests
and in the local twin. Nothing here decides whose session ends: that is :func:`.decide.decide`,
which is pure and reads nothing but the snapshot.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from types import MappingProxyType
from typing import Any, Literal, Protocol

from hpops_core.common import validation

from .documents import session_kind
from .errors import SessionLimitError
from .identity import IdentityConfig, RunAsPreferences, needs_principal_tags, normalize_owner
from .policy import COUNTED_STATUSES, LimitPolicy
from .session_api import SessionDirectory
from .targets import login_target_prefix, target_mismatch

Scope = Literal["owner", "all"]


@dataclass(frozen=True)
class ListedSession:
    """A session on this cluster's login nodes that is an interactive shell, with every field a
    decision needs (records missing one are :class:`UnresolvedSession` instead)."""

    session_id: str
    owner: str
    target: str
    start_date: datetime
    status: str


@dataclass(frozen=True)
class UnresolvedSession:
    """A listed session that is neither counted nor ended, and why."""

    session_id: str
    owner: str | None
    reason: str


@dataclass(frozen=True)
class TagLookup:
    """One IAM role's or user's tags, or why they could not be read."""

    tags: Mapping[str, str] | None
    error: str = ""

    def __post_init__(self) -> None:
        if self.tags is not None:
            object.__setattr__(self, "tags", MappingProxyType(dict(self.tags)))


@dataclass(frozen=True)
class SessionSnapshot:
    """What AWS said, once: the decision reads this and nothing else."""

    cluster_id: str
    login_group: str
    scope: Scope  # "owner": only the starting principal's sessions were listed; "all": every session
    sessions: tuple[ListedSession, ...]  # counted candidates, deduplicated, in listing order
    # Listed under the login prefix but never counted, each with its reason.
    not_on_login_nodes: tuple[UnresolvedSession, ...] = ()  # e.g. group "login-2" for group "login"
    not_shells: tuple[UnresolvedSession, ...] = ()  # port forwarding, SSH tunnels, commands
    unusable: tuple[UnresolvedSession, ...] = ()  # records missing an id, owner, start date or status
    # The account's Run As settings and the principals' tags; None / empty when nobody could be over
    # a limit, so no identity was worth a call (``identities_skipped`` says why).
    run_as: RunAsPreferences | None = None
    principal_tags: Mapping[str, TagLookup] = field(default_factory=lambda: MappingProxyType({}))
    identities_skipped: str = ""
    trigger_session_listed: bool | None = None  # None when no session triggered the check (sweeps)
    api_calls: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        # Read-only all the way down, whoever builds it: a decision can never change what was read.
        for name in ("sessions", "not_on_login_nodes", "not_shells", "unusable"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        object.__setattr__(self, "principal_tags", MappingProxyType(dict(self.principal_tags)))
        object.__setattr__(self, "api_calls", MappingProxyType(dict(self.api_calls)))

    def countable(self, policy: LimitPolicy, already_ended: frozenset[str] = frozenset()) -> list[ListedSession]:
        """Sessions that occupy a slot and could be limited: the ones identities matter for."""
        return [
            s for s in self.sessions
            if s.status in COUNTED_STATUSES
            and s.session_id not in already_ended
            and policy.principal_exempt(s.owner) is None
        ]


class OwnerListing(SessionDirectory, Protocol):
    """A directory whose listing holds only one principal's sessions (``Boto3SessionDirectory.owner_scoped``)."""

    owner: str


def call_counts(directory: Any) -> Counter[str]:
    """A copy of the directory's API call counter (empty if it keeps none)."""
    calls = getattr(directory, "calls", None)
    return Counter(calls) if isinstance(calls, Mapping) else Counter()


def calls_since(directory: Any, before: Counter[str]) -> dict[str, int]:
    """The calls made since ``before`` was taken, by AWS operation name."""
    calls = call_counts(directory)
    calls.subtract(before)
    return {name: count for name, count in sorted(calls.items()) if count > 0}


def _classify(record: Any, cluster_id: str, login_group: str) -> ListedSession | tuple[str, UnresolvedSession]:
    """One DescribeSessions record -> a counted candidate, or (category, why not). Pure."""
    sid = record.get("SessionId") if isinstance(record, Mapping) else None
    owner = record.get("Owner") if isinstance(record, Mapping) else None
    shown_id = sid if validation.is_session_id(sid) else "<invalid>"
    shown_owner = owner if isinstance(owner, str) else None

    def skip(category: str, reason: str) -> tuple[str, UnresolvedSession]:
        return category, UnresolvedSession(shown_id, shown_owner, reason)

    if not isinstance(record, Mapping):
        return skip("unusable", "record is not an object")
    if not validation.is_session_id(sid):
        return skip("unusable", "missing or unsafe SessionId")
    target = record.get("Target")
    mismatch = target_mismatch(target, cluster_id, login_group)
    if mismatch:
        # Prefix filtering lets "login-2" through for group "login"; this is the exact check.
        return skip("not on login nodes", mismatch)
    kind = session_kind(record.get("DocumentName"))
    if not kind.counted:
        return skip("not a shell", f"not an interactive shell: {kind.reason}")
    if not isinstance(owner, str) or not owner:
        return skip("unusable", "missing Owner")
    start = record.get("StartDate")
    if not isinstance(start, datetime):
        return skip("unusable", "missing StartDate (cannot order it, so never ended)")
    status = record.get("Status")
    if not isinstance(status, str):
        return skip("unusable", "missing Status")
    return ListedSession(sid, owner, target, start, status)


def _shows_owner(records: list[Any], owner: str, session_id: str | None) -> bool:
    for record in records:
        if isinstance(record, Mapping) and (record.get("Owner") == owner or record.get("SessionId") == session_id):
            return True
    return False


def gather(
    directory: SessionDirectory,
    cluster_id: str,
    login_group: str,
    policy: LimitPolicy,
    identity_config: IdentityConfig,
    *,
    trigger_session_id: str | None = None,
    owner_listing: OwnerListing | None = None,
    other_sessions: int = 0,
) -> SessionSnapshot:
    """List the login-node sessions and read what attributing them to POSIX users takes.

    ``owner_listing`` (a StartSession event): that principal's sessions are listed first, one call
    however big the account. They are used when they show a session of that principal (the new one,
    or another when the new one already ended); otherwise everything is listed from ``directory``.

    ``policy`` and ``identity_config`` only decide which reads are worth making: if the sessions
    that could count are no more than the smallest limit anyone has, nobody can be over, so the
    Run As preferences and tags are not read (the common event stays at one call). Tags are read
    once per IAM role/user, only for owners whose Run As the tag could decide.

    ``other_sessions``: sessions counted besides these shells (the login nodes' SSH sessions), which
    can put a user over with fewer shells.

    Raises for what makes any decision unsafe (bad cluster/group names, ``SessionListingFailed``,
    ``RunAsPreferencesUnavailable``). A failed tag lookup is recorded in the snapshot instead, so
    one unreadable principal does not block everyone else.
    """
    prefix = login_target_prefix(cluster_id, login_group)  # validates both names
    before = call_counts(directory)
    scope: Scope = "all"
    records: list[Any] | None = None
    if owner_listing is not None:
        scoped = list(owner_listing.active_sessions(prefix))
        if _shows_owner(scoped, owner_listing.owner, trigger_session_id):
            scope, records = "owner", scoped
    if records is None:
        records = list(directory.active_sessions(prefix))

    sessions: dict[str, ListedSession] = {}  # paging can repeat a record while the set changes
    skipped: dict[str, list[UnresolvedSession]] = {"not on login nodes": [], "not a shell": [], "unusable": []}
    for record in records:
        result = _classify(record, cluster_id, login_group)
        if isinstance(result, ListedSession):
            sessions.setdefault(result.session_id, result)
        else:
            skipped[result[0]].append(result[1])

    snapshot = SessionSnapshot(
        cluster_id=cluster_id,
        login_group=login_group,
        scope=scope,
        sessions=tuple(sessions.values()),
        not_on_login_nodes=tuple(skipped["not on login nodes"]),
        not_shells=tuple(skipped["not a shell"]),
        unusable=tuple(skipped["unusable"]),
        trigger_session_listed=None if trigger_session_id is None else trigger_session_id in sessions,
    )
    countable = snapshot.countable(policy)
    if len(countable) + other_sessions <= policy.min_limit():
        skipped_because = (
            f"{len(countable)} countable session(s) <= smallest limit {policy.min_limit()}; no identity lookups needed"
        )
        return replace(snapshot, identities_skipped=skipped_because, api_calls=calls_since(directory, before))

    # Whose session it is depends first on the account's Run As settings; without them no decision
    # is safe, so a failure to read them (RunAsPreferencesUnavailable) stops the run here.
    run_as = directory.run_as_preferences()
    tags: dict[str, TagLookup] = {}
    for owner in dict.fromkeys(s.owner for s in countable):
        iam_arn = normalize_owner(owner) if needs_principal_tags(owner, run_as, identity_config) else None
        # Many sessions share one role (assumed-role/Researchers/alice, .../bob): one lookup each.
        if iam_arn is None or iam_arn in tags:
            continue
        try:
            tags[iam_arn] = TagLookup(directory.principal_tags(iam_arn))
        except SessionLimitError as exc:  # TagLookupFailed: that principal stays uncounted
            tags[iam_arn] = TagLookup(None, str(exc))
    return replace(snapshot, run_as=run_as, principal_tags=tags, api_calls=calls_since(directory, before))
