"""One EnforceSessionLimits run (hpops_core.session_limits.run): gather, decide, the ledger only when
something would end, apply, record, notify, and the named errors. Session Manager is the in-memory
double; the ledger (DynamoDB) and the AlertTopic (SNS) are moto."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import boto3
import pytest
from moto import mock_aws

from fake_session_directory import InMemorySessionDirectory
from hpops_core.common import clients
from hpops_core.common.errors import TransientAwsError
from hpops_core.session_limits import ledger, node_sessions
from hpops_core.session_limits.config import SessionLimitsConfig
from hpops_core.session_limits.request import SessionLimitsRequest
from hpops_core.session_limits.run import SessionReportFailed, SessionTerminationFailed, enforce_limits

ACCOUNT = "123456789012"
CLUSTER_ID = "abc123def456"
T0 = datetime(2025, 3, 14, 9, 0, tzinfo=timezone.utc)
NOW = T0 + timedelta(hours=1)
ENV = {
    "CLUSTER_NAME": "ml-research", "CLUSTER_ID": CLUSTER_ID, "LOGIN_GROUP_NAME": "login",
    "MAX_SESSIONS_PER_USER": "2", "UNMAPPED_SESSION_POLICY": "count-as-principal", "SESSION_EXCESS_POLICY": "newest",
    "SESSION_LIMITS_DRY_RUN": "false", "ALERT_TOPIC_ARN": f"arn:aws:sns:us-east-1:{ACCOUNT}:alerts",
    "STATE_TABLE_NAME": "state",
}
SWEEP = SessionLimitsRequest(cluster="ml-research", mode="sweep", dry_run=False, trigger="sweep")


def node(n: int) -> str:
    return f"sagemaker-cluster:{CLUSTER_ID}_login-i-{n:017x}"


def owner(user: str) -> str:
    return f"arn:aws:sts::{ACCOUNT}:assumed-role/role-{user}/{user}"


def open_sessions(fake: InMemorySessionDirectory, user: str, count: int) -> list[str]:
    fake.set_tags(f"arn:aws:iam::{ACCOUNT}:role/role-{user}", {"SSMSessionRunAs": user})
    ids = [f"{user}-{i:03d}" for i in range(count)]
    for i, sid in enumerate(ids):
        fake.add_session(sid, owner(user), node(i + 1), T0 + timedelta(minutes=i))
    return ids


def config(**env: str) -> SessionLimitsConfig:
    return SessionLimitsConfig.from_env(ENV | env)


@pytest.fixture
def aws(monkeypatch):
    """The ledger table and the AlertTopic; records every DynamoDB operation and SNS message sent."""
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with mock_aws():
        clients.reset_clients()
        boto3.client("dynamodb").create_table(
            TableName="state", BillingMode="PAY_PER_REQUEST",
            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
            AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}, {"AttributeName": "sk", "AttributeType": "S"}])
        boto3.client("sns").create_topic(Name="alerts")
        seen = SimpleNamespace(dynamodb=[], sns=[])
        clients.client("dynamodb").meta.events.register(
            "before-call.dynamodb", lambda model, **_: seen.dynamodb.append(model.name))
        clients.client("sns").meta.events.register(
            "provide-client-params.sns.Publish", lambda params, **_: seen.sns.append(params))
        yield seen
        clients.reset_clients()


def ledger_kinds() -> dict[str, str]:
    return dict(node_sessions.read_cluster_state("state", "ml-research", NOW).recorded)


def test_a_sweep_under_the_limit_writes_nothing_and_tells_nobody(aws):
    fake = InMemorySessionDirectory()
    open_sessions(fake, "alice", 2)
    result = enforce_limits(config(), SWEEP, NOW, fake)
    assert result.error is None and fake.terminated == []
    # One Query of each partition: the ledger with the Run As state, the login nodes' reports (their SSH
    # sessions count too); no alert.
    assert aws.dynamodb == ["Query", "Query"] and aws.sns == []
    assert result.output["plannedCount"] == 0 and result.output["notified"] is False
    assert result.output["apiCalls"] == {"DescribeSessions": 1}


def test_a_sweep_over_the_limit_ends_the_newest_records_it_and_says_why(aws):
    fake = InMemorySessionDirectory()
    alice = open_sessions(fake, "alice", 3)
    open_sessions(fake, "bob", 2)

    result = enforce_limits(config(), SWEEP, NOW, fake)

    assert result.error is None and fake.terminated == [alice[2]]
    output = result.output
    assert (output["endedCount"], output["ended"][0]["sessionId"], output["ended"][0]["user"]) == (1, alice[2], "alice")
    assert output["usersOverLimit"] == [{"user": "alice", "limit": 2, "activeCount": 3, "toTerminate": [alice[2]],
                                         "reason": "3 active > default limit 2; ending the 1 newest"}]
    assert output["scope"] == "all" and output["recorded"] == 1 and output["notified"] is True
    assert output["apiCalls"] == {"DescribeSessions": 1, "GetDocument": 1, "ListRoleTags": 2, "TerminateSession": 1}
    # One Query of each partition (ledger and Run As state, node reports); no PutItem: Run As is on, as
    # never recorded means.
    assert aws.dynamodb == ["Query", "Query", "BatchWriteItem"]
    assert ledger_kinds() == {alice[2]: ledger.ENDED}
    (message,) = aws.sns
    assert "alice" in message["Subject"] and "User alice: limit 2, 3 active session(s); ended 1" in message["Message"]
    assert result.metrics["SessionsEnded"] == 1 and result.metrics["UsersOverLimit"] == 1
    assert [line.level for line in result.log] == ["info"]


def test_a_session_the_ledger_says_was_ended_is_not_counted_again(aws):
    """DescribeSessions can list an ended session as Connected for a while: the ledger keeps the
    next run from ending a second, legitimate session of the same user."""
    fake = InMemorySessionDirectory()
    alice = open_sessions(fake, "alice", 3)
    enforce_limits(config(), SWEEP, NOW, fake)
    fake.set_status(alice[2], "Connected")  # the stale listing

    result = enforce_limits(config(), SWEEP, NOW + timedelta(minutes=5), fake)

    assert fake.terminated == [alice[2]] and result.output["endedCount"] == 0
    assert len(aws.sns) == 1, "nothing new to tell"


def test_a_dry_run_ends_nothing_and_reports_each_session_once(aws):
    fake = InMemorySessionDirectory()
    alice = open_sessions(fake, "alice", 3)
    dry = config(SESSION_LIMITS_DRY_RUN="true")

    first = enforce_limits(dry, SWEEP, NOW, fake)
    second = enforce_limits(dry, SWEEP, NOW + timedelta(minutes=5), fake)

    assert fake.terminated == [] and "TerminateSession" not in fake.calls
    assert first.output["dryRun"] is True and first.output["planned"] == [alice[2]]
    assert first.output["notified"] is True and second.output["notified"] is False
    assert len(aws.sns) == 1 and "would end 1" in aws.sns[0]["Subject"] and "DRY RUN" in aws.sns[0]["Message"]
    assert ledger_kinds() == {alice[2]: ledger.DRY_RUN_REPORTED}


def test_an_event_checks_the_starting_principals_sessions_only(aws):
    fake = InMemorySessionDirectory(page_size=2)
    for user in ("bob", "carol", "dave"):
        open_sessions(fake, user, 2)
    alice = open_sessions(fake, "alice", 3)
    event = SessionLimitsRequest(cluster="ml-research", mode="event", dry_run=False, trigger=f"StartSession {alice[2]}",
                                 session_id=alice[2], owner=owner("alice"))

    result = enforce_limits(config(), event, NOW, fake)

    assert fake.terminated == [alice[2]]
    assert result.output["scope"] == "owner" and result.output["triggerSessionListed"] is True
    assert result.output["apiCalls"]["DescribeSessions"] == 2, "alice's 3 sessions, not the account's 9"


def test_a_failed_termination_is_notified_and_fails_the_task_by_name(aws):
    fake = InMemorySessionDirectory()
    alice = open_sessions(fake, "alice", 4)
    fake.fail_termination(alice[3])

    result = enforce_limits(config(), SWEEP, NOW, fake)

    assert isinstance(result.error, SessionTerminationFailed) and alice[3] in str(result.error)
    assert fake.terminated == [alice[2]] and ledger_kinds() == {alice[2]: ledger.ENDED}
    assert result.output["failed"][0]["sessionId"] == alice[3] and result.output["failedCount"] == 1
    assert "FAILED" in aws.sns[0]["Subject"] and "TERMINATION FAILED" in aws.sns[0]["Message"]
    with pytest.raises(SessionTerminationFailed):
        result.output_or_raise()


def test_a_failed_record_still_notifies_then_fails_the_task_by_name(aws, monkeypatch):
    fake = InMemorySessionDirectory()
    alice = open_sessions(fake, "alice", 3)

    def unavailable(*args, **kwargs):
        raise TransientAwsError("dynamodb:BatchWriteItem: ProvisionedThroughputExceededException")

    monkeypatch.setattr(ledger, "record_sessions", unavailable)
    result = enforce_limits(config(), SWEEP, NOW, fake)

    assert isinstance(result.error, SessionReportFailed) and "recording ended sessions failed" in str(result.error)
    assert fake.terminated == [alice[2]] and len(aws.sns) == 1, "the notification is never lost"
    assert result.output["notified"] is True and result.output["recorded"] == 0
    assert result.log[-1].level == "error" and result.log[-1].extra["problems"]


def test_a_failed_notification_fails_the_task_by_name(aws):
    fake = InMemorySessionDirectory()
    alice = open_sessions(fake, "alice", 3)
    result = enforce_limits(config(ALERT_TOPIC_ARN=f"arn:aws:sns:us-east-1:{ACCOUNT}:gone"), SWEEP, NOW, fake)
    assert isinstance(result.error, SessionReportFailed) and "SNS notification failed" in str(result.error)
    assert fake.terminated == [alice[2]] and ledger_kinds() == {alice[2]: ledger.ENDED}
    assert result.output["notified"] is False


def test_the_output_fits_the_execution_state_however_big_the_sweep(aws):
    fake = InMemorySessionDirectory()
    for number in range(120):
        open_sessions(fake, f"user{number:03d}", 3)
    result = enforce_limits(config(), SWEEP, NOW, fake)
    output = result.output
    assert output["endedCount"] == output["usersOverLimitCount"] == 120
    assert len(output["ended"]) == len(output["usersOverLimit"]) == len(output["planned"]) == 100
    assert len(json.dumps(output)) < 256 * 1024
