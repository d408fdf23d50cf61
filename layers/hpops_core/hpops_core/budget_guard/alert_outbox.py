"""Per-user alerts waiting to be sent: one DynamoDB item each, never a list in Step Functions state.

CheckUserSpend queues every alert it decides (a user's spend threshold, a hold's transition) as an
item, before it marks the alert fired or remembers the hold; SendUserAlerts pages through the items,
sends each (both topics and one event) and deletes it only once all three took it. So an alert is
sent at least once whatever fails: a send that fails leaves its item for the next page, the next
try of the step or the next sweep (and the failed execution's alarm fires); nothing is ever marked
sent before it was sent. A page is bounded (PAGE_SIZE), so each step's state is a few counts
however many users cross at once.

Item: pk ``budget#<cluster>`` (alert_state.partition_key), sk ``outbox#<alert key>``, the alert's
JSON, when it was queued and a TTL. The key is the alert's own (once per user, kind, threshold and
month; a hold's transition at its sweep's time), so queuing the same alert again is the same item.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping
from itertools import islice
from typing import Any

from hpops_core.budget_guard.alert_state import partition_key
from hpops_core.common.clients import client, transient_errors_named
from hpops_core.common.paged_items import BATCH_WRITE, batch_write

PREFIX = "outbox#"
# Alerts sent per SendUserAlerts invocation: 3 batched calls per 10 alerts, well inside its timeout.
PAGE_SIZE = 500
# An alert no sweep could send for this long is dropped by DynamoDB's TTL (every failed try alarmed).
OUTBOX_TTL = dt.timedelta(days=40)


def outbox_key(alert: Mapping[str, Any]) -> str:
    """The alert's own key: a spend alert's fired key, or its hold transition at its sweep's time."""
    if alert.get("kind") == "hold":
        return f"{PREFIX}{alert['asOf'][:7]}:hold:{alert['user']}:{alert['transition']}:{alert['asOf']}"
    return f"{PREFIX}{alert['key']}"


def queue(table: str, cluster: str, alerts: Iterable[Mapping[str, Any]], now: dt.datetime, dynamodb: Any = None) -> int:
    """Put each alert's item (the same alert queued twice is one item), a batch at a time as ``alerts``
    yields them (only one batch's items in memory); returns how many."""
    ttl = str(int((now + OUTBOX_TTL).timestamp()))
    queued_at = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    alerts = iter(alerts)
    count = 0
    while batch := [{"PutRequest": {"Item": {
            "pk": {"S": partition_key(cluster)}, "sk": {"S": outbox_key(alert)},
            "alert": {"S": json.dumps(alert, sort_keys=True, separators=(",", ":"))},
            "queuedAt": {"S": queued_at}, "ttl": {"N": ttl}}}} for alert in islice(alerts, BATCH_WRITE)]:
        batch_write(table, batch, dynamodb)
        count += len(batch)
    return count


def page(table: str, cluster: str, limit: int = PAGE_SIZE, dynamodb: Any = None) -> tuple[list[tuple[str, dict]], bool]:
    """Up to ``limit`` queued alerts, oldest key first, as (sk, alert); and whether more may wait."""
    request = {"TableName": table, "KeyConditionExpression": "pk = :pk AND begins_with(sk, :prefix)",
               "ExpressionAttributeValues": {":pk": {"S": partition_key(cluster)}, ":prefix": {"S": PREFIX}},
               "ConsistentRead": True, "Limit": limit}
    found: list[tuple[str, dict]] = []
    more = False
    dynamodb = dynamodb or client("dynamodb")
    while len(found) < limit:
        with transient_errors_named("dynamodb:Query"):
            answer = dynamodb.query(**dict(request, Limit=limit - len(found)))
        found += [(item["sk"]["S"], json.loads(item["alert"]["S"])) for item in answer.get("Items", [])]
        if "LastEvaluatedKey" not in answer:
            break
        more = True
        request["ExclusiveStartKey"] = answer["LastEvaluatedKey"]
    return found, more and len(found) >= limit


def remove(table: str, cluster: str, keys: Iterable[str], dynamodb: Any = None) -> None:
    """The sent alerts' items, deleted (after they were sent)."""
    requests = [{"DeleteRequest": {"Key": {"pk": {"S": partition_key(cluster)}, "sk": {"S": key}}}} for key in keys]
    batch_write(table, requests, dynamodb)


def count(table: str, cluster: str, dynamodb: Any = None) -> int:
    """How many alerts wait (`hpops status`, the bench): a Select COUNT Query, nothing read into memory."""
    paginator = (dynamodb or client("dynamodb")).get_paginator("query")
    total = 0
    with transient_errors_named("dynamodb:Query"):
        for answer in paginator.paginate(
            TableName=table, KeyConditionExpression="pk = :pk AND begins_with(sk, :prefix)", Select="COUNT",
            ExpressionAttributeValues={":pk": {"S": partition_key(cluster)}, ":prefix": {"S": PREFIX}},
        ):
            total += answer.get("Count", 0)
    return total
