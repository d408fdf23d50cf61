"""In-memory :class:`~hpops_core.session_limits.session_api.SessionDirectory` for unit tests.

A test double, so it lives with the tests, not in the Lambda layer. (The twin plays Session
Manager behind moto instead: twin/hpops_twin/ssm_sessions.py.)

It models the AWS behaviour enforcement depends on, and counts calls the way AWS would bill
them: one ``DescribeSessions`` per page of ``page_size`` active sessions (at least one call even
when nothing is active), one ``ListRoleTags``/``ListUserTags`` per lookup, one
``TerminateSession`` per terminate. It deliberately does *not* cache tags, so call counts show
exactly what the caller's own caching saves.
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any

from hpops_core.session_limits.identity import RunAsPreferences
from hpops_core.session_limits.session_api import (
    DESCRIBE_PAGE_SIZE,
    RunAsPreferencesUnavailable,
    TagLookupFailed,
    TerminateFailed,
)

# Most tests are about limits, not about Run As: by default the account has Run As on and no
# default user, so each principal's SSMSessionRunAs tag (or the unmapped policy) decides.
RUN_AS_ON = RunAsPreferences(enabled=True)

# What DescribeSessions(State=Active) returns; Terminated/Failed sessions move to History.
_ACTIVE_STATE_STATUSES = frozenset({"Connected", "Connecting", "Disconnected", "Terminating"})
_IAM_ARN_RE = re.compile(r"^arn:aws[a-z-]*:iam::[0-9]{12}:(?P<kind>role|user)/")


@dataclass(frozen=True)
class FakeSession:
    session_id: str
    owner: str
    target: str
    start_date: datetime
    status: str = "Connected"
    document_name: str = "SSM-SessionManagerRunShell"

    def as_api_record(self) -> dict[str, Any]:
        """Shaped like one element of DescribeSessions' ``Sessions``."""
        return {
            "SessionId": self.session_id,
            "Target": self.target,
            "Status": self.status,
            "StartDate": self.start_date,
            "DocumentName": self.document_name,
            "Owner": self.owner,
        }


class InMemorySessionDirectory:
    def __init__(
        self,
        *,
        page_size: int = DESCRIBE_PAGE_SIZE,
        tags: Mapping[str, Mapping[str, str]] | None = None,
        preferences: RunAsPreferences = RUN_AS_ON,
    ) -> None:
        if not 1 <= page_size <= DESCRIBE_PAGE_SIZE:
            raise ValueError("page_size must be 1..200, like DescribeSessions MaxResults")
        self.page_size = page_size
        self._sessions: dict[str, FakeSession] = {}  # insertion order == listing order
        self._tags: dict[str, dict[str, str]] = {arn: dict(t) for arn, t in (tags or {}).items()}
        self._failing_tag_lookups: set[str] = set()
        self._failing_terminations: set[str] = set()
        self.preferences: RunAsPreferences | None = preferences  # None: GetDocument fails
        self._lock = threading.Lock()  # the twin may drive it from several threads
        self.calls: Counter[str] = Counter()
        self.terminated: list[str] = []  # successful TerminateSession ids, in call order

    # -- arranging state ---------------------------------------------------------------------

    def add_session(
        self,
        session_id: str,
        owner: str,
        target: str,
        start_date: datetime,
        status: str = "Connected",
        document_name: str = "SSM-SessionManagerRunShell",
    ) -> FakeSession:
        if start_date.tzinfo is None:
            start_date = start_date.replace(tzinfo=timezone.utc)
        session = FakeSession(session_id, owner, target, start_date, status, document_name)
        with self._lock:
            if session_id in self._sessions:
                raise ValueError(f"duplicate session id {session_id}")
            self._sessions[session_id] = session
        return session

    def set_status(self, session_id: str, status: str) -> None:
        with self._lock:
            self._sessions[session_id] = replace(self._sessions[session_id], status=status)

    def set_tags(self, iam_arn: str, tags: Mapping[str, str]) -> None:
        with self._lock:
            self._tags[iam_arn] = dict(tags)

    def fail_tag_lookup(self, iam_arn: str) -> None:
        """Make ``principal_tags(iam_arn)`` raise, like AccessDenied on ListRoleTags."""
        self._failing_tag_lookups.add(iam_arn)

    def fail_termination(self, session_id: str) -> None:
        self._failing_terminations.add(session_id)

    def session(self, session_id: str) -> FakeSession:
        return self._sessions[session_id]

    def reset_calls(self) -> None:
        self.calls.clear()

    @property
    def total_calls(self) -> int:
        return sum(self.calls.values())

    # -- SessionDirectory --------------------------------------------------------------------

    def active_sessions(self, target_prefix: str) -> Iterator[dict[str, Any]]:
        with self._lock:
            active = [s.as_api_record() for s in self._sessions.values() if s.status in _ACTIVE_STATE_STATUSES]
        # Paging happens over *all* active sessions (the Target filter is exact-match only), so
        # the page count reflects the whole account, not just this cluster.
        pages = [active[i : i + self.page_size] for i in range(0, len(active), self.page_size)] or [[]]
        for page in pages:
            self.calls["DescribeSessions"] += 1
            for record in page:
                if record["Target"].startswith(target_prefix):
                    yield record

    def terminate(self, session_id: str) -> None:
        self.calls["TerminateSession"] += 1
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None or session_id in self._failing_terminations:
                raise TerminateFailed(f"TerminateSession {session_id} failed: InvalidParameters")
            # Terminating an already-ended session succeeds in AWS too; keep that idempotency.
            self._sessions[session_id] = replace(session, status="Terminated")
            self.terminated.append(session_id)

    def principal_tags(self, iam_arn: str) -> dict[str, str]:
        match = _IAM_ARN_RE.match(iam_arn or "")
        if not match:
            raise TagLookupFailed(f"not an IAM role/user ARN: {iam_arn!r}")
        self.calls["ListRoleTags" if match.group("kind") == "role" else "ListUserTags"] += 1
        if iam_arn in self._failing_tag_lookups:
            raise TagLookupFailed(f"tag lookup for {iam_arn} failed: AccessDenied")
        with self._lock:
            return dict(self._tags.get(iam_arn, {}))

    def run_as_preferences(self) -> RunAsPreferences:
        self.calls["GetDocument"] += 1
        if self.preferences is None:
            raise RunAsPreferencesUnavailable("GetDocument SSM-SessionManagerRunShell failed: AccessDeniedException")
        return self.preferences

    def owner_scoped(self, owner: str, *, filter_works: bool = True) -> OwnerScopedFake:
        """DescribeSessions with the ``Owner`` filter, like OwnerScopedDirectory. ``filter_works=False``
        plays a filter that wants another value than the caller ARN: it matches nothing."""
        return OwnerScopedFake(self, owner, filter_works)


class OwnerScopedFake:
    """One principal's sessions of an :class:`InMemorySessionDirectory`; shares its call counter."""

    def __init__(self, inner: InMemorySessionDirectory, owner: str, filter_works: bool) -> None:
        self.inner = inner
        self.owner = owner
        self.filter_works = filter_works

    @property
    def calls(self) -> Counter[str]:
        return self.inner.calls

    def active_sessions(self, target_prefix: str) -> Iterator[dict[str, Any]]:
        with self.inner._lock:
            mine = [s.as_api_record() for s in self.inner._sessions.values()
                    if s.status in _ACTIVE_STATE_STATUSES and s.owner == self.owner and self.filter_works]
        pages = [mine[i : i + self.inner.page_size] for i in range(0, len(mine), self.inner.page_size)] or [[]]
        for page in pages:
            self.inner.calls["DescribeSessions"] += 1
            yield from (r for r in page if r["Target"].startswith(target_prefix))

    def terminate(self, session_id: str) -> None:
        self.inner.terminate(session_id)

    def principal_tags(self, iam_arn: str) -> dict[str, str]:
        return self.inner.principal_tags(iam_arn)

    def run_as_preferences(self) -> RunAsPreferences:
        return self.inner.run_as_preferences()
