"""Once-per-cluster-per-month alert dedupe in DynamoDB.

Several cluster events can arrive at once (each instance group change is its own
event) and Lambda retries; a read-then-write check would let two invocations
both alert. A conditional PutItem (``attribute_not_exists``) is atomic on the
server, so exactly one caller wins per (cluster, alert key).

Table: the stack's ``SyncStateTable`` (template.yaml): partition key ``pk`` (S), sort key
``sk`` (S), TTL on ``ttl`` (epoch seconds). Item: ``pk = budget#<cluster>``,
``sk = <alert key>`` e.g. ``2026-11:projected:100``.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import boto3
from botocore.exceptions import ClientError

from hpops_core.budget_guard.aws_budgets import RETRY_CONFIG
from hpops_core.budget_guard.budget_spec import validate_cluster_name
from hpops_core.budget_guard.projection import NaiveDatetimeError

__all__ = [
    "TTL_ATTRIBUTE",
    "TTL",
    "alert_table",
    "fired_keys",
    "mark_fired",
    "partition_key",
]

# The table's TimeToLiveSpecification.AttributeName (template.yaml, SyncStateTable).
TTL_ATTRIBUTE = "ttl"
# Longer than any month, so a key written on the 1st still guards the 31st;
# after that the month is over and the key can never match again.
TTL = dt.timedelta(days=40)


def alert_table(table_name: str, session: boto3.session.Session | None = None) -> Any:
    """DynamoDB Table resource, created at call time with standard retries."""
    return (session or boto3).resource("dynamodb", config=RETRY_CONFIG).Table(table_name)


def partition_key(cluster: str) -> str:
    return f"budget#{validate_cluster_name(cluster)}"


def _aware(now: dt.datetime) -> dt.datetime:
    if now.tzinfo is None or now.utcoffset() is None:
        raise NaiveDatetimeError(f"{now.isoformat()} has no time zone")
    return now.astimezone(dt.timezone.utc)


def mark_fired(
    table: Any, cluster: str, alert_key: str, now: dt.datetime, owner: str | None = None
) -> bool:
    """Record that ``alert_key`` fired for ``cluster``. True if this call was the
    first (so the caller should send the alert), False if it had already fired.

    ``owner`` (e.g. the Step Functions execution id) makes a retried call by the
    same owner win again, so a task that marked an alert and then died before
    returning does not lose the alert on retry; other owners still lose."""
    if not isinstance(alert_key, str) or not alert_key:
        raise ValueError("alert_key must be a non-empty string")
    now_utc = _aware(now)
    item = {
        "pk": partition_key(cluster),
        "sk": alert_key,
        "fired_at": now_utc.isoformat(),
        TTL_ATTRIBUTE: int((now_utc + TTL).timestamp()),
    }
    condition = "attribute_not_exists(#pk)"
    values: dict[str, Any] = {}
    if owner is not None:
        if not isinstance(owner, str) or not owner:
            raise ValueError("owner must be a non-empty string")
        item["fired_by"] = owner
        condition += " OR #owner = :owner"
        values[":owner"] = owner
    try:
        table.put_item(
            Item=item,
            ConditionExpression=condition,
            ExpressionAttributeNames={"#pk": "pk", **({"#owner": "fired_by"} if owner is not None else {})},
            **({"ExpressionAttributeValues": values} if values else {}),
        )
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
            return False
        raise
    return True


def fired_keys(table: Any, cluster: str, month: str) -> set[str]:
    """Alert keys already fired for ``cluster`` in ``month`` (``YYYY-MM``), to pass
    as ``already_fired`` to ``decide_alerts``. Only an optimisation to skip work:
    ``mark_fired`` remains the authority."""
    request: dict[str, Any] = {
        "KeyConditionExpression": "#pk = :pk AND begins_with(#sk, :month)",
        "ExpressionAttributeNames": {"#pk": "pk", "#sk": "sk"},
        "ExpressionAttributeValues": {":pk": partition_key(cluster), ":month": f"{month}:"},
        "ProjectionExpression": "#sk",
        "ConsistentRead": True,
    }
    keys: set[str] = set()
    while True:
        page = table.query(**request)
        keys.update(item["sk"] for item in page.get("Items", []))
        if "LastEvaluatedKey" not in page:
            return keys
        request["ExclusiveStartKey"] = page["LastEvaluatedKey"]
