"""Wrappers around a :class:`SessionDirectory` that make enforcement cheaper without changing it.

* :class:`SnapshotDirectory` lists once and replays the listing, so the handler can plan first
  (dry, without reading the ended-session ledger) and only pay for the ledger when that plan would
  end something: the common StartSession event then costs one ``DescribeSessions`` call.
* :class:`OwnerScopedDirectory` lists only the sessions of one principal (``DescribeSessions``
  ``Owner`` filter). A StartSession event is checked against the starting principal's own login
  sessions: one call however many sessions the account has, where the unfiltered listing costs one
  call per 200 active sessions of the whole account (the ``Target`` filter is exact-match only).

Why the scoped check is safe: a decision over a *subset* of a user's sessions never ends a session
the decision over the full set would keep (for "newest", a session among the subset's k_sub newest
has fewer than k_sub + (n_full - n_sub) = k_full newer sessions in the full set; "oldest" is
symmetric). It can only under-count, e.g. a POSIX user reached through two principals; the sweep,
which always lists everything, catches that.

UNCONFIRMED: the documentation only says the ``Owner`` filter takes "an AWS user". We pass the
caller ARN from the CloudTrail record (the value ``DescribeSessions`` reports as ``Owner``). The
handler trusts the scoped listing only when it shows a session of that very owner (the new one, or
another one when the new one has already ended, e.g. a duplicate event); otherwise it falls back
to the full listing, so a different filter semantic costs calls, never correctness.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from .identity import RunAsPreferences
from .session_api import DESCRIBE_PAGE_SIZE, Boto3SessionDirectory, SessionDirectory, SessionListingFailed


class SnapshotDirectory:
    """Delegates to ``inner``; ``active_sessions`` is listed once per prefix and then replayed, and
    the Run As preferences are read once: one snapshot per invocation, so both planning passes see
    the same sessions and the same preferences."""

    def __init__(self, inner: SessionDirectory) -> None:
        self.inner = inner
        self._listings: dict[str, list[dict[str, Any]]] = {}
        self._preferences: RunAsPreferences | None = None

    @property
    def calls(self) -> Counter[str]:
        return getattr(self.inner, "calls", Counter())

    def active_sessions(self, target_prefix: str) -> Iterator[dict[str, Any]]:
        if target_prefix not in self._listings:
            self._listings[target_prefix] = list(self.inner.active_sessions(target_prefix))
        return iter(self._listings[target_prefix])

    def listed(self, target_prefix: str, key: str) -> set[Any]:
        """The values of ``key`` ("SessionId", "Owner", ...) among the records listed so far."""
        return {r.get(key) for r in self._listings.get(target_prefix, []) if isinstance(r, dict)}

    def terminate(self, session_id: str) -> None:
        self.inner.terminate(session_id)

    def principal_tags(self, iam_arn: str) -> dict[str, str]:
        return self.inner.principal_tags(iam_arn)

    def run_as_preferences(self) -> RunAsPreferences:
        if self._preferences is None:
            self._preferences = self.inner.run_as_preferences()
        return self._preferences


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
            code = exc.response.get("Error", {}).get("Code", "ClientError") if isinstance(exc, ClientError) else type(exc).__name__
            raise SessionListingFailed(f"DescribeSessions (Owner filter) failed: {code}") from exc

    def terminate(self, session_id: str) -> None:
        self.inner.terminate(session_id)

    def principal_tags(self, iam_arn: str) -> dict[str, str]:
        return self.inner.principal_tags(iam_arn)

    def run_as_preferences(self) -> RunAsPreferences:
        return self.inner.run_as_preferences()
