"""DynamoDB: at most one reconcile per cluster, and no event lost while one runs.

One item per cluster (pk = "cluster#<cluster>", sk = "sync-lease") holds the lease (holder, expiresAt), a `pending`
flag and the instance-id -> IP cache. In the common case a reconcile costs two DynamoDB calls:
  acquire: UpdateItem, condition "free or expired", returns the item (and so the IP cache);
  release: UpdateItem, condition "I hold it and nothing is pending", stores the new cache.
An execution that finds the lease taken sets `pending` and ends; the holder's release then fails
its condition, clears `pending` and runs one more pass, so the burst is folded into one extra pass.
The lease expires on its own (longer than the state machine's timeout) if a holder dies.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from botocore.exceptions import ClientError

from hpops_core.common.clients import client, transient_errors_named
from hpops_core.common.state_table import host_identity_of, lease_item_key


@dataclass(frozen=True)
class LeaseGrant:
    acquired: bool
    reason: str
    ip_cache: dict[str, str] = field(default_factory=dict)
    host_identity: dict | None = None  # the published canonical fingerprints (public), if any


@dataclass(frozen=True)
class LeaseRelease:
    rerun: bool
    reason: str


def _conditional_failed(error: ClientError) -> bool:
    return error.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException"


def _cache_from_item(item: Mapping) -> dict[str, str]:
    return {k: v["S"] for k, v in item.get("ipCache", {}).get("M", {}).items()}


def acquire(table: str, cluster: str, holder: str, now: int, lease_seconds: int) -> LeaseGrant:
    ddb = client("dynamodb")
    # Two tries: if the holder releases between our two conditional writes, try once more.
    for _ in range(2):
        try:
            with transient_errors_named("dynamodb:UpdateItem"):
                item = ddb.update_item(
                    TableName=table,
                    Key=lease_item_key(cluster),
                    UpdateExpression="SET holder = :me, expiresAt = :exp, pending = :no",
                    ConditionExpression="attribute_not_exists(holder) OR expiresAt < :now",
                    ExpressionAttributeValues={
                        ":me": {"S": holder},
                        ":exp": {"N": str(now + lease_seconds)},
                        ":now": {"N": str(now)},
                        ":no": {"BOOL": False},
                    },
                    ReturnValues="ALL_NEW",
                )["Attributes"]
            return LeaseGrant(True, "lease acquired", _cache_from_item(item), host_identity_of(item))
        except ClientError as error:
            if not _conditional_failed(error):
                raise
        try:
            with transient_errors_named("dynamodb:UpdateItem"):
                ddb.update_item(
                    TableName=table,
                    Key=lease_item_key(cluster),
                    UpdateExpression="SET pending = :yes",
                    ConditionExpression="attribute_exists(holder) AND expiresAt >= :now",
                    ExpressionAttributeValues={":yes": {"BOOL": True}, ":now": {"N": str(now)}},
                )
            return LeaseGrant(False, "another reconcile holds the lease; it will run one more pass")
        except ClientError as error:
            if not _conditional_failed(error):
                raise
    return LeaseGrant(False, "lease contended twice; the holder's next pass or the sweep covers this event")


def _cache_value(ip_cache: Mapping[str, str]) -> dict:
    return {"M": {k: {"S": v} for k, v in sorted(ip_cache.items())}}


def release(table: str, cluster: str, holder: str, ip_cache: Mapping[str, str], force: bool = False) -> LeaseRelease:
    """Release, unless an event arrived meanwhile: then keep the lease and ask for another pass.

    `force` releases even if something is pending (after the last allowed pass); the next event
    or the periodic sweep picks the pending work up.
    """
    ddb = client("dynamodb")
    try:
        with transient_errors_named("dynamodb:UpdateItem"):
            ddb.update_item(
                TableName=table,
                Key=lease_item_key(cluster),
                UpdateExpression="SET ipCache = :cache REMOVE holder, expiresAt",
                ConditionExpression="holder = :me" + ("" if force else " AND pending = :no"),
                ExpressionAttributeValues={":me": {"S": holder}, ":cache": _cache_value(ip_cache)}
                | ({} if force else {":no": {"BOOL": False}}),
            )
        return LeaseRelease(False, "lease released")
    except ClientError as error:
        if not _conditional_failed(error):
            raise
    try:
        with transient_errors_named("dynamodb:UpdateItem"):
            ddb.update_item(
                TableName=table,
                Key=lease_item_key(cluster),
                UpdateExpression="SET ipCache = :cache, pending = :no",
                ConditionExpression="holder = :me",
                ExpressionAttributeValues={":me": {"S": holder}, ":cache": _cache_value(ip_cache), ":no": {"BOOL": False}},
            )
        return LeaseRelease(True, "events arrived during this pass; running one more")
    except ClientError as error:
        if not _conditional_failed(error):
            raise
    return LeaseRelease(False, "lease had expired and was taken over; the new holder reconciles")


def abandon(table: str, cluster: str, holder: str) -> LeaseRelease:
    """Release after a failure, keeping the cache and any pending flag for the next run."""
    try:
        with transient_errors_named("dynamodb:UpdateItem"):
            client("dynamodb").update_item(
                TableName=table,
                Key=lease_item_key(cluster),
                UpdateExpression="REMOVE holder, expiresAt",
                ConditionExpression="holder = :me",
                ExpressionAttributeValues={":me": {"S": holder}},
            )
    except ClientError as error:
        if not _conditional_failed(error):
            raise
        return LeaseRelease(False, "lease was no longer ours")
    return LeaseRelease(False, "lease released after a failure")
