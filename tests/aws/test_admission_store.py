"""Load-aware admission's record in DynamoDB (moto): written against the version read, read back whole,
and a record that is not what the function writes refused by name."""

from __future__ import annotations

import boto3
import pytest
from moto import mock_aws

from hpops_core.common import clients
from hpops_core.common.errors import TransientAwsError
from hpops_core.login_sync import admission_store
from hpops_core.login_sync.admission import AdmissionState, OutOfRotation

TABLE, CLUSTER = "state", "lab"


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


def test_two_runs_that_read_the_same_version_cannot_both_write(table):
    assert admission_store.read_admission(table, CLUSTER) == (AdmissionState(), 0)
    state = AdmissionState({"i-1": OutOfRotation("10.1.0.11", 100, "hot")}, {}, None, "on", 100)
    admission_store.write_admission(table, CLUSTER, state, 0)
    assert admission_store.read_admission(table, CLUSTER) == (state, 1)
    with pytest.raises(TransientAwsError):
        admission_store.write_admission(table, CLUSTER, AdmissionState(), 0)  # a second run that read version 0
    assert admission_store.read_admission(table, CLUSTER) == (state, 1)


def test_a_record_that_is_not_the_functions_is_refused_by_name(table):
    boto3.client("dynamodb").put_item(TableName=table, Item={
        "pk": {"S": f"admission#{CLUSTER}"}, "sk": {"S": "login-admission"}, "state": {"S": '{"out": {"i-1": {}}}'},
        "version": {"N": "1"}})
    with pytest.raises(admission_store.MalformedAdmissionRecord, match="unreadable"):
        admission_store.read_admission(table, CLUSTER)
