"""Enforcement's three steps on their own: gather (every read), decide (pure), apply (TerminateSession only).

AWS is played by InMemorySessionDirectory (tests/fake_session_directory.py), which counts calls per
AWS operation; its account has Run As on and no default user unless a test says otherwise.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import os
import pkgutil
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

import hpops_core.session_limits as session_limits
from fake_session_directory import InMemorySessionDirectory
from hpops_core.common.errors import HpopsError
from hpops_core.session_limits.apply import apply
from hpops_core.session_limits.decide import SessionToEnd, TerminationPlan, decide
from hpops_core.session_limits.gather import ListedSession, SessionSnapshot, TagLookup, gather
from hpops_core.session_limits.identity import IdentityConfig, RunAsPreferences
from hpops_core.session_limits.policy import LimitPolicy

REPO = Path(__file__).resolve().parents[2]
ACCOUNT = "123456789012"
CLUSTER = "abc123def456"
GROUP = "login"
T0 = datetime(2025, 3, 14, 9, 0, tzinfo=timezone.utc)
NOW = T0 + timedelta(hours=1)
POLICY = LimitPolicy(default_max=2)
IDENTITY = IdentityConfig()
RESEARCHERS = f"arn:aws:iam::{ACCOUNT}:role/Researchers"


def node(n: int, group: str = GROUP) -> str:
    return f"sagemaker-cluster:{CLUSTER}_{group}-i-{n:017x}"


def assumed(session_name: str, role: str = "Researchers") -> str:
    return f"arn:aws:sts::{ACCOUNT}:assumed-role/{role}/{session_name}"


def sessions_of(fake: InMemorySessionDirectory, user: str, count: int, *, start: int = 0, role: str | None = None) -> list[str]:
    ids = [f"{user}-{start + i:03d}" for i in range(count)]
    for i, sid in enumerate(ids):
        fake.add_session(sid, assumed(user, role or f"role-{user}"), node(i + 1), T0 + timedelta(minutes=start + i))
        fake.set_tags(f"arn:aws:iam::{ACCOUNT}:role/{role or f'role-{user}'}", {"SSMSessionRunAs": user})
    return ids


def gathered(fake: InMemorySessionDirectory, policy: LimitPolicy = POLICY, **kw) -> SessionSnapshot:
    return gather(fake, CLUSTER, GROUP, policy, IDENTITY, **kw)


def listed(sid: str, user: str, minute: int, status: str = "Connected") -> ListedSession:
    return ListedSession(sid, assumed(user, f"role-{user}"), node(1), T0 + timedelta(minutes=minute), status)


def handmade_snapshot() -> SessionSnapshot:
    """A snapshot built without any directory: decide() needs nothing else."""
    sessions = (listed("alice-1", "alice", 1), listed("alice-2", "alice", 2), listed("alice-3", "alice", 3),
                listed("bob-1", "bob", 4), listed("carol-1", "carol", 5), listed("carol-2", "carol", 6),
                listed("carol-3", "carol", 7))
    tags = {f"arn:aws:iam::{ACCOUNT}:role/role-{u}": TagLookup({"SSMSessionRunAs": u}) for u in ("alice", "bob")}
    tags[f"arn:aws:iam::{ACCOUNT}:role/role-carol"] = TagLookup(None, "ListRoleTags role-carol failed: AccessDenied")
    return SessionSnapshot(CLUSTER, GROUP, "all", sessions, run_as=RunAsPreferences(enabled=True), principal_tags=tags)


# ---------------------------------------------------------------------- decide: pure


def test_decide_needs_only_the_snapshot_and_says_why_for_every_session_it_ends():
    plan = decide(handmade_snapshot(), POLICY, IDENTITY, NOW)

    assert plan.session_ids == ("alice-3",)
    (to_end,) = plan.to_end
    assert (to_end.posix_user, to_end.owner) == ("alice", assumed("alice", "role-alice"))
    assert to_end.reason == "alice: 3 active > default limit 2; ending the 1 newest"
    assert [(v.user, v.limit, v.active_count) for v in plan.users_over_limit] == [("alice", 2, 3)]
    assert all(v.reason for v in plan.verdicts)
    # carol's role tags could not be read: her sessions are never counted or ended, and say why.
    assert {u.session_id: u.reason for u in plan.unresolved} == {
        sid: "run-as tag lookup failed (ListRoleTags role-carol failed: AccessDenied); not counted"
        for sid in ("carol-1", "carol-2", "carol-3")
    }
    assert plan.checked_at == NOW


def test_same_snapshot_same_plan_however_often_and_in_whatever_order_it_was_listed():
    snapshot = handmade_snapshot()
    first = decide(snapshot, POLICY, IDENTITY, NOW)
    assert decide(snapshot, POLICY, IDENTITY, NOW) == first
    reordered = dataclasses.replace(snapshot, sessions=tuple(reversed(snapshot.sessions)))
    assert decide(reordered, POLICY, IDENTITY, NOW).to_end == first.to_end


def test_now_is_only_the_plans_timestamp():
    later = decide(handmade_snapshot(), POLICY, IDENTITY, NOW + timedelta(days=30))
    assert later.to_end == decide(handmade_snapshot(), POLICY, IDENTITY, NOW).to_end
    assert later.checked_at == NOW + timedelta(days=30)


def test_decide_makes_no_call_even_on_a_gathered_snapshot():
    fake = InMemorySessionDirectory()
    sessions_of(fake, "alice", 3)
    snapshot = gathered(fake)
    calls = dict(fake.calls)

    plans = [decide(snapshot, POLICY, IDENTITY, NOW) for _ in range(3)]

    assert dict(fake.calls) == calls and fake.terminated == []
    assert plans[0] == plans[1] == plans[2] and plans[0].session_ids == ("alice-002",)


def test_already_ended_sessions_are_neither_counted_nor_picked_again():
    snapshot = handmade_snapshot()
    plan = decide(snapshot, POLICY, IDENTITY, NOW, already_ended={"alice-3"})
    assert plan.to_end == () and plan.verdicts[0].active_count == 2
    # With a fourth session alice is over again: the newest session not yet ended goes.
    more = dataclasses.replace(snapshot, sessions=snapshot.sessions + (listed("alice-4", "alice", 8),))
    assert decide(more, POLICY, IDENTITY, NOW, already_ended={"alice-3"}).session_ids == ("alice-4",)


def test_policy_and_identity_config_change_the_plan_not_the_snapshot():
    snapshot = handmade_snapshot()
    oldest = decide(snapshot, LimitPolicy(default_max=2, excess="oldest"), IDENTITY, NOW)
    assert oldest.session_ids == ("alice-1",) and "ending the 1 oldest" in oldest.to_end[0].reason
    exempt = decide(snapshot, LimitPolicy(default_max=2, exempt_users=frozenset({"alice"})), IDENTITY, NOW)
    assert exempt.to_end == () and "exempt" in exempt.verdicts[0].reason
    mapped = decide(snapshot, POLICY, IdentityConfig(mapping_rules=(("*/role-carol/*", "carol"),)), NOW)
    assert mapped.session_ids == ("alice-3", "carol-3"), "a mapping rule stands in for the unreadable tag"
    assert mapped.to_end[1].reason.startswith("carol: 3 active > default limit 2")


def test_a_snapshot_where_nobody_can_be_over_is_decided_without_identities():
    plan = decide(SessionSnapshot(CLUSTER, GROUP, "owner", handmade_snapshot().sessions[:2]), POLICY, IDENTITY, NOW)
    assert plan.to_end == () and plan.identities == {}
    assert plan.note == "2 countable session(s) <= smallest limit 2; no identity lookups needed"


def test_without_run_as_preferences_nobody_is_attributed_so_nothing_ends():
    """A snapshot gathered for a looser policy has no Run As settings: no guess is safe."""
    no_run_as = dataclasses.replace(handmade_snapshot(), run_as=None)
    plan = decide(no_run_as, POLICY, IDENTITY, NOW)
    assert plan.to_end == ()
    assert {u.reason for u in plan.unresolved} == {"Run As preferences were not read; not counted"}


# ---------------------------------------------------------------------- gather: every read, once


def test_gather_reads_sessions_preferences_and_each_role_once():
    fake = InMemorySessionDirectory()
    sessions_of(fake, "alice", 3)
    sessions_of(fake, "bob", 2, start=10, role="Shared")
    sessions_of(fake, "carol", 1, start=20, role="Shared")  # the Shared role's tag now says carol

    snapshot = gathered(fake)

    assert dict(fake.calls) == {"DescribeSessions": 1, "GetDocument": 1, "ListRoleTags": 2}
    assert snapshot.api_calls == {"DescribeSessions": 1, "GetDocument": 1, "ListRoleTags": 2}
    assert [s.session_id for s in snapshot.sessions] == ["alice-000", "alice-001", "alice-002", "bob-010", "bob-011",
                                                         "carol-020"]
    assert snapshot.principal_tags[f"arn:aws:iam::{ACCOUNT}:role/Shared"].tags == {"SSMSessionRunAs": "carol"}
    assert snapshot.scope == "all" and snapshot.trigger_session_listed is None


@pytest.mark.parametrize("source", ["gathered", "handmade"])
def test_the_snapshot_is_immutable(source):
    fake = InMemorySessionDirectory()
    sessions_of(fake, "alice", 3)
    snapshot = gathered(fake) if source == "gathered" else handmade_snapshot()
    with pytest.raises(dataclasses.FrozenInstanceError):
        snapshot.sessions = ()  # type: ignore[misc]
    with pytest.raises(TypeError):
        snapshot.principal_tags["arn:aws:iam::123456789012:role/x"] = TagLookup({})  # type: ignore[index]
    with pytest.raises(TypeError):
        snapshot.principal_tags[f"arn:aws:iam::{ACCOUNT}:role/role-alice"].tags["SSMSessionRunAs"] = "root"  # type: ignore[index]
    with pytest.raises(TypeError):
        snapshot.api_calls["DescribeSessions"] = 0  # type: ignore[index]


def test_gather_skips_identity_reads_when_nobody_can_be_over():
    fake = InMemorySessionDirectory()
    sessions_of(fake, "alice", 2)
    snapshot = gathered(fake)
    assert dict(fake.calls) == {"DescribeSessions": 1}
    assert snapshot.run_as is None and snapshot.identities_skipped.startswith("2 countable session(s)")


def test_gather_keeps_uncounted_sessions_with_their_reasons():
    fake = InMemorySessionDirectory()
    sessions_of(fake, "alice", 1)
    fake.add_session("sib-1", assumed("alice", "role-alice"), node(9, group="login-2"), T0)
    fake.add_session("tunnel-1", assumed("alice", "role-alice"), node(1), T0, document_name="AWS-StartSSHSession")
    snapshot = gathered(fake)
    assert [s.session_id for s in snapshot.sessions] == ["alice-000"]
    assert [(u.session_id, u.reason) for u in snapshot.not_on_login_nodes] == [
        ("sib-1", "target is on instance group 'login-2', not the login group 'login'")]
    assert [u.session_id for u in snapshot.not_shells] == ["tunnel-1"]
    assert "not an interactive shell" in snapshot.not_shells[0].reason


def test_a_failed_tag_lookup_is_recorded_not_raised():
    fake = InMemorySessionDirectory()
    sessions_of(fake, "alice", 3)
    fake.fail_tag_lookup(f"arn:aws:iam::{ACCOUNT}:role/role-alice")
    lookup = gathered(fake).principal_tags[f"arn:aws:iam::{ACCOUNT}:role/role-alice"]
    assert lookup.tags is None and "AccessDenied" in lookup.error


def test_an_event_lists_the_starting_principals_sessions_first():
    fake = InMemorySessionDirectory(page_size=2)
    for user in ("bob", "carol", "dave"):
        sessions_of(fake, user, 2)  # 6 other sessions: 3 pages of the whole account
    alice = sessions_of(fake, "alice", 3)

    snapshot = gathered(fake, trigger_session_id=alice[-1], owner_listing=fake.owner_scoped(assumed("alice", "role-alice")))

    assert snapshot.scope == "owner" and snapshot.trigger_session_listed is True
    assert [s.session_id for s in snapshot.sessions] == alice
    assert fake.calls["DescribeSessions"] == 2, "alice's 3 sessions are 2 pages; the account's 9 would be 5"
    assert decide(snapshot, POLICY, IDENTITY, NOW).session_ids == (alice[-1],)


def test_when_the_owner_listing_shows_nothing_of_the_owner_everything_is_listed():
    fake = InMemorySessionDirectory()
    sessions_of(fake, "bob", 2)
    alice = sessions_of(fake, "alice", 3)
    owner_listing = fake.owner_scoped(assumed("alice", "role-alice"), filter_works=False)

    snapshot = gathered(fake, trigger_session_id=alice[-1], owner_listing=owner_listing)

    assert snapshot.scope == "all" and len(snapshot.sessions) == 5
    assert fake.calls["DescribeSessions"] == 2, "the scoped try, then the full listing"
    assert decide(snapshot, POLICY, IDENTITY, NOW).session_ids == (alice[-1],)


# ---------------------------------------------------------------------- apply: TerminateSession only


class RecordingDirectory(InMemorySessionDirectory):
    """Records every SessionDirectory method called, in order."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.methods: list[str] = []

    def __getattribute__(self, name: str):
        if name in ("active_sessions", "terminate", "principal_tags", "run_as_preferences"):
            object.__getattribute__(self, "methods").append(name)
        return object.__getattribute__(self, name)


def plan_ending(*session_ids: str) -> TerminationPlan:
    return TerminationPlan(
        checked_at=NOW, verdicts=(), unresolved=(),
        to_end=tuple(SessionToEnd(sid, "alice", assumed("alice"), node(1), T0, "test plan") for sid in session_ids),
    )


def test_apply_terminates_exactly_the_plans_sessions_and_calls_nothing_else():
    fake = RecordingDirectory()
    ids = sessions_of(fake, "alice", 5)
    fake.methods.clear()

    outcome = apply(fake, plan_ending(ids[4], ids[1]), dry_run=False)

    assert fake.methods == ["terminate", "terminate"]
    assert fake.terminated == [ids[4], ids[1]], "in plan order"
    assert [s.session_id for s in outcome.ended] == [ids[4], ids[1]] and outcome.failed == ()
    assert outcome.api_calls == {"TerminateSession": 2}
    assert {sid: fake.session(sid).status for sid in ids} == {
        ids[0]: "Connected", ids[1]: "Terminated", ids[2]: "Connected", ids[3]: "Connected", ids[4]: "Terminated"}


def test_apply_of_a_dry_run_or_an_empty_plan_calls_nothing():
    fake = RecordingDirectory()
    ids = sessions_of(fake, "alice", 3)
    fake.methods.clear()
    fake.reset_calls()
    assert apply(fake, plan_ending(ids[2]), dry_run=True).ended == ()
    assert apply(fake, plan_ending(), dry_run=False).ended == ()
    assert fake.methods == [] and fake.total_calls == 0 and fake.terminated == []


def test_apply_records_a_failed_termination_and_still_ends_the_rest():
    fake = InMemorySessionDirectory()
    ids = sessions_of(fake, "alice", 4)
    fake.fail_termination(ids[3])
    outcome = apply(fake, plan_ending(ids[3], ids[2]), dry_run=False)
    assert [s.session_id for s in outcome.ended] == [ids[2]]
    assert [(f.session_id, f.posix_user) for f in outcome.failed] == [(ids[3], "alice")]
    assert "InvalidParameters" in outcome.failed[0].error
    assert outcome.api_calls == {"TerminateSession": 2}, "the failed call is a call too"


# ---------------------------------------------------------------------- one error root, lean cold starts


def _package_modules():
    for info in pkgutil.iter_modules(session_limits.__path__):
        yield importlib.import_module(f"{session_limits.__name__}.{info.name}")


def test_every_session_limits_error_is_an_hpops_error():
    errors = [
        cls for module in _package_modules() for _, cls in inspect.getmembers(module, inspect.isclass)
        if issubclass(cls, BaseException) and cls.__module__ == module.__name__
    ]
    assert {cls.__name__ for cls in errors} >= {"SessionLimitError", "MalformedSessionEvent", "InvalidPolicy",
                                                "SessionListingFailed", "SessionTerminationFailed", "SessionReportFailed"}
    assert [cls.__name__ for cls in errors if not issubclass(cls, HpopsError)] == []


def test_every_error_the_state_machine_matches_by_name_exists():
    asl = json.loads((REPO / "statemachines" / "session_limits.asl.json").read_text())
    named = set()
    for state in asl["States"].values():
        for rule in state.get("Retry", []) + state.get("Catch", []):
            named |= {n for n in rule["ErrorEquals"] if not n.startswith(("States.", "Lambda."))}
    ours = {cls.__name__ for module in _package_modules() for _, cls in inspect.getmembers(module, inspect.isclass)
            if issubclass(cls, HpopsError)}
    assert named and named <= ours


@pytest.mark.parametrize("module, loads_pydantic", [
    ("enforce_session_limits", False),
    ("publish_login_limits", False),
    ("parse_session_trigger", True),  # the one function that parses raw events
])
def test_only_the_event_parser_loads_pydantic(module, loads_pydantic):
    code = ("import sys, " + module + "; print(sorted(m for m in sys.modules "
            "if m.split('.')[0] == 'pydantic' or m.startswith('aws_lambda_powertools.utilities.parser')))")
    path = os.pathsep.join([str(REPO / "layers" / "hpops_core"), str(REPO / "functions" / "session_limits")])
    env = os.environ | {"PYTHONPATH": path, "POWERTOOLS_TRACE_DISABLED": "true", "AWS_DEFAULT_REGION": "us-east-1"}
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True,
                                       text=True, cwd=REPO).stdout.replace("'", '"'))
    assert bool(loaded) is loads_pydantic, loaded
