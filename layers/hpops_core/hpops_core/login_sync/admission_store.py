"""Where load-aware admission keeps its record: one item in the state table, written by every run.

    pk = "admission#<cluster>"   sk = "login-admission"   state (JSON: admission.AdmissionState), version

Written with a condition on the version read, so two overlapping runs cannot both decide from the
same record (the loser fails and EventBridge retries it). LoginNodeSync reads it (GetItem) to keep
the nodes that are out of rotation out of the target group; a record that stopped being refreshed
is ignored there (admission.held_out).
"""

from __future__ import annotations

import json

from botocore.exceptions import ClientError

from hpops_core.common.clients import client, transient_errors_named
from hpops_core.common.errors import HpopsError, TransientAwsError
from hpops_core.common.state_table import admission_partition
from hpops_core.login_sync.admission import AdmissionState

SK = "login-admission"


def _key(cluster: str) -> dict:
    return {"pk": {"S": admission_partition(cluster)}, "sk": {"S": SK}}


class MalformedAdmissionRecord(HpopsError):
    """The admission record is not what the admission function writes; the sync then keeps nobody out."""


def read_admission(table: str, cluster: str) -> tuple[AdmissionState, int]:
    """The record and its version (0: none yet); MalformedAdmissionRecord when it cannot be read as one."""
    with transient_errors_named("dynamodb:GetItem"):
        item = client("dynamodb").get_item(TableName=table, Key=_key(cluster), ConsistentRead=True).get("Item")
    if not item:
        return AdmissionState(), 0
    try:
        return AdmissionState.from_json(json.loads(item["state"]["S"])), int(item["version"]["N"])
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise MalformedAdmissionRecord(f"admission record of {cluster} unreadable ({type(error).__name__})") from None


def write_admission(table: str, cluster: str, state: AdmissionState, read_version: int) -> None:
    """Replace the record if nobody wrote it since `read_version` was read; TransientAwsError otherwise."""
    condition = "attribute_not_exists(pk)" if read_version == 0 else "version = :read"
    values = {} if read_version == 0 else {":read": {"N": str(read_version)}}
    try:
        with transient_errors_named("dynamodb:PutItem"):
            client("dynamodb").put_item(
                TableName=table, Item=_key(cluster) | {"state": {"S": json.dumps(state.to_json(), sort_keys=True)},
                                                       "version": {"N": str(read_version + 1)}},
                ConditionExpression=condition, **({"ExpressionAttributeValues": values} if values else {}))
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
            raise TransientAwsError("another admission run wrote the record since it was read") from None
        raise
