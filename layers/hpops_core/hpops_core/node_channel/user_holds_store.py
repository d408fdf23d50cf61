"""Where the holds document waits for the controller's agent: DynamoDB items, not a 4 KB parameter.

pk ``holds#<cluster>`` (state_table.user_holds_partition): sk ``document`` is the header (revision,
the document's version, month, expiresAt, dryRun, how many users and pages, the pages' prefix); the
users are pages under that prefix (common/paged_items), so any number of held users fits. Only
the BudgetGuard sweep writes them; NodeChannel `fetch` reads them for the enrolled controller agent
and answers the document as one JSON text, the shape user_holds.parse_document checks (the agent is
unchanged). The public marker /hpops/<cluster>/node/instructions/user-holds names the revision, so
the agent fetches only when it moved.

What bounds it now: NodeChannel's answer travels in a synchronous invoke's response (6 MB);
MAX_DOCUMENT_BYTES keeps it well under, about 150,000 users of the longest names.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from hpops_core.common.clients import client, transient_errors_named
from hpops_core.common.errors import HpopsError, TransientAwsError
from hpops_core.common.paged_items import page_prefix, put_header, read_pages, write_pages
from hpops_core.common.state_table import user_holds_partition
from hpops_core.node_channel import instructions, user_holds

HEADER_SK = "document"
PAGES_NAME = "users"
# Lambda's synchronous response is 6 MB; the rest of NodeChannel's answer is a few hundred bytes.
MAX_DOCUMENT_BYTES = 5 * 1024 * 1024


class HoldsUndeliverable(HpopsError):
    """The holds document cannot be delivered to the controller's agent (too large for NodeChannel's answer)."""


def _header(table: str, cluster: str, dynamodb: Any) -> dict[str, Any] | None:
    with transient_errors_named("dynamodb:GetItem"):
        return dynamodb.get_item(TableName=table, ConsistentRead=True, Key={
            "pk": {"S": user_holds_partition(cluster)}, "sk": {"S": HEADER_SK}}).get("Item")


def publish(table: str, cluster: str, document: Mapping[str, Any], writer: str, now: dt.datetime,
            dynamodb: Any = None) -> int | None:
    """The document's pages, its header (conditional on the revision read), then the public marker.
    Returns the new revision, or None when the kept document is this one already (nothing written).
    HoldsUndeliverable when it could not reach the agent; TransientAwsError when another sweep
    published first (the state machine retries against the new state)."""
    size = len(user_holds.canonical_json(dict(document)).encode())
    if size > MAX_DOCUMENT_BYTES:
        raise HoldsUndeliverable(f"{len(document['users'])} held users make a {size:,}-byte holds document: "
                                 f"NodeChannel answers at most {MAX_DOCUMENT_BYTES:,}")
    dynamodb = dynamodb or client("dynamodb")
    pk = user_holds_partition(cluster)
    kept = _header(table, cluster, dynamodb)
    if kept is not None and kept["version"]["S"] == document["version"]:
        return None
    revision = int(kept["revision"]["N"]) + 1 if kept else 1
    prefix = page_prefix(PAGES_NAME, revision, f"{writer}@{now.isoformat()}")
    pages = write_pages(table, pk, prefix, list(document["users"]), now, dynamodb)
    header = {"pk": {"S": pk}, "sk": {"S": HEADER_SK}, "revision": {"N": str(revision)},
              "version": {"S": document["version"]}, "month": {"S": document["month"]},
              "expiresAt": {"S": document["expiresAt"]}, "dryRun": {"BOOL": document["dryRun"]},
              "users": {"N": str(len(document["users"]))}, "pages": {"N": str(pages)}, "prefix": {"S": prefix},
              "bytes": {"N": str(size)}}
    if not put_header(table, header, kept["revision"]["N"] if kept else None, dynamodb):
        raise TransientAwsError("dynamodb:PutItem: another sweep published the holds first; retry")
    instructions.mark(user_holds.user_holds_parameter(cluster), revision)
    return revision


def read(table: str, cluster: str, dynamodb: Any = None) -> dict[str, Any] | None:
    """{"value": the document's JSON text, "version": its revision} for NodeChannel, or None (nothing
    published: the agent lifts what it held)."""
    dynamodb = dynamodb or client("dynamodb")
    header = _header(table, cluster, dynamodb)
    if header is None:
        return None
    users = read_pages(table, user_holds_partition(cluster), header["prefix"]["S"], int(header["pages"]["N"]), dynamodb)
    document = {"format": user_holds.USER_HOLDS_FORMAT, "version": header["version"]["S"],
                "month": header["month"]["S"], "expiresAt": header["expiresAt"]["S"],
                "dryRun": header["dryRun"]["BOOL"], "users": users}
    return {"value": user_holds.canonical_json(document), "version": int(header["revision"]["N"])}


def summary(table: str, cluster: str, dynamodb: Any = None) -> dict[str, Any] | None:
    """The header only (no user names): revision, version, how many users, bytes (`hpops status`, the bench)."""
    header = _header(table, cluster, dynamodb or client("dynamodb"))
    if header is None:
        return None
    return {"revision": int(header["revision"]["N"]), "version": header["version"]["S"],
            "users": int(header["users"]["N"]), "pages": int(header["pages"]["N"]), "bytes": int(header["bytes"]["N"])}
