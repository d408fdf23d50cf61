"""Cost Explorer's answer kept for a day, so the hourly sweep asks it about once a day, not 24 times.

Cost Explorer charges $0.01 per request and refreshes its own data at least once every 24 hours
(about three times a day), and billed rates change at most that often. So CheckUserSpend (and
`hpops cost`) read the billed month from the state table and ask Cost Explorer only when the kept
answer is missing, unreadable, for another request (the month turned, the filter changed), or
older than COST_EXPLORER_MAX_AGE_HOURS (config.py). A scale-out's projection asks afresh (its early alert is the
point, and it is rare) and keeps what it got, so the next sweep reuses it.

Item: pk ``ce-cache#<cluster>``, sk ``billed-month``: ``query`` (the request's parameters except the
period's End, which moves every day: a kept answer says which days it covers, and the spend report
estimates the hours after them from the nodes up now, so an answer from yesterday stays consistent),
``fetchedAt``, ``result``. Written only if newer than what is kept (a condition on fetchedAt): of two
sweeps that fetched at the same time the later answer stays, and a late writer never replaces it.

Time is an input: ``now`` is the sweep's start time, never the clock here.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from decimal import Decimal
from types import MappingProxyType
from typing import Any

from botocore.exceptions import ClientError

from hpops_core.budget_guard.pricing import billed_month, billed_request
from hpops_core.budget_guard.rates import BilledMonth, BilledUsage, no_billed_month
from hpops_core.common.clients import client, transient_errors_named

__all__ = ["CacheOutcome", "billed_month_cached", "cache_key", "kept_answer", "query_of"]

SORT_KEY = "billed-month"
# Scheduled ticks land a few seconds early or late: the hourly sweep 24 h minus a few seconds after
# the fetch refreshes, instead of serving a 25-hour-old answer.
TICK_SLACK = dt.timedelta(minutes=5)
# A kept answer outlives its month by a little, then DynamoDB drops it (a deleted cluster's too).
TTL_SECONDS = 40 * 24 * 3600
UNREADABLE = "CostExplorerCacheUnreadable"


def cache_key(cluster: str) -> str:
    return f"ce-cache#{cluster}"


def query_of(request: Mapping[str, Any]) -> str:
    """What a kept answer answers: the request without the period's End (see the module's docstring)."""
    return json.dumps({**request, "TimePeriod": {"Start": request["TimePeriod"]["Start"]}},
                      sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class CacheOutcome:
    source: str  # "cache" | "cost-explorer" | "none" (the 1st: nothing billed to ask about)
    reason: str
    fetched_at: str | None
    problem: str | None = None  # a named problem with the kept item: logged, never fatal

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


def _iso(when: dt.datetime) -> str:
    return when.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _time(text: str) -> dt.datetime:
    value = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    if value.tzinfo is None:
        raise ValueError(f"fetchedAt {text!r} has no time zone")
    return value


def _decimal(text: Any) -> Decimal:
    value = Decimal(str(text))
    if not value.is_finite():
        raise ValueError(f"{text!r} is not a finite amount")
    return value


def result_of(billed: BilledMonth) -> str:
    return json.dumps({
        "start": billed.start, "end": billed.end, "otherUsd": f"{billed.other_cost_usd:f}",
        "byType": {t: {"usd": f"{u.cost_usd:f}", "hours": f"{u.hours:f}"} for t, u in billed.by_instance_type.items()},
    }, sort_keys=True, separators=(",", ":"))


def billed_of(result: str, fetched_at: str) -> BilledMonth:
    """The BilledMonth a kept ``result`` holds; KeyError/TypeError/ValueError if it is not one."""
    raw = json.loads(result)
    start, end = str(raw["start"]), str(raw["end"])
    for day in (start, end):
        dt.date.fromisoformat(day)
    usage = {str(t): BilledUsage(str(t), _decimal(u["usd"]), _decimal(u["hours"]), start, end)
             for t, u in sorted(raw["byType"].items())}
    return BilledMonth(MappingProxyType(usage), _decimal(raw["otherUsd"]), start, end, fetched_at=fetched_at)


def kept_answer(item: Mapping[str, Any] | None, query: str, now: dt.datetime,
                max_age: dt.timedelta) -> tuple[BilledMonth | None, str, str | None]:
    """Pure: (the kept answer to use, or None to ask Cost Explorer; why; a named problem or None)."""
    if not item:
        return None, "no kept answer yet", None
    try:
        fetched_text = item["fetchedAt"]["S"]
        fetched = _time(fetched_text)
        kept_query = item["query"]["S"]
        billed = billed_of(item["result"]["S"], fetched_text)
    except (KeyError, TypeError, ValueError, ArithmeticError, AttributeError) as error:
        return None, f"the kept answer cannot be read ({type(error).__name__}: {error}); asking again", UNREADABLE
    if kept_query != query:
        try:
            other_month = json.loads(kept_query)["TimePeriod"]["Start"] != json.loads(query)["TimePeriod"]["Start"]
        except (ValueError, KeyError, TypeError):
            other_month = False
        return None, ("the kept answer is for another month" if other_month
                      else "the kept answer is for another request (filter, metrics or grouping changed)"), None
    age = now - fetched
    hours = f"{age.total_seconds() / 3600:.1f} h"
    if age < dt.timedelta(0):
        return None, f"the kept answer was fetched at {fetched_text}, after now", None
    if age >= max_age - TICK_SLACK:
        return None, f"the kept answer is {hours} old (max {max_age.total_seconds() / 3600:.0f} h)", None
    return billed, f"kept answer fetched at {fetched_text}, {hours} old (max {max_age.total_seconds() / 3600:.0f} h)", None


def _store(dynamodb: Any, table: str, cluster: str, query: str, billed: BilledMonth, now: dt.datetime,
           replace: bool = False) -> bool:
    """Keep ``billed`` unless a newer answer is kept already (a concurrent sweep's or a scale-out's).

    ``replace``: the kept item could not be read, so its fetchedAt cannot be trusted to compare with
    (text that sorts after any time would keep a broken item, and a request, every hour)."""
    item = {
        "pk": {"S": cache_key(cluster)}, "sk": {"S": SORT_KEY}, "query": {"S": query},
        "fetchedAt": {"S": billed.fetched_at or _iso(now)}, "result": {"S": result_of(billed)},
        "ttl": {"N": str(int(now.timestamp()) + TTL_SECONDS)},
    }
    try:
        with transient_errors_named("dynamodb:PutItem"):
            if replace:
                dynamodb.put_item(TableName=table, Item=item)
            else:
                dynamodb.put_item(
                    TableName=table, Item=item,
                    ConditionExpression="attribute_not_exists(pk) OR NOT attribute_type(fetchedAt, :text) "
                                        "OR fetchedAt < :fetched",
                    ExpressionAttributeValues={":fetched": item["fetchedAt"], ":text": {"S": "S"}})
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
            return False
        raise
    return True


def billed_month_cached(ce: Any, table: str, cluster: str, now: dt.datetime, max_age_hours: int, *,
                        fresh: bool = False, keep: bool = True, dynamodb: Any = None) -> tuple[BilledMonth, CacheOutcome]:
    """The cluster's billed month: the kept answer if it is usable, else one GetCostAndUsage, kept.

    ``fresh``: ask Cost Explorer whatever is kept (a scale-out's projection, `hpops cost --fresh`).
    ``keep``: False for the operator CLI, which only reads the state table (its policy has no PutItem there).
    ``dynamodb``: a client of the stack's region (the operator CLI's session); the Lambda's own by default."""
    request = billed_request(cluster, now)
    if request is None:
        return no_billed_month(), CacheOutcome("none", "the 1st of the month: no complete day billed yet", None)
    query = query_of(request)
    db = dynamodb or client("dynamodb")
    problem = None
    if fresh:
        reason = "a fresh answer was asked for"
    else:
        with transient_errors_named("dynamodb:GetItem"):
            item = db.get_item(TableName=table, Key={"pk": {"S": cache_key(cluster)}, "sk": {"S": SORT_KEY}},
                               ConsistentRead=True).get("Item")
        kept, reason, problem = kept_answer(item, query, now, dt.timedelta(hours=max_age_hours))
        if kept is not None:
            return kept, CacheOutcome("cache", reason, kept.fetched_at)
    billed = billed_month(ce, cluster, now)
    if keep and not _store(db, table, cluster, query, billed, now, replace=problem is not None):
        reason += "; a newer answer is kept already, so this one is used once and not kept"
    return billed, CacheOutcome("cost-explorer", reason, billed.fetched_at, problem)
