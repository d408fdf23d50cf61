"""The twin's TransactWriteItems (hpops_twin/dynamodb_transactions.py) backs up only the items it writes:
a cancelled transaction must still leave every item, the ones it wrote first included, as it was."""

from __future__ import annotations

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from hpops_twin.dynamodb_transactions import transactions_copy_only_their_items


@pytest.fixture
def dynamodb():
    patches = transactions_copy_only_their_items()
    with mock_aws():
        for patch in patches:
            patch.start()
        try:
            client = boto3.client("dynamodb", region_name="us-east-1")
            client.create_table(TableName="ranged", BillingMode="PAY_PER_REQUEST",
                                KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
                                AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"},
                                                      {"AttributeName": "sk", "AttributeType": "S"}])
            client.create_table(TableName="hashed", BillingMode="PAY_PER_REQUEST",
                                KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
                                AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}])
            for window in range(5):
                client.put_item(TableName="ranged", Item={"pk": {"S": "usage"}, "sk": {"S": f"window#{window}"},
                                                          "usd": {"N": "1"}})
            client.put_item(TableName="ranged", Item={"pk": {"S": "usage"}, "sk": {"S": "total"}, "usd": {"N": "5"}})
            client.put_item(TableName="hashed", Item={"id": {"S": "status"}, "runs": {"N": "1"}})
            yield client
        finally:
            for patch in reversed(patches):
                patch.stop()


def everything(client) -> dict:
    return {name: sorted(map(str, client.scan(TableName=name)["Items"])) for name in ("ranged", "hashed")}


def add_window(window: int, total_before: str) -> list[dict]:
    """RecordUsageReport's shape: the window, the running total updated on a condition, a status."""
    return [
        {"Put": {"TableName": "ranged", "Item": {"pk": {"S": "usage"}, "sk": {"S": f"window#{window}"}, "usd": {"N": "1"}},
                 "ConditionExpression": "attribute_not_exists(pk)"}},
        {"Update": {"TableName": "ranged", "Key": {"pk": {"S": "usage"}, "sk": {"S": "total"}},
                    "UpdateExpression": "SET usd = usd + :one", "ConditionExpression": "usd = :before",
                    "ExpressionAttributeValues": {":one": {"N": "1"}, ":before": {"N": total_before}}}},
        {"Update": {"TableName": "hashed", "Key": {"id": {"S": "status"}}, "UpdateExpression": "SET runs = runs + :one",
                    "ExpressionAttributeValues": {":one": {"N": "1"}}}},
    ]


def test_a_committed_transaction_writes_every_item_and_leaves_the_others(dynamodb):
    before = dynamodb.get_item(TableName="ranged", Key={"pk": {"S": "usage"}, "sk": {"S": "window#2"}})["Item"]
    dynamodb.transact_write_items(TransactItems=add_window(5, "5"))
    assert dynamodb.get_item(TableName="ranged", Key={"pk": {"S": "usage"}, "sk": {"S": "total"}})["Item"]["usd"] == {"N": "6"}
    assert dynamodb.get_item(TableName="hashed", Key={"id": {"S": "status"}})["Item"]["runs"] == {"N": "2"}
    assert dynamodb.get_item(TableName="ranged", Key={"pk": {"S": "usage"}, "sk": {"S": "window#5"}})["Item"]["usd"] == {"N": "1"}
    assert dynamodb.get_item(TableName="ranged", Key={"pk": {"S": "usage"}, "sk": {"S": "window#2"}})["Item"] == before


@pytest.mark.parametrize("cancelled_by", ["the last condition", "the first condition"])
def test_a_cancelled_transaction_leaves_every_item_as_it_was(dynamodb, cancelled_by):
    before = everything(dynamodb)
    # The put and the status update succeed before the total's condition fails (or the put's own does).
    items = add_window(5, "4") if cancelled_by == "the last condition" else add_window(3, "5")
    items = [items[0], items[2], items[1]]
    with pytest.raises(ClientError) as refused:
        dynamodb.transact_write_items(TransactItems=items)
    assert refused.value.response["Error"]["Code"] == "TransactionCanceledException"
    assert everything(dynamodb) == before
    # And the table still takes the next transaction.
    dynamodb.transact_write_items(TransactItems=add_window(5, "5"))
    assert dynamodb.get_item(TableName="hashed", Key={"id": {"S": "status"}})["Item"]["runs"] == {"N": "2"}
