"""Pure limit decision: given every active login-node session, which ones end and why.

The decision always looks at the *whole current set* of sessions, never at the event that
triggered it, so duplicated, delayed or reordered events converge on the same outcome, and the
periodic sweep uses exactly the same code.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from fnmatch import fnmatchcase
from types import MappingProxyType
from typing import Literal

from hpops_core.common import validation

from .errors import SessionLimitError

# Disconnected sessions can be resumed but hold no shell; Terminating ones are already on the way
# out. Only these two statuses occupy a login-node slot.
COUNTED_STATUSES = frozenset({"Connected", "Connecting"})

Excess = Literal["newest", "oldest"]


class InvalidPolicy(SessionLimitError, ValueError):
    """The limit policy cannot be applied safely (negative limits, unknown excess mode, ...)."""


def _check_limit(name: str, value: object, minimum: int) -> int:
    # bool is an int subclass; "True sessions" is always a config mistake.
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidPolicy(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


@dataclass(frozen=True)
class LimitPolicy:
    default_max: int
    overrides: Mapping[str, int] = field(default_factory=dict)
    exempt_users: frozenset[str] = frozenset()
    # fnmatch globs over the session Owner ARN (e.g. a break-glass admin role); such sessions
    # neither count toward nor are ended by any limit.
    exempt_principal_patterns: tuple[str, ...] = ()
    excess: Excess = "newest"

    def __post_init__(self) -> None:
        # default >= 1 so a typo cannot lock every user out; an explicit override of 0 is allowed
        # (deliberately blocks one user from login nodes).
        _check_limit("default_max", self.default_max, 1)
        overrides = {}
        for user, limit in dict(self.overrides).items():
            try:
                validation.check_limited_user(user, "override")
            except validation.InvalidValue as exc:
                raise InvalidPolicy(str(exc)) from None
            overrides[user] = _check_limit(f"overrides[{user!r}]", limit, 0)
        object.__setattr__(self, "overrides", MappingProxyType(overrides))
        if isinstance(self.exempt_users, str):
            raise InvalidPolicy("exempt_users must be a set of user names, not one string")
        object.__setattr__(self, "exempt_users", frozenset(self.exempt_users))
        if isinstance(self.exempt_principal_patterns, str):
            raise InvalidPolicy("exempt_principal_patterns must be a sequence of globs, not one string")
        object.__setattr__(self, "exempt_principal_patterns", tuple(self.exempt_principal_patterns))
        if self.excess not in ("newest", "oldest"):
            raise InvalidPolicy(f"excess must be 'newest' or 'oldest', got {self.excess!r}")

    def limit_for(self, user: str) -> int:
        return self.overrides.get(user, self.default_max)

    def min_limit(self) -> int:
        """Smallest limit any user can have: if fewer sessions exist in total, nobody is over."""
        return min([self.default_max, *self.overrides.values()])

    def principal_exempt(self, owner: str) -> str | None:
        for pattern in self.exempt_principal_patterns:
            if fnmatchcase(owner, pattern):
                return pattern
        return None


@dataclass(frozen=True)
class ActiveSession:
    session_id: str
    owner: str
    target: str
    start_date: datetime
    posix_user: str | None
    status: str = "Connected"

    def __post_init__(self) -> None:
        # Naive timestamps can't be compared with aware ones; AWS timestamps are UTC.
        if self.start_date.tzinfo is None:
            object.__setattr__(self, "start_date", self.start_date.replace(tzinfo=timezone.utc))


@dataclass(frozen=True)
class UserVerdict:
    user: str
    limit: int | None  # None for exempt users (no limit applies)
    active_count: int
    to_terminate: tuple[str, ...]
    reason: str

    @property
    def over_limit(self) -> bool:
        return self.limit is not None and self.active_count > self.limit


@dataclass(frozen=True)
class SkippedSession:
    session_id: str
    reason: str


@dataclass(frozen=True)
class Decision:
    verdicts: tuple[UserVerdict, ...]
    to_terminate: tuple[str, ...]
    skipped: tuple[SkippedSession, ...] = ()

    def verdict_for(self, user: str) -> UserVerdict | None:
        return next((v for v in self.verdicts if v.user == user), None)


def decide_terminations(
    sessions: Iterable[ActiveSession],
    policy: LimitPolicy,
    already_terminated: Iterable[str] = frozenset(),
    unlisted: Mapping[str, int] = MappingProxyType({}),
) -> Decision:
    """Pick, per POSIX user over their limit, the excess sessions to end. Pure and deterministic.

    Sessions in ``already_terminated`` are neither counted nor picked again: DescribeSessions may
    still list a session for a while after TerminateSession, and counting it would make a
    duplicate event end a *second* session of the same user.

    ``unlisted``: per user, sessions known to exist but not listed (a busy login node counts some
    without naming them): counted against the limit, never picked, so at most the excess ends.
    """
    done = frozenset(already_terminated)
    by_user: dict[str, list[ActiveSession]] = defaultdict(list)
    skipped: list[SkippedSession] = []
    seen: set[str] = set()

    for session in sessions:
        if session.session_id in seen:  # the same session listed twice (e.g. across pages)
            continue
        seen.add(session.session_id)
        if session.status not in COUNTED_STATUSES:
            skipped.append(SkippedSession(session.session_id, f"status {session.status} does not occupy a slot"))
        elif session.session_id in done:
            skipped.append(SkippedSession(session.session_id, "already terminated by an earlier run"))
        elif session.posix_user is None:
            skipped.append(SkippedSession(session.session_id, "no POSIX user attributed; never counted or ended"))
        elif (pattern := policy.principal_exempt(session.owner)) is not None:
            skipped.append(SkippedSession(session.session_id, f"owner matches exempt principal pattern {pattern!r}"))
        else:
            by_user[session.posix_user].append(session)

    verdicts: list[UserVerdict] = []
    chosen: list[str] = []
    extra = {user: n for user, n in unlisted.items() if n > 0}
    for user in sorted(set(by_user) | set(extra)):
        user_sessions = by_user.get(user, [])
        count = len(user_sessions) + extra.get(user, 0)
        if user in policy.exempt_users:
            verdicts.append(UserVerdict(user, None, count, (), "exempt user; no limit applies"))
            continue
        limit = policy.limit_for(user)
        source = "override" if user in policy.overrides else "default"
        if count <= limit:
            verdicts.append(UserVerdict(user, limit, count, (), f"{count} active <= {source} limit {limit}"))
            continue
        # Sort oldest-first with session id as tie-break so equal StartDates stay deterministic.
        ordered = sorted(user_sessions, key=lambda s: (s.start_date, s.session_id))
        if policy.excess == "newest":
            ordered.reverse()
        excess = count - limit
        picked = tuple(s.session_id for s in ordered[:excess])
        chosen.extend(picked)
        verdicts.append(
            UserVerdict(
                user,
                limit,
                count,
                picked,
                f"{count} active > {source} limit {limit}; ending the {excess} {policy.excess}"
                + (f" ({excess - len(picked)} once their node lists them)" if len(picked) < excess else ""),
            )
        )

    return Decision(tuple(verdicts), tuple(chosen), tuple(skipped))
