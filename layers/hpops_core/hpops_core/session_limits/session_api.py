"""The transport seam for session data: a small protocol plus the real boto3 implementation.

moto implements none of DescribeSessions / TerminateSession / StartSession, so everything that
touches sessions goes through :class:`SessionDirectory`; unit tests use an in-memory double
(tests/fake_session_directory.py), Lambda and the local twin use :class:`Boto3SessionDirectory`.

:class:`OwnerScopedDirectory` (``Boto3SessionDirectory.owner_scoped``) lists only the sessions of
one principal (``DescribeSessions`` ``Owner`` filter). A StartSession event is checked against the
starting principal's own login sessions: one call however many sessions the account has, where the
unfiltered listing costs one call per 200 active sessions of the whole account (the ``Target``
filter is exact-match only). :func:`~.gather.gather` tries it first and falls back to the full listing.

Why the scoped check is safe: a decision over a *subset* of a user's sessions never ends a session
the decision over the full set would keep (for "newest", a session among the subset's k_sub newest
has fewer than k_sub + (n_full - n_sub) = k_full newer sessions in the full set; "oldest" is
symmetric). It can only under-count, e.g. a POSIX user reached through two principals; the sweep,
which always lists everything, catches that.

UNCONFIRMED: the documentation only says the ``Owner`` filter takes "an AWS user". We pass the
caller ARN from the CloudTrail record (the value ``DescribeSessions`` reports as ``Owner``). Gathering
trusts the scoped listing only when it shows a session of that very owner (the new one, or
another one when the new one has already ended, e.g. a duplicate event); otherwise it falls back
to the full listing, so a different filter semantic costs calls, never correctness.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol, runtime_checkable

from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from .identity import PREFERENCES_DOCUMENT, InvalidRunAsPreferences, RunAsPreferences, parse_run_as_preferences
from .errors import SessionLimitError

DESCRIBE_PAGE_SIZE = 200  # DescribeSessions maximum; fewer pages = fewer calls per event.
RETRY_CONFIG = Config(retries={"mode": "standard"})


class DirectoryError(SessionLimitError):
    """A session-directory call failed."""


class SessionListingFailed(DirectoryError):
    """DescribeSessions failed; without the full list no safe decision is possible."""


class TagLookupFailed(DirectoryError):
    """Principal tags could not be read (denied, throttled, foreign account, not a role/user)."""


class TerminateFailed(DirectoryError):
    """TerminateSession failed for one session."""


class RunAsPreferencesUnavailable(DirectoryError):
    """The Session Manager preferences (Run As) could not be read; without them nobody's user is known."""


@runtime_checkable
class SessionDirectory(Protocol):
    """What enforcement needs from AWS. Implementations may expose ``calls: Counter`` (API call
    counts keyed by AWS operation name) so reports can show what an enforcement run cost."""

    def active_sessions(self, target_prefix: str) -> Iterable[dict[str, Any]]:
        """DescribeSessions(State=Active) records whose ``Target`` starts with ``target_prefix``."""
        ...

    def terminate(self, session_id: str) -> None:
        """TerminateSession. Permanent; raise :class:`TerminateFailed` on failure."""
        ...

    def principal_tags(self, iam_arn: str) -> dict[str, str]:
        """Tags of an IAM role/user ARN ({} if it no longer exists); :class:`TagLookupFailed` otherwise."""
        ...

    def run_as_preferences(self) -> RunAsPreferences:
        """The account's Session Manager Run As settings; :class:`RunAsPreferencesUnavailable` if unreadable."""
        ...


_IAM_ARN_RE = re.compile(
    r"^arn:aws[a-z-]*:iam::(?P<account>[0-9]{12}):(?P<kind>role|user)/(?:[A-Za-z0-9+=,.@_/-]*/)?(?P<name>[\w+=,.@-]{1,128})$"
)


def _error_code(exc: Exception) -> str:
    if isinstance(exc, ClientError):
        return exc.response.get("Error", {}).get("Code", "ClientError")
    return type(exc).__name__


class Boto3SessionDirectory:
    """SSM + IAM backed :class:`SessionDirectory`.

    Clients are created on first use (not at import or construction) with standard retries, so
    building one is free in tests and cold starts only pay for the clients actually used.
    """

    def __init__(
        self,
        ssm_client: Any | None = None,
        iam_client: Any | None = None,
        *,
        region_name: str | None = None,
        account_id: str | None = None,
        tag_ttl_seconds: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ssm = ssm_client
        self._iam = iam_client
        self._region_name = region_name
        # When known, tag lookups for principals of other accounts are refused: a same-named role
        # in *this* account would otherwise lend its tags to a stranger.
        self._account_id = account_id
        self._tag_ttl = tag_ttl_seconds
        self._clock = clock
        # Survives across warm Lambda invocations; keyed by IAM ARN; negative results cached too.
        self._tag_cache: dict[str, tuple[float, dict[str, str]]] = {}
        self.calls: Counter[str] = Counter()

    # -- clients ---------------------------------------------------------------------------

    def _client(self, service: str) -> Any:
        import boto3  # call-time import keeps the pure modules importable without boto3 setup

        return boto3.client(service, region_name=self._region_name, config=RETRY_CONFIG)

    @property
    def ssm(self) -> Any:
        if self._ssm is None:
            self._ssm = self._client("ssm")
        return self._ssm

    @property
    def iam(self) -> Any:
        if self._iam is None:
            self._iam = self._client("iam")
        return self._iam

    # -- sessions --------------------------------------------------------------------------

    def _describe_pages(self) -> Iterator[dict[str, Any]]:
        # Filter key Target only takes an exact target, so list every active session and filter
        # locally. Prefer botocore's paginator (it exists for describe_sessions); fall back to
        # hand-written NextToken paging for clients that lack one.
        client = self.ssm
        if client.can_paginate("describe_sessions"):
            pages = client.get_paginator("describe_sessions").paginate(
                State="Active", PaginationConfig={"PageSize": DESCRIBE_PAGE_SIZE}
            )
            for page in pages:
                self.calls["DescribeSessions"] += 1
                yield page
            return
        kwargs: dict[str, Any] = {"State": "Active", "MaxResults": DESCRIBE_PAGE_SIZE}
        while True:
            page = client.describe_sessions(**kwargs)
            self.calls["DescribeSessions"] += 1
            yield page
            token = page.get("NextToken")
            if not token:
                return
            kwargs["NextToken"] = token

    def active_sessions(self, target_prefix: str) -> Iterator[dict[str, Any]]:
        try:
            for page in self._describe_pages():
                for session in page.get("Sessions", []):
                    target = session.get("Target")
                    if isinstance(target, str) and target.startswith(target_prefix):
                        yield session
        except (ClientError, BotoCoreError) as exc:
            raise SessionListingFailed(f"DescribeSessions failed: {_error_code(exc)}") from exc

    def terminate(self, session_id: str) -> None:
        self.calls["TerminateSession"] += 1
        try:
            self.ssm.terminate_session(SessionId=session_id)
        except (ClientError, BotoCoreError) as exc:
            raise TerminateFailed(f"TerminateSession {session_id} failed: {_error_code(exc)}") from exc

    # -- Run As preferences ----------------------------------------------------------------

    def run_as_preferences(self) -> RunAsPreferences:
        """GetDocument SSM-SessionManagerRunShell, on every call: callers cache it per invocation
        (SnapshotDirectory), so an operator's change of preferences counts from the next run."""
        self.calls["GetDocument"] += 1
        try:
            document = self.ssm.get_document(Name=PREFERENCES_DOCUMENT, DocumentFormat="JSON")
        except ClientError as exc:
            if _error_code(exc) == "InvalidDocument":  # never saved: Session Manager's defaults apply
                return parse_run_as_preferences(None)
            raise RunAsPreferencesUnavailable(f"GetDocument {PREFERENCES_DOCUMENT} failed: {_error_code(exc)}") from exc
        except BotoCoreError as exc:
            raise RunAsPreferencesUnavailable(f"GetDocument {PREFERENCES_DOCUMENT} failed: {_error_code(exc)}") from exc
        try:
            return parse_run_as_preferences(document.get("Content") or "")
        except InvalidRunAsPreferences as exc:
            raise RunAsPreferencesUnavailable(str(exc)) from None

    def owner_scoped(self, owner: str) -> OwnerScopedDirectory:
        """This directory with its listing limited to ``owner``'s sessions (see the module docstring)."""
        return OwnerScopedDirectory(self, owner)

    # -- tags ------------------------------------------------------------------------------

    def principal_tags(self, iam_arn: str) -> dict[str, str]:
        now = self._clock()
        cached = self._tag_cache.get(iam_arn)
        if cached is not None and cached[0] > now:
            return dict(cached[1])

        match = _IAM_ARN_RE.match(iam_arn or "")
        if not match:
            raise TagLookupFailed(f"not an IAM role/user ARN: {iam_arn!r}")
        if self._account_id and match.group("account") != self._account_id:
            raise TagLookupFailed(f"principal is in another account ({match.group('account')})")

        kind, name = match.group("kind"), match.group("name")
        operation, method, param = (
            ("ListRoleTags", "list_role_tags", "RoleName")
            if kind == "role"
            else ("ListUserTags", "list_user_tags", "UserName")
        )
        tags: dict[str, str] = {}
        try:
            for page in self._tag_pages(method, param, name):
                self.calls[operation] += 1
                tags.update({t["Key"]: t["Value"] for t in page.get("Tags", [])})
        except ClientError as exc:
            self.calls[operation] += 1  # the failing page was a call too
            if _error_code(exc) != "NoSuchEntity":
                raise TagLookupFailed(f"{operation} {name} failed: {_error_code(exc)}") from exc
            tags = {}  # deleted principal: no tags, and worth caching like any answer
        except BotoCoreError as exc:
            raise TagLookupFailed(f"{operation} {name} failed: {_error_code(exc)}") from exc

        self._tag_cache[iam_arn] = (now + self._tag_ttl, tags)
        return dict(tags)

    def _tag_pages(self, method: str, param: str, name: str) -> Iterator[dict[str, Any]]:
        client = self.iam
        if client.can_paginate(method):
            yield from client.get_paginator(method).paginate(**{param: name})
            return
        kwargs: dict[str, Any] = {param: name}
        while True:
            page = getattr(client, method)(**kwargs)
            yield page
            if not page.get("IsTruncated"):
                return
            kwargs["Marker"] = page["Marker"]


class OwnerScopedDirectory:
    """A :class:`Boto3SessionDirectory` whose listing is limited to one owner's sessions.

    Shares the inner directory's clients, call counter and run-as tag cache.
    """

    def __init__(self, inner: Boto3SessionDirectory, owner: str) -> None:
        self.inner = inner
        self.owner = owner

    @property
    def calls(self) -> Counter[str]:
        return self.inner.calls

    def active_sessions(self, target_prefix: str) -> Iterator[dict[str, Any]]:
        client = self.inner.ssm
        kwargs: dict[str, Any] = {
            "State": "Active",
            "MaxResults": DESCRIBE_PAGE_SIZE,
            "Filters": [{"key": "Owner", "value": self.owner}],
        }
        try:
            while True:
                page = client.describe_sessions(**kwargs)
                self.inner.calls["DescribeSessions"] += 1
                for session in page.get("Sessions", []):
                    target = session.get("Target")
                    if isinstance(target, str) and target.startswith(target_prefix):
                        yield session
                token = page.get("NextToken")
                if not token:
                    return
                kwargs["NextToken"] = token
        except (ClientError, BotoCoreError) as exc:
            raise SessionListingFailed(f"DescribeSessions (Owner filter) failed: {_error_code(exc)}") from exc

    def terminate(self, session_id: str) -> None:
        self.inner.terminate(session_id)

    def principal_tags(self, iam_arn: str) -> dict[str, str]:
        return self.inner.principal_tags(iam_arn)

    def run_as_preferences(self) -> RunAsPreferences:
        return self.inner.run_as_preferences()
