"""The last cluster state the budget guard saw, per cluster, in DynamoDB.

A scale-out is "TargetCount went up compared with the last state seen", so the guard keeps
that state: item ``pk = budget#<cluster>``, ``sk = last-seen`` in the stack's SyncStateTable,
holding the compact state (status, and per instance group the type and counts) as JSON text
(so counts come back as ints, not DynamoDB Decimals) and the time it was observed.

Events can arrive out of order; the write is conditional on being at least as new as what
is stored, so a late, older event never rolls the baseline back. The state is saved at the
end of an execution (RememberClusterState), after any alert went out: if an execution fails
half-way, the next event or sweep sees the same scale-out again, and alert_state keeps the
alert from going out twice.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from botocore.exceptions import ClientError

from hpops_core.budget_guard.alert_state import TTL_ATTRIBUTE, partition_key
from hpops_core.budget_guard.projection import NaiveDatetimeError

__all__ = ["LAST_SEEN_KEY", "STATE_TTL", "load_last_seen", "save_last_seen"]

LAST_SEEN_KEY = "last-seen"
# Refreshed by every event and sweep; only a cluster nobody watches any more lets it expire.
STATE_TTL = dt.timedelta(days=90)


def _epoch_ms(now: dt.datetime) -> int:
    if now.tzinfo is None or now.utcoffset() is None:
        raise NaiveDatetimeError(f"{now.isoformat()} has no time zone")
    return int(now.timestamp() * 1000)


def load_last_seen(table: Any, cluster: str) -> dict[str, Any] | None:
    """The last saved state ({"ClusterStatus", "InstanceGroups"}), or None if never seen."""
    item = table.get_item(
        Key={"pk": partition_key(cluster), "sk": LAST_SEEN_KEY}, ConsistentRead=True
    ).get("Item")
    if not item or not isinstance(item.get("observed"), str):
        return None
    try:
        observed = json.loads(item["observed"])
    except ValueError:
        return None  # unreadable state: behave as on first sight (CurrentCount baseline)
    return observed if isinstance(observed, dict) else None


def save_last_seen(table: Any, cluster: str, observed: dict[str, Any], now: dt.datetime) -> bool:
    """Store ``observed`` as seen at ``now``; False if a newer state is already stored."""
    seen_ms = _epoch_ms(now)
    try:
        table.put_item(
            Item={
                "pk": partition_key(cluster),
                "sk": LAST_SEEN_KEY,
                "observed": json.dumps(observed, sort_keys=True, separators=(",", ":")),
                "seen_at_ms": seen_ms,
                "seen_at": now.astimezone(dt.timezone.utc).isoformat(),
                TTL_ATTRIBUTE: int((now + STATE_TTL).timestamp()),
            },
            ConditionExpression="attribute_not_exists(#pk) OR #seen <= :seen",
            ExpressionAttributeNames={"#pk": "pk", "#seen": "seen_at_ms"},
            ExpressionAttributeValues={":seen": seen_ms},
        )
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
            return False
        raise
    return True
