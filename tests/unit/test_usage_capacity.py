"""A usage window's parts against the cluster's capacity (pure): the running total a part makes, and
the refusal of the part that would take the window over."""

import pytest

from hpops_core.budget_guard.usage_capacity import (
    MAX_WINDOW_ENTRIES,
    UsageExceedsCapacityError,
    UsageWindowTooLarge,
    WindowTotal,
    check_window,
    next_total,
)
from hpops_core.budget_guard.usage_reports import MalformedUsageReport, UsageRecord, UsageReport, parse_usage_event
from hpops_core.node_channel import contract

GROUPS = [{"InstanceGroupName": "gpu-nodes", "CurrentCount": 2, "TargetCount": 2,
           "SlurmConfig": {"NodeType": "Compute", "PartitionNames": ["gpu"]}},
          {"InstanceGroupName": "cpu-nodes", "CurrentCount": 10, "TargetCount": 10,
           "SlurmConfig": {"NodeType": "Compute", "PartitionNames": ["cpu"]}}]
HOUR = 3600


def part(number, parts, collected="2026-11-26T10:30:00Z", **node_seconds):
    records = tuple(UsageRecord(f"user{i}", partition, seconds, 0, 0, 1)
                    for i, (partition, seconds) in enumerate(node_seconds.items()))
    return UsageReport("ml", "i-0123456789abcdef0", "2026-11-26T10:00:00Z", "2026-11-26T11:00:00Z", False, "ok", "",
                       collected, records, {}, number, parts)


def add(total, report):
    made = next_total(total, report)
    check_window(made, report, GROUPS)
    return made


def test_parts_under_the_bound_alone_are_refused_once_their_sum_is_over():
    total = add(None, part(1, 3, gpu=3000, cpu=HOUR))
    total = add(total, part(2, 3, gpu=3000))
    assert total.used() == {"gpu": 6000, "cpu": HOUR} and total.version == 2
    third = part(3, 3, gpu=3000)
    with pytest.raises(UsageExceedsCapacityError, match=r"partition gpu .* would reach \(with part 3 of 3.*"
                                                        r"9000 node-seconds; group gpu-nodes \(2 instances"):
        check_window(next_total(total, third), third, GROUPS)
    # Each partition is bounded by its own group: cpu has 10 nodes' worth of room.
    assert add(total, part(3, 3, cpu=9 * HOUR)).used() == {"gpu": 6000, "cpu": 10 * HOUR}


def test_a_redelivered_part_replaces_itself_and_adds_nothing():
    first, second = part(1, 2, gpu=3600), part(2, 2, gpu=3600)
    total = add(add(None, first), second)
    again = add(add(total, second), first)  # redelivered, in any order
    assert again.used() == {"gpu": 7200} and again.parts == total.parts


def test_a_newer_collection_starts_afresh_and_an_older_ones_part_counts_for_nothing():
    old = add(add(None, part(1, 2, gpu=3600)), part(2, 2, gpu=3600))
    newer = add(old, part(1, 1, "2026-11-26T10:45:00Z", gpu=7000))
    assert newer.used() == {"gpu": 7000} and newer.collected_at == "2026-11-26T10:45:00Z"
    assert next_total(newer, part(2, 2, gpu=3600)) is None  # the old collection's part, late: never read back


def test_a_window_keeping_more_pairs_than_its_total_item_holds_is_refused_by_name():
    crowded = WindowTotal("2026-11-26T10:30:00Z", {n: {"cpu": 1} for n in range(1, MAX_WINDOW_ENTRIES + 1)})
    one_more = part(MAX_WINDOW_ENTRIES + 1, 1000, cpu=1)
    with pytest.raises(UsageWindowTooLarge):
        check_window(next_total(crowded, one_more), one_more, GROUPS)


def event(start, end):
    detail = {"format": contract.USAGE_FORMAT, "cluster": "ml", "instanceId": "i-0123456789abcdef0",
              "agentVersion": "1", "windowStart": start, "windowEnd": end, "final": True, "status": "ok", "reason": "",
              "collectedAt": "2026-11-26T11:10:00Z", "partitionGroups": {}, "part": 1, "parts": 1, "records": []}
    return {"source": contract.REPORT_SOURCE, "detail-type": contract.USAGE_DETAIL_TYPE, "detail": detail}


@pytest.mark.parametrize("start,end", [("2026-11-26T10:00:00Z", "2026-11-27T10:00:00Z"),  # a day: 24x the bound
                                       ("2026-11-26T10:30:00Z", "2026-11-26T11:30:00Z"),  # not on the hour
                                       ("2026-11-26T10:00:00Z", "2026-11-26T10:00:00Z"),
                                       ("2026-02-30T10:00:00Z", "2026-02-30T11:00:00Z")])  # no such day
def test_a_window_that_is_not_one_hour_on_the_hour_is_refused_by_name(start, end):
    with pytest.raises(MalformedUsageReport, match="window"):
        parse_usage_event(event(start, end))
    assert parse_usage_event(event("2026-11-26T10:00:00Z", "2026-11-26T11:00:00Z")).window_end == "2026-11-26T11:00:00Z"
