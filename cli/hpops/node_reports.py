"""The node agents' latest reports, read from the stack's state table (status and doctor both show them)."""

from __future__ import annotations

from typing import Any

from hpops_core.common.state_table import node_report_partition
from hpops_core.node_channel.report_store import SK_PREFIX, report_from_item


def read_node_reports(dynamodb: Any, table: str, cluster: str) -> dict[str, dict]:
    """Instance id -> the latest report its agent sent (one item per node, report_store's layout)."""
    pages = dynamodb.get_paginator("query").paginate(
        TableName=table, KeyConditionExpression="pk = :pk AND begins_with(sk, :sk)",
        ExpressionAttributeValues={":pk": {"S": node_report_partition(cluster)}, ":sk": {"S": SK_PREFIX}})
    return {item["sk"]["S"][len(SK_PREFIX):]: report_from_item(item) for page in pages for item in page["Items"]}
