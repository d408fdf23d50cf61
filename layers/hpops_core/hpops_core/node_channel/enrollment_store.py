"""Where enrollments live: the state table's `enroll#<cluster>` and `approval#<cluster>` partitions.

    enroll#<cluster>   sk "node#<instance id>"      the enrollment (enrollment.Enrollment): key, fingerprint,
                                                    AWS's group and role, IP, status enrolled|contested,
                                                    enrolledAt, via, contestedBy (at most MAX_CONTESTED_BY),
                                                    windowEndsAt, expectDocument, recollectFrom,
                                                    replacedKey (while a replaced key's leftovers go),
                                                    replacedKeyUsage "keep" (its usage stays counted),
                                                    earlierReplacedKeys (keys still to void before it)
    enroll#<cluster>   sk "documents"               present once an agent of the cluster enrolled with a
                                                    verified instance identity document (documentsSince)
    approval#<cluster> sk "approval#<instance id>"  an operator's single-use approval of one key
                                                    fingerprint (expires), and what becomes of the usage
                                                    of the key it replaces: replacedKeyUsage keep|discard
                                                    of the standing key named `replacing`

Approvals have their own partition so that the administrator's policy can write them and never an
enrollment (a dynamodb:LeadingKeys condition names partitions, not sort keys).

Public facts only (public keys, fingerprints): nothing here is a secret.
"""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from hpops_core.common.clients import client, transient_errors_named
from hpops_core.common.errors import HpopsError, TransientAwsError
from hpops_core.common.state_table import approval_partition, enrollment_partition
from hpops_core.node_channel.enrollment import CONTESTED, KEEP, MAX_CONTESTED_BY, REPLACED_KEY_USAGE, Approval, Enrollment

NODE_PREFIX = "node#"
APPROVAL_PREFIX = "approval#"
DOCUMENTS_SK = "documents"
# An approval is for a planned re-enrollment within the day; an unused one should not linger.
APPROVAL_TTL_SECONDS = 24 * 3600
# A transaction cancelled for these wrote nothing and may be sent again (DynamoDB's TransactWriteItems
# CancellationReasons codes): throttled, or an item held by another transaction in flight.
TRANSIENT_CANCELLATIONS = frozenset({"ThrottlingError", "ProvisionedThroughputExceeded", "TransactionConflict"})


def _key(cluster: str, prefix: str, instance_id: str) -> dict:
    partition = approval_partition(cluster) if prefix == APPROVAL_PREFIX else enrollment_partition(cluster)
    return {"pk": {"S": partition}, "sk": {"S": prefix + instance_id}}


def enrollment_item(record: Enrollment) -> dict:
    item = _key(record.cluster, NODE_PREFIX, record.instance_id) | {
        "instanceId": {"S": record.instance_id}, "publicKey": {"S": record.public_key},
        "fingerprint": {"S": record.fingerprint}, "group": {"S": record.group}, "role": {"S": record.role},
        "ip": {"S": record.ip}, "status": {"S": record.status}, "enrolledAt": {"S": record.enrolled_at},
        "via": {"S": record.via},
    }
    if record.contested_by:
        item["contestedBy"] = {"L": [{"S": f} for f in record.contested_by]}
    if record.window_ends_at:
        item["windowEndsAt"] = {"S": record.window_ends_at}
    if record.expect_document:
        item["expectDocument"] = {"BOOL": True}
    if record.recollect_from:
        item["recollectFrom"] = {"S": record.recollect_from}
    if record.replaced_key:
        item["replacedKey"] = {"S": record.replaced_key}
    if record.replaced_usage_kept:
        item["replacedKeyUsage"] = {"S": KEEP}
    if record.earlier_replaced_keys:
        item["earlierReplacedKeys"] = {"L": [{"S": f} for f in record.earlier_replaced_keys]}
    return item


def enrollment_from_item(cluster: str, item: dict | None) -> Enrollment | None:
    if not item or "publicKey" not in item:
        return None
    text = {name: item.get(name, {}).get("S", "") for name in
            ("instanceId", "publicKey", "fingerprint", "group", "role", "ip", "status", "enrolledAt", "via")}
    contested_by = tuple(entry["S"] for entry in item.get("contestedBy", {}).get("L", []))
    return Enrollment(cluster, text["instanceId"], text["publicKey"], text["fingerprint"], text["group"],
                      text["role"], text["ip"], text["status"], text["enrolledAt"], text["via"], contested_by,
                      item.get("windowEndsAt", {}).get("S", ""), bool(item.get("expectDocument", {}).get("BOOL")),
                      item.get("recollectFrom", {}).get("S", ""), item.get("replacedKey", {}).get("S", ""),
                      item.get("replacedKeyUsage", {}).get("S") == KEEP,
                      tuple(entry["S"] for entry in item.get("earlierReplacedKeys", {}).get("L", [])))


def _get(table: str, key: dict, dynamodb: Any = None) -> dict | None:
    with transient_errors_named("dynamodb:GetItem"):
        return (dynamodb or client("dynamodb")).get_item(TableName=table, Key=key, ConsistentRead=True).get("Item")


def get_enrollment(table: str, cluster: str, instance_id: str, dynamodb: Any = None) -> Enrollment | None:
    return enrollment_from_item(cluster, _get(table, _key(cluster, NODE_PREFIX, instance_id), dynamodb))


def get_approval(table: str, cluster: str, instance_id: str, now_epoch: int) -> Approval | None:
    item = _get(table, _key(cluster, APPROVAL_PREFIX, instance_id))
    if not item or int(item.get("ttl", {}).get("N", "0")) <= now_epoch:  # TTL deletion lags: check it here
        return None
    keep = item.get("replacedKeyUsage", {}).get("S") == KEEP
    return Approval(instance_id, item["fingerprint"]["S"], item.get("approvedAt", {}).get("S", ""),
                    item.get("replacing", {}).get("S", "") if keep else "")


def _conditional(operation: str, call) -> bool:
    """True if the write happened; False if its condition failed (someone else won)."""
    try:
        with transient_errors_named(operation):
            call()
        return True
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
            return False
        raise


def put_first(table: str, record: Enrollment) -> bool:
    """First presenter wins: store only if the instance has no enrollment yet."""
    return _conditional("dynamodb:PutItem", lambda: client("dynamodb").put_item(
        TableName=table, Item=enrollment_item(record), ConditionExpression="attribute_not_exists(sk)"))


class StandingKeyChangedError(HpopsError):
    """The node's stored enrollment changed between the read an approval was decided on and its write
    (another key enrolled or replaced it): nothing was written; decide again against what is stored."""


def put_approved(table: str, record: Enrollment, standing_fingerprint: str | None) -> bool:
    """Use the operator's approval once and store the record over whatever was there, in one transaction:
    the approval is deleted only if it still names this fingerprint, and the record is put only with it
    (a failure between two writes would leave the approval used and the old key stored, and the agent's
    retry refused). The record is put only over the enrollment it was decided against
    (`standing_fingerprint`, None: no enrollment), since what it carries of the replaced key (whose usage
    to keep or void) came from that read. False if the approval was gone (used or replaced meanwhile);
    StandingKeyChangedError if the enrollment changed meanwhile; TransientAwsError, with nothing
    written, if DynamoDB throttled the transaction or another one held its items."""
    standing: dict[str, Any] = ({"ConditionExpression": "attribute_not_exists(sk)"} if standing_fingerprint is None else
                                {"ConditionExpression": "fingerprint = :standing",
                                 "ExpressionAttributeValues": {":standing": {"S": standing_fingerprint}}})
    try:
        with transient_errors_named("dynamodb:TransactWriteItems"):
            client("dynamodb").transact_write_items(TransactItems=[
                {"Delete": {"TableName": table, "Key": _key(record.cluster, APPROVAL_PREFIX, record.instance_id),
                            "ConditionExpression": "fingerprint = :fingerprint",
                            "ExpressionAttributeValues": {":fingerprint": {"S": record.fingerprint}}}},
                {"Put": {"TableName": table, "Item": enrollment_item(record)} | standing}])
        return True
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") != "TransactionCanceledException":
            raise
        reasons = [reason.get("Code", "None") for reason in error.response.get("CancellationReasons") or []]
        if reasons[:1] == ["ConditionalCheckFailed"]:
            return False
        if reasons[1:2] == ["ConditionalCheckFailed"]:
            raise StandingKeyChangedError(f"the enrollment of {record.instance_id} changed meanwhile") from error
        if TRANSIENT_CANCELLATIONS.intersection(reasons):
            raise TransientAwsError(f"dynamodb:TransactWriteItems: cancelled ({', '.join(reasons)})") from error
        raise


def put_displacing(table: str, record: Enrollment, displaced: Enrollment) -> bool:
    """A verified document's key over the unverified one decided against, only if that one is still
    stored (a concurrent change means deciding again). False if it was not."""
    return _conditional("dynamodb:PutItem", lambda: client("dynamodb").put_item(
        TableName=table, Item=enrollment_item(record), ConditionExpression="fingerprint = :fingerprint",
        ExpressionAttributeValues={":fingerprint": {"S": displaced.fingerprint}}))


def mark_contested(table: str, cluster: str, instance_id: str, fingerprint: str) -> bool:
    """Contested until an operator re-enrolls it (or its agent's verified document settles it); the
    presenting fingerprint is kept for the operator, at most MAX_CONTESTED_BY of them: a flood of keys
    writes nothing more. False when the bound was reached meanwhile."""
    return _conditional("dynamodb:UpdateItem", lambda: client("dynamodb").update_item(
        TableName=table, Key=_key(cluster, NODE_PREFIX, instance_id),
        UpdateExpression="SET #status = :contested, contestedBy = list_append(if_not_exists(contestedBy, :none), :by)",
        ConditionExpression="attribute_exists(sk) AND (attribute_not_exists(contestedBy) OR size(contestedBy) < :max)",
        ExpressionAttributeNames={"#status": "status"},
        ExpressionAttributeValues={":contested": {"S": CONTESTED}, ":none": {"L": []}, ":by": {"L": [{"S": fingerprint}]},
                                   ":max": {"N": str(MAX_CONTESTED_BY)}}))


def documents_seen(table: str, cluster: str) -> bool:
    """Whether an agent of this cluster ever enrolled with a verified instance identity document."""
    return _get(table, {"pk": {"S": enrollment_partition(cluster)}, "sk": {"S": DOCUMENTS_SK}}) is not None


def record_documents_seen(table: str, cluster: str, since: str) -> None:
    """Once: the first verified document tells the stack this cluster's IMDS serves them."""
    _conditional("dynamodb:PutItem", lambda: client("dynamodb").put_item(
        TableName=table, Item={"pk": {"S": enrollment_partition(cluster)}, "sk": {"S": DOCUMENTS_SK},
                               "documentsSince": {"S": since}},
        ConditionExpression="attribute_not_exists(sk)"))


def put_approval(table: str, cluster: str, instance_id: str, fingerprint: str, approved_at: str, now_epoch: int,
                 dynamodb: Any = None, replaced_key_usage: str = "", replacing: str = "") -> None:
    """The operator's approval (hpops node approve-enrollment): the next enroll with this key wins.
    ``replaced_key_usage`` (keep|discard) of the standing key ``replacing``: "keep" leaves that key's
    usage windows counted (it was this node's own), anything else voids them (enrollment.replacing)."""
    item = _key(cluster, APPROVAL_PREFIX, instance_id) | {
        "fingerprint": {"S": fingerprint}, "approvedAt": {"S": approved_at},
        "ttl": {"N": str(now_epoch + APPROVAL_TTL_SECONDS)}}
    if replaced_key_usage in REPLACED_KEY_USAGE and replacing:
        item |= {"replacedKeyUsage": {"S": replaced_key_usage}, "replacing": {"S": replacing}}
    with transient_errors_named("dynamodb:PutItem"):
        (dynamodb or client("dynamodb")).put_item(TableName=table, Item=item)


def list_enrollments(table: str, cluster: str, dynamodb: Any = None,
                     with_approvals: bool = False) -> tuple[list[Enrollment], list[dict]]:
    """(enrollments, pending approvals as {"instanceId", "fingerprint", "approvedAt"}) of the cluster; the
    approvals' partition is read only `with_approvals` (the operator's listing; the sync needs none)."""
    enrollments, approvals, _ = read_enrollments(table, cluster, dynamodb, with_approvals)
    return enrollments, approvals


def read_enrollments(table: str, cluster: str, dynamodb: Any = None,
                     with_approvals: bool = False) -> tuple[list[Enrollment], list[dict], bool]:
    """list_enrollments, and whether a verified instance identity document was ever seen (same Query)."""
    enrollments, approvals, documents = [], [], False
    paginator = (dynamodb or client("dynamodb")).get_paginator("query")
    partitions = [enrollment_partition(cluster)] + ([approval_partition(cluster)] if with_approvals else [])
    with transient_errors_named("dynamodb:Query"):
        for partition in partitions:
            for page in paginator.paginate(TableName=table, KeyConditionExpression="pk = :pk", ConsistentRead=True,
                                           ExpressionAttributeValues={":pk": {"S": partition}}):
                for item in page.get("Items", []):
                    sk = item["sk"]["S"]
                    if sk.startswith(NODE_PREFIX):
                        enrollments.append(enrollment_from_item(cluster, item))
                    elif sk.startswith(APPROVAL_PREFIX):
                        approvals.append({"instanceId": sk[len(APPROVAL_PREFIX):],
                                          "fingerprint": item["fingerprint"]["S"],
                                          "approvedAt": item.get("approvedAt", {}).get("S", "")})
                    elif sk == DOCUMENTS_SK:
                        documents = True
    return enrollments, approvals, documents


def finish_replacement(table: str, cluster: str, instance_id: str, fingerprint: str, recollect_from: str) -> bool:
    """What the replaced key left is gone: forget which key it was, and (when ``recollect_from`` is given)
    have the controller's agent re-collect from that window (its answer says so), only while
    ``fingerprint`` is still the enrolled key. False when another key was enrolled meanwhile."""
    forget = "REMOVE replacedKey, replacedKeyUsage, earlierReplacedKeys"
    update, values = forget, {":fingerprint": {"S": fingerprint}}
    if recollect_from:
        update, values = f"SET recollectFrom = :window {forget}", values | {":window": {"S": recollect_from}}
    return _conditional("dynamodb:UpdateItem", lambda: client("dynamodb").update_item(
        TableName=table, Key=_key(cluster, NODE_PREFIX, instance_id), UpdateExpression=update,
        ConditionExpression="fingerprint = :fingerprint", ExpressionAttributeValues=values))
