"""Whose session it is, as Session Manager decides it, and which sessions count at all.

Order (identity.py): Run As off -> ssm-user; on -> session tag (operators' mapping rules stand in
for it, it is invisible to us) -> the role's/user's SSMSessionRunAs tag -> runAsDefaultUser ->
nothing (SSM would refuse the session; the unmapped policy decides). Only interactive shells on
this cluster's login nodes count; the rest is skipped with a reason and counted in a metric.
"""

import json
from datetime import datetime, timedelta, timezone

import boto3
import pytest
from botocore.stub import Stubber

from fake_session_directory import InMemorySessionDirectory
from hpops_core.session_limits.config import SessionTriggerConfig
from hpops_core.session_limits.decide import decide
from hpops_core.session_limits.documents import session_kind
from hpops_core.session_limits.enforce import enforce
from hpops_core.session_limits.gather import gather
from hpops_core.session_limits.identity import (
    IdentityConfig,
    InvalidRunAsPreferences,
    RunAsPreferences,
    parse_run_as_preferences,
    resolve_posix_user,
)
from hpops_core.session_limits.models import parse_start_session
from hpops_core.session_limits.policy import LimitPolicy
from hpops_core.session_limits.session_api import Boto3SessionDirectory, RunAsPreferencesUnavailable
from hpops_core.session_limits.trigger import SessionLimitsRequest, parse_session_input

ACCOUNT = "111122223333"
CLUSTER_ID = "abc123def456"
T0 = datetime(2025, 3, 14, 9, 0, tzinfo=timezone.utc)
ON = RunAsPreferences(enabled=True)
OFF = parse_run_as_preferences(None)
RESEARCHERS = f"arn:aws:iam::{ACCOUNT}:role/Researchers"
SSO_RULE = ("arn:aws:sts::*:assumed-role/AWSReservedSSO_*/*", "jdoe")


def node(n: int, group: str = "login") -> str:
    return f"sagemaker-cluster:{CLUSTER_ID}_{group}-i-{n:017x}"


def assumed(session_name: str, role: str = "Researchers") -> str:
    return f"arn:aws:sts::{ACCOUNT}:assumed-role/{role}/{session_name}"


def iam_user(name: str) -> str:
    return f"arn:aws:iam::{ACCOUNT}:user/{name}"


def run(fake, policy=None, config=None, **kw):
    return enforce(fake, CLUSTER_ID, "login", policy or LimitPolicy(default_max=2), config or IdentityConfig(),
                   T0 + timedelta(hours=1), **kw)


def preferences_document(enabled, default_user="") -> str:
    return json.dumps({"schemaVersion": "1.0", "sessionType": "Standard_Stream",
                       "inputs": {"runAsEnabled": enabled, "runAsDefaultUser": default_user, "s3BucketName": ""}})


# --- the preferences document ---------------------------------------------------------------------


def test_preferences_parse_like_session_manager_reads_them():
    assert OFF.enabled is False and "no SSM-SessionManagerRunShell document" in OFF.note
    assert parse_run_as_preferences(preferences_document(False, "ubuntu")) == RunAsPreferences(False, None)
    assert parse_run_as_preferences(preferences_document(True, "ubuntu")) == RunAsPreferences(True, "ubuntu")
    assert parse_run_as_preferences(preferences_document("true", "")) == RunAsPreferences(True, None)
    assert parse_run_as_preferences(json.dumps({"schemaVersion": "1.0"})) == RunAsPreferences(False, None)
    root = parse_run_as_preferences(preferences_document(True, "root"))
    assert root.enabled and root.default_user is None and "not usable" in root.note
    for broken in ("{", json.dumps({"inputs": []}), preferences_document("maybe"), preferences_document(True, 7)):
        with pytest.raises(InvalidRunAsPreferences):
            parse_run_as_preferences(broken)


# --- each rule of the order -----------------------------------------------------------------------


def test_run_as_off_every_hyperpod_shell_is_root_so_nobody_is_counted_whatever_the_tags_and_rules_say():
    resolution = resolve_posix_user(assumed("j.doe", "AWSReservedSSO_R_1"), OFF, {"SSMSessionRunAs": "tagged"},
                                    [SSO_RULE])
    assert (resolution.posix_user, resolution.source) == (None, "run-as-off")
    assert resolution.reason.startswith("Run As is off: sessions run as root, per-user limits cannot apply")


def test_mapping_rule_stands_in_for_the_session_tag_so_it_outranks_the_role_tag():
    owner = assumed("j.doe", "AWSReservedSSO_R_1")
    resolution = resolve_posix_user(owner, ON, {"SSMSessionRunAs": "shared"}, [SSO_RULE])
    assert (resolution.posix_user, resolution.source) == ("jdoe", "mapping")
    assert "session tag" in resolution.reason


def test_mapping_rules_never_apply_to_iam_users_who_cannot_carry_session_tags():
    resolution = resolve_posix_user(iam_user("bob"), ON, {"SSMSessionRunAs": "rbob"}, [("*", "someone")])
    assert (resolution.posix_user, resolution.source) == ("rbob", "tag")


def test_the_principals_tag_outranks_the_default_user():
    resolution = resolve_posix_user(assumed("alice"), RunAsPreferences(True, "shared"), {"SSMSessionRunAs": "alice"})
    assert (resolution.posix_user, resolution.source) == ("alice", "tag")


def test_without_a_tag_the_default_user_applies():
    resolution = resolve_posix_user(assumed("alice"), RunAsPreferences(True, "shared"), {})
    assert (resolution.posix_user, resolution.source) == ("shared", "default-user")


def test_an_unusable_tag_stops_session_manager_so_the_default_does_not_apply():
    resolution = resolve_posix_user(assumed("alice"), RunAsPreferences(True, "shared"), {"SSMSessionRunAs": "root"},
                                    unmapped_policy="ignore")
    assert resolution.posix_user is None and "not a usable user" in resolution.reason


@pytest.mark.parametrize("policy, user", [("count-as-principal", "alice"), ("ignore", None)])
def test_with_nothing_ssm_could_use_the_unmapped_policy_decides(policy, user):
    resolution = resolve_posix_user(assumed("alice"), ON, {}, unmapped_policy=policy)
    assert resolution.posix_user == user
    assert "no runAsDefaultUser" in resolution.reason


# --- the order applied by enforcement --------------------------------------------------------------


def test_enforcement_with_run_as_off_on_hyperpod_ends_nothing_and_says_why():
    """HyperPod: a session with Run As off "initially connects you as the root user"; root is never
    limited, so three people's shells (or one person's three) end nothing."""
    fake = InMemorySessionDirectory(preferences=OFF, tags={RESEARCHERS: {"SSMSessionRunAs": "research"}})
    fake.add_session("alice-1", assumed("alice"), node(1), T0)
    fake.add_session("alice-2", assumed("alice"), node(2), T0 + timedelta(minutes=1))
    fake.add_session("bob-1", iam_user("bob"), node(2), T0 + timedelta(minutes=1))
    fake.add_session("carol-1", assumed("carol"), node(3), T0 + timedelta(minutes=2))

    report = run(fake, policy=LimitPolicy(default_max=1))

    assert report.ended_ids == () and report.planned == () and "TerminateSession" not in fake.calls
    assert report.verdicts == ()
    assert {u.session_id for u in report.unresolved} == {"alice-1", "alice-2", "bob-1", "carol-1"}
    assert all(u.reason.startswith("Run As is off: sessions run as root, per-user limits cannot apply")
               for u in report.unresolved)
    assert report.run_as.startswith("Run As is off: sessions run as root, per-user limits cannot apply")
    assert "ListRoleTags" not in fake.calls, "with Run As off no tag can matter"


def test_enforcement_reads_the_preferences_once_and_only_when_someone_could_be_over():
    fake = InMemorySessionDirectory(preferences=RunAsPreferences(True, "shared"))
    fake.add_session("a-1", assumed("alice"), node(1), T0)
    fake.add_session("a-2", assumed("alice"), node(1), T0 + timedelta(minutes=1))
    assert run(fake).note and "GetDocument" not in fake.calls, "2 sessions <= limit 2: no identity needed"

    fake.add_session("b-1", iam_user("bob"), node(2), T0 + timedelta(minutes=2))
    fake.reset_calls()
    snapshot = gather(fake, CLUSTER_ID, "login", LimitPolicy(default_max=2), IdentityConfig())
    assert fake.calls["GetDocument"] == 1, "one read per invocation: the snapshot holds it"
    # Planned without and with the ledger (as the Lambda does): no second read.
    first = decide(snapshot, LimitPolicy(default_max=2), IdentityConfig(), T0)
    second = decide(snapshot, LimitPolicy(default_max=2), IdentityConfig(), T0, already_ended={"nothing-1"})
    assert first.session_ids == second.session_ids == ("b-1",), "alice's and bob's shells all run as 'shared'"
    assert fake.calls["GetDocument"] == 1


def test_enforcement_stops_with_a_named_error_when_the_preferences_cannot_be_read():
    fake = InMemorySessionDirectory(preferences=None)
    for i in range(3):
        fake.add_session(f"a-{i}", assumed("alice"), node(1), T0 + timedelta(minutes=i))
    with pytest.raises(RunAsPreferencesUnavailable):
        run(fake)
    assert fake.terminated == []


def test_boto3_directory_reads_the_preferences_document():
    ssm = boto3.client("ssm", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    directory = Boto3SessionDirectory(ssm_client=ssm, iam_client=object())
    expected = {"Name": "SSM-SessionManagerRunShell", "DocumentFormat": "JSON"}
    with Stubber(ssm) as stub:
        stub.add_response("get_document", {"Name": "SSM-SessionManagerRunShell", "DocumentType": "Session",
                                           "Content": preferences_document(True, "ubuntu")}, expected)
        stub.add_client_error("get_document", "InvalidDocument", expected_params=expected)
        stub.add_client_error("get_document", "AccessDeniedException", expected_params=expected)
        stub.add_response("get_document", {"Name": "SSM-SessionManagerRunShell", "Content": "{"}, expected)

        assert directory.run_as_preferences() == RunAsPreferences(True, "ubuntu")
        assert directory.run_as_preferences().enabled is False  # never saved: Session Manager's defaults
        with pytest.raises(RunAsPreferencesUnavailable, match="AccessDeniedException"):
            directory.run_as_preferences()
        with pytest.raises(RunAsPreferencesUnavailable, match="not a JSON document"):
            directory.run_as_preferences()
        stub.assert_no_pending_responses()
    assert directory.calls["GetDocument"] == 4


# --- which sessions count -------------------------------------------------------------------------


@pytest.mark.parametrize("document, counted", [
    (None, True),
    ("SSM-SessionManagerRunShell", True),
    ("AWS-StartInteractiveCommand", True),
    ("MyTeam-ShellPreferences", True),
    ("arn:aws:ssm:us-east-1:111122223333:document/MyTeam-ShellPreferences", True),
    ("AWS-StartPortForwardingSession", False),
    ("AWS-StartPortForwardingSessionToRemoteHost", False),
    ("AWS-StartPortForwardingSessionToSocket", False),
    ("AWS-StartSSHSession", False),
    ("AWS-StartNonInteractiveCommand", False),
])
def test_which_documents_are_interactive_shells(document, counted):
    kind = session_kind(document)
    assert kind.counted is counted and kind.reason


def test_tunnels_and_commands_neither_count_nor_end_and_are_reported():
    fake = InMemorySessionDirectory()
    fake.add_session("a-1", assumed("alice"), node(1), T0)
    fake.add_session("a-2", assumed("alice"), node(1), T0 + timedelta(minutes=1))
    fake.add_session("a-ssh", assumed("alice"), node(1), T0 + timedelta(minutes=2), document_name="AWS-StartSSHSession")
    fake.add_session("a-pf", assumed("alice"), node(2), T0 + timedelta(minutes=3),
                     document_name="AWS-StartPortForwardingSession")
    fake.add_session("a-cmd", assumed("alice"), node(2), T0 + timedelta(minutes=4),
                     document_name="AWS-StartInteractiveCommand")

    report = run(fake)

    assert report.ended_ids == ("a-cmd",), "an interactive command is a shell; the tunnels are not"
    assert sorted(u.session_id for u in report.not_shells) == ["a-pf", "a-ssh"]
    assert all("not an interactive shell" in u.reason for u in report.not_shells)
    assert report.metrics()["SessionsNotShells"] == 2


def test_sessions_not_on_this_clusters_login_nodes_are_counted_in_a_metric_with_a_reason():
    fake = InMemorySessionDirectory()
    for i in range(2):
        fake.add_session(f"a-{i}", assumed("alice"), node(1), T0 + timedelta(minutes=i))
    fake.add_session("sibling", assumed("alice"), node(5, group="login-2"), T0 + timedelta(minutes=5))
    fake.add_session("odd", assumed("alice"), f"sagemaker-cluster:{CLUSTER_ID}_login-i-12345678abcdefghi", T0)

    report = run(fake)

    assert report.ended_ids == () and fake.terminated == []
    reasons = {u.session_id: u.reason for u in report.not_on_login_nodes}
    assert "instance group 'login-2'" in reasons["sibling"]
    assert "does not look like" in reasons["odd"]
    assert report.metrics()["SessionsNotOnLoginNodes"] == 2
    assert report.to_dict()["not_on_login_nodes"][0]["reason"]


# --- session ids as botocore allows them ----------------------------------------------------------

ODD_ID = "alice+ops=1,x-0123456789abcdef0"
TRIGGER_CONFIG = SessionTriggerConfig(cluster_name="ml-research", cluster_id=CLUSTER_ID, login_group="login",
                                      dry_run=False)


def start_session_event(saved_event, session_id=ODD_ID, document=None):
    event = saved_event("ssm-start-session.json")
    event["detail"]["responseElements"]["sessionId"] = session_id
    if document:
        event["detail"]["requestParameters"]["documentName"] = document
    return event


def test_a_session_id_with_plus_equals_comma_is_accepted_end_to_end(saved_event):
    event = start_session_event(saved_event)
    assert parse_start_session(event).session_id == ODD_ID
    request = parse_session_input(event, TRIGGER_CONFIG)
    assert request.session_id == ODD_ID and request.ignored is None
    assert SessionLimitsRequest.from_state(request.to_state()).session_id == ODD_ID

    fake = InMemorySessionDirectory()
    owner = assumed("alice+ops=1,x", role="Ops")
    for i, sid in enumerate(("alice+ops=1,x-1", "alice+ops=1,x-2", ODD_ID)):
        fake.add_session(sid, owner, node(1), T0 + timedelta(minutes=i))
    assert run(fake).ended_ids == (ODD_ID,)


def test_a_start_session_event_for_a_tunnel_is_ignored_before_any_listing(saved_event):
    request = parse_session_input(start_session_event(saved_event, document="AWS-StartPortForwardingSession"),
                                  TRIGGER_CONFIG)
    assert request.ignored and "not an interactive shell" in request.ignored
