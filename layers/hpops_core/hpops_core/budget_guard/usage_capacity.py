"""Could the cluster have run this? A usage report's node-seconds against the groups' capacity. PURE.

Per window and partition, the node-seconds reported cannot exceed what the partition's instance group
could give: max(CurrentCount, TargetCount) instances x the window's seconds. The partition -> group
map comes from AWS's record (DescribeCluster's SlurmConfig.PartitionNames) where the cluster has one;
clusters configured by provisioning_parameters.json have none there, so the map is the signed
controller report's own partitionGroups (the enrolled controller's word, not any node's). A partition
neither names is bounded by the whole cluster's capacity.

A window's report may come in parts (one EventBridge entry each). The bound holds for the window:
the parts of its newest collection (the ones a read counts, usage_store) are summed in a running
total kept beside them (WindowTotal), and a part that would take the sum over is refused whole.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from hpops_core.budget_guard import BudgetGuardError
from hpops_core.budget_guard.usage_reports import UsageReport


class UsageExceedsCapacityError(BudgetGuardError):
    """A usage report claims more node-seconds in a partition than its group could have run. Nothing stored."""


class UsageWindowTooLarge(UsageExceedsCapacityError):
    """A window's parts name more (part, partition) pairs than its total item can keep. Nothing stored."""


# (part, partition) pairs a window's total keeps: far beyond a cluster's partitions x a window's parts
# (a few), and well inside DynamoDB's 400 KB item with 64-character partition names.
MAX_WINDOW_ENTRIES = 3000


@dataclass(frozen=True)
class WindowTotal:
    """What the stored parts of a window's newest collection add up to: per part, node-seconds per partition.

    ``version`` numbers the writes of the total item, so two parts arriving at once cannot both add
    to the same total (each write is conditional on the version it read)."""

    collected_at: str
    parts: dict[int, dict[str, int]] = field(default_factory=dict)
    partition_groups: dict[str, str] = field(default_factory=dict)
    version: int = 0

    def used(self) -> dict[str, int]:
        summed: dict[str, int] = defaultdict(int)
        for usage in self.parts.values():
            for partition, node_seconds in usage.items():
                summed[partition] += node_seconds
        return dict(summed)


def _seconds(start: str, end: str) -> int:
    parse = lambda text: datetime.strptime(text[:19], "%Y-%m-%dT%H:%M:%S")  # noqa: E731
    return max(0, int((parse(end) - parse(start)).total_seconds()))


def group_capacity(instance_groups: list[dict[str, Any]]) -> dict[str, int]:
    """{group: instances it may have had}: the larger of CurrentCount and TargetCount."""
    return {g.get("InstanceGroupName"): max(int(g.get("CurrentCount") or 0), int(g.get("TargetCount") or 0))
            for g in instance_groups if isinstance(g, dict) and g.get("InstanceGroupName")}


def aws_partition_groups(instance_groups: list[dict[str, Any]]) -> dict[str, str]:
    """{partition: group} from SlurmConfig.PartitionNames; empty where the cluster has no SlurmConfig."""
    mapping = {}
    for group in instance_groups:
        for partition in ((group.get("SlurmConfig") or {}).get("PartitionNames") or []) if isinstance(group, dict) else []:
            mapping[partition] = group.get("InstanceGroupName")
    return mapping


def part_usage(report: UsageReport) -> dict[str, int]:
    """{partition: node-seconds} of one report part."""
    used: dict[str, int] = defaultdict(int)
    for record in report.records:
        used[record.partition] += record.node_seconds
    return dict(used)


def _check(used: dict[str, int], report_groups: dict[str, str], instance_groups: list[dict[str, Any]],
           window_seconds: int, what: str) -> str:
    capacity = group_capacity(instance_groups)
    from_aws = aws_partition_groups(instance_groups)
    mapping, source = (from_aws, "DescribeCluster SlurmConfig") if from_aws else (report_groups,
                                                                                  "the signed controller report")
    everything = sum(capacity.values())
    for partition, node_seconds in sorted(used.items()):
        group = mapping.get(partition)
        instances = capacity.get(group, 0) if group is not None else everything
        if node_seconds > instances * window_seconds:
            raise UsageExceedsCapacityError(
                f"partition {partition} {what} {node_seconds} node-seconds; "
                f"{'group ' + group if group else 'the whole cluster'} ({instances} instances, map from {source}) "
                f"could run at most {instances * window_seconds}")
    return source


def check_capacity(report: UsageReport, instance_groups: list[dict[str, Any]]) -> str:
    """The map's source if every partition of this part fits its group's capacity; UsageExceedsCapacityError
    otherwise. (A part on its own: check_window bounds the sum of the window's parts.)"""
    return _check(part_usage(report), report.partition_groups, instance_groups,
                  _seconds(report.window_start, report.window_end),
                  f"reports in the window from {report.window_start}")


def next_total(kept: WindowTotal | None, report: UsageReport) -> WindowTotal | None:
    """The window's total once this part is stored; None when the part does not count.

    A newer collection starts the total afresh (a read counts only the newest collection's parts); a
    part of the same collection replaces its own number's contribution, so a redelivered part adds
    nothing; a part of an older collection is never read back, so it adds nothing and changes nothing."""
    if kept is not None and kept.collected_at > report.collected_at:
        return None
    same = kept is not None and kept.collected_at == report.collected_at
    parts = dict(kept.parts) if same else {}
    parts[report.part] = part_usage(report)
    # The agent repeats one map on every part; a part's map adds to the ones kept (as the read merges them).
    groups = dict(kept.partition_groups, **report.partition_groups) if same else dict(report.partition_groups)
    return WindowTotal(report.collected_at, parts, groups, kept.version + 1 if kept is not None else 1)


def check_window(total: WindowTotal, report: UsageReport, instance_groups: list[dict[str, Any]]) -> str:
    """The map's source if the window's parts (this one included) fit together; UsageExceedsCapacityError
    naming the part that would take the window over otherwise."""
    entries = sum(len(usage) for usage in total.parts.values())
    if entries > MAX_WINDOW_ENTRIES:
        raise UsageWindowTooLarge(f"the window from {report.window_start} would keep {entries} (part, partition) "
                                  f"pairs with part {report.part}; at most {MAX_WINDOW_ENTRIES}")
    return _check(total.used(), total.partition_groups, instance_groups,
                  _seconds(report.window_start, report.window_end),
                  f"in the window from {report.window_start} would reach (with part {report.part} of "
                  f"{report.parts}, collected {report.collected_at}; {len(total.parts)} part(s) kept)")
