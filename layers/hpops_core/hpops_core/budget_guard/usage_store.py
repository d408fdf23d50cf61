"""Where usage reports are kept: one DynamoDB item per report part, in the stack's state table.

Item: pk ``usage#<cluster>#<YYYY-MM>``, sk ``window#<windowStart>#<part>``: a month of one cluster
is one Query (at most 744 hourly windows). A window is re-sent while it is open; the newer
collection replaces the older (a condition on collectedAt, so a late retry of an old report never
wins), and on reading only the parts of a window's newest collection count. One more item,
sk ``status`` under pk ``usage#<cluster>``, keeps the collector's latest status, so a report can
say "accounting not enabled" instead of showing zeros.

Beside a window's parts, sk ``total#<windowStart>`` sums what its newest collection's parts claim
(usage_capacity.WindowTotal). A part and the total it makes are written in one transaction, the
total conditional on the version read: two parts of a window arriving at once cannot both add to
the same sum, and a part that would take the window over the groups' capacity is refused whole.

Each part records its writer (the enrolled key's fingerprint), and sk ``writer#<fingerprint>`` under
pk ``usage#<cluster>`` the first window that key's parts were stored for (``writers-since``: from
which window on every part has one). When an operator's approval or a
verified document replaces the controller's key, that key's parts from the first window it wrote
(at most USAGE_RECOLLECT_MAX_WINDOWS back) are void: sk ``voided`` under pk ``usage#<cluster>`` maps
each such fingerprint to that window, one write that every later read honours (a part of a voided
writer from that window on counts for nothing), and the agent re-collects the same hours from Slurm
(the enroll answer's "recollectFrom"), whose newer collections then replace them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from botocore.exceptions import ClientError

from hpops_core.budget_guard import BudgetGuardError
from hpops_core.budget_guard.usage_capacity import WindowTotal, check_window, next_total
from hpops_core.budget_guard.usage_reports import UsageRecord, UsageReport
from hpops_core.budget_guard.user_spend import MonthUsage, recent_since
from hpops_core.common.clients import client, transient_errors_named
from hpops_core.common.paged_items import page_prefix, put_header, read_pages, write_pages
from hpops_core.node_channel.contract import USAGE_OK
from hpops_core.node_channel.report_proof import ReportReplayError

# Kept a good year, so last year's same month can still be charged back.
USAGE_TTL_SECONDS = 400 * 24 * 3600
# Two parts of a window racing for its total: each loser reads again; more than this many losses
# in a row is not a race between a window's few parts.
TOTAL_ATTEMPTS = 8


class UsageWindowContendedError(BudgetGuardError):
    """The window's total kept changing while this part was written; nothing stored (EventBridge retries)."""


def month_key(cluster: str, month: str) -> str:
    return f"usage#{cluster}#{month}"


def total_key(window_start: str) -> str:
    return f"total#{window_start}"


def status_key(cluster: str) -> str:
    return f"usage#{cluster}"


@dataclass(frozen=True)
class StoredWindow:
    window_start: str
    collected_at: str
    final: bool
    status: str
    records: tuple[UsageRecord, ...]
    partition_groups: dict[str, str]


@dataclass(frozen=True)
class CollectorStatus:
    status: str
    reason: str
    collected_at: str
    window_start: str
    instance_id: str


def _newer_condition(item: dict[str, Any], collected_at: str, sequence: int | None) -> dict[str, Any]:
    """A Put of ``item`` unless the kept item is newer (collection time; with a sequence, also the
    sequence, compared only with a part the same key wrote: sequences are one key's count)."""
    condition, values = "attribute_not_exists(pk) OR collectedAt <= :collected", {":collected": {"S": collected_at}}
    put: dict[str, Any] = {"Item": item}
    if sequence is not None:
        put["Item"] = dict(item, sequence={"N": str(sequence)})
        same_writer = "attribute_not_exists(#sequence) OR #sequence <= :sequence"
        names = {"#sequence": "sequence"}
        if "writer" in item:
            same_writer += " OR attribute_not_exists(#writer) OR #writer <> :writer"
            values[":writer"], names["#writer"] = item["writer"], "writer"
        condition = f"({condition}) AND ({same_writer})"
        values[":sequence"] = {"N": str(sequence)}
        put["ExpressionAttributeNames"] = names
    return dict(put, ConditionExpression=condition, ExpressionAttributeValues=values)


def _older(sequence: int | None) -> bool:
    """A kept part is newer: with a sequence (a signed window part) a replayed or reordered report,
    ReportReplayError (the agent's re-sends are newer in both); without, not stored (False)."""
    if sequence is not None:
        raise ReportReplayError(f"usage report sequence {sequence} is older than the kept window part "
                                "(replayed or reordered)")
    return False


def _put_if_newer(table: str, item: dict[str, Any], collected_at: str, sequence: int | None = None) -> bool:
    """Store unless the kept item is newer (the same part again, an EventBridge redelivery, is stored
    again and changes nothing)."""
    try:
        with transient_errors_named("dynamodb:PutItem"):
            client("dynamodb").put_item(TableName=table, **_newer_condition(item, collected_at, sequence))
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
            return _older(sequence)
        raise
    return True


def _read_total(table: str, pk: str, window_start: str) -> WindowTotal | None:
    with transient_errors_named("dynamodb:GetItem"):
        item = client("dynamodb").get_item(TableName=table, Key={"pk": {"S": pk}, "sk": {"S": total_key(window_start)}},
                                           ConsistentRead=True).get("Item")
    if not item:
        return None
    parts = {int(number): usage for number, usage in json.loads(item["parts"]["S"]).items()}
    return WindowTotal(item["collectedAt"]["S"], parts, json.loads(item["partitionGroups"]["S"]),
                       int(item["version"]["N"]))


def _total_put(table: str, pk: str, window_start: str, total: WindowTotal, kept: WindowTotal | None,
               ttl: int) -> dict[str, Any]:
    item = {"pk": {"S": pk}, "sk": {"S": total_key(window_start)}, "collectedAt": {"S": total.collected_at},
            "parts": {"S": json.dumps({str(n): u for n, u in sorted(total.parts.items())}, separators=(",", ":"))},
            "partitionGroups": {"S": json.dumps(total.partition_groups, sort_keys=True)},
            "version": {"N": str(total.version)}, "ttl": {"N": str(ttl)}}
    if kept is None:
        return {"TableName": table, "Item": item, "ConditionExpression": "attribute_not_exists(pk)"}
    return {"TableName": table, "Item": item, "ConditionExpression": "#version = :version",
            "ExpressionAttributeNames": {"#version": "version"},
            "ExpressionAttributeValues": {":version": {"N": str(kept.version)}}}


def _store_window(table: str, item: dict[str, Any], report: UsageReport, instance_groups: list[dict[str, Any]],
                  sequence: int | None, ttl: int) -> bool:
    """The part and the window's new total in one transaction; UsageExceedsCapacityError (nothing
    written) when the window's parts would sum past the capacity."""
    pk = item["pk"]["S"]
    for _ in range(TOTAL_ATTEMPTS):
        kept = _read_total(table, pk, report.window_start)
        total = next_total(kept, report)
        if total is None:  # a part of an older collection: kept as before, never read back, sums nothing
            return _put_if_newer(table, item, report.collected_at, sequence)
        check_window(total, report, instance_groups)
        try:
            with transient_errors_named("dynamodb:TransactWriteItems"):
                client("dynamodb").transact_write_items(TransactItems=[
                    {"Put": dict(TableName=table, **_newer_condition(item, report.collected_at, sequence))},
                    {"Put": _total_put(table, pk, report.window_start, total, kept, ttl)}])
            return True
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") != "TransactionCanceledException":
                raise
            reasons = [r.get("Code") for r in error.response.get("CancellationReasons") or []]
            if reasons[:1] == ["ConditionalCheckFailed"]:
                return _older(sequence)
            # The total moved (another part of the window was kept first) or a transaction on it was in
            # flight (TransactionConflict): read it again and decide again.
    raise UsageWindowContendedError(f"window {report.window_start}'s total changed {TOTAL_ATTEMPTS} times while "
                                    f"part {report.part} was written")


def store_usage(table: str, report: UsageReport, now_epoch: int, instance_groups: list[dict[str, Any]],
                sequence: int | None = None, writer: str = "") -> dict[str, bool]:
    """Conditional writes: the window part with its window's total (``instance_groups``: DescribeCluster's,
    the capacity the total must fit), then the collector's status. Re-sending changes nothing.

    Only a report that read sacct stores its window: a collection that failed ("sacct failed",
    "accounting not enabled") must not replace the usage an earlier collection found."""
    records = [{"user": r.user, "partition": r.partition, "nodeSeconds": r.node_seconds, "cpuSeconds": r.cpu_seconds,
                "gpuSeconds": r.gpu_seconds, "jobs": r.jobs} for r in report.records]
    window = {
        "pk": {"S": month_key(report.cluster, report.month)},
        "sk": {"S": f"window#{report.window_start}#{report.part:04d}"},
        "collectedAt": {"S": report.collected_at},
        "final": {"BOOL": report.final},
        "status": {"S": report.status},
        "part": {"N": str(report.part)},
        "parts": {"N": str(report.parts)},
        "records": {"S": json.dumps(records, separators=(",", ":"))},
        "partitionGroups": {"S": json.dumps(report.partition_groups, sort_keys=True)},
        "ttl": {"N": str(now_epoch + USAGE_TTL_SECONDS)},
    }
    if writer:
        window["writer"] = {"S": writer}
    status = {
        "pk": {"S": status_key(report.cluster)}, "sk": {"S": "status"},
        "collectedAt": {"S": report.collected_at}, "status": {"S": report.status},
        "reason": {"S": report.reason}, "windowStart": {"S": report.window_start},
        "instanceId": {"S": report.instance_id},
        "ttl": {"N": str(now_epoch + USAGE_TTL_SECONDS)},
    }
    if writer and report.status == USAGE_OK:
        # Before the part: a marker that claims a window whose part is then refused voids nothing real,
        # a part stored without its marker could escape a void.
        _mark_writer(table, report.cluster, writer, report.window_start, now_epoch)
    stored = report.status == USAGE_OK and _store_window(table, window, report, instance_groups, sequence,
                                                         now_epoch + USAGE_TTL_SECONDS)
    return {"window": stored, "status": _put_if_newer(table, status, report.collected_at)}


def _counted(items: list[dict[str, Any]], voided: dict[str, str]) -> list[dict[str, Any]]:
    """The parts that count: not written by a voided writer at or after the window it was voided from."""
    return [item for item in items if not (
        item.get("writer", {}).get("S") in voided and item["sk"]["S"].split("#")[1] >= voided[item["writer"]["S"]])]


def _window_of(items: list[dict[str, Any]], voided: dict[str, str] | None = None) -> StoredWindow | None:
    """The window as its newest counted collection says; None when no part counts."""
    items = _counted(items, voided) if voided else items
    if not items:
        return None
    newest = max(item["collectedAt"]["S"] for item in items)
    current = [item for item in items if item["collectedAt"]["S"] == newest]
    records: list[UsageRecord] = []
    groups: dict[str, str] = {}
    for item in sorted(current, key=lambda i: int(i["part"]["N"])):
        for raw in json.loads(item["records"]["S"]):
            records.append(UsageRecord(raw["user"], raw["partition"], raw["nodeSeconds"], raw["cpuSeconds"],
                                       raw["gpuSeconds"], raw["jobs"]))
        groups.update(json.loads(item["partitionGroups"]["S"]))
    first = current[0]
    return StoredWindow(first["sk"]["S"].split("#")[1], newest, any(i["final"]["BOOL"] for i in current),
                        first["status"]["S"], tuple(records), groups)


def month_usage(table: str, cluster: str, month: str, dynamodb: Any = None) -> list[StoredWindow]:
    """Every window of ``month`` (``YYYY-MM``) as last collected, oldest first.

    ``dynamodb``: a client of the stack's region (the operator CLI's session); the Lambda's own by default."""
    by_window: dict[str, list[dict[str, Any]]] = {}
    voided = voided_writers(table, cluster, dynamodb)
    paginator = (dynamodb or client("dynamodb")).get_paginator("query")
    with transient_errors_named("dynamodb:Query"):
        for page in paginator.paginate(
            TableName=table, KeyConditionExpression="pk = :pk AND begins_with(sk, :window)",
            ExpressionAttributeValues={":pk": {"S": month_key(cluster, month)}, ":window": {"S": "window#"}},
        ):
            for item in page.get("Items", []):
                by_window.setdefault(item["sk"]["S"].split("#")[1], []).append(item)
    windows = (_window_of(items, voided) for _, items in sorted(by_window.items()))
    return [window for window in windows if window is not None]


RUNNING_TOTAL = "running-total"


def _window_items(table: str, cluster: str, month: str, dynamodb: Any, after: str | None = None,
                  before: str | None = None):
    """The month's window parts in key order (window by window), optionally only windows starting in
    [after, before): one Query, paged, read as it goes."""
    condition, values = "pk = :pk AND begins_with(sk, :window)", {":pk": {"S": month_key(cluster, month)},
                                                                  ":window": {"S": "window#"}}
    if after is not None or before is not None:
        condition = "pk = :pk AND sk BETWEEN :low AND :high"
        values = {":pk": values[":pk"], ":low": {"S": f"window#{after or ''}"},
                  ":high": {"S": f"window#{before}" if before else "window#~"}}
    paginator = dynamodb.get_paginator("query")
    with transient_errors_named("dynamodb:Query"):
        for page in paginator.paginate(TableName=table, KeyConditionExpression=condition,
                                       ExpressionAttributeValues=values):
            yield from page.get("Items", [])


def _windows(items, voided: dict[str, str]) -> Any:
    """Items in key order -> StoredWindow one at a time (only one window's parts held at once)."""
    current: list[dict[str, Any]] = []
    for item in items:
        if current and item["sk"]["S"].split("#")[1] != current[0]["sk"]["S"].split("#")[1]:
            yield from filter(None, [_window_of(current, voided)])
            current = []
        current.append(item)
    if current:
        yield from filter(None, [_window_of(current, voided)])


def _total_versions(table: str, cluster: str, month: str, dynamodb: Any) -> dict[str, int]:
    """Each window's total's version (a window's parts change only with it): small items, one Query."""
    versions: dict[str, int] = {}
    paginator = dynamodb.get_paginator("query")
    with transient_errors_named("dynamodb:Query"):
        for page in paginator.paginate(
            TableName=table, KeyConditionExpression="pk = :pk AND begins_with(sk, :total)",
            ProjectionExpression="sk, version",
            ExpressionAttributeValues={":pk": {"S": month_key(cluster, month)}, ":total": {"S": "total#"}},
        ):
            versions.update((item["sk"]["S"].split("#", 1)[1], int(item["version"]["N"])) for item in page.get("Items", []))
    return versions


def month_totals(table: str, cluster: str, month: str, now: Any, writer: str = "", save: bool = True,
                 dynamodb: Any = None) -> tuple[MonthUsage, dict[str, Any]]:
    """The month's usage per user (user_spend.MonthUsage) and how it was read ({kept, folded, reread,
    recent, saved}): the kept running total, plus the windows that settled since (summed into it and
    kept again when ``save``), plus the last day's windows as they are."""
    dynamodb = dynamodb or client("dynamodb")
    settled_before = recent_since(now).strftime("%Y-%m-%dT%H:%M:%SZ")
    with transient_errors_named("dynamodb:GetItem"):
        header = dynamodb.get_item(TableName=table, ConsistentRead=True, Key={
            "pk": {"S": month_key(cluster, month)}, "sk": {"S": RUNNING_TOTAL}}).get("Item")
    versions = _total_versions(table, cluster, month, dynamodb)
    voided = voided_writers(table, cluster, dynamodb)
    summed: dict[str, int | None] = json.loads(header["windows"]["S"]) if header else {}
    # A summed window's total moved, or a window before the last summed one arrived late (catching up),
    # or a writer was voided since the kept sum: sum again.
    stale = [w for w, version in summed.items() if versions.get(w) != version] + \
        [w for w in versions if summed and w < max(summed) and w not in summed] + \
        (["voided"] if header and json.loads(header.get("voided", {}).get("S", "{}")) != voided else [])
    outcome = {"kept": len(summed), "folded": 0, "reread": bool(stale), "recent": 0, "saved": False}
    if header and not stale:
        usage = MonthUsage.from_rows(read_pages(table, month_key(cluster, month), header["prefix"]["S"],
                                                int(header["pages"]["N"]), dynamodb),
                                     json.loads(header["partitionGroups"]["S"]))
        after = max(summed) + "~" if summed else None
    else:  # first sweep of the month, or a settled window changed: sum the settled windows again
        usage, summed, after = MonthUsage(), {}, None
    for window in _windows(_window_items(table, cluster, month, dynamodb, after, f"{settled_before}"), voided):
        usage.add(window, recent=False)
        summed[window.window_start] = versions.get(window.window_start)
        outcome["folded"] += 1
    if save and outcome["folded"]:
        outcome["saved"] = _save_running_total(table, cluster, month, usage, summed, header, writer, now, dynamodb,
                                               voided)
    for window in _windows(_window_items(table, cluster, month, dynamodb, settled_before), voided):
        usage.add(window, recent=True)
        outcome["recent"] += 1
    return usage, outcome


def _save_running_total(table: str, cluster: str, month: str, usage: MonthUsage, summed: dict[str, int | None],
                        header: dict[str, Any] | None, writer: str, now: Any, dynamodb: Any,
                        voided: dict[str, str]) -> bool:
    """Pages, then the header conditional on the one read; False when another sweep kept one first (its
    sum is as good: nothing lost)."""
    revision = int(header["revision"]["N"]) + 1 if header else 1
    pk = month_key(cluster, month)
    prefix = page_prefix(RUNNING_TOTAL, revision, f"{writer}@{now.isoformat()}")
    pages = write_pages(table, pk, prefix, usage.rows(), now, dynamodb)
    item = {"pk": {"S": pk}, "sk": {"S": RUNNING_TOTAL}, "revision": {"N": str(revision)}, "prefix": {"S": prefix},
            "pages": {"N": str(pages)}, "users": {"N": str(len(usage.users))},
            "windows": {"S": json.dumps(summed, sort_keys=True, separators=(",", ":"))},
            "partitionGroups": {"S": json.dumps(usage.partition_groups, sort_keys=True)},
            "voided": {"S": json.dumps(voided, sort_keys=True)},
            "ttl": {"N": str(int(now.timestamp()) + USAGE_TTL_SECONDS)}}
    return put_header(table, item, header["revision"]["N"] if header else None, dynamodb)


def cluster_items(table: str, cluster: str, dynamodb: Any = None) -> dict[str, dict[str, Any]]:
    """Every item under ``usage#<cluster>`` by sort key, in one Query: the collector's status and the
    budget holds' state and agent report (hold_state), which a sweep reads together."""
    items: dict[str, dict[str, Any]] = {}
    paginator = (dynamodb or client("dynamodb")).get_paginator("query")
    with transient_errors_named("dynamodb:Query"):
        for page in paginator.paginate(TableName=table, KeyConditionExpression="pk = :pk", ConsistentRead=True,
                                       ExpressionAttributeValues={":pk": {"S": status_key(cluster)}}):
            items.update((item["sk"]["S"], item) for item in page.get("Items", []))
    return items


def collector_status(table: str, cluster: str, dynamodb: Any = None,
                     items: dict[str, dict[str, Any]] | None = None) -> CollectorStatus | None:
    """``items``: cluster_items() already read; else one GetItem."""
    if items is not None:
        item = items.get("status")
    else:
        with transient_errors_named("dynamodb:GetItem"):
            item = (dynamodb or client("dynamodb")).get_item(
                TableName=table, Key={"pk": {"S": status_key(cluster)}, "sk": {"S": "status"}}, ConsistentRead=True,
            ).get("Item")
    if not item:
        return None
    return CollectorStatus(item["status"]["S"], item.get("reason", {}).get("S", ""), item["collectedAt"]["S"],
                           item["windowStart"]["S"], item["instanceId"]["S"])


VOIDED_SK = "voided"
VOIDED_PREFIX = "writer#"  # one attribute per voided fingerprint: one UpdateItem adds one


def voided_writers(table: str, cluster: str, dynamodb: Any = None) -> dict[str, str]:
    """Fingerprint -> the first window (ISO) from which that key's parts count for nothing."""
    with transient_errors_named("dynamodb:GetItem"):
        item = (dynamodb or client("dynamodb")).get_item(
            TableName=table, Key={"pk": {"S": status_key(cluster)}, "sk": {"S": VOIDED_SK}}, ConsistentRead=True,
        ).get("Item") or {}
    return {name[len(VOIDED_PREFIX):]: value["S"] for name, value in item.items() if name.startswith(VOIDED_PREFIX)}


WRITER_PREFIX = "writer#"  # sk under usage#<cluster>: the first window a key's parts were stored for
WRITERS_SINCE_SK = "writers-since"  # the window from which every stored part has its writer's marker


def _put_unless(table: str, item: dict[str, Any], condition: str, values: dict[str, Any] | None = None) -> bool:
    """A conditional Put; False (nothing written) when its condition does not hold."""
    try:
        with transient_errors_named("dynamodb:PutItem"):
            client("dynamodb").put_item(TableName=table, Item=item, ConditionExpression=condition,
                                        **({"ExpressionAttributeValues": values} if values else {}))
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
            return False
        raise
    return True


def _mark_writer(table: str, cluster: str, writer: str, window_start: str, now_epoch: int) -> None:
    """Keep ``writer``'s earliest window (a small item per key, no TTL: a key's parts outlive any TTL it
    could take), so a replaced key's windows are found with one read, not a Query of 62 days of parts
    (first_window_written). One conditional Put; it writes only for a key's first part or an earlier
    window, and the first write ever records since when markers are kept."""
    pk = {"S": status_key(cluster)}
    if _put_unless(table, {"pk": pk, "sk": {"S": WRITER_PREFIX + writer}, "firstWindow": {"S": window_start}},
                   "attribute_not_exists(firstWindow) OR firstWindow > :window", {":window": {"S": window_start}}):
        since = datetime.fromtimestamp(now_epoch, timezone.utc).strftime("%Y-%m-%dT%H:00:00Z")
        _put_unless(table, {"pk": pk, "sk": {"S": WRITERS_SINCE_SK}, "since": {"S": since}}, "attribute_not_exists(pk)")


def first_window_written(table: str, cluster: str, fingerprint: str, since: datetime, now: datetime,
                         dynamodb: Any = None) -> str | None:
    """The earliest window start at or after ``since`` holding a part ``fingerprint`` wrote; None if none.

    Two reads: the key's marker (_mark_writer) and since when markers are kept. Only windows before
    that (parts stored by a release without markers, at most 62 days back and fewer every day) are
    found by a Query per month (a filter on the writer; windows' keys only). A marker older than
    ``since`` answers ``since``'s window."""
    dynamodb = dynamodb or client("dynamodb")
    low = since.strftime("%Y-%m-%dT%H:00:00Z")

    def read(sk: str) -> dict[str, Any]:
        with transient_errors_named("dynamodb:GetItem"):
            return dynamodb.get_item(TableName=table, Key={"pk": {"S": status_key(cluster)}, "sk": {"S": sk}},
                                     ConsistentRead=True).get("Item") or {}

    marked = read(WRITER_PREFIX + fingerprint).get("firstWindow", {}).get("S")
    kept_since = read(WRITERS_SINCE_SK).get("since", {}).get("S")
    found = [max(marked, low)] if marked else []
    if kept_since is None or kept_since > low:
        before = datetime.strptime(kept_since, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc) \
            if kept_since else now
        scanned = _first_part_before(dynamodb, table, cluster, fingerprint, since, min(before, now), kept_since)
        found += [scanned] if scanned else []
    return min(found) if found else None


def _first_part_before(dynamodb: Any, table: str, cluster: str, fingerprint: str, since: datetime, until: datetime,
                       before: str | None) -> str | None:
    """The earliest window from ``since`` (and before the window ``before``, if given) with a part of
    ``fingerprint``: one Query per month, filtered on the writer, keys only."""
    low = since.strftime("%Y-%m-%dT%H:00:00Z")
    high = f"window#{before}" if before else "window#~"  # a part's sk "window#<start>#<part>" sorts after "window#<start>"
    month = since.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    while month <= until:
        paginator = dynamodb.get_paginator("query")
        with transient_errors_named("dynamodb:Query"):
            for page in paginator.paginate(
                TableName=table, KeyConditionExpression="pk = :pk AND sk BETWEEN :low AND :high",
                FilterExpression="writer = :writer", ProjectionExpression="sk",
                ExpressionAttributeValues={":pk": {"S": month_key(cluster, f"{month:%Y-%m}")},
                                           ":low": {"S": f"window#{low}"}, ":high": {"S": high},
                                           ":writer": {"S": fingerprint}},
            ):
                starts = [item["sk"]["S"].split("#")[1] for item in page.get("Items", [])]
                if starts:
                    return min(starts)  # key order: the month's first page with one holds the earliest
        month = (month + timedelta(days=32)).replace(day=1)
    return None


def void_writer(table: str, cluster: str, fingerprint: str, from_window: str, now_epoch: int,
                dynamodb: Any = None) -> None:
    """From ``from_window`` on, ``fingerprint``'s parts count for nothing: one UpdateItem, honoured by
    every read after it (month_usage, month_totals)."""
    with transient_errors_named("dynamodb:UpdateItem"):
        (dynamodb or client("dynamodb")).update_item(
            TableName=table, Key={"pk": {"S": status_key(cluster)}, "sk": {"S": VOIDED_SK}},
            UpdateExpression="SET #writer = :from, #ttl = :ttl",
            ExpressionAttributeNames={"#writer": VOIDED_PREFIX + fingerprint, "#ttl": "ttl"},
            ExpressionAttributeValues={":from": {"S": from_window}, ":ttl": {"N": str(now_epoch + USAGE_TTL_SECONDS)}})
