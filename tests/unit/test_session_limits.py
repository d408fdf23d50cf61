"""Per-user Session Manager session limits on HyperPod login nodes.

AWS session APIs are not in moto, so enforcement runs against InMemorySessionDirectory
(tests/fake_session_directory.py, which counts calls per AWS operation; its account has Run As on
unless a test says otherwise) and the boto3 implementation against botocore's Stubber.
"""

from __future__ import annotations

import itertools
import json
import random
from datetime import datetime, timedelta, timezone
from pathlib import Path

import boto3
import pytest
from botocore.stub import Stubber

from hpops_core.session_limits.enforce import EnforcementReport, enforce, enforce_for_event
from fake_session_directory import InMemorySessionDirectory
from hpops_core.session_limits.identity import (
    IdentityConfig,
    InvalidIdentityConfig,
    RunAsPreferences,
    normalize_owner,
    resolve_posix_user,
)
from hpops_core.session_limits.errors import MalformedSessionEvent, SessionLimitError
from hpops_core.session_limits.models import parse_start_session
from hpops_core.session_limits.policy import (
    ActiveSession,
    InvalidPolicy,
    LimitPolicy,
    decide_terminations,
)
from hpops_core.session_limits.session_api import (
    Boto3SessionDirectory,
    SessionDirectory,
    SessionListingFailed,
    TagLookupFailed,
)
from hpops_core.session_limits.targets import cluster_id_from_arn, login_target_matches, login_target_prefix

REPO = Path(__file__).resolve().parents[2]
SAMPLE_EVENT = REPO / "events" / "ssm-start-session.json"

ACCOUNT = "123456789012"
CLUSTER = "abc123def456"
GROUP = "login"
T0 = datetime(2025, 3, 14, 9, 0, tzinfo=timezone.utc)
NOW = T0 + timedelta(hours=1)
RESEARCHERS = f"arn:aws:iam::{ACCOUNT}:role/Researchers"


def node(n: int, group: str = GROUP, cluster: str = CLUSTER) -> str:
    return f"sagemaker-cluster:{cluster}_{group}-i-{n:017x}"


def assumed(session_name: str, role: str = "Researchers") -> str:
    return f"arn:aws:sts::{ACCOUNT}:assumed-role/{role}/{session_name}"


def iam_user(name: str) -> str:
    return f"arn:aws:iam::{ACCOUNT}:user/{name}"


def add(fake: InMemorySessionDirectory, sid: str, owner: str, minute: int, *, n: int = 1, **kw) -> None:
    fake.add_session(sid, owner, node(n), T0 + timedelta(minutes=minute), **kw)


def run(fake: SessionDirectory, policy: LimitPolicy | None = None, config: IdentityConfig | None = None, **kw) -> EnforcementReport:
    return enforce(
        fake,
        CLUSTER,
        GROUP,
        policy or LimitPolicy(default_max=2),
        config or IdentityConfig(),
        NOW,
        **kw,
    )


def sample_event() -> dict:
    return json.loads(SAMPLE_EVENT.read_text())


def event_for(session_id: str, owner: str, target: str, event_id: str | None = None) -> dict:
    event = sample_event()
    detail = event["detail"]
    detail["userIdentity"]["arn"] = owner
    detail["requestParameters"]["target"] = target
    detail["responseElements"]["sessionId"] = session_id
    detail["responseElements"]["streamUrl"] = detail["responseElements"]["streamUrl"].replace(
        "alice-0a1b2c3d4e5f67890", session_id
    )
    detail["eventID"] = event_id or f"evt-{session_id}"
    return event


def on_event(fake, event, policy=None, config=None, **kw):
    return enforce_for_event(
        event, fake, CLUSTER, GROUP, policy or LimitPolicy(default_max=2), config or IdentityConfig(), NOW, **kw
    )


def statuses(fake: InMemorySessionDirectory, *ids: str) -> dict[str, str]:
    return {sid: fake.session(sid).status for sid in ids}


# --- core limit behaviour -------------------------------------------------------------------------


def test_limit_two_with_three_sessions_ends_exactly_the_newest():
    fake = InMemorySessionDirectory()
    add(fake, "alice-001", assumed("alice"), 0)
    add(fake, "alice-003", assumed("alice"), 20, n=2)  # newest, but not last inserted
    add(fake, "alice-002", assumed("alice"), 10)

    report = run(fake)

    assert report.ended_ids == ("alice-003",)
    assert fake.terminated == ["alice-003"]
    assert statuses(fake, "alice-001", "alice-002") == {"alice-001": "Connected", "alice-002": "Connected"}
    (verdict,) = report.users_over_limit
    assert (verdict.user, verdict.limit, verdict.active_count, verdict.to_terminate) == ("alice", 2, 3, ("alice-003",))
    assert report.metrics()["SessionsEnded"] == 1


def test_two_users_are_limited_independently():
    fake = InMemorySessionDirectory()
    for i in range(3):
        add(fake, f"alice-00{i}", assumed("alice"), i)
    for i in range(2):
        add(fake, f"bob-00{i}", assumed("bob"), 10 + i)  # newer than all of alice's, but within bob's limit

    report = run(fake)

    assert report.ended_ids == ("alice-002",)
    assert {v.user: v.active_count for v in report.verdicts} == {"alice": 3, "bob": 2}


def test_per_user_overrides():
    fake = InMemorySessionDirectory()
    for i in range(3):
        add(fake, f"alice-00{i}", assumed("alice"), i)
    for i in range(2):
        add(fake, f"bob-00{i}", assumed("bob"), i)
    add(fake, "carol-000", assumed("carol"), 0)

    policy = LimitPolicy(default_max=2, overrides={"alice": 3, "bob": 1, "carol": 0})
    report = run(fake, policy)

    assert sorted(report.ended_ids) == ["bob-001", "carol-000"]
    assert {v.user: v.limit for v in report.verdicts} == {"alice": 3, "bob": 1, "carol": 0}


def test_exempt_users_and_principals_are_never_terminated():
    fake = InMemorySessionDirectory()
    for i in range(5):
        add(fake, f"alice-00{i}", assumed("alice"), i)
    for i in range(4):
        add(fake, f"ops-00{i}", assumed("oncall", role="BreakGlass"), i)
    for i in range(3):
        add(fake, f"bob-00{i}", assumed("bob"), i)

    policy = LimitPolicy(
        default_max=1,
        exempt_users=frozenset({"alice"}),
        exempt_principal_patterns=(f"arn:aws:sts::{ACCOUNT}:assumed-role/BreakGlass/*",),
    )
    report = run(fake, policy)

    assert sorted(report.ended_ids) == ["bob-001", "bob-002"]
    assert not any(sid.startswith(("alice", "ops")) for sid in fake.terminated)
    alice = next(v for v in report.verdicts if v.user == "alice")
    assert alice.limit is None and alice.to_terminate == () and "exempt" in alice.reason


def test_excess_oldest_ends_the_oldest_sessions():
    fake = InMemorySessionDirectory()
    for i in range(4):
        add(fake, f"alice-00{i}", assumed("alice"), i)

    report = run(fake, LimitPolicy(default_max=2, excess="oldest"))

    assert report.ended_ids == ("alice-000", "alice-001")


def test_equal_start_dates_break_ties_by_session_id():
    same = T0
    sessions = [ActiveSession(sid, assumed("alice"), node(1), same, "alice") for sid in ("b", "c", "a")]
    newest = decide_terminations(sessions, LimitPolicy(default_max=2))
    oldest = decide_terminations(sessions, LimitPolicy(default_max=2, excess="oldest"))
    assert newest.to_terminate == ("c",)
    assert oldest.to_terminate == ("a",)


def test_already_terminated_sessions_are_neither_counted_nor_picked():
    sessions = [ActiveSession(f"a{i}", assumed("alice"), node(1), T0 + timedelta(minutes=i), "alice") for i in range(4)]
    decision = decide_terminations(sessions, LimitPolicy(default_max=2), already_terminated={"a3"})
    assert decision.to_terminate == ("a2",)
    assert decision.verdict_for("alice").active_count == 3
    assert ("a3", "already terminated by an earlier run") in [(s.session_id, s.reason) for s in decision.skipped]
    assert decide_terminations(sessions, LimitPolicy(default_max=2), {"a3", "a2"}).to_terminate == ()


def test_only_connected_and_connecting_sessions_count():
    fake = InMemorySessionDirectory()
    add(fake, "alice-000", assumed("alice"), 0)
    add(fake, "alice-001", assumed("alice"), 1, status="Disconnected")
    add(fake, "alice-002", assumed("alice"), 2, status="Terminating")
    add(fake, "alice-003", assumed("alice"), 3, status="Connecting")

    assert run(fake).ended_ids == ()

    add(fake, "alice-004", assumed("alice"), 4, status="Connecting")
    assert run(fake).ended_ids == ("alice-004",)


def test_other_clusters_and_similarly_named_groups_are_ignored():
    fake = InMemorySessionDirectory()
    add(fake, "alice-000", assumed("alice"), 0)
    add(fake, "alice-001", assumed("alice"), 1)
    # "login" is a prefix of "login-b": these must not count towards group "login".
    fake.add_session("alice-100", assumed("alice"), node(5, group="login-b"), T0 + timedelta(minutes=5))
    fake.add_session("alice-200", assumed("alice"), node(6, cluster="zzz999zzz999"), T0 + timedelta(minutes=6))
    fake.add_session("alice-300", assumed("alice"), node(7, group="compute"), T0 + timedelta(minutes=7))

    report = run(fake)

    assert report.ended_ids == ()
    assert report.login_sessions_listed == 2


# --- events: duplicates, ordering, loss --------------------------------------------------------------


def test_duplicate_event_terminates_nothing_extra():
    fake = InMemorySessionDirectory()
    for i in range(3):
        add(fake, f"alice-00{i}", assumed("alice"), i)
    add(fake, "bob-000", assumed("bob"), 5)  # keeps the run past the "nobody can be over" shortcut
    event = event_for("alice-002", assumed("alice"), node(1))

    first = on_event(fake, event)
    assert first.ended_ids == ("alice-002",)

    # DescribeSessions can keep listing a just-terminated session as Connected for a while.
    # Without already_terminated, the duplicate would count it again and act a second time.
    fake.set_status("alice-002", "Connected")
    second = on_event(fake, event, already_terminated=set(first.ended_ids))

    assert second.ended_ids == ()
    assert fake.terminated == ["alice-002"]
    assert statuses(fake, "alice-000", "alice-001") == {"alice-000": "Connected", "alice-001": "Connected"}


def test_duplicate_event_with_consistent_listing_terminates_nothing_extra():
    fake = InMemorySessionDirectory()
    for i in range(3):
        add(fake, f"alice-00{i}", assumed("alice"), i)
    event = event_for("alice-002", assumed("alice"), node(1))

    on_event(fake, event)
    assert on_event(fake, event).ended_ids == ()
    assert fake.terminated == ["alice-002"]


@pytest.mark.parametrize("order", list(itertools.permutations(["alice-000", "alice-001", "alice-002"])))
def test_event_order_does_not_matter(order):
    fake = InMemorySessionDirectory()
    for i in range(3):
        add(fake, f"alice-00{i}", assumed("alice"), i)

    for sid in order:  # events delivered in any order, after all sessions exist
        on_event(fake, event_for(sid, assumed("alice"), node(1)))

    assert fake.terminated == ["alice-002"]


def test_decision_is_independent_of_input_order():
    sessions = [
        ActiveSession(f"{user}-{i:03d}", assumed(user), node(i), T0 + timedelta(minutes=(i * 7) % 11), user)
        for user in ("alice", "bob", "carol")
        for i in range(6)
    ]
    policy = LimitPolicy(default_max=2, overrides={"bob": 4})
    expected = decide_terminations(sessions, policy)
    rng = random.Random(7)
    for _ in range(20):
        shuffled = sessions[:]
        rng.shuffle(shuffled)
        assert decide_terminations(shuffled, policy) == expected
    assert len(expected.to_terminate) == 4 + 2 + 4


def test_lost_event_is_caught_by_sweep():
    fake = InMemorySessionDirectory()
    add(fake, "bob-000", assumed("bob"), 0)
    add(fake, "bob-001", assumed("bob"), 1)
    on_event(fake, event_for("bob-001", assumed("bob"), node(1)))
    add(fake, "bob-002", assumed("bob"), 2)  # its StartSession event never arrives
    assert fake.terminated == []

    report = run(fake, trigger="sweep")

    assert report.ended_ids == ("bob-002",)
    assert report.trigger_session_listed is None


def test_event_before_session_is_listed_is_reported_and_sweep_catches_it():
    fake = InMemorySessionDirectory()
    add(fake, "bob-000", assumed("bob"), 0)
    add(fake, "bob-001", assumed("bob"), 1)

    report = on_event(fake, event_for("bob-002", assumed("bob"), node(1)))
    assert report.trigger_session_listed is False
    assert report.ended_ids == ()

    add(fake, "bob-002", assumed("bob"), 2)
    assert run(fake).ended_ids == ("bob-002",)


def test_event_for_another_cluster_or_group_makes_no_calls():
    fake = InMemorySessionDirectory()
    assert on_event(fake, event_for("x-1", assumed("alice"), node(1, group="compute"))) is None
    assert on_event(fake, event_for("x-2", assumed("alice"), node(1, cluster="zzz999zzz999"))) is None
    assert fake.total_calls == 0


# --- identity ----------------------------------------------------------------------------------------


def test_run_as_tag_groups_principals_sharing_a_role_with_one_lookup():
    fake = InMemorySessionDirectory(tags={RESEARCHERS: {"SSMSessionRunAs": "research"}})
    add(fake, "alice-000", assumed("alice"), 0)
    add(fake, "bob-000", assumed("bob"), 1)
    add(fake, "carol-000", assumed("carol"), 2)

    report = run(fake)

    # All three run as POSIX user "research": one over the limit, the newest goes.
    assert report.ended_ids == ("carol-000",)
    assert report.identities[assumed("alice")].source == "tag"
    assert fake.calls["ListRoleTags"] == 1


def test_iam_user_tag_and_mapping_rules():
    bob = iam_user("bob")
    fake = InMemorySessionDirectory(tags={bob: {"SSMSessionRunAs": "rbob"}})
    for i in range(2):
        add(fake, f"bob-00{i}", bob, i)
    for i in range(2):
        add(fake, f"sso-00{i}", assumed("alice@example.com", role="AWSReservedSSO_Research_0123abcd"), 10 + i)

    config = IdentityConfig(mapping_rules=(("arn:aws:sts::*:assumed-role/AWSReservedSSO_Research_*/*", "rbob"),))
    report = run(fake, config=config)

    assert report.identities[bob].source == "tag"
    assert report.identities[assumed("alice@example.com", role="AWSReservedSSO_Research_0123abcd")].source == "mapping"
    assert report.ended_ids == ("sso-001", "sso-000")  # 4 sessions of rbob, limit 2, newest first
    assert fake.calls["ListUserTags"] == 1


def test_unknown_principal_count_as_principal():
    fake = InMemorySessionDirectory()  # no tags, no mapping rules
    for i in range(3):
        add(fake, f"dave-00{i}", assumed("dave", role="Contractors"), i)

    report = run(fake, config=IdentityConfig(unmapped_policy="count-as-principal"))

    assert report.ended_ids == ("dave-002",)
    assert report.identities[assumed("dave", role="Contractors")].source == "principal-name"
    assert report.verdicts[0].user == "dave"


def test_unknown_principal_ignore_policy_never_terminates():
    fake = InMemorySessionDirectory()
    for i in range(3):
        add(fake, f"dave-00{i}", assumed("dave", role="Contractors"), i)

    report = run(fake, config=IdentityConfig(unmapped_policy="ignore"))

    assert report.ended_ids == () and fake.terminated == []
    assert sorted(u.session_id for u in report.unresolved) == ["dave-000", "dave-001", "dave-002"]
    assert report.metrics()["UnresolvedSessions"] == 3


def test_failed_tag_lookup_leaves_that_principal_uncounted():
    fake = InMemorySessionDirectory()
    fake.fail_tag_lookup(RESEARCHERS)
    for i in range(3):
        add(fake, f"alice-00{i}", assumed("alice"), i)
    for i in range(3):
        add(fake, f"eve-00{i}", iam_user("eve"), i)

    report = run(fake)

    assert report.ended_ids == ("eve-002",)
    assert {u.session_id for u in report.unresolved} == {"alice-000", "alice-001", "alice-002"}
    assert fake.calls["ListRoleTags"] == 1  # failure not retried per session


def test_normalize_owner():
    assert normalize_owner(assumed("alice")) == RESEARCHERS
    assert normalize_owner("arn:aws-us-gov:sts::111122223333:assumed-role/R/s") == "arn:aws-us-gov:iam::111122223333:role/R"
    assert normalize_owner(iam_user("div/bob")) == iam_user("div/bob")
    assert normalize_owner(f"arn:aws:sts::{ACCOUNT}:federated-user/carol") is None
    assert normalize_owner(f"arn:aws:iam::{ACCOUNT}:root") is None
    assert normalize_owner("not-an-arn") is None


def test_resolution_order_and_never_root():
    on = RunAsPreferences(enabled=True)
    owner = assumed("alice")
    rules = [("arn:aws:sts::*:assumed-role/Researchers/*", "mapped")]
    # A mapping rule stands in for the session tag, which Session Manager prefers to the role's tag.
    assert resolve_posix_user(owner, on, {"SSMSessionRunAs": "tagged"}, rules, "ignore").posix_user == "mapped"
    assert resolve_posix_user(owner, on, {"SSMSessionRunAs": "tagged"}, [], "ignore").posix_user == "tagged"
    assert resolve_posix_user(owner, on, None, [], "count-as-principal").posix_user == "alice"
    assert resolve_posix_user(owner, on, None, [], "ignore").posix_user is None

    root_tag = resolve_posix_user(owner, on, {"SSMSessionRunAs": "root"}, [], "count-as-principal")
    assert root_tag.posix_user == "alice" and "not a usable user" in root_tag.reason
    named_root = resolve_posix_user(assumed("root"), on, None, [], "count-as-principal")
    assert named_root.posix_user is None and named_root.source == "unmapped"
    assert resolve_posix_user(f"arn:aws:iam::{ACCOUNT}:root", on, None, [], "count-as-principal").posix_user is None
    with pytest.raises(InvalidIdentityConfig):
        resolve_posix_user(owner, on, None, [("*", "root")], "ignore")
    with pytest.raises(InvalidIdentityConfig):
        IdentityConfig(unmapped_policy="count-everything")


# --- malformed events ----------------------------------------------------------------------------------


def _mutate(fn):
    event = sample_event()
    fn(event)
    return event


MALFORMED = {
    "missing detail": _mutate(lambda e: e.pop("detail")),
    "missing session id": _mutate(lambda e: e["detail"]["responseElements"].pop("sessionId")),
    "missing target": _mutate(lambda e: e["detail"]["requestParameters"].pop("target")),
    "missing userIdentity": _mutate(lambda e: e["detail"].pop("userIdentity")),
    "wrong eventName": _mutate(lambda e: e["detail"].update(eventName="TerminateSession")),
    "wrong source": _mutate(lambda e: e.update(source="aws.ec2")),
    "wrong eventSource": _mutate(lambda e: e["detail"].update(eventSource="ec2.amazonaws.com")),
    "failed call": _mutate(
        lambda e: e["detail"].update(errorCode="AccessDenied", errorMessage="denied", responseElements=None)
    ),
    "errorCode with response": _mutate(lambda e: e["detail"].update(errorCode="ThrottlingException")),
    "no responseElements": _mutate(lambda e: e["detail"].update(responseElements=None)),
    "shell in session id": _mutate(lambda e: e["detail"]["responseElements"].update(sessionId="a;rm -rf /")),
    "newline in session id": _mutate(lambda e: e["detail"]["responseElements"].update(sessionId="alice-1\nFAKE LOG")),
    "overlong session id": _mutate(lambda e: e["detail"]["responseElements"].update(sessionId="a" * 97)),
    "plain instance target": _mutate(lambda e: e["detail"]["requestParameters"].update(target="i-0123456789abcdef0")),
    "target with suffix": _mutate(
        lambda e: e["detail"]["requestParameters"].update(target=node(1) + "\n" + node(2))
    ),
    "target with bad cluster": _mutate(
        lambda e: e["detail"]["requestParameters"].update(target="sagemaker-cluster:ABC/../x_login-i-0123456789abcdef0")
    ),
    "non-string session id": _mutate(lambda e: e["detail"]["responseElements"].update(sessionId=12345)),
    "bad principal arn": _mutate(lambda e: e["detail"]["userIdentity"].update(arn="alice <script>")),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_events_raise_named_error_and_touch_nothing(name):
    fake = InMemorySessionDirectory()
    for i in range(3):
        add(fake, f"alice-00{i}", assumed("alice"), i)

    with pytest.raises(MalformedSessionEvent) as info:
        on_event(fake, MALFORMED[name])

    assert isinstance(info.value, SessionLimitError)
    assert fake.total_calls == 0 and fake.terminated == []


@pytest.mark.parametrize("bad", [None, [], "event", 42])
def test_non_object_events_are_malformed(bad):
    with pytest.raises(MalformedSessionEvent):
        parse_start_session(bad)


def test_sample_event_parses():
    parsed = parse_start_session(sample_event())
    assert parsed.session_id == "alice-0a1b2c3d4e5f67890"
    assert parsed.owner_arn == assumed("alice")
    assert login_target_matches(parsed.target, CLUSTER, GROUP)
    assert parsed.detail.userIdentity.sessionContext.sessionIssuer.arn == RESEARCHERS
    assert parsed.event_time == datetime(2025, 3, 14, 9, 26, 53, tzinfo=timezone.utc)


def test_target_helpers():
    assert cluster_id_from_arn(f"arn:aws:sagemaker:us-east-1:{ACCOUNT}:cluster/{CLUSTER}") == CLUSTER
    assert login_target_matches(f"sagemaker-cluster:{CLUSTER}_login-i-0123456789abcdef0", CLUSTER, "login")
    assert login_target_matches(f"sagemaker-cluster:{CLUSTER}_login-b-i-0123456789abcdef0", CLUSTER, "login-b")
    assert not login_target_matches(f"sagemaker-cluster:{CLUSTER}_login-b-i-0123456789abcdef0", CLUSTER, "login")
    assert not login_target_matches(f"sagemaker-cluster:{CLUSTER}_login-i-0123", CLUSTER, "login")
    assert login_target_prefix(CLUSTER, "login") == f"sagemaker-cluster:{CLUSTER}_login-"
    with pytest.raises(MalformedSessionEvent):
        login_target_prefix("abc_x", "login")


# --- cost, paging, dry run -----------------------------------------------------------------------------


def test_event_for_user_under_limit_costs_at_most_three_calls():
    fake = InMemorySessionDirectory()
    add(fake, "alice-000", assumed("alice"), 0)
    add(fake, "alice-001", assumed("alice"), 1)
    add(fake, "bob-000", assumed("bob"), 2)  # 3 sessions > smallest limit, so identities are resolved

    report = on_event(fake, event_for("alice-001", assumed("alice"), node(1)))

    assert report.ended_ids == ()
    # One listing, the Run As preferences once, one role looked up once.
    assert dict(fake.calls) == {"DescribeSessions": 1, "GetDocument": 1, "ListRoleTags": 1}
    assert report.api_calls == {"DescribeSessions": 1, "GetDocument": 1, "ListRoleTags": 1}
    assert report.total_api_calls <= 3


def test_no_identity_lookups_when_nobody_can_be_over_the_limit():
    fake = InMemorySessionDirectory()
    add(fake, "alice-000", assumed("alice"), 0)
    add(fake, "bob-000", iam_user("bob"), 1)

    report = on_event(fake, event_for("alice-000", assumed("alice"), node(1)))

    assert dict(fake.calls) == {"DescribeSessions": 1}
    assert "no identity lookups" in report.note


def test_fake_pages_over_more_than_a_thousand_active_sessions():
    fake = InMemorySessionDirectory()
    for i in range(1_050):  # other clusters' sessions fill most pages
        fake.add_session(f"other-{i:04d}", assumed(f"u{i}"), node(i, cluster="zzz999zzz999"), T0)
    for i in range(3):
        add(fake, f"alice-00{i}", assumed("alice"), i)

    report = run(fake)

    assert fake.calls["DescribeSessions"] == 6  # ceil(1053 / 200)
    assert report.ended_ids == ("alice-002",)  # alice's sessions sit on the last page


def _session_record(i: int, target: str) -> dict:
    return {
        "SessionId": f"user{i % 7}-{i:05d}",
        "Target": target,
        "Status": "Connected",
        "StartDate": T0 + timedelta(seconds=i),
        "DocumentName": "SSM-SessionManagerRunShell",
        "Owner": assumed(f"user{i % 7}"),
    }


def test_boto3_directory_follows_next_token_over_1000_sessions():
    ssm = boto3.client("ssm", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    assert ssm.can_paginate("describe_sessions")
    total, page_size = 1_050, 200
    records = [
        _session_record(i, node(i) if i % 2 == 0 else node(i, cluster="zzz999zzz999")) for i in range(total)
    ]
    with Stubber(ssm) as stub:
        pages = [records[i : i + page_size] for i in range(0, total, page_size)]
        for index, page in enumerate(pages):
            expected = {"State": "Active", "MaxResults": page_size}
            if index:
                expected["NextToken"] = f"token-{index}"
            response = {"Sessions": page}
            if index + 1 < len(pages):
                response["NextToken"] = f"token-{index + 1}"
            stub.add_response("describe_sessions", response, expected)

        directory = Boto3SessionDirectory(ssm_client=ssm, iam_client=object())
        found = list(directory.active_sessions(login_target_prefix(CLUSTER, GROUP)))
        stub.assert_no_pending_responses()

    assert len(found) == 525  # every even record, from all six pages
    assert found[-1]["SessionId"] == records[1048]["SessionId"]
    assert directory.calls["DescribeSessions"] == 6


class _NoPaginatorSSM:
    """A client without a describe_sessions paginator: the hand-written NextToken loop is used."""

    def __init__(self, records, page_size=200):
        self.pages = [records[i : i + page_size] for i in range(0, len(records), page_size)]
        self.requests = []
        self.terminated = []

    def can_paginate(self, name):
        return False

    def describe_sessions(self, **kwargs):
        self.requests.append(kwargs)
        index = int(kwargs.get("NextToken", "0"))
        response = {"Sessions": self.pages[index]}
        if index + 1 < len(self.pages):
            response["NextToken"] = str(index + 1)
        return response

    def terminate_session(self, SessionId):
        self.terminated.append(SessionId)
        return {"SessionId": SessionId}

    def get_document(self, Name, DocumentFormat):
        assert (Name, DocumentFormat) == ("SSM-SessionManagerRunShell", "JSON")
        return {"Name": Name, "DocumentType": "Session", "Content": json.dumps({"inputs": {"runAsEnabled": True}})}


def test_boto3_directory_manual_paging_and_enforcement_end_to_end():
    records = [_session_record(i, node(i, cluster="zzz999zzz999")) for i in range(1_001)]
    records += [
        {**_session_record(2_000 + i, node(1)), "SessionId": f"alice-00{i}", "Owner": assumed("alice")}
        for i in range(3)
    ]
    ssm = _NoPaginatorSSM(records)
    directory = Boto3SessionDirectory(ssm_client=ssm, iam_client=object())

    report = run(directory, config=IdentityConfig(lookup_tags=False))

    assert [r.get("NextToken") for r in ssm.requests] == [None, "1", "2", "3", "4", "5"]
    assert all(r["MaxResults"] == 200 and r["State"] == "Active" for r in ssm.requests)
    assert ssm.terminated == ["alice-002"] and report.ended_ids == ("alice-002",)
    assert report.api_calls == {"DescribeSessions": 6, "GetDocument": 1, "TerminateSession": 1}


def test_boto3_directory_tag_lookup_caches_with_ttl_and_maps_errors():
    iam = boto3.client("iam", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    clock = [1000.0]
    directory = Boto3SessionDirectory(ssm_client=object(), iam_client=iam, tag_ttl_seconds=60, clock=lambda: clock[0], account_id=ACCOUNT)
    with Stubber(iam) as stub:
        tags = {"Tags": [{"Key": "SSMSessionRunAs", "Value": "research"}], "IsTruncated": False}
        stub.add_response("list_role_tags", tags, {"RoleName": "Researchers"})
        stub.add_response("list_role_tags", tags, {"RoleName": "Researchers"})
        stub.add_client_error("list_user_tags", "NoSuchEntity", expected_params={"UserName": "gone"})
        stub.add_client_error("list_user_tags", "AccessDenied", expected_params={"UserName": "locked"})

        assert directory.principal_tags(RESEARCHERS) == {"SSMSessionRunAs": "research"}
        assert directory.principal_tags(RESEARCHERS) == {"SSMSessionRunAs": "research"}  # cached
        clock[0] += 61
        assert directory.principal_tags(RESEARCHERS) == {"SSMSessionRunAs": "research"}  # refreshed
        assert directory.principal_tags(iam_user("gone")) == {}
        with pytest.raises(TagLookupFailed):
            directory.principal_tags(iam_user("locked"))
        stub.assert_no_pending_responses()

    with pytest.raises(TagLookupFailed):
        directory.principal_tags("arn:aws:iam::999999999999:role/Researchers")  # foreign account
    assert directory.calls["ListRoleTags"] == 2


def test_boto3_directory_listing_failure_is_named():
    ssm = boto3.client("ssm", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    with Stubber(ssm) as stub:
        stub.add_client_error("describe_sessions", "AccessDeniedException")
        with pytest.raises(SessionListingFailed):
            list(Boto3SessionDirectory(ssm_client=ssm).active_sessions("sagemaker-cluster:"))


def test_dry_run_terminates_nothing_but_reports_the_plan():
    fake = InMemorySessionDirectory()
    for i in range(4):
        add(fake, f"alice-00{i}", assumed("alice"), i)

    report = run(fake, dry_run=True)

    assert fake.terminated == [] and "TerminateSession" not in fake.calls
    assert report.planned_ids == ("alice-003", "alice-002") and report.ended_ids == ()
    note = report.notification()
    assert "would end 2" in note.subject
    assert "DRY RUN" in note.text and "alice-003" in note.text


def test_termination_failure_is_reported_and_others_still_end():
    fake = InMemorySessionDirectory()
    for i in range(4):
        add(fake, f"alice-00{i}", assumed("alice"), i)
    fake.fail_termination("alice-003")

    report = run(fake)

    assert report.ended_ids == ("alice-002",)
    assert [f.session_id for f in report.failed] == ["alice-003"]
    assert "FAILED" in report.notification().subject


def test_notification_names_user_limit_and_sessions():
    fake = InMemorySessionDirectory()
    for i in range(3):
        add(fake, f"alice-00{i}", assumed("alice"), i)

    report = run(fake)
    note = report.notification()

    assert len(note.subject) <= 100 and "\n" not in note.subject
    assert "User alice: limit 2, 3 active" in note.text and "alice-002" in note.text
    data = json.loads(note.message.split("--- details (JSON) ---\n", 1)[1])
    assert data["ended"][0]["session_id"] == "alice-002"
    assert data["ended"][0]["reason"] == "alice: 3 active > default limit 2; ending the 1 newest"
    assert data["users_over_limit"][0] == {
        "user": "alice",
        "limit": 2,
        "active_count": 3,
        "to_terminate": ["alice-002"],
        "reason": data["users_over_limit"][0]["reason"],
    }
    assert run(fake).notification() is None  # nothing over the limit any more


def test_policy_validation():
    for bad in (0, -1, True, "2"):
        with pytest.raises(InvalidPolicy):
            LimitPolicy(default_max=bad)
    with pytest.raises(InvalidPolicy):
        LimitPolicy(default_max=2, overrides={"alice": -1})
    with pytest.raises(InvalidPolicy):
        LimitPolicy(default_max=2, excess="random")
    with pytest.raises(InvalidPolicy):
        LimitPolicy(default_max=2, exempt_users="alice")
    policy = LimitPolicy(default_max=2, overrides={"alice": 3})
    with pytest.raises(TypeError):
        policy.overrides["alice"] = 9  # frozen all the way down


def test_directories_satisfy_the_protocol():
    assert isinstance(InMemorySessionDirectory(), SessionDirectory)
    assert isinstance(Boto3SessionDirectory(), SessionDirectory)  # no client created yet


def test_notification_names_the_cluster_by_its_name_with_the_id_beside_it():
    fake = InMemorySessionDirectory()
    for i in range(3):
        add(fake, f"alice-00{i}", assumed("alice"), i)

    report = run(fake)
    note = report.notification("ml-research")

    assert note.subject.startswith("HyperPod ml-research: ended 1 login session(s) over limit (alice)")
    assert f"HyperPod cluster ml-research (id {report.cluster_id})" in note.text
