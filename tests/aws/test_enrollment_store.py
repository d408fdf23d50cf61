"""Enrollments and signed-report sequences in DynamoDB (moto): first presenter wins, an approval is used
once, an older report is refused while the same one delivered again changes nothing."""

from __future__ import annotations

import json
from contextlib import contextmanager

import boto3
import pytest
from botocore.awsrequest import AWSResponse
from botocore.retries import standard as standard_retries
from moto import mock_aws
from moto.core.botocore_stubber import BotocoreStubber, MockRawResponse

from hpops_core.budget_guard.hold_state import store_agent_report
from hpops_core.common import clients
from hpops_core.common.errors import TransientAwsError
from hpops_core.node_channel import enrollment_store
from hpops_core.node_channel.enrollment import Enrollment
from hpops_core.node_channel.report_proof import ReportReplayError

TABLE, CLUSTER, ID = "state", "lab", "i-0123456789abcdef0"


@pytest.fixture
def table(monkeypatch):
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    with mock_aws():
        clients.reset_clients()
        boto3.client("dynamodb").create_table(
            TableName=TABLE, BillingMode="PAY_PER_REQUEST",
            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
            AttributeDefinitions=[{"AttributeName": k, "AttributeType": "S"} for k in ("pk", "sk")])
        yield TABLE
        clients.reset_clients()


def record(fingerprint: str, via: str = "window") -> Enrollment:
    return Enrollment(CLUSTER, ID, "ssh-ed25519 " + "A" * 68, fingerprint, "login", "login", "10.1.0.5", "enrolled",
                      "2026-11-26T12:00:00Z", via)


def test_first_presenter_wins_and_an_approval_is_used_once(table):
    assert enrollment_store.put_first(table, record("SHA256:agent"))
    assert not enrollment_store.put_first(table, record("SHA256:impostor"))
    assert enrollment_store.get_enrollment(table, CLUSTER, ID).fingerprint == "SHA256:agent"

    enrollment_store.mark_contested(table, CLUSTER, ID, "SHA256:impostor")
    contested = enrollment_store.get_enrollment(table, CLUSTER, ID)
    assert (contested.status, contested.contested_by) == ("contested", ("SHA256:impostor",))

    enrollment_store.put_approval(table, CLUSTER, ID, "SHA256:agent", "2026-11-26T12:05:00Z", 1_800_000_000)
    assert enrollment_store.get_approval(table, CLUSTER, ID, 1_800_000_001).fingerprint == "SHA256:agent"
    assert enrollment_store.get_approval(table, CLUSTER, ID, 1_800_000_000 + 25 * 3600) is None, "expired"
    assert not enrollment_store.put_approved(table, record("SHA256:impostor", "approval"), "SHA256:agent"), \
        "another key's approval"
    assert enrollment_store.put_approved(table, record("SHA256:agent", "approval"), "SHA256:agent")
    assert not enrollment_store.put_approved(table, record("SHA256:agent", "approval"), "SHA256:agent"), "single use"
    records, approvals = enrollment_store.list_enrollments(table, CLUSTER)
    assert [(r.status, r.via) for r in records] == [("enrolled", "approval")] and approvals == []


THROTTLED = {  # DynamoDB's answers to a write it did not carry out: the call throttled, or the transaction
    "call": (("PutItem", "TransactWriteItems"), "ThrottlingException",
             {"message": "Rate of requests exceeds the allowed throughput."}),
    "transaction": (("TransactWriteItems",), "TransactionCanceledException", {
        "Message": "Transaction cancelled, please refer cancellation reasons for specific reasons [None, ThrottlingError]",
        "CancellationReasons": [{"Code": "None"}, {"Code": "ThrottlingError",
                                                   "Message": "Throughput exceeds the current capacity of your table"}]}),
}


@contextmanager
def enrollment_writes_throttled(how: str, monkeypatch):
    """Every request that would write an enrollment (its partition in a PutItem or a transaction) is answered
    as DynamoDB answers a throttled one and never reaches moto (botocore calls every before-send handler, so
    moto's own is wrapped, as the twin's ChaosTransport does); botocore retries as it would, without waits."""
    operations, code, body = THROTTLED[how]
    answered = []
    moto_answers = BotocoreStubber.__call__

    def answer(stubber, event_name, request, **kwargs):
        text = request.body.decode() if isinstance(request.body, bytes) else str(request.body or "")
        operation = event_name.rsplit(".", 1)[-1]
        if operation in operations and f'"enroll#{CLUSTER}"' in text:
            answered.append(operation)
            return AWSResponse(request.url, 400, {"Content-Type": "application/x-amz-json-1.0", "x-amzn-ErrorType": code},
                               MockRawResponse(json.dumps({"__type": f"com.amazonaws.dynamodb.v20120810#{code}"} | body)))
        return moto_answers(stubber, event_name, request, **kwargs)

    monkeypatch.setattr(standard_retries.ExponentialBackoff, "delay_amount", lambda *_: 0)
    with monkeypatch.context() as patched:
        patched.setattr(BotocoreStubber, "__call__", answer)
        yield answered


def stored(table):
    """The node's enrollment and the pending approvals, as the operator's listing shows them."""
    return enrollment_store.get_enrollment(table, CLUSTER, ID), enrollment_store.list_enrollments(table, CLUSTER, with_approvals=True)[1]


@pytest.mark.parametrize("how", sorted(THROTTLED))
def test_an_approved_key_is_stored_with_its_approval_used_or_neither_and_a_retry_succeeds(table, how, monkeypatch):
    """The approval is used and the key stored in one write: a write DynamoDB cancels (another key's
    approval, or throttled) leaves the approval and the impostor's enrollment as they were."""
    enrollment_store.put_first(table, record("SHA256:impostor"))
    enrollment_store.mark_contested(table, CLUSTER, ID, "SHA256:agent")
    enrollment_store.put_approval(table, CLUSTER, ID, "SHA256:agent", "2026-11-26T12:05:00Z", 1_800_000_000)
    before = stored(table)
    assert before[0].fingerprint == "SHA256:impostor" and [a["fingerprint"] for a in before[1]] == ["SHA256:agent"]

    assert not enrollment_store.put_approved(table, record("SHA256:other", "approval"), "SHA256:impostor"), \
        "not the approved key"
    assert stored(table) == before
    with enrollment_writes_throttled(how, monkeypatch) as answered, pytest.raises(TransientAwsError):
        enrollment_store.put_approved(table, record("SHA256:agent", "approval"), "SHA256:impostor")
    assert answered, "the write was throttled"
    assert stored(table) == before, "the approval is still there for the retry, and the old state untouched"

    assert enrollment_store.put_approved(table, record("SHA256:agent", "approval"), "SHA256:impostor")  # the retry
    enrolled, approvals = stored(table)
    assert (enrolled.fingerprint, enrolled.status, enrolled.via, approvals) == ("SHA256:agent", "enrolled", "approval", [])


def test_an_older_holds_report_is_refused_the_same_one_again_changes_nothing(table):
    report = {"cluster": CLUSTER, "instanceId": ID, "reportedAt": "2026-11-26T12:00:00Z", "version": "v", "users": []}
    assert store_agent_report(table, report, "2026-11-26T12:00:01Z", sequence=20)
    assert store_agent_report(table, report, "2026-11-26T12:00:02Z", sequence=20)
    with pytest.raises(ReportReplayError):
        store_agent_report(table, report, "2026-11-26T12:00:03Z", sequence=19)
    with pytest.raises(ReportReplayError):
        store_agent_report(table, report | {"reportedAt": "2026-11-26T11:00:00Z"}, "x", sequence=21)


def test_finishing_a_replacement_sets_the_recollect_marker_only_for_the_key_still_enrolled(table):
    from dataclasses import replace

    assert enrollment_store.put_first(table, replace(record("SHA256:agent"), replaced_key="SHA256:impostor"))
    assert enrollment_store.get_enrollment(table, CLUSTER, ID).replaced_key == "SHA256:impostor"
    assert not enrollment_store.finish_replacement(table, CLUSTER, ID, "SHA256:impostor", "2026-11-01T00:00:00Z")
    assert enrollment_store.get_enrollment(table, CLUSTER, ID).recollect_from == ""
    assert enrollment_store.finish_replacement(table, CLUSTER, ID, "SHA256:agent", "2026-11-01T00:00:00Z")
    stored = enrollment_store.get_enrollment(table, CLUSTER, ID)
    assert (stored.recollect_from, stored.replaced_key) == ("2026-11-01T00:00:00Z", "")


def test_a_replaced_controller_keys_holds_report_goes(table):
    from hpops_core.budget_guard.hold_state import forget_agent_report, read_agent_report

    store_agent_report(table, {"cluster": CLUSTER, "instanceId": ID, "reportedAt": "2026-11-26T12:00:00Z",
                               "version": 3, "enforced": True, "users": []}, "2026-11-26T12:00:01Z", 10**15)
    assert read_agent_report(table, CLUSTER) is not None
    forget_agent_report(table, CLUSTER)
    assert read_agent_report(table, CLUSTER) is None


def test_an_approval_decided_against_one_key_is_not_stored_over_another(table):
    """What an approved record carries of the key it replaces (whose usage to keep or void) was read with
    that key: if another key enrolled or replaced it meanwhile, nothing is written and the approval stays
    for the decision made again."""
    enrollment_store.put_approval(table, CLUSTER, ID, "SHA256:agent", "2026-11-26T12:05:00Z", 1_800_000_000)
    enrollment_store.put_first(table, record("SHA256:late"))  # enrolled after NodeChannel read "no enrollment"
    before = stored(table)
    with pytest.raises(enrollment_store.StandingKeyChangedError):
        enrollment_store.put_approved(table, record("SHA256:agent", "approval"), None)
    with pytest.raises(enrollment_store.StandingKeyChangedError):
        enrollment_store.put_approved(table, record("SHA256:agent", "approval"), "SHA256:impostor")
    assert stored(table) == before, "the late key stands and the approval is still there"
    assert enrollment_store.put_approved(table, record("SHA256:agent", "approval"), "SHA256:late")
    assert stored(table)[0].fingerprint == "SHA256:agent"
