"""DynamoDB record of the sessions enforcement has ended (or, in a dry run, reported).

Why a record at all: ``DescribeSessions`` can keep listing a session as Connected for a while after
``TerminateSession``. If the next run (a duplicate event, another user's event, the sweep) counted
it, the user would look over the limit again and a *second*, legitimate session could be ended.
``enforce(already_terminated=...)`` neither counts nor picks the ids recorded here.

Items live in the stack's SyncStateTable, in a partition of their own (state_table.session_partition),
and expire through the table's TTL attribute:

    pk = "session#<cluster name>"   sk = "session#<session id>"
    kind = "ended" | "dry-run-reported"   user, at (ISO time), ttl (epoch seconds)

Reading is one ``Query`` of that partition each run (node_sessions.py; strongly consistent, so the
previous run's writes are visible); writing is one ``BatchWriteItem`` per 25 sessions.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timezone

from hpops_core.common.clients import client, transient_errors_named
from hpops_core.common.errors import TransientAwsError
from hpops_core.common.state_table import session_partition

ENDED = "ended"
DRY_RUN_REPORTED = "dry-run-reported"
SK_PREFIX = "session#"
# Terminated sessions leave the Active listing within minutes; a day is a wide margin, and
# session ids are never reused, so an expired record can never hide a new session.
RECORD_TTL_SECONDS = 24 * 3600
BATCH = 25  # BatchWriteItem maximum
UNPROCESSED_RETRIES = 4


@dataclass(frozen=True)
class RecordedSession:
    session_id: str
    user: str


def session_record(item: dict, cutoff: int) -> tuple[str, str] | None:
    """(session id, kind) of one ledger item, or None when it is no session record or has expired."""
    sk = item.get("sk", {}).get("S", "")
    # TTL deletion lags by up to days; an expired record no longer means anything.
    if not sk.startswith(SK_PREFIX) or ("ttl" in item and int(item["ttl"]["N"]) < cutoff):
        return None
    return sk[len(SK_PREFIX):], item.get("kind", {}).get("S", ENDED)


def record_sessions(
    table: str, cluster: str, sessions: Iterable[RecordedSession], kind: str, at: datetime
) -> int:
    """Write one record per session; returns how many were written. Raises TransientAwsError if
    DynamoDB keeps some unprocessed after a few retries."""
    at_iso = at.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
    expires = str(int(at.timestamp()) + RECORD_TTL_SECONDS)
    requests = [
        {
            "PutRequest": {
                "Item": {
                    "pk": {"S": session_partition(cluster)},
                    "sk": {"S": SK_PREFIX + s.session_id},
                    "kind": {"S": kind},
                    "user": {"S": s.user},
                    "at": {"S": at_iso},
                    "ttl": {"N": expires},
                }
            }
        }
        for s in sessions
    ]
    ddb = client("dynamodb")
    for start in range(0, len(requests), BATCH):
        pending = {table: requests[start : start + BATCH]}
        for _ in range(UNPROCESSED_RETRIES):
            with transient_errors_named("dynamodb:BatchWriteItem"):
                pending = ddb.batch_write_item(RequestItems=pending).get("UnprocessedItems") or {}
            if not pending:
                break
        if pending:
            raise TransientAwsError(f"dynamodb:BatchWriteItem left {len(pending.get(table, []))} item(s) unprocessed")
    return len(requests)


RUN_AS_SK = "run-as"
RUN_AS_OFF = "off"
RUN_AS_ON = "on"


def record_run_as_state(table: str, cluster: str, state: str, at: datetime) -> bool:
    """Record whether Run As is on or off; True only when that changed (so the caller alerts once
    per change of state, not on every run).

    One conditional ``PutItem`` and no read. Never recorded counts as "on" (what the product needs),
    so the first run that finds Run As off alerts, and a first run that finds it on does not."""
    if state not in (RUN_AS_OFF, RUN_AS_ON):
        raise ValueError("run-as state must be 'on' or 'off'")
    condition = "attribute_not_exists(#state) OR #state <> :state" if state == RUN_AS_OFF else "#state = :off"
    values = {":state": {"S": state}} if state == RUN_AS_OFF else {":off": {"S": RUN_AS_OFF}}
    item = {
        "pk": {"S": session_partition(cluster)},
        "sk": {"S": RUN_AS_SK},
        "state": {"S": state},
        "at": {"S": at.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")},
    }
    ddb = client("dynamodb")
    try:
        with transient_errors_named("dynamodb:PutItem"):
            ddb.put_item(TableName=table, Item=item, ConditionExpression=condition,
                         ExpressionAttributeNames={"#state": "state"}, ExpressionAttributeValues=values)
    except ddb.exceptions.ConditionalCheckFailedException:
        return False
    return True
