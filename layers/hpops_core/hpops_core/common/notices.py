"""Once an hour per message (shared: the gate's "kept out" notices, NodeChannel's enrollment conflicts).

A login node kept out stays out until it is fixed, and every
LoginNodeSync execution in between (the several events of one replacement, sweeps) would send the
operator the same "kept out" message again within seconds.

The key is a digest of the message (it names the nodes and why), kept in the state table. The check
comes before the publish and the record after it: a publish that failed is retried by the state
machine and must not be skipped (at least once, never silently none). Two executions racing past
the check can both send: rare, and a duplicate is better than a lost notice.
"""

from __future__ import annotations

import hashlib

from hpops_core.common.clients import client, transient_errors_named
from hpops_core.common.state_table import notice_partition

# The same message again after this is a reminder that the node is still out, not noise.
REPEAT_AFTER_SECONDS = 3600


def notice_key(cluster: str, subject: str, message: str) -> dict:
    digest = hashlib.sha256(f"{subject}\n{message}".encode()).hexdigest()[:24]
    return {"pk": {"S": notice_partition(cluster)}, "sk": {"S": f"notice#{digest}"}}


def sent_recently(table: str, key: dict, now_epoch: int) -> bool:
    with transient_errors_named("dynamodb:GetItem"):
        item = client("dynamodb").get_item(TableName=table, Key=key, ConsistentRead=True).get("Item")
    # DynamoDB deletes expired items lazily (up to days later): the time stored decides, not the TTL.
    return item is not None and now_epoch - int(item["sentAt"]["N"]) < REPEAT_AFTER_SECONDS


def record_sent(table: str, key: dict, now_epoch: int) -> None:
    with transient_errors_named("dynamodb:PutItem"):
        client("dynamodb").put_item(TableName=table, Item={**key, "sentAt": {"N": str(now_epoch)},
                                                           "ttl": {"N": str(now_epoch + 2 * REPEAT_AFTER_SECONDS)}})
