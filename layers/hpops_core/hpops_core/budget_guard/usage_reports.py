"""Slurm usage reports as they arrive from the controller's node agent: validated and checked. PURE.

The agent reads `sacct` on the controller node and sends, per hourly UTC window, each user's
allocated node-, CPU- and GPU-seconds per partition (node/hpops_node_agent/usage.py). A report
is re-sent while its window is open and once more when it is final, so the newest collection of
a window replaces the older one; a window's report may come in several parts.

A report is accepted only from an instance that DescribeClusterNode places in this cluster's
controller group: any node's role may send events to the report bus, and a login node must not
be able to make up what other users spent.
"""

from __future__ import annotations

import datetime
import json
import re
from dataclasses import dataclass
from typing import Any

from hpops_core.budget_guard import BudgetGuardError
from hpops_core.common import validation
from hpops_core.node_channel import contract

# The agent sizes parts as compact JSON (node/hpops_node_agent/usage.py): measure the same way.
MAX_SECONDS = 10**12  # far beyond a window's node-seconds on any cluster; bounds a hostile number
MAX_RECORDS = 5000
MAX_REASON = 300
_ISO = re.compile(r"\A[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?Z\Z")
_VERSION = re.compile(r"\A[A-Za-z0-9:._-]{0,128}\Z")
_RECORD_FIELDS = ("key", "user", "partition", "nodeSeconds", "cpuSeconds", "gpuSeconds", "jobs")
_REPORT_FIELDS = ("format", "cluster", "instanceId", "agentVersion", "windowStart", "windowEnd", "final", "status",
                  "reason", "records", "skipped", "skippedReasons", "collectedAt", "sacctSeconds", "partitionGroups",
                  "partitionGroupsSkipped", "partitionGroupsReason", "part", "parts")


class MalformedUsageReport(BudgetGuardError):
    """A usage report that is not what the agent sends. Nothing was recorded."""


class UsageReportRejected(BudgetGuardError):
    """A well-formed usage report from an instance that is not this cluster's controller node."""


@dataclass(frozen=True)
class UsageRecord:
    user: str
    partition: str
    node_seconds: int
    cpu_seconds: int
    gpu_seconds: int
    jobs: int


@dataclass(frozen=True)
class UsageReport:
    cluster: str
    instance_id: str
    window_start: str  # ISO UTC, on the hour
    window_end: str
    final: bool
    status: str  # contract.USAGE_STATUSES
    reason: str
    collected_at: str
    records: tuple[UsageRecord, ...]
    partition_groups: dict[str, str]  # Slurm partition -> HyperPod instance group
    part: int
    parts: int

    @property
    def month(self) -> str:
        return self.window_start[:7]


def _one_window(start: str, end: str) -> bool:
    try:
        begins, ends = (datetime.datetime.strptime(t, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.timezone.utc)
                        for t in (start, end))
    except ValueError:  # the shape matched, the date does not exist
        return False
    return begins.timestamp() % contract.USAGE_WINDOW_SECONDS == 0 and \
        (ends - begins).total_seconds() == contract.USAGE_WINDOW_SECONDS


def _record(raw: Any, index: int, cluster: str, window_start: str, bad: list[str]) -> UsageRecord | None:
    before = len(bad)
    f = validation.JsonFields(raw, f"records[{index}]", _RECORD_FIELDS, bad)
    user = f.get("user", validation.is_posix_user)
    partition = f.get("partition", contract.is_usage_partition)
    numbers = {name: f.count(name, MAX_SECONDS) for name in ("nodeSeconds", "cpuSeconds", "gpuSeconds", "jobs")}
    if len(bad) == before:
        # The key is the agent's idempotency promise: it must be the one the stack would compute.
        if f.data.get("key") != contract.usage_record_key(cluster, window_start, user, partition):
            bad.append(f"records[{index}].key")
    if len(bad) > before:
        return None
    return UsageRecord(user, partition, numbers["nodeSeconds"], numbers["cpuSeconds"], numbers["gpuSeconds"],
                       numbers["jobs"])


def parse_usage_event(event: Any) -> UsageReport:
    """The EventBridge event -> its validated report; MalformedUsageReport naming the bad fields otherwise."""
    if not isinstance(event, dict) or len(json.dumps(event, default=str, separators=(",", ":"))) > contract.MAX_USAGE_REPORT_BYTES + 4096:
        raise MalformedUsageReport("expected an EventBridge event of the size a usage report has")
    bad: list[str] = []
    if event.get("source") != contract.REPORT_SOURCE:
        bad.append("source")
    if event.get("detail-type") != contract.USAGE_DETAIL_TYPE:
        bad.append("detail-type")
    f = validation.JsonFields(event.get("detail"), "", _REPORT_FIELDS, bad)
    f.one_of("format", (contract.USAGE_FORMAT,))
    cluster = f.get("cluster", validation.is_cluster_name)
    instance_id = f.get("instanceId", validation.is_instance_id)
    f.text("agentVersion", _VERSION, required=False)
    window_start = f.text("windowStart", contract.USAGE_WINDOW_START_RE)
    window_end = f.text("windowEnd", contract.USAGE_WINDOW_START_RE)
    final = f.boolean("final")
    status = f.one_of("status", contract.USAGE_STATUSES)
    reason = f.short("reason", MAX_REASON, default="", required=False)
    collected_at = f.text("collectedAt", _ISO)
    f.count("skipped", MAX_SECONDS, required=False)
    f.mapping("skippedReasons", lambda k: isinstance(k, str) and len(k) <= 64, lambda v: type(v) is int, 32)
    f.get("sacctSeconds", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0, required=False)
    groups = f.mapping("partitionGroups", contract.is_usage_partition, validation.is_instance_group,
                       contract.USAGE_MAX_PARTITION_GROUPS)
    f.count("partitionGroupsSkipped", MAX_SECONDS, required=False)
    f.short("partitionGroupsReason", MAX_REASON, required=False)
    part = f.get("part", lambda v: type(v) is int and 1 <= v <= 1000, default=1, required=False)
    parts = f.get("parts", lambda v: type(v) is int and 1 <= v <= 1000, default=1, required=False)
    raw_records = f.get("records", lambda v: isinstance(v, list) and len(v) <= MAX_RECORDS, default=[])
    if part > parts:
        bad.append("part")
    # The window is the capacity bound's length (usage_capacity): an hour on the hour, as the agent sends it.
    if window_start is not None and window_end is not None and not _one_window(window_start, window_end):
        bad.append("windowEnd")
    records: list[UsageRecord] = []
    if not bad:
        for index, raw in enumerate(raw_records):
            record = _record(raw, index, cluster, window_start, bad)
            if record is not None:
                records.append(record)
    if bad:
        shown = sorted(set(bad))
        more = f" and {len(shown) - 5} more" if len(shown) > 5 else ""
        raise MalformedUsageReport(f"usage report rejected; invalid field(s): {', '.join(shown[:5])}{more}")
    return UsageReport(cluster, instance_id, window_start, window_end, final, status, reason, collected_at,
                       tuple(records), groups, part, parts)


@dataclass(frozen=True)
class UsageOrigin:
    accepted: bool
    reason: str


def check_usage_origin(report: UsageReport, cluster: str, controller_group: str, node: dict | None) -> UsageOrigin:
    """Pure: does AWS's record of the instance (DescribeClusterNode's NodeDetails) make it the controller?"""
    if report.cluster != cluster:
        return UsageOrigin(False, f"report names cluster {report.cluster}, this stack manages {cluster}")
    if node is None:
        return UsageOrigin(False, f"{report.instance_id} is not a node of cluster {cluster}")
    if node.get("InstanceGroupName") != controller_group:
        return UsageOrigin(False, f"{report.instance_id} is in group {node.get('InstanceGroupName')}, "
                                  f"not the controller group {controller_group}")
    return UsageOrigin(True, "report comes from the cluster's controller node")
