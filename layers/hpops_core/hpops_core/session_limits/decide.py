"""Step 2 of enforcement, decide: a snapshot in, a plan out. Pure: no AWS, no clock, no randomness.

The same snapshot, policy, identity configuration, ``now`` and ``already_ended`` always give the
same plan, and every session the plan ends says why in words an operator can act on.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType

from .gather import ListedSession, SessionSnapshot, TagLookup, UnresolvedSession
from .identity import (
    IdentityConfig,
    IdentityResolution,
    RunAsPreferences,
    needs_principal_tags,
    normalize_owner,
    resolve_posix_user,
)
from .cluster_sessions import NodeSshSession, SshSessionToEnd, decide_cluster_wide
from .policy import ActiveSession, LimitPolicy, SkippedSession, UserVerdict, decide_terminations


@dataclass(frozen=True)
class SessionToEnd:
    session_id: str
    posix_user: str
    owner: str
    target: str
    start_date: datetime
    reason: str  # why this session, e.g. "alice: 3 active > default limit 2; ending the 1 newest"


@dataclass(frozen=True)
class TerminationPlan:
    checked_at: datetime
    verdicts: tuple[UserVerdict, ...]  # one per POSIX user counted, with its reason
    to_end: tuple[SessionToEnd, ...]
    unresolved: tuple[UnresolvedSession, ...]  # listed, but attributed to nobody: never counted or ended
    identities: Mapping[str, IdentityResolution] = field(default_factory=lambda: MappingProxyType({}))
    skipped: tuple[SkippedSession, ...] = ()
    note: str = ""
    # SSH sessions on the login nodes, counted with the shells: the ones to end (by their node's
    # agent), and each user's sessions by path and node (what status shows against the limit).
    ssh_to_end: tuple[SshSessionToEnd, ...] = ()
    by_user: Mapping[str, Mapping[str, Mapping[str, int]]] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def session_ids(self) -> tuple[str, ...]:
        return tuple(s.session_id for s in self.to_end)

    @property
    def users_over_limit(self) -> tuple[UserVerdict, ...]:
        return tuple(v for v in self.verdicts if v.to_terminate)


def attribute_owner(
    owner: str, run_as: RunAsPreferences, principal_tags: Mapping[str, TagLookup], config: IdentityConfig
) -> IdentityResolution:
    """The POSIX user ``owner``'s sessions run as, from the gathered Run As settings and tags."""
    tags = None
    if needs_principal_tags(owner, run_as, config):
        lookup = principal_tags.get(normalize_owner(owner) or "")
        if lookup is None:
            # The tag outranks the default user; guessing without it could end the wrong person's session.
            return IdentityResolution(None, "unmapped", "run-as tags were not read for this principal; not counted")
        if lookup.tags is None:
            return IdentityResolution(None, "unmapped", f"run-as tag lookup failed ({lookup.error}); not counted")
        tags = lookup.tags
    return resolve_posix_user(owner, run_as, tags, config.mapping_rules, config.unmapped_policy)


def decide(
    snapshot: SessionSnapshot,
    policy: LimitPolicy,
    identity_config: IdentityConfig,
    now: datetime,
    already_ended: Iterable[str] = frozenset(),
    ssh_sessions: Iterable[NodeSshSession] = (),
    ssh_unlisted: Mapping[str, Mapping[str, int]] | None = None,
) -> TerminationPlan:
    """Which sessions end, per POSIX user over their limit, and why.

    ``ssh_sessions`` (from the login nodes' reports) count with the shells: one limit per user
    over both paths on all login nodes (cluster_sessions.py). Their ``key`` is what ``already_ended``
    holds for an SSH session a node was told to end. ``ssh_unlisted``: node -> user -> SSH sessions a
    busy node counted without listing them (counted, never picked).

    Sessions in ``already_ended`` (ended by an earlier run; DescribeSessions may list them for a
    while yet) are neither counted nor picked. ``now`` is only the plan's timestamp: the decision
    orders sessions by their own start dates.
    """
    done = frozenset(already_ended)
    ssh = [s for s in ssh_sessions if s.key not in done]
    countable = snapshot.countable(policy, done)
    unresolved = list(snapshot.unusable)
    unlisted = {node: dict(counts) for node, counts in (ssh_unlisted or {}).items()}
    if len(countable) + len(ssh) + sum(sum(c.values()) for c in unlisted.values()) <= policy.min_limit():
        note = f"{len(countable)} countable session(s) <= smallest limit {policy.min_limit()}; no identity lookups needed"
        return TerminationPlan(now, verdicts=(), to_end=(), unresolved=tuple(unresolved), note=note)

    identities: dict[str, IdentityResolution] = {}
    for owner in dict.fromkeys(s.owner for s in countable):
        if snapshot.run_as is None:
            # Gathered for a policy under which nobody could be over: this one needs identities.
            identities[owner] = IdentityResolution(None, "unmapped", "Run As preferences were not read; not counted")
        else:
            identities[owner] = attribute_owner(owner, snapshot.run_as, snapshot.principal_tags, identity_config)
    active = []
    for s in countable:
        resolution = identities[s.owner]
        if resolution.posix_user is None:
            unresolved.append(UnresolvedSession(s.session_id, s.owner, resolution.reason))
        active.append(ActiveSession(s.session_id, s.owner, s.target, s.start_date, resolution.posix_user, s.status))
    ssh_to_end: tuple[SshSessionToEnd, ...] = ()
    by_user: Mapping[str, Mapping[str, Mapping[str, int]]] = MappingProxyType({})
    if ssh or unlisted:
        combined = decide_cluster_wide(ssh, active, policy, done, unlisted)
        decision = decide_terminations(active, policy, done)  # for the shells' skipped reasons only
        decision = type(decision)(combined.verdicts, combined.ssm_to_terminate, decision.skipped)
        ssh_to_end, by_user = combined.ssh_to_end, MappingProxyType(dict(combined.by_user))
    else:
        decision = decide_terminations(active, policy, done)

    by_id: dict[str, ListedSession] = {s.session_id: s for s in countable}
    verdict_of = {sid: v for v in decision.verdicts for sid in v.to_terminate}
    to_end = tuple(
        SessionToEnd(
            sid, verdict_of[sid].user, by_id[sid].owner, by_id[sid].target, by_id[sid].start_date,
            f"{verdict_of[sid].user}: {verdict_of[sid].reason}",
        )
        for sid in decision.to_terminate
    )
    return TerminationPlan(
        checked_at=now,
        verdicts=decision.verdicts,
        to_end=to_end,
        unresolved=tuple(unresolved),
        identities=MappingProxyType(identities),
        skipped=decision.skipped,
        ssh_to_end=ssh_to_end,
        by_user=by_user,
    )
