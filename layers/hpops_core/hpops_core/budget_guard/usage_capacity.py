"""Could the cluster have run this? A usage report's node-seconds against the groups' capacity. PURE.

Per window and partition, the node-seconds reported cannot exceed what the partition's instance group
could give: max(CurrentCount, TargetCount) instances x the window's seconds. The partition -> group
map comes from AWS's record (DescribeCluster's SlurmConfig.PartitionNames) where the cluster has one;
clusters configured by provisioning_parameters.json have none there, so the map is the signed
controller report's own partitionGroups (the enrolled controller's word, not any node's). A partition
neither names is bounded by the whole cluster's capacity. Each part of a window is checked on its
own (a window split in parts is bounded part by part, not in sum).
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Any

from hpops_core.budget_guard import BudgetGuardError
from hpops_core.budget_guard.usage_reports import UsageReport


class UsageExceedsCapacityError(BudgetGuardError):
    """A usage report claims more node-seconds in a partition than its group could have run. Nothing stored."""


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


def check_capacity(report: UsageReport, instance_groups: list[dict[str, Any]]) -> str:
    """The map's source if every partition fits its group's capacity; UsageExceedsCapacityError otherwise."""
    capacity = group_capacity(instance_groups)
    from_aws = aws_partition_groups(instance_groups)
    mapping, source = (from_aws, "DescribeCluster SlurmConfig") if from_aws else (report.partition_groups,
                                                                                  "the signed controller report")
    window = _seconds(report.window_start, report.window_end)
    used: dict[str, int] = defaultdict(int)
    for record in report.records:
        used[record.partition] += record.node_seconds
    everything = sum(capacity.values())
    for partition, node_seconds in sorted(used.items()):
        group = mapping.get(partition)
        instances = capacity.get(group, 0) if group is not None else everything
        if node_seconds > instances * window:
            raise UsageExceedsCapacityError(
                f"partition {partition} reports {node_seconds} node-seconds in the window from {report.window_start}; "
                f"{'group ' + group if group else 'the whole cluster'} ({instances} instances, map from {source}) "
                f"could run at most {instances * window}")
    return source
