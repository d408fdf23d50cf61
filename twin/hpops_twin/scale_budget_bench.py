"""`make bench`, budget paths at a real cluster's size: 200 / 2,000 / 10,000 users, every one of them
crossing their limit in one sweep at month end, held, then released.

The product's own functions fed stored data (a twin run of a month at 10,000 users would take hours):
moto's DynamoDB, SNS and EventBridge; the month's running per-user total as the sweeps before would
have kept it (usage_store), plus the last day's windows and one window settling, stored by
RecordUsageReport's own store (2,000 users active an hour, or all of them when fewer). Then
CheckUserSpend's work (spend_check.check_user_spend) and SendUserAlerts' pages (the state machine's
loop) until the queue is empty, twice: once with the limits crossed (alerts, holds), once with the
limit raised (releases). The holds list is read as NodeChannel answers it to the controller's agent
and parsed by the agent's own parser.

Per size it prints calls, the peak memory of each step against its function's MemorySize
(template.yaml), its step output against Step Functions' 256 KB, the holds document against
NodeChannel's answer (6 MB, Lambda's synchronous response) and its items against DynamoDB's 400 KB,
and the marker parameter against 4 KB. Seconds are this machine's against moto, not AWS latency.

    python -m hpops_twin.scale_budget_bench [--merge [FILE]] [--sizes 200,2000]
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import sys
import time
import tracemalloc
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from decimal import Decimal
from typing import Any
from unittest import mock

import boto3
import botocore.client
from moto import mock_aws
from moto.dynamodb.models.table import Table

from hpops_core.budget_guard import alert_outbox, hold_state, spend_check, usage_store
from hpops_core.budget_guard.config import UserAlertConfig, UserSpendConfig
from hpops_core.budget_guard.usage_reports import UsageRecord, UsageReport
from hpops_core.budget_guard.user_spend import MonthUsage
from hpops_core.common import clients
from hpops_core.common.state_table import user_holds_partition
from hpops_core.node_channel import contract, user_holds, user_holds_store
from hpops_twin.bench_section import run_alone
from hpops_twin.cost_model import budget_sweep_cost
from hpops_twin.template_model import REPO_ROOT

KEY = "scale_budget"
SIZES = (200, 2_000, 10_000)
ACTIVE_PER_HOUR = 2_000
CLUSTER = "ml-research"
TABLE = "hpops-state"
REGION = "us-east-1"
MONTH_END = dt.datetime(2026, 11, 30, 23, 40, tzinfo=dt.timezone.utc)
GROUP, PARTITION, INSTANCE_TYPE = "gpu-workers", "gpu", "ml.p5.48xlarge"
NODES = 500
LIMIT_USD, RAISED_LIMIT_USD = "1000", "1000000"
RATE_USD_PER_HOUR = "100"
RECORDS_PER_PART = 1_000
STATE_LIMIT = 256 * 1024  # Step Functions: a state's input or output
ITEM_LIMIT = 400 * 1024  # DynamoDB
ANSWER_LIMIT = 6 * 1024 * 1024  # Lambda synchronous response (NodeChannel's answer to the agent)
PARAMETER_LIMIT = 4096  # SSM standard parameter
INSTANCE_ID = "i-0123456789abcdef0"


@dataclass
class ScaleRow:
    users: int
    active_per_hour: int
    alerts_sent: int
    alerts_expected: int
    held: int
    released: int
    check_calls: int
    check_seconds: float
    check_peak_mb: float
    check_memory_mb: int
    check_output_bytes: int
    send_pages: int
    send_calls: int
    send_peak_mb: float
    send_memory_mb: int
    send_output_bytes: int
    holds_answer_bytes: int
    holds_pages: int
    largest_item_bytes: int
    marker_bytes: int
    usage_windows_read: int
    steady_calls: int  # the next hour's check and its empty send, nobody new crossing
    steady_seconds: float
    steady_peak_mb: float
    steady_alerts: int
    # DynamoDB on-demand units of that ordinary hour (the check and SendUserAlerts' one empty Query), and
    # what they cost a month at BudgetSweepSchedule's hourly default (cost_model.budget_sweep_cost)
    steady_read_units: float
    steady_write_units: float
    steady_monthly_usd: float
    crossing_read_units: float  # the sweep where everyone crossed: its check and every SendUserAlerts page
    crossing_write_units: float
    users_usd: str  # the crossing check's users' spend, and what the seeded usage makes it
    expected_users_usd: str

    def verdicts(self) -> dict[str, bool]:
        n = f"{self.users:,} users"
        return {
            f"scale budget, {n}: every alert sent (spend and hold), once": self.alerts_sent == self.alerts_expected,
            f"scale budget, {n}: every user held, then every one released": self.held == self.users == self.released,
            f"scale budget, {n}: users' spend is what the stored usage makes it, to the cent":
                self.users_usd == self.expected_users_usd,
            f"scale budget, {n}: CheckUserSpend peak memory under its MemorySize":
                self.check_peak_mb < self.check_memory_mb,
            f"scale budget, {n}: step outputs under Step Functions' 256 KB":
                max(self.check_output_bytes, self.send_output_bytes) < STATE_LIMIT,
            f"scale budget, {n}: holds list under NodeChannel's 6 MB answer, items under 400 KB":
                self.holds_answer_bytes < ANSWER_LIMIT and self.largest_item_bytes < ITEM_LIMIT,
            f"scale budget, {n}: the month's usage read is the last day's windows, not the month's":
                self.usage_windows_read <= 25,
            f"scale budget, {n}: an hourly check at month end with nobody new: under 30 calls and its MemorySize":
                self.steady_calls < 30 and self.steady_peak_mb < self.check_memory_mb and self.steady_alerts == 0,
        }


def memory_sizes() -> dict[str, int]:
    """MemorySize of each function (its own, else Globals), from template.yaml."""
    import yaml

    class _Loader(yaml.SafeLoader):
        pass

    _Loader.add_multi_constructor("!", lambda loader, suffix, node: None)
    template = yaml.load((REPO_ROOT / "template.yaml").read_text(encoding="utf-8"), Loader=_Loader)
    default = template["Globals"]["Function"]["MemorySize"]
    return {name: (resource.get("Properties") or {}).get("MemorySize") or default
            for name, resource in template["Resources"].items() if resource.get("Type") == "AWS::Serverless::Function"}


class NoBill:
    """Cost Explorer with no complete day billed yet, and a Price List without the type: the override rate."""

    def get_cost_and_usage(self, **_: Any) -> dict:
        return {"ResultsByTime": []}

    def get_products(self, **_: Any) -> dict:
        return {"PriceList": []}

    def get_paginator(self, _: str) -> Any:
        return mock.Mock(paginate=lambda **__: iter([{"PriceList": []}]))


class RecordingTopics:
    """SNS and EventBridge as the sender sees them, keeping what was sent (moto's are too slow for
    30,000 messages in a bench): each batch is checked against the services' limits (10 entries,
    256 KB), and can be told to refuse entries, as SNS and EventBridge do one entry at a time."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, dict]] = []
        self.events: list[dict] = []
        self.refuse = 0  # the next N entries are refused (each batch's first ones)

    def _check(self, entries: list) -> None:
        if not 0 < len(entries) <= 10 or len(json.dumps(entries, default=str)) > 256 * 1024:
            raise ValueError(f"batch of {len(entries)} entries over the service's limits")

    def _refused(self, entry_id: str) -> bool:
        if self.refuse > 0:
            self.refuse -= 1
            return True
        return False

    def publish_batch(self, TopicArn: str, PublishBatchRequestEntries: list) -> dict:
        self._check(PublishBatchRequestEntries)
        ok, failed = [], []
        for entry in PublishBatchRequestEntries:
            if self._refused(entry["Id"]):
                failed.append({"Id": entry["Id"], "Code": "InternalError", "SenderFault": False})
            else:
                self.messages.append((TopicArn, entry))
                ok.append({"Id": entry["Id"], "MessageId": str(len(self.messages))})
        return {"Successful": ok, "Failed": failed}

    def put_events(self, Entries: list) -> dict:
        self._check(Entries)
        self.events += Entries
        return {"FailedEntryCount": 0, "Entries": [{"EventId": str(i)} for i, _ in enumerate(Entries)]}


class CallCount(Counter):
    """Calls by service.operation; ``units``: DynamoDB's on-demand read and write units they took."""

    def __init__(self) -> None:
        super().__init__()
        self.units: Counter = Counter()

    def clear(self) -> None:
        super().clear()
        self.units.clear()


def _item_bytes(item: dict) -> int:
    # Attribute names and values as sent (JSON of the attribute map): close to DynamoDB's item size.
    return len(json.dumps(item, separators=(",", ":")))


def dynamodb_units(operation: str, params: dict, result: dict) -> tuple[str, float]:
    """("read"|"write", units) of one call as DynamoDB on-demand bills it: a read unit per 4 KB read
    (half for an eventually consistent read; a Query's items summed, then rounded), a write unit
    per 1 KB written, twice in a transaction."""
    if operation in ("GetItem", "Query"):
        size = _item_bytes(result.get("Item") or {}) if operation == "GetItem" else sum(
            _item_bytes(item) for item in result.get("Items", []))
        return "read", max(1, math.ceil(size / 4096)) * (1 if params.get("ConsistentRead") else 0.5)
    if operation == "PutItem":
        return "write", max(1, math.ceil(_item_bytes(params["Item"]) / 1024))
    if operation == "DeleteItem":
        return "write", 1
    if operation == "BatchWriteItem":
        return "write", sum(max(1, math.ceil(_item_bytes(request["PutRequest"]["Item"]) / 1024)) if "PutRequest" in request
                            else 1 for requests in params["RequestItems"].values() for request in requests)
    if operation == "TransactWriteItems":
        return "write", sum(2 * max(1, math.ceil(_item_bytes(entry["Put"]["Item"]) / 1024)) if "Put" in entry else 2
                            for entry in params["TransactItems"])
    return "", 0


@contextmanager
def counted_calls() -> Iterator[CallCount]:
    calls = CallCount()
    original = botocore.client.BaseClient._make_api_call

    def counting(self: Any, operation: str, params: dict) -> Any:
        service = self.meta.service_model.service_name
        calls[f"{service}.{operation}"] += 1
        result = original(self, operation, params)
        if service == "dynamodb":
            kind, units = dynamodb_units(operation, params, result)
            if kind:
                calls.units[kind] += units
        return result

    with mock.patch.object(botocore.client.BaseClient, "_make_api_call", counting):
        yield calls


@contextmanager
def partition_queries() -> Iterator[None]:
    """moto's table Query sorts every item of the table on each call (comparing DynamoType objects) and
    then keeps its partition's: paging through 30,000 queued alerts beside 100,000 other items is
    quadratic (most of a 10,000-user run). Here a table Query (no index) sees only its own partition,
    in key order: the same items, order, limits and LastEvaluatedKey, as DynamoDB reads a Query from
    its partition alone."""
    original = Table.query

    def query(self: Table, hash_key: Any, *args: Any, **kwargs: Any) -> Any:
        index_name = kwargs.get("index_name", args[6] if len(args) > 6 else None)
        if index_name or hash_key is None or not self.range_key_attr:
            return original(self, hash_key, *args, **kwargs)
        everything = self.items
        # In key order already (one key per item, not a comparison per pair): moto's own sorts then pass once.
        self.items = ({hash_key: dict(sorted(everything[hash_key].items(), key=lambda pair: pair[0].cast_value))}
                      if hash_key in everything else {})
        try:
            return original(self, hash_key, *args, **kwargs)
        finally:
            self.items = everything

    with mock.patch.object(Table, "query", query):
        yield


@contextmanager
def stored_world(limit: str = LIMIT_USD, action: str = "hold") -> Iterator[dict[str, str]]:
    """moto with the state table, both topics and the functions' environment."""
    environment = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": REGION,
                   "AWS_REGION": REGION, "CLUSTER_NAME": CLUSTER, "STATE_TABLE_NAME": TABLE,
                   "USER_MONTHLY_BUDGET_USD": limit, "USER_THRESHOLDS_PERCENT": "80,100",
                   "PROJECTION_THRESHOLDS_PERCENT": "80,100", "USER_BUDGET_ACTION": action,
                   "RATE_OVERRIDES_JSON": json.dumps({INSTANCE_TYPE: RATE_USD_PER_HOUR}), "STACK_NAME": "hpops"}
    with mock.patch.dict(os.environ, environment), mock_aws(), partition_queries():
        clients.reset_clients()
        boto3.client("dynamodb").create_table(
            TableName=TABLE, BillingMode="PAY_PER_REQUEST",
            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
            AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"},
                                  {"AttributeName": "sk", "AttributeType": "S"}])
        sns = boto3.client("sns")
        os.environ["ALERT_TOPIC_ARN"] = sns.create_topic(Name="alerts")["TopicArn"]
        os.environ["USER_ALERT_TOPIC_ARN"] = sns.create_topic(Name="user-alerts")["TopicArn"]
        try:
            yield environment
        finally:
            clients.reset_clients()


def user_names(users: int) -> list[str]:
    # Directory names as sites give them, of a realistic length (the holds list's size follows it).
    return [f"researcher{i:05d}.lab" for i in range(users)]


def seed_month(names: list[str], now: dt.datetime, active: int, windows: int = 25) -> int:
    """The running total the month's earlier sweeps kept (every user 11 node-hours: over a $1,000
    limit at $100/h), and the windows since: 24 recent and one settling, ``active`` users each, 0.1
    node-hour a user. Returns how many windows it stored."""
    earlier = MonthUsage({name: {PARTITION: [11 * 3600, 11 * 3600 * 8, 5, 0]} for name in names}, {PARTITION: GROUP})
    settled_through = now - dt.timedelta(hours=26)
    hour = settled_through.replace(minute=0, second=0, microsecond=0)
    usage_store._save_running_total(TABLE, CLUSTER, f"{now:%Y-%m}", earlier, {f"{hour:%Y-%m-%dT%H:%M:%SZ}": None},
                                    None, "seed", now, boto3.client("dynamodb"), {})
    groups = [{"InstanceGroupName": GROUP, "InstanceType": INSTANCE_TYPE, "CurrentCount": NODES}]
    stored = 0
    for step in range(1, windows + 1):
        start = hour + dt.timedelta(hours=step)
        if start > now:
            break
        stored += 1
        window_users = [names[(step * active + i) % len(names)] for i in range(min(active, len(names)))]
        records = [UsageRecord(name, PARTITION, 360, 360 * 96, 360 * 8, 1) for name in window_users]
        parts = [records[i:i + RECORDS_PER_PART] for i in range(0, len(records), RECORDS_PER_PART)]
        collected = min(now, start + dt.timedelta(minutes=59))
        for number, part in enumerate(parts):
            report = UsageReport(CLUSTER, INSTANCE_ID, f"{start:%Y-%m-%dT%H:%M:%SZ}",
                                 f"{start + dt.timedelta(hours=1):%Y-%m-%dT%H:%M:%SZ}", collected < now,
                                 contract.USAGE_OK, "", f"{collected:%Y-%m-%dT%H:%M:%SZ}", tuple(part),
                                 {PARTITION: GROUP}, number, len(parts))
            usage_store.store_usage(TABLE, report, int(now.timestamp()), groups)
    return stored


def _measured(run: Any, memory: bool = True) -> tuple[Any, float, float]:
    if not memory:  # tracemalloc slows every allocation, moto's included
        began = time.perf_counter()
        return run(), time.perf_counter() - began, 0.0
    tracemalloc.start()
    began = time.perf_counter()
    try:
        result = run()
    finally:
        seconds = time.perf_counter() - began
        peak = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
    return result, seconds, peak


def sweep(now: dt.datetime, owner: str, calls: Counter, topics: RecordingTopics,
          memory: bool = True) -> tuple[dict, dict]:
    """CheckUserSpend's work, then SendUserAlerts' pages until the queue is empty (the state machine's loop)."""
    observed = {"InstanceGroups": [{"InstanceGroupName": GROUP, "InstanceType": INSTANCE_TYPE, "CurrentCount": NODES,
                                    "TargetCount": NODES}]}
    request = {"cluster": CLUSTER, "mode": "sweep", "now": now.isoformat()}
    calls.clear()
    result, seconds, peak = _measured(lambda: spend_check.check_user_spend(
        UserSpendConfig.from_env(), request, observed, ce=NoBill(), pricing=NoBill(), owner=owner), memory)
    check = {"calls": sum(calls.values()), "units": dict(calls.units), "seconds": seconds, "peak": peak, "result": result,
             "output": len(json.dumps({k: v for k, v in result.items() if k not in ("userRows", "alertSummaries")}))}
    calls.clear()
    sent, pages, send_peak, send_output = 0, 0, 0.0, 0
    config = UserAlertConfig.from_env()
    while True:
        # A page's memory is the same for every page: the first one is measured (tracemalloc is slow).
        page, _, peak = _measured(lambda: spend_check.send_queued_alerts(config, sns=topics, events=topics),
                                  memory and pages == 0)
        pages += 1
        sent += page["sent"]
        send_peak, send_output = max(send_peak, peak), max(send_output, len(json.dumps(page)))
        if not page["more"]:
            break
    send = {"calls": sum(calls.values()), "units": dict(calls.units), "pages": pages, "sent": sent, "peak": send_peak, "output": send_output}
    return check, send


def _largest_item(month: str) -> int:
    """The largest item the budget paths keep for a list that grows with users (JSON of its attributes,
    close to DynamoDB's item size): the holds pages, the hold state's, the running total's, a window part."""
    dynamodb = boto3.client("dynamodb")
    largest = 0
    for pk in (user_holds_partition(CLUSTER), hold_state.state_partition(CLUSTER), usage_store.month_key(CLUSTER, month),
               usage_store.status_key(CLUSTER)):
        for page in dynamodb.get_paginator("query").paginate(
                TableName=TABLE, KeyConditionExpression="pk = :pk", ExpressionAttributeValues={":pk": {"S": pk}}):
            largest = max([largest] + [len(json.dumps(item)) for item in page["Items"]])
    return largest


def measure(users: int) -> ScaleRow:
    names = user_names(users)
    active = min(ACTIVE_PER_HOUR, users)
    memory = memory_sizes()
    topics = RecordingTopics()
    with stored_world():
        windows = seed_month(names, MONTH_END, active)
        clients.client("dynamodb"), clients.client("ssm")  # a warm function: its clients exist
        with counted_calls() as calls:
            check, send = sweep(MONTH_END, "arn:execution:crossing", calls, topics)
            answer = user_holds_store.read(TABLE, CLUSTER)
            held = user_holds.parse_document(answer["value"])["users"]
            holds_answer = len(json.dumps({"ok": True, "instanceId": INSTANCE_ID, "items": {"userHolds": answer}}))
            summary = user_holds_store.summary(TABLE, CLUSTER)
            marker = boto3.client("ssm").get_parameter(Name=contract.instruction_marker_parameter(
                user_holds.user_holds_parameter(CLUSTER)))["Parameter"]["Value"]
            largest = _largest_item(f"{MONTH_END:%Y-%m}")
            usage, outcome = usage_store.month_totals(TABLE, CLUSTER, f"{MONTH_END:%Y-%m}", MONTH_END, save=False)
            queued_left = alert_outbox.count(TABLE, CLUSTER)
            os.environ["USER_MONTHLY_BUDGET_USD"] = RAISED_LIMIT_USD
            later = MONTH_END + dt.timedelta(minutes=10)
            release_check, release_send = sweep(later, "arn:execution:raised", calls, topics, memory=False)
            released = release_check["result"]["holdAlerts"]
            still_held = user_holds.parse_document(user_holds_store.read(TABLE, CLUSTER)["value"])["users"]
    steady, steady_send = measure_steady(names, active)
    steady_units = {f"steady_{kind}_units": steady["units"].get(kind, 0) + steady_send["units"].get(kind, 0)
                    for kind in ("read", "write")}
    # Each user: one actual and one projected alert (the highest threshold crossed), and one hold alert.
    expected = 3 * users
    return ScaleRow(
        users=users, active_per_hour=active,
        alerts_sent=send["sent"] if queued_left == 0 else -queued_left, alerts_expected=expected,
        held=len(held), released=released if not still_held and release_send["sent"] == released else -1,
        check_calls=check["calls"], check_seconds=round(check["seconds"], 2), check_peak_mb=round(check["peak"], 1),
        check_memory_mb=memory["CheckUserSpendFunction"], check_output_bytes=check["output"],
        send_pages=send["pages"], send_calls=send["calls"], send_peak_mb=round(send["peak"], 1),
        send_memory_mb=memory["PublishUserSpendAlertFunction"], send_output_bytes=send["output"],
        holds_answer_bytes=holds_answer, holds_pages=summary["pages"], largest_item_bytes=largest,
        marker_bytes=len(marker.encode()), usage_windows_read=outcome["folded"] + outcome["recent"],
        steady_calls=steady["calls"] + steady_send["calls"], steady_seconds=round(steady["seconds"], 2),
        steady_peak_mb=round(steady["peak"], 1), steady_alerts=steady["result"]["alertCount"],
        **steady_units, steady_monthly_usd=budget_sweep_cost(steady_units["steady_read_units"],
                                                             steady_units["steady_write_units"])["usd"],
        crossing_read_units=check["units"].get("read", 0) + send["units"].get("read", 0),
        crossing_write_units=check["units"].get("write", 0) + send["units"].get("write", 0),
        users_usd=check["result"]["usersUsd"], expected_users_usd=expected_spend(users, active, windows))


def expected_spend(users: int, active: int, windows: int) -> str:
    """What seed_month stored, priced: every user's 11 settled node-hours, plus 0.1 node-hour for each of
    ``active`` users in each of its windows, at RATE_USD_PER_HOUR."""
    node_hours = Decimal(11 * users) + Decimal("0.1") * active * windows
    return f"{node_hours * Decimal(RATE_USD_PER_HOUR):.2f}"


def measure_steady(names: list[str], active: int) -> tuple[dict, dict]:
    """An hourly check at month end where nobody is over their limit: what every ordinary hour costs
    (the running total, the windows settled since, the last day's windows; an empty queue)."""
    with stored_world(limit=RAISED_LIMIT_USD), counted_calls() as calls:
        seed_month(names, MONTH_END, active)
        clients.client("dynamodb"), clients.client("ssm")  # a warm function: its clients exist
        return sweep(MONTH_END, "arn:execution:steady", calls, RecordingTopics())


def render(rows: list[ScaleRow]) -> str:
    lines = ["users | alerts sent | held/released | CheckUserSpend calls, s, peak MB / MemorySize | output B "
             "| SendUserAlerts pages, calls, peak MB | holds answer B (6 MB), pages | largest item B (400 KB) "
             "| marker B (4 KB) | windows read | next hour: calls, s, peak MB"]
    for r in rows:
        lines.append(f"{r.users:,} | {r.alerts_sent:,}/{r.alerts_expected:,} | {r.held:,}/{r.released:,} | "
                     f"{r.check_calls:,}, {r.check_seconds}, {r.check_peak_mb}/{r.check_memory_mb} | "
                     f"{r.check_output_bytes:,} | {r.send_pages}, {r.send_calls:,}, {r.send_peak_mb}/{r.send_memory_mb} | "
                     f"{r.holds_answer_bytes:,}, {r.holds_pages} | {r.largest_item_bytes:,} | {r.marker_bytes} | "
                     f"{r.usage_windows_read} | {r.steady_calls}, {r.steady_seconds}, {r.steady_peak_mb}")
    return "\n".join(lines)


def scale_budget_section(sizes: tuple[int, ...] = SIZES) -> tuple[list[ScaleRow], dict[str, bool]]:
    # moto's and botocore's first use loads their models (about 90 MB): a warm function's memory does
    # not hold moto, so the first size is not charged with it.
    measure_steady(user_names(5), 5)
    rows = [measure(users) for users in sizes]
    verdicts: dict[str, bool] = {}
    for row in rows:
        verdicts |= row.verdicts()
    return rows, verdicts


def main(argv: list[str]) -> int:
    sizes = SIZES
    if "--sizes" in argv:
        index = argv.index("--sizes")
        sizes = tuple(int(n) for n in argv[index + 1].split(","))
        argv = argv[:index] + argv[index + 2:]
    rows, verdicts = scale_budget_section(sizes)
    print(render(rows))
    return run_alone(argv, verdicts, {KEY: [asdict(r) for r in rows]})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
