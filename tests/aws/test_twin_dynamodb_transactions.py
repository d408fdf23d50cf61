"""The twin's TransactWriteItems (item copies in place of moto's table copy) answers and leaves the
tables exactly as moto's own does: written whole, or cancelled with nothing changed."""

from __future__ import annotations

import contextlib

import boto3
from botocore.exceptions import ClientError
from moto import mock_aws

from hpops_twin.dynamodb_transactions import item_copies_in_transactions

RANGE_TABLE, HASH_TABLE = "state", "flat"


def _put(table: str, pk: str, sk: str | None = None, **values: int) -> dict:
    item = {"pk": {"S": pk}, **({"sk": {"S": sk}} if sk is not None else {}),
            **{name: {"N": str(value)} for name, value in values.items()}}
    return {"Put": {"TableName": table, "Item": item}}


def _update(table: str, key: dict, expected_version: int) -> dict:
    return {"Update": {"TableName": table, "Key": key, "UpdateExpression": "SET version = version + :one",
                       "ConditionExpression": "version = :expected",
                       "ExpressionAttributeValues": {":one": {"N": "1"}, ":expected": {"N": str(expected_version)}}}}


# Each transaction after the first two seeds: some cancelled by a condition, some by naming one item twice.
TRANSACTIONS = [
    [_put(RANGE_TABLE, "usage", "total", version=1), _put(HASH_TABLE, "lease", version=1)],
    [_put(RANGE_TABLE, "usage", "window#1", version=1), _update(RANGE_TABLE, {"pk": {"S": "usage"}, "sk": {"S": "total"}}, 1)],
    # The total's condition fails after the window part was written: the part must go again.
    [_put(RANGE_TABLE, "usage", "window#2", version=1), _update(RANGE_TABLE, {"pk": {"S": "usage"}, "sk": {"S": "total"}}, 1)],
    # An update of an existing item, then a failing condition on the other table.
    [_update(HASH_TABLE, {"pk": {"S": "lease"}}, 1), _update(HASH_TABLE, {"pk": {"S": "missing"}}, 7)],
    [{"Delete": {"TableName": RANGE_TABLE, "Key": {"pk": {"S": "usage"}, "sk": {"S": "window#1"}}}},
     _put(RANGE_TABLE, "other", "x", version=3), _update(RANGE_TABLE, {"pk": {"S": "usage"}, "sk": {"S": "total"}}, 5)],
    [_put(RANGE_TABLE, "usage", "window#3", version=1), _put(RANGE_TABLE, "usage", "window#3", version=2)],
    [{"Delete": {"TableName": RANGE_TABLE, "Key": {"pk": {"S": "usage"}, "sk": {"S": "window#1"}}}},
     _update(HASH_TABLE, {"pk": {"S": "lease"}}, 1)],
]


def _played(patches: list) -> tuple[list[str], dict[str, list[dict]]]:
    """Each transaction's answer (ok or the error and its reasons) and both tables at the end."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock_aws())
        for patch in patches:
            stack.enter_context(patch)
        dynamodb = boto3.client("dynamodb", region_name="us-east-1")
        for name, keys in ((RANGE_TABLE, ("pk", "sk")), (HASH_TABLE, ("pk",))):
            dynamodb.create_table(TableName=name, BillingMode="PAY_PER_REQUEST",
                                  AttributeDefinitions=[{"AttributeName": k, "AttributeType": "S"} for k in keys],
                                  KeySchema=[{"AttributeName": k, "KeyType": kind} for k, kind in zip(keys, ("HASH", "RANGE"))])
        answers = []
        for transaction in TRANSACTIONS:
            try:
                dynamodb.transact_write_items(TransactItems=transaction)
                answers.append("ok")
            except ClientError as error:
                reasons = [r.get("Code") for r in error.response.get("CancellationReasons") or []]
                answers.append(f"{error.response['Error']['Code']} {reasons}")
        tables = {name: sorted(dynamodb.scan(TableName=name)["Items"], key=str) for name in (RANGE_TABLE, HASH_TABLE)}
        return answers, tables


def test_the_twins_transactions_answer_and_roll_back_as_motos_own():
    answers, tables = _played(item_copies_in_transactions())
    assert (answers, tables) == _played([])
    # The sequence cancels transactions of both kinds after a write of the same transaction, and each
    # cancelled one left nothing behind: only the last transaction's delete and update remain.
    assert [answer.split()[0] for answer in answers] == ["ok", "ok", "TransactionCanceledException",
                                                         "TransactionCanceledException", "TransactionCanceledException",
                                                         "ValidationException", "ok"]
    assert [(item["sk"]["S"], item["version"]["N"]) for item in tables[RANGE_TABLE]] == [("total", "2")]
    assert [item["version"]["N"] for item in tables[HASH_TABLE]] == ["2"]
