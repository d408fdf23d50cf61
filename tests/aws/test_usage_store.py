"""Usage report parts in DynamoDB (moto): the newest collection of a window wins, months read whole.

Reports are built by the real agent code and parsed by the stack's parser, so what is stored
is exactly what a controller's report turns into.
"""

from __future__ import annotations

import datetime

import boto3
import pytest
from moto import mock_aws

from hpops_core.budget_guard.usage_capacity import UsageExceedsCapacityError
from hpops_core.budget_guard.usage_reports import UsageRecord, parse_usage_event
from hpops_core.budget_guard.usage_store import (
    USAGE_TTL_SECONDS,
    collector_status,
    first_window_written,
    month_totals,
    month_usage,
    store_usage,
    void_writer,
    voided_writers,
)
from hpops_core.budget_guard.user_spend import fold_windows
from hpops_core.common import clients
from hpops_core.node_channel import contract
from hpops_node_agent import usage

TABLE = "state"
CLUSTER = "lab"
INSTANCE_ID = "i-0123456789abcdef0"
HOUR = 3600
PARTITIONS = usage.PartitionGroups({"gpu": "gpu-workers", "cpu": "cpu-workers"}, 0, "")
# DescribeCluster's groups: room for any window these tests store (the capacity tests use their own).
ROOMY = [{"InstanceGroupName": "gpu-workers", "CurrentCount": 10_000}, {"InstanceGroupName": "cpu-workers", "CurrentCount": 10_000}]


def at(text: str) -> int:
    return int(datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=datetime.timezone.utc).timestamp())


W0 = at("2026-11-23T06:00:00")


@pytest.fixture
def table(monkeypatch):
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_SECURITY_TOKEN": "testing", "AWS_SESSION_TOKEN": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    with mock_aws():
        clients.reset_clients()
        # The keys of template.yaml's SyncStateTable.
        boto3.client("dynamodb").create_table(
            TableName=TABLE,
            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
            AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"},
                                  {"AttributeName": "sk", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        yield TABLE
        clients.reset_clients()


def totals(**node_seconds: int) -> dict:
    """user_partition=seconds -> the agent's totals (8 CPUs and no GPUs per node, one job each)."""
    found = {}
    for name, seconds in node_seconds.items():
        user, partition = name.rsplit("_", 1)
        found[(user, partition)] = {"nodeSeconds": seconds, "cpuSeconds": 8 * seconds, "gpuSeconds": 0, "jobs": 1}
    return found


def reports(window_start: int, now: int, found: dict | None = None, status: str = contract.USAGE_OK,
            reason: str = "", max_bytes: int = contract.MAX_USAGE_REPORT_BYTES):
    """The parsed parts of one collection, as the stack would receive them."""
    detail = usage.build_report(CLUSTER, INSTANCE_ID, window_start, now, status, reason, totals=found,
                                partitions=PARTITIONS)
    return [parse_usage_event({"source": contract.REPORT_SOURCE, "detail-type": contract.USAGE_DETAIL_TYPE,
                               "detail": part}) for part in usage.split_report(detail, max_bytes)]


def store_all(table: str, parts) -> list[dict]:
    return [store_usage(table, part, now_epoch=W0, instance_groups=ROOMY) for part in parts]


def seconds_by_user(window) -> dict:
    return {(r.user, r.partition): r.node_seconds for r in window.records}


def many_users(count: int, seconds: int) -> dict:
    return {(f"user{i:04d}", "gpu"): {"nodeSeconds": seconds, "cpuSeconds": 96 * seconds, "gpuSeconds": 8 * seconds,
                                      "jobs": 1} for i in range(count)}


# --------------------------------------------------------------------------- one window


def test_storing_the_same_report_twice_leaves_one_window(table):
    parts = reports(W0, W0 + 1800, totals(alice_gpu=3600, bob_cpu=1800))
    assert store_all(table, parts) == [{"window": True, "status": True}]
    # EventBridge delivers at least once: the same report again is accepted and changes nothing.
    assert store_all(table, parts) == [{"window": True, "status": True}]
    windows = month_usage(table, CLUSTER, "2026-11")
    assert len(windows) == 1
    assert windows[0].window_start == "2026-11-23T06:00:00Z"
    assert windows[0].collected_at == "2026-11-23T06:30:00Z" and windows[0].final is False
    assert windows[0].records == (UsageRecord("alice", "gpu", 3600, 8 * 3600, 0, 1),
                                  UsageRecord("bob", "cpu", 1800, 8 * 1800, 0, 1))
    assert windows[0].partition_groups == {"cpu": "cpu-workers", "gpu": "gpu-workers"}


def test_a_newer_collection_replaces_the_older_and_a_late_retry_of_the_older_does_not(table):
    early = reports(W0, W0 + 1200, totals(alice_gpu=1200))
    later = reports(W0, W0 + 1800, totals(alice_gpu=1800, bob_cpu=600))
    store_all(table, early)
    assert store_all(table, later) == [{"window": True, "status": True}]
    [window] = month_usage(table, CLUSTER, "2026-11")
    assert seconds_by_user(window) == {("alice", "gpu"): 1800, ("bob", "cpu"): 600}

    # The first collection's PutEvents was retried and arrives last: it must not undo the newer one.
    assert store_all(table, early) == [{"window": False, "status": False}]
    [window] = month_usage(table, CLUSTER, "2026-11")
    assert seconds_by_user(window) == {("alice", "gpu"): 1800, ("bob", "cpu"): 600}
    assert window.collected_at == "2026-11-23T06:30:00Z"
    assert collector_status(table, CLUSTER).collected_at == "2026-11-23T06:30:00Z"


def test_the_final_collection_marks_the_window_final(table):
    store_all(table, reports(W0, W0 + 1800, totals(alice_gpu=1800)))
    store_all(table, reports(W0, W0 + HOUR + contract.USAGE_SETTLE_SECONDS, totals(alice_gpu=3600)))
    [window] = month_usage(table, CLUSTER, "2026-11")
    assert window.final is True and seconds_by_user(window) == {("alice", "gpu"): 3600}


def test_a_window_recollected_into_fewer_parts_reads_back_only_the_newest_parts(table):
    big = many_users(60, 3600)
    first = reports(W0, W0 + 1200, big, max_bytes=4000)
    assert len(first) == 3
    store_all(table, first)
    assert len(month_usage(table, CLUSTER, "2026-11")[0].records) == 60

    # Twenty users' jobs turned out to be someone else's: the re-collection has 40 records, in 2 parts.
    fewer = {key: dict(value, nodeSeconds=1800) for key, value in list(big.items())[:40]}
    second = reports(W0, W0 + 1800, fewer, max_bytes=4000)
    assert len(second) == 2
    store_all(table, second)
    [window] = month_usage(table, CLUSTER, "2026-11")
    assert len(window.records) == 40
    assert seconds_by_user(window) == {key: 1800 for key in fewer}, "no record of the old third part"

    # The old third part's event delivered once more, late: still not part of the window.
    store_usage(table, first[2], now_epoch=W0, instance_groups=ROOMY)
    assert seconds_by_user(month_usage(table, CLUSTER, "2026-11")[0]) == {key: 1800 for key in fewer}


def test_a_failed_collection_keeps_the_last_good_usage_and_says_why(table):
    store_all(table, reports(W0, W0 + 1800, totals(alice_gpu=1800)))
    assert collector_status(table, CLUSTER).status == contract.USAGE_OK

    failed = reports(W0, W0 + 2400, status=contract.USAGE_SACCT_FAILED,
                     reason="sacct: error: Problem talking to the database: Connection refused")
    assert store_all(table, failed) == [{"window": False, "status": True}]
    [window] = month_usage(table, CLUSTER, "2026-11")
    assert seconds_by_user(window) == {("alice", "gpu"): 1800}, "no zeros for a window sacct could not read"
    status = collector_status(table, CLUSTER)
    assert (status.status, status.collected_at, status.window_start, status.instance_id) == (
        contract.USAGE_SACCT_FAILED, "2026-11-23T06:40:00Z", "2026-11-23T06:00:00Z", INSTANCE_ID)
    assert "Connection refused" in status.reason

    # sacct answers again: the status recovers and the window moves on.
    store_all(table, reports(W0, W0 + 3000, totals(alice_gpu=3000)))
    assert collector_status(table, CLUSTER).status == contract.USAGE_OK
    assert seconds_by_user(month_usage(table, CLUSTER, "2026-11")[0]) == {("alice", "gpu"): 3000}


def test_an_ok_collection_with_no_jobs_replaces_one_that_had_some(table):
    # Jobs are requeued and their accounting corrected: the newest reading of the window is the truth.
    store_all(table, reports(W0, W0 + 1200, totals(alice_gpu=1200)))
    store_all(table, reports(W0, W0 + 1800, {}))
    [window] = month_usage(table, CLUSTER, "2026-11")
    assert window.records == ()


def test_no_status_before_the_first_report(table):
    assert collector_status(table, CLUSTER) is None
    assert month_usage(table, CLUSTER, "2026-11") == []


def test_stored_usage_is_kept_long_enough_to_charge_back_last_years_month(table):
    store_all(table, reports(W0, W0 + 1800, totals(alice_gpu=1800)))
    items = boto3.client("dynamodb").scan(TableName=TABLE)["Items"]
    assert sorted(item["sk"]["S"] for item in items) == ["status", "total#2026-11-23T06:00:00Z",
                                                         "window#2026-11-23T06:00:00Z#0001"]
    assert {int(item["ttl"]["N"]) for item in items} == {W0 + USAGE_TTL_SECONDS}
    assert USAGE_TTL_SECONDS > 366 * 24 * HOUR


# --------------------------------------------------------------------------- a month


def test_a_month_reads_its_own_windows_oldest_first(table):
    starts = ["2026-10-31T23:00:00", "2026-11-30T23:00:00", "2026-11-01T00:00:00", "2026-12-01T00:00:00",
              "2026-11-15T12:00:00", "2026-11-01T01:00:00"]
    for start in starts:
        store_all(table, reports(at(start), at(start) + 1800, totals(alice_gpu=1800)))
    # Another cluster's windows in the same month are not this cluster's spend.
    other = usage.build_report("other", INSTANCE_ID, at("2026-11-02T00:00:00"), at("2026-11-02T00:30:00"),
                               contract.USAGE_OK, totals=totals(mallory_gpu=3600))
    store_usage(table, parse_usage_event({"source": contract.REPORT_SOURCE, "detail-type": contract.USAGE_DETAIL_TYPE,
                                          "detail": other}), now_epoch=W0, instance_groups=ROOMY)

    november = month_usage(table, CLUSTER, "2026-11")
    assert [w.window_start for w in november] == [
        "2026-11-01T00:00:00Z", "2026-11-01T01:00:00Z", "2026-11-15T12:00:00Z", "2026-11-30T23:00:00Z"]
    assert all(seconds_by_user(w) == {("alice", "gpu"): 1800} for w in november)
    assert [w.window_start for w in month_usage(table, CLUSTER, "2026-10")] == ["2026-10-31T23:00:00Z"]
    assert [w.window_start for w in month_usage(table, CLUSTER, "2026-12")] == ["2026-12-01T00:00:00Z"]
    assert [seconds_by_user(w) for w in month_usage(table, "other", "2026-11")] == [{("mallory", "gpu"): 3600}]


def test_a_month_larger_than_one_query_page_is_read_whole(table):
    # DynamoDB returns at most 1 MB per Query page; a busy month is far more than that.
    query_pages = []
    clients.client("dynamodb").meta.events.register("after-call.dynamodb.Query",
                                                     lambda **kwargs: query_pages.append(1))
    first = at("2026-11-01T00:00:00")
    windows = 16
    for index in range(windows):
        # 1,000 records a window, each window's report in two parts
        store_all(table, reports(first + index * HOUR, first + index * HOUR + 1800, many_users(1000, 60 + index),
                                 max_bytes=100_000))
    november = month_usage(table, CLUSTER, "2026-11")
    assert len(query_pages) > 1, "the month did not span several pages; this test proves nothing"
    assert [w.window_start for w in november] == [
        f"2026-11-01T{hour:02d}:00:00Z" for hour in range(windows)]
    assert [len(w.records) for w in november] == [1000] * windows
    assert [w.records[0].node_seconds for w in november] == [60 + index for index in range(windows)]


# --------------------------------------------------------------------------- a window's parts against capacity

TWO_GPU_NODES = [{"InstanceGroupName": "gpu-workers", "CurrentCount": 2, "TargetCount": 2},
                 {"InstanceGroupName": "cpu-workers", "CurrentCount": 100, "TargetCount": 100}]


def window_records(table) -> dict:
    windows = month_usage(table, CLUSTER, "2026-11")
    return {} if not windows else seconds_by_user(windows[0])


def test_parts_each_within_capacity_but_over_it_together_are_refused_from_the_part_that_crosses(table):
    # 60 users x 130 node-seconds on gpu: 7,800 in the window, the gpu group's 2 nodes run 7,200.
    parts = reports(W0, W0 + 1800, many_users(60, 130), max_bytes=4000)
    assert len(parts) == 3 and all(sum(r.node_seconds for r in p.records) <= 2 * HOUR for p in parts)
    stored = [store_usage(table, part, now_epoch=W0, instance_groups=TWO_GPU_NODES) for part in parts[:2]]
    assert stored == [{"window": True, "status": True}] * 2
    before = boto3.client("dynamodb").scan(TableName=TABLE, ConsistentRead=True)["Items"]
    kept = window_records(table)

    with pytest.raises(UsageExceedsCapacityError, match=r"partition gpu in the window from 2026-11-23T06:00:00Z "
                                                        r"would reach \(with part 3 of 3.*7800 node-seconds"):
        store_usage(table, parts[2], now_epoch=W0, instance_groups=TWO_GPU_NODES)
    # Nothing of the third part is kept (nor the collector's status): its users are not charged.
    assert boto3.client("dynamodb").scan(TableName=TABLE, ConsistentRead=True)["Items"] == before
    assert window_records(table) == kept and len(kept) == sum(len(p.records) for p in parts[:2])
    assert sum(window_records(table).values()) <= 2 * HOUR


def test_a_redelivered_part_is_accepted_and_counted_once(table):
    # 60 users x 110 node-seconds: 6,600 of the 7,200 the gpu group could run; each part ~2,200.
    parts = reports(W0, W0 + 1800, many_users(60, 110), max_bytes=4000)
    for part in parts + parts[::-1] + parts:  # EventBridge delivers at least once, in any order
        assert store_usage(table, part, now_epoch=W0, instance_groups=TWO_GPU_NODES) == {"window": True, "status": True}
    assert sum(window_records(table).values()) == 6600
    # Counted once: what the window holds still leaves exactly 600 node-seconds of room.
    extra = reports(W0, W0 + 1800, many_users(60, 110) | {("zed", "gpu"): {"nodeSeconds": 601, "cpuSeconds": 0,
                                                                           "gpuSeconds": 0, "jobs": 1}}, max_bytes=4000)
    with pytest.raises(UsageExceedsCapacityError):
        for part in extra:
            store_usage(table, part, now_epoch=W0, instance_groups=TWO_GPU_NODES)


def test_a_newer_collection_starts_the_windows_sum_afresh(table):
    # Usage moves between collections (requeued jobs): the newest collection is bounded alone, not added.
    store_all_bounded = lambda parts: [store_usage(table, p, now_epoch=W0, instance_groups=TWO_GPU_NODES)  # noqa: E731
                                       for p in parts]
    store_all_bounded(reports(W0, W0 + 1200, many_users(60, 100), max_bytes=4000))
    store_all_bounded(reports(W0, W0 + 1800, many_users(60, 110), max_bytes=4000))
    assert sum(window_records(table).values()) == 6600


def test_two_parts_of_a_window_arriving_at_once_cannot_both_add_to_the_same_sum(table):
    parts = reports(W0, W0 + 1800, many_users(60, 130), max_bytes=4000)
    store_usage(table, parts[0], now_epoch=W0, instance_groups=TWO_GPU_NODES)
    # Part 3 is delivered while part 2 is between reading the window's total and writing it.
    raced: list = []

    def part_3_lands(**_):
        if not raced:  # once: part 3's own read comes through here too
            raced.append("landing")
            raced[0] = store_usage(table, parts[2], now_epoch=W0, instance_groups=TWO_GPU_NODES)

    clients.client("dynamodb").meta.events.register("after-call.dynamodb.GetItem", part_3_lands)
    with pytest.raises(UsageExceedsCapacityError, match="part 2 of 3"):
        store_usage(table, parts[1], now_epoch=W0, instance_groups=TWO_GPU_NODES)
    assert raced == [{"window": True, "status": True}]
    assert sum(window_records(table).values()) == sum(r.node_seconds for p in (parts[0], parts[2]) for r in p.records)


# --------------------------------------------------------------------------- the month's running total


def _per_user(usage) -> dict:
    return {user: {p: tuple(v) for p, v in partitions.items()} for user, partitions in usage.users.items()}


def _store_hours(table: str, first: int, hours: int, found_of) -> None:
    for hour in range(hours):
        start = first + hour * HOUR
        store_all(table, reports(start, start + HOUR, found_of(hour)))


def test_the_running_total_sums_each_window_once_and_a_later_sweep_reads_only_the_last_day(table):
    first = at("2026-11-01T00:00:00")
    _store_hours(table, first, 72, lambda hour: totals(alice_gpu=600 + hour, bob_cpu=60 * (hour % 3)))
    now = datetime.datetime.fromtimestamp(first + 72 * HOUR, datetime.timezone.utc)
    whole = fold_windows(month_usage(table, CLUSTER, "2026-11"), now)

    usage, outcome = month_totals(table, CLUSTER, "2026-11", now, "sweep-1")
    assert _per_user(usage) == _per_user(whole)
    assert (outcome["folded"], outcome["recent"], outcome["saved"]) == (48, 24, True)

    # An hour later: the kept total, one window settled since, the last day's 24 read as they are.
    store_all(table, reports(first + 72 * HOUR, first + 73 * HOUR, totals(alice_gpu=5000)))
    later = now + datetime.timedelta(hours=1)
    usage, outcome = month_totals(table, CLUSTER, "2026-11", later, "sweep-2")
    assert (outcome["kept"], outcome["folded"], outcome["recent"], outcome["reread"]) == (48, 1, 24, False)
    assert _per_user(usage) == _per_user(fold_windows(month_usage(table, CLUSTER, "2026-11"), later))


def test_a_repeated_part_a_new_collection_or_a_late_window_of_a_settled_hour_still_counts_once(table):
    first = at("2026-11-01T00:00:00")
    _store_hours(table, first, 48, lambda hour: totals(alice_gpu=1000) if hour != 5 else {})
    now = datetime.datetime.fromtimestamp(first + 48 * HOUR, datetime.timezone.utc)
    month_totals(table, CLUSTER, "2026-11", now, "sweep-1")

    # The same report of hour 2 delivered again (EventBridge at least once): counted once.
    store_all(table, reports(first + 2 * HOUR, first + 3 * HOUR, totals(alice_gpu=1000)))
    # Hour 3 collected again later with more usage: the newer collection replaces the older.
    store_all(table, reports(first + 3 * HOUR, first + 4 * HOUR + 60, totals(alice_gpu=1500)))
    # Hour 5's report was lost and arrives a day late (the agent catching up).
    store_all(table, reports(first + 5 * HOUR, first + 6 * HOUR, totals(alice_gpu=700, carol_cpu=300)))
    usage, outcome = month_totals(table, CLUSTER, "2026-11", now, "sweep-2")
    assert outcome["reread"] is True
    assert usage.users["alice"]["gpu"][0] == 47 * 1000 + 500 + 700
    assert usage.users["carol"]["cpu"][0] == 300
    assert _per_user(usage) == _per_user(fold_windows(month_usage(table, CLUSTER, "2026-11"), now))
    # Kept again: the next sweep needs no re-read.
    assert month_totals(table, CLUSTER, "2026-11", now, "sweep-3")[1]["reread"] is False


# --------------------------------------------------------------------------- a replaced key's windows

IMPOSTOR, REAL = "SHA256:" + "i" * 43, "SHA256:" + "r" * 43


def test_a_replaced_keys_windows_count_for_nothing_from_the_first_it_wrote_and_the_real_agents_resend_counts(table):
    first = at("2026-11-01T00:00:00")
    # Hours 0-23 by the real key; hours 24-47 by a key later replaced, charging carol a GPU day each hour.
    for hour in range(48):
        start, writer = first + hour * HOUR, REAL if hour < 24 else IMPOSTOR
        found = totals(alice_gpu=1000) if hour < 24 else totals(carol_gpu=3600)
        for part in reports(start, start + HOUR, found):
            store_usage(table, part, now_epoch=W0, instance_groups=ROOMY, sequence=10**15 + hour, writer=writer)
    now = datetime.datetime.fromtimestamp(first + 48 * HOUR, datetime.timezone.utc)
    usage, _ = month_totals(table, CLUSTER, "2026-11", now, "sweep-1")
    assert usage.users["carol"]["gpu"][0] == 24 * 3600

    since = now - datetime.timedelta(days=62)
    assert first_window_written(table, CLUSTER, IMPOSTOR, since, now) == "2026-11-02T00:00:00Z"
    assert first_window_written(table, CLUSTER, "SHA256:" + "n" * 43, since, now) is None
    void_writer(table, CLUSTER, IMPOSTOR, "2026-11-02T00:00:00Z", W0)
    assert voided_writers(table, CLUSTER) == {IMPOSTOR: "2026-11-02T00:00:00Z"}
    # The very next read, the kept running total included, counts none of it; the real key's hours stay.
    usage, outcome = month_totals(table, CLUSTER, "2026-11", now, "sweep-2")
    assert outcome["reread"] is True and "carol" not in usage.users
    assert usage.users["alice"]["gpu"][0] == 24 * 1000
    assert "carol" not in {r.user for w in month_usage(table, CLUSTER, "2026-11") for r in w.records}

    # The real agent re-sends hour 30 with a lower sequence than the replaced key's part: it is kept
    # (sequences are one key's count), and counts.
    start = first + 30 * HOUR
    for part in reports(start, start + HOUR + 60, totals(alice_gpu=900)):
        assert store_usage(table, part, now_epoch=W0, instance_groups=ROOMY, sequence=5, writer=REAL)["window"]
    usage, _ = month_totals(table, CLUSTER, "2026-11", now, "sweep-3")
    assert usage.users["alice"]["gpu"][0] == 24 * 1000 + 900 and "carol" not in usage.users


def _node_channel():
    """functions/node_channel/app.py as Lambda loads it (its own directory is not a package)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "functions" / "node_channel" / "app.py"
    spec = importlib.util.spec_from_file_location("usage_store_test_node_channel", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("kept", [True, False])
def test_a_second_replacement_before_the_first_discard_finished_still_voids_the_first_replaced_key(table, kept):
    """Key A (an impostor) wrote day 1; the operator approved B over it, but NodeChannel failed before the
    discard (the record still names A). Before B's agent asks again, the operator approves C over B (a
    re-image: B's day-2 windows kept, or not). C's discard voids A's windows too: A's day never counts."""
    from types import SimpleNamespace

    from hpops_core.node_channel import enrollment_store
    from hpops_core.node_channel.enrollment import Approval, Enrollment, replacing

    a, b, c = ("SHA256:" + letter * 43 for letter in "abc")
    first = at("2026-11-01T00:00:00")
    for hour in range(48):
        start, writer = first + hour * HOUR, a if hour < 24 else b
        found = totals(carol_gpu=3600) if hour < 24 else totals(alice_gpu=1000)
        for part in reports(start, start + HOUR, found):
            store_usage(table, part, now_epoch=W0, instance_groups=ROOMY, sequence=10**15 + hour, writer=writer)

    def enrolled(fingerprint, via):
        return Enrollment(CLUSTER, INSTANCE_ID, "ssh-ed25519 " + "A" * 68, fingerprint, "controller-machine",
                          "controller", "10.1.0.9", "enrolled", "2026-11-03T00:00:00Z", via)

    standing = replacing(enrolled(b, "approval"), enrolled(a, "window"), None)  # stored, discard unfinished
    assert standing.keys_to_void == (a,)
    approval = Approval(INSTANCE_ID, c, "2026-11-03T00:00:00Z", keep_usage_of=b if kept else "")
    record = replacing(enrolled(c, "approval"), standing, approval)
    assert record.keys_to_void == ((a,) if kept else (a, b))
    enrollment_store.put_first(table, record)

    now = datetime.datetime.fromtimestamp(first + 48 * HOUR, datetime.timezone.utc)
    finished = _node_channel().discard_replaced(SimpleNamespace(state_table=table, cluster_name=CLUSTER), record, now)
    voided = {a: "2026-11-01T00:00:00Z"} | ({} if kept else {b: "2026-11-02T00:00:00Z"})
    assert voided_writers(table, CLUSTER) == voided
    assert (finished.replaced_key, finished.recollect_from) == ("", "2026-11-01T00:00:00Z")
    stored = enrollment_store.get_enrollment(table, CLUSTER, INSTANCE_ID)
    assert (stored.replaced_key, stored.earlier_replaced_keys, stored.recollect_from) == ("", (), "2026-11-01T00:00:00Z")
    usage_now, _ = month_totals(table, CLUSTER, "2026-11", now, "sweep-1")
    assert "carol" not in usage_now.users
    assert usage_now.users.get("alice", {}).get("gpu", [0])[0] == (24 * 1000 if kept else 0)
