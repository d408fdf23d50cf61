"""A list too long for one DynamoDB item (400 KB), kept as pages under a prefix a header item names.

The writer puts the pages first (BatchWriteItem, 25 a call), each under a prefix unique to this
write, then its header (a conditional Put, the caller's): a reader that finds a header finds all
its pages, and two writers racing never mix their pages (the loser's are left to the TTL). A reader
Queries the header's prefix and checks it got as many pages as the header says.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Sequence
from typing import Any

from botocore.exceptions import ClientError

from hpops_core.common.clients import client, transient_errors_named
from hpops_core.common.errors import TransientAwsError

# JSON text per page: a quarter of DynamoDB's 400 KB item, so a page's item is never near the limit.
PAGE_BYTES = 100_000
# Pages outlive any header that names them by far (a header is replaced at most once a sweep).
PAGE_TTL = dt.timedelta(days=2)
BATCH_WRITE = 25
UNPROCESSED_ATTEMPTS = 5


class PagesIncomplete(TransientAwsError):
    """A header names more pages than were found (its pages expired or are being written): read again."""


def page_prefix(name: str, revision: int, writer: str) -> str:
    """Unique per write: the revision, and a digest of who wrote it (an execution id) and when."""
    return f"{name}#{revision:012d}#{hashlib.sha256(writer.encode()).hexdigest()[:12]}#"


def split(entries: Sequence[Any], page_bytes: int = PAGE_BYTES) -> list[list[Any]]:
    """Entries in order, in pages whose JSON stays under ``page_bytes`` (one entry alone may not)."""
    pages: list[list[Any]] = [[]]
    size = 2
    for entry in entries:
        length = len(json.dumps(entry, separators=(",", ":"))) + 1
        if pages[-1] and size + length > page_bytes:
            pages.append([])
            size = 2
        pages[-1].append(entry)
        size += length
    return pages


def batch_write(table: str, requests: Sequence[dict[str, Any]], dynamodb: Any = None) -> int:
    """BatchWriteItem, 25 requests a call, unprocessed ones sent again; returns the calls made."""
    dynamodb = dynamodb or client("dynamodb")
    calls = 0
    for start in range(0, len(requests), BATCH_WRITE):
        pending = {table: list(requests[start:start + BATCH_WRITE])}
        for _ in range(UNPROCESSED_ATTEMPTS):
            calls += 1
            with transient_errors_named("dynamodb:BatchWriteItem"):
                pending = dynamodb.batch_write_item(RequestItems=pending).get("UnprocessedItems") or {}
            if not pending:
                break
        else:
            raise TransientAwsError(f"dynamodb:BatchWriteItem left {len(pending.get(table, []))} request(s) unprocessed")
    return calls


def write_pages(table: str, pk: str, prefix: str, entries: Sequence[Any], now: dt.datetime,
                dynamodb: Any = None) -> int:
    """The pages of ``entries`` under ``prefix``; returns how many (0 for none: nothing written)."""
    pages = split(entries) if entries else []
    ttl = str(int((now + PAGE_TTL).timestamp()))
    batch_write(table, [{"PutRequest": {"Item": {
        "pk": {"S": pk}, "sk": {"S": f"{prefix}{number:05d}"},
        "entries": {"S": json.dumps(page, separators=(",", ":"))}, "ttl": {"N": ttl}}}}
        for number, page in enumerate(pages)], dynamodb)
    return len(pages)


def put_header(table: str, item: dict[str, Any], kept_revision: str | None, dynamodb: Any = None) -> bool:
    """The header naming the pages just written, put only if the header read before is still there
    (``kept_revision``; None: there was none). False when another writer's header came first."""
    condition = ({"ConditionExpression": "attribute_not_exists(pk)"} if kept_revision is None else
                 {"ConditionExpression": "revision = :revision",
                  "ExpressionAttributeValues": {":revision": {"N": kept_revision}}})
    try:
        with transient_errors_named("dynamodb:PutItem"):
            (dynamodb or client("dynamodb")).put_item(TableName=table, Item=item, **condition)
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
            return False
        raise
    return True


def read_pages(table: str, pk: str, prefix: str, pages: int, dynamodb: Any = None) -> list[Any]:
    """Every entry of the ``pages`` pages under ``prefix``, in order; PagesIncomplete if any is missing."""
    if pages == 0:
        return []
    entries: list[Any] = []
    found = 0
    paginator = (dynamodb or client("dynamodb")).get_paginator("query")
    with transient_errors_named("dynamodb:Query"):
        for answer in paginator.paginate(
            TableName=table, KeyConditionExpression="pk = :pk AND begins_with(sk, :prefix)", ConsistentRead=True,
            ExpressionAttributeValues={":pk": {"S": pk}, ":prefix": {"S": prefix}},
        ):
            for item in answer.get("Items", []):
                entries += json.loads(item["entries"]["S"])
                found += 1
    if found != pages:
        raise PagesIncomplete(f"{found} of {pages} page(s) under {prefix}: read again")
    return entries
