"""Where node reports are kept: one item per node in the SyncStateTable, the latest report wins.

    pk = "node-report#<cluster>"   sk = "node-report#<instance id>"   report (JSON), receivedAt, ttl,
    eventId (the EventBridge event that brought it: a redelivery of the same event is recognised)
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from botocore.exceptions import ClientError

from hpops_core.common.clients import client, transient_errors_named
from hpops_core.common.state_table import node_report_partition
from hpops_core.node_channel.report_proof import ReportReplayError

if TYPE_CHECKING:  # the pydantic model; reading reports back needs no pydantic at all
    from hpops_core.node_channel.reports import NodeReport

SK_PREFIX = "node-report#"
REPORT_TTL_SECONDS = 30 * 24 * 3600  # a replaced node's last report outlives it long enough to debug


def report_item(cluster: str, report: NodeReport, received_at: str, now_epoch: int, event_id: str | None = None,
                sequence: int | None = None) -> dict:
    """The DynamoDB item (low-level format) that keeps a node's latest report."""
    item = {
        "pk": {"S": node_report_partition(cluster)},
        "sk": {"S": SK_PREFIX + report.instanceId},
        "report": {"S": report.to_json()},
        "receivedAt": {"S": received_at},
        "ttl": {"N": str(now_epoch + REPORT_TTL_SECONDS)},
    }
    if event_id:
        item["eventId"] = {"S": event_id}
    if sequence is not None:
        item["sequence"] = {"N": str(sequence)}
    return item


def report_from_item(item: dict | None) -> dict | None:
    """The stored report as plain JSON plus when it was received, or None."""
    if not item or "report" not in item:
        return None
    report = json.loads(item["report"]["S"])
    report["receivedAt"] = item.get("receivedAt", {}).get("S")
    return report


def latest_report(table: str, cluster: str, instance_id: str) -> dict | None:
    with transient_errors_named("dynamodb:GetItem"):
        item = client("dynamodb").get_item(
            TableName=table, Key={"pk": {"S": node_report_partition(cluster)}, "sk": {"S": SK_PREFIX + instance_id}},
            ConsistentRead=True,
        ).get("Item")
    return report_from_item(item)


def store_report(table: str, cluster: str, report: NodeReport, received_at: str, now_epoch: int,
                 event_id: str | None = None, sequence: int | None = None) -> dict | None:
    """Keep the report; returns the one it replaced (as report_from_item, plus its eventId), or None.
    The old item comes back with the same PutItem (ReturnValues), so comparing costs no read.
    With a sequence, a report older than the kept one is refused (ReportReplayError); the same one again
    (EventBridge delivers at least once; the agent never reuses a sequence) is stored again, changing nothing."""
    condition = {}
    if sequence is not None:
        condition = {"ConditionExpression": "attribute_not_exists(#sequence) OR #sequence <= :sequence",
                     "ExpressionAttributeNames": {"#sequence": "sequence"},
                     "ExpressionAttributeValues": {":sequence": {"N": str(sequence)}}}
    try:
        with transient_errors_named("dynamodb:PutItem"):
            old = client("dynamodb").put_item(
                TableName=table, Item=report_item(cluster, report, received_at, now_epoch, event_id, sequence),
                ReturnValues="ALL_OLD", **condition).get("Attributes")
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
            raise ReportReplayError(f"{report.instanceId}'s report sequence {sequence} is below the last "
                                    "accepted one (replayed or reordered)") from None
        raise
    previous = report_from_item(old)
    if previous is not None:
        previous["eventId"] = old.get("eventId", {}).get("S")
    return previous


def forget_report(table: str, cluster: str, instance_id: str) -> dict | None:
    """Drop the node's stored report and its sequence: a key replaced by another (an operator's approval,
    a verified document) leaves nothing that counts or pins the sequence. Returns the dropped report
    (report_from_item), or None."""
    with transient_errors_named("dynamodb:DeleteItem"):
        old = client("dynamodb").delete_item(
            TableName=table, Key={"pk": {"S": node_report_partition(cluster)}, "sk": {"S": SK_PREFIX + instance_id}},
            ReturnValues="ALL_OLD").get("Attributes")
    return report_from_item(old)


def cluster_reports(table: str, cluster: str) -> dict[str, dict]:
    """Every node's stored report (instance id -> report_from_item), one paged Query, strongly consistent."""
    reports = {}
    pages = client("dynamodb").get_paginator("query").paginate(
        TableName=table, KeyConditionExpression="pk = :pk", ConsistentRead=True,
        ExpressionAttributeValues={":pk": {"S": node_report_partition(cluster)}},
        ProjectionExpression="sk, report, receivedAt")
    with transient_errors_named("dynamodb:Query"):
        for page in pages:
            for item in page.get("Items", []):
                report = report_from_item(item)
                if report is not None and item["sk"]["S"].startswith(SK_PREFIX):
                    reports[item["sk"]["S"][len(SK_PREFIX):]] = report
    return reports
