"""Step 3 of enforcement, apply: TerminateSession for exactly the plan's sessions, nothing else."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from .decide import SessionToEnd, TerminationPlan
from .errors import SessionLimitError
from .gather import call_counts, calls_since
from .session_api import SessionDirectory


@dataclass(frozen=True)
class FailedTermination:
    session_id: str
    posix_user: str
    error: str


@dataclass(frozen=True)
class ApplyOutcome:
    ended: tuple[SessionToEnd, ...] = ()
    failed: tuple[FailedTermination, ...] = ()
    api_calls: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        object.__setattr__(self, "api_calls", MappingProxyType(dict(self.api_calls)))


def apply(directory: SessionDirectory, plan: TerminationPlan, dry_run: bool) -> ApplyOutcome:
    """End the plan's sessions, in plan order; a dry run ends nothing and calls nothing.

    A failed TerminateSession is recorded and the rest still end: the caller reports the failures
    (SessionTerminationFailed) and the next run, which lists them again, retries them.
    """
    if dry_run or not plan.to_end:
        return ApplyOutcome()
    before = call_counts(directory)
    ended: list[SessionToEnd] = []
    failed: list[FailedTermination] = []
    for session in plan.to_end:
        try:
            directory.terminate(session.session_id)
        except SessionLimitError as exc:  # TerminateFailed and friends
            failed.append(FailedTermination(session.session_id, session.posix_user, str(exc)))
        else:
            ended.append(session)
    return ApplyOutcome(tuple(ended), tuple(failed), calls_since(directory, before))
