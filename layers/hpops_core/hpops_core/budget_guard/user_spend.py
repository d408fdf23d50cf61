"""Per-user spend from Slurm accounting, and which per-user alerts to send. PURE: time is an input.

Dollars = allocated node-hours (the controller's sacct, per partition) x the hourly rate of the
partition's instance type (budget_guard.rates: billed, list or override, each figure names its
source). The lines add up to the cluster's cost for the month so far:

    users' allocated cost + idle (nodes up, no job on them) + other (storage, ...) = cluster cost

where the cluster cost is Cost Explorer's bill for the complete days so far plus, for the hours
the bill does not cover yet, the nodes up now x their rate (an estimate, and labelled so).

A user's projection is their month so far plus their run-rate over the last 24 hours until the
month ends: a user who starts a big allocation today is projected over budget today, not on
the day the bill says so.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from hpops_core.budget_guard.projection import month_bounds

RUN_RATE_HOURS = 24
# The agent reports every 15 minutes by default; two hours without one means it stopped.
USAGE_STALE_AFTER = dt.timedelta(hours=2)
_HOUR = Decimal(3600)
_CENT = Decimal("0.01")
# Amounts are kept to the micro-dollar, so that lines subtracted and added back are exact.
_MICRO = Decimal("0.000001")
KINDS = ("actual", "projected")


@dataclass(frozen=True)
class UserLimits:
    """A default monthly limit for every user, and per-user overrides (None: no limit)."""

    default: Decimal | None = None
    overrides: Mapping[str, Decimal] = field(default_factory=dict)

    def of(self, user: str) -> tuple[Decimal | None, str | None]:
        if user in self.overrides:
            return self.overrides[user], "override"
        if self.default is not None:
            return self.default, "default"
        return None, None


@dataclass(frozen=True)
class UserSpend:
    user: str
    node_hours: Decimal
    gpu_hours: Decimal
    jobs: int
    usd: Decimal
    unpriced_node_hours: Decimal  # in partitions whose instance type or rate is unknown: not in usd
    run_rate_usd_per_hour: Decimal
    projected_usd: Decimal
    limit_usd: Decimal | None
    limit_source: str | None
    sources: tuple[str, ...]  # rate sources behind usd ("billed", "list", "override")

    def percent(self, amount: Decimal) -> Decimal | None:
        if self.limit_usd is None or self.limit_usd <= 0:
            return None
        return (amount * 100 / self.limit_usd).quantize(Decimal("0.1"), ROUND_HALF_UP)


@dataclass(frozen=True)
class CostLine:
    usd: Decimal
    reason: str


@dataclass(frozen=True)
class SpendReport:
    cluster: str
    month: str
    as_of: str
    users: tuple[UserSpend, ...]  # highest spend first
    idle: CostLine
    other: CostLine
    cluster_cost: CostLine
    rates: tuple[dict[str, str], ...]
    warnings: tuple[dict[str, str], ...]
    collector: dict[str, str] | None

    @property
    def users_usd(self) -> Decimal:
        return sum((u.usd for u in self.users), Decimal(0))


@dataclass(frozen=True)
class UserAlert:
    user: str
    kind: str  # "actual" | "projected"
    threshold: Decimal
    key: str  # once per user, kind and threshold per month (alert_state.mark_fired)
    summary: str
    crossed: tuple[str, ...]  # every key this alert covers (lower thresholds crossed at the same time)


def _utc(now: dt.datetime) -> dt.datetime:
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    return now.astimezone(dt.timezone.utc)


def _iso_time(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(dt.timezone.utc)


def _iso_hour(text: str) -> dt.datetime:
    return dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc)


def usd(amount: Decimal) -> str:
    return f"${amount.quantize(_CENT, ROUND_HALF_UP):,}"


def user_alert_key(month: str, user: str, kind: str, threshold: Decimal) -> str:
    return f"{month}:user:{user}:{kind}:{threshold.normalize():f}"


@dataclass
class MonthUsage:
    """The month's usage summed per user and partition: [node-seconds, GPU-seconds, jobs, node-seconds in
    the run-rate hours]. O(users x partitions), however many windows went in (usage_store keeps the
    settled windows' sums between sweeps, so a sweep reads only the last day's windows)."""

    users: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    partition_groups: dict[str, str] = field(default_factory=dict)  # the newest window's mapping wins

    def add(self, window: Any, recent: bool) -> None:
        """One window, as last collected (usage_store.StoredWindow), added in window order."""
        self.partition_groups.update(window.partition_groups)
        for record in window.records:
            row = self.users.setdefault(record.user, {}).setdefault(record.partition, [0, 0, 0, 0])
            row[0] += record.node_seconds
            row[1] += record.gpu_seconds
            row[2] += record.jobs
            if recent:
                row[3] += record.node_seconds

    def rows(self) -> list[list[Any]]:
        """JSON-safe rows, one per user and partition (kept between sweeps without the recent column)."""
        return [[user, partition, *values[:3]] for user, partitions in sorted(self.users.items())
                for partition, values in sorted(partitions.items())]

    @classmethod
    def from_rows(cls, rows: Iterable[Sequence[Any]], partition_groups: Mapping[str, str]) -> MonthUsage:
        usage = cls(partition_groups=dict(partition_groups))
        for user, partition, node, gpu, jobs in rows:
            usage.users.setdefault(user, {})[partition] = [int(node), int(gpu), int(jobs), 0]
        return usage


def recent_since(now: dt.datetime) -> dt.datetime:
    """Windows starting at or after this count in the run rate."""
    return _utc(now) - dt.timedelta(hours=RUN_RATE_HOURS)


def fold_windows(windows: Iterable[Any], now: dt.datetime, usage: MonthUsage | None = None) -> MonthUsage:
    """Windows (oldest first) added to ``usage``; those of the last RUN_RATE_HOURS also to the run rate."""
    usage = usage if usage is not None else MonthUsage()
    since = recent_since(now)
    for window in windows:
        usage.add(window, _iso_hour(window.window_start) >= since)
    return usage


def _unbilled_capacity(groups: Iterable[Mapping[str, Any]], since: dt.datetime, now: dt.datetime,
                       rate_of: Any) -> tuple[Decimal, list[str]]:
    hours = Decimal(max(0, int((now - since).total_seconds()))) / _HOUR
    total, unpriced = Decimal(0), []
    for group in groups:
        count, instance_type = group.get("CurrentCount") or 0, group.get("InstanceType")
        rate = rate_of(instance_type) if isinstance(instance_type, str) else None
        if rate is None:
            if count:
                unpriced.append(str(group.get("InstanceGroupName")))
            continue
        total += Decimal(int(count)) * hours * rate
    return total.quantize(_MICRO, ROUND_HALF_UP), unpriced


def spend_report(
    cluster: str, now: dt.datetime, windows: Iterable[Any] | MonthUsage, observed_groups: Sequence[Mapping[str, Any]],
    rates: Any, billed: Any, limits: UserLimits, collector: Any = None,
) -> SpendReport:
    """The month so far, per user, with idle and other lines that make it add up to the cluster's cost.

    ``windows``: usage_store.StoredWindow of this month (oldest first), or their MonthUsage;
    ``observed_groups``: DescribeCluster's instance groups (InstanceGroupName, InstanceType, CurrentCount); ``rates``: rates.RateChoice;
    ``billed``: rates.BilledMonth."""
    now = _utc(now)
    month_start, month_end = month_bounds(now)
    month = f"{month_start:%Y-%m}"
    group_types = {g["InstanceGroupName"]: g["InstanceType"] for g in observed_groups
                   if isinstance(g.get("InstanceGroupName"), str) and isinstance(g.get("InstanceType"), str)}
    usage = windows if isinstance(windows, MonthUsage) else fold_windows(windows, now)
    partition_types = {partition: group_types[group] for partition, group in usage.partition_groups.items()
                       if group in group_types}
    warnings: list[dict[str, str]] = []

    totals: dict[str, dict[str, Any]] = {}
    unmapped: set[str] = set()
    for user, partitions in usage.users.items():
        row = totals[user] = {"node": 0, "gpu": 0, "jobs": 0, "usd": Decimal(0), "recent_usd": Decimal(0),
                              "unpriced": 0, "sources": set()}
        for partition, (node, gpu, jobs, recent) in partitions.items():
            row["node"] += node
            row["gpu"] += gpu
            row["jobs"] += jobs
            instance_type = partition_types.get(partition)
            rate = rates.rates.get(instance_type) if instance_type else None
            if rate is None:
                row["unpriced"] += node
                unmapped.add(partition if instance_type is None else f"{partition} ({instance_type})")
                continue
            row["usd"] += (Decimal(node) / _HOUR * rate.usd_per_hour).quantize(_MICRO, ROUND_HALF_UP)
            row["recent_usd"] += (Decimal(recent) / _HOUR * rate.usd_per_hour).quantize(_MICRO, ROUND_HALF_UP)
            row["sources"].add(rate.source)
    if unmapped:
        warnings.append({"name": "UnpricedPartition", "reason": (
            f"no instance type or rate for partition(s) {', '.join(sorted(unmapped))}: their node-hours are shown "
            "but not charged (the controller's provisioning_parameters.json maps partitions to instance groups)")})

    hours_left = Decimal(max(0, int((month_end - now).total_seconds()))) / _HOUR
    users = []
    for user, row in totals.items():
        limit, limit_source = limits.of(user)
        run_rate = (row["recent_usd"] / RUN_RATE_HOURS).quantize(_MICRO, ROUND_HALF_UP)
        users.append(UserSpend(
            user=user, node_hours=Decimal(row["node"]) / _HOUR, gpu_hours=Decimal(row["gpu"]) / _HOUR,
            jobs=row["jobs"], usd=row["usd"], unpriced_node_hours=Decimal(row["unpriced"]) / _HOUR,
            run_rate_usd_per_hour=run_rate,
            projected_usd=(row["usd"] + run_rate * hours_left).quantize(_MICRO, ROUND_HALF_UP),
            limit_usd=limit, limit_source=limit_source, sources=tuple(sorted(row["sources"])),
        ))
    users.sort(key=lambda u: (-u.usd, u.user))

    # The cluster's cost: the bill for the complete days, the nodes up now for the hours after it.
    billed_instances = sum((b.cost_usd for b in billed.by_instance_type.values()), Decimal(0))
    billed_until = (dt.datetime.fromisoformat(billed.end).replace(tzinfo=dt.timezone.utc)
                    if billed.end else month_start)
    estimate, unpriced_groups = _unbilled_capacity(observed_groups, billed_until, now, rates.usd_per_hour)
    if unpriced_groups:
        warnings.append({"name": "UnpricedInstanceGroup", "reason": (
            f"instance group(s) {', '.join(sorted(unpriced_groups))} have no rate: the cluster's cost since "
            f"{billed_until:%Y-%m-%d %H:%M} UTC leaves them out")})
    instance_cost = (billed_instances + estimate).quantize(_MICRO, ROUND_HALF_UP)
    fetched = f", asked at {billed.fetched_at}" if getattr(billed, "fetched_at", None) else ""
    billed_text = (f"Cost Explorer {billed.start}..{billed.end} (exclusive{fetched}): "
                   f"{usd(billed_instances + billed.other_cost_usd)}" if billed.end else "no billed day yet this month")
    cluster_cost = CostLine(instance_cost + billed.other_cost_usd, (
        f"{billed_text}; since {billed_until:%Y-%m-%d %H:%M} UTC, estimated from the nodes up now: {usd(estimate)}"))
    users_usd = sum((u.usd for u in users), Decimal(0))
    idle = CostLine(instance_cost - users_usd, "node time no job was allocated (cluster instance cost minus users)")
    if idle.usd < 0:
        warnings.append({"name": "AllocatedAboveCapacity", "reason": (
            f"users' allocated cost exceeds the cluster's instance cost by {usd(-idle.usd)}: the bill for today is "
            "not in yet, or nodes left the cluster during the month (the estimate counts the nodes up now)")})
    other = CostLine(billed.other_cost_usd, "billed cost of the cluster that is not instance time (storage, ...)")
    rate_rows = tuple({"instanceType": r.instance_type, "usdPerHour": f"{r.usd_per_hour:f}", "source": r.source,
                       "detail": r.detail} for r in sorted(rates.rates.values(), key=lambda r: r.instance_type))
    if collector is None:
        warnings.append({"name": "NoUsageReport", "reason": (
            "no usage report from the controller yet: the node agent must run on the controller group's node "
            "(ControllerGroupName) with usage collection on (usageSeconds)")})
    elif now - _iso_time(collector.collected_at) > USAGE_STALE_AFTER:
        hours = int((now - _iso_time(collector.collected_at)).total_seconds() // 3600)
        warnings.append({"name": "UsageReportsStale", "reason": (
            f"the controller's last usage report was collected at {collector.collected_at}, {hours} h ago: "
            "users' figures stop there while the cluster's cost goes on (is its node agent running?)")})
    if collector is not None and collector.status == "ok" and collector.reason:
        warnings.append({"name": "UsageNote", "reason": f"the controller's collector notes: {collector.reason}"})
    if collector is not None and collector.status != "ok":
        warnings.append({"name": "UsageNotCollected", "reason": (
            f"the controller's collector says {collector.status!r} ({collector.reason}) at {collector.collected_at}: "
            "users' figures stop at the last window it read")})
    collector_row = None if collector is None else {
        "status": collector.status, "reason": collector.reason, "collectedAt": collector.collected_at,
        "windowStart": collector.window_start}
    return SpendReport(cluster, month, now.strftime("%Y-%m-%dT%H:%M:%SZ"), tuple(users), idle, other, cluster_cost,
                       rate_rows, tuple(warnings), collector_row)


def decide_user_alerts(report: SpendReport, thresholds: Sequence[Decimal], already_fired: set[str]) -> list[UserAlert]:
    """Per user and kind, the highest threshold crossed that has not alerted this month (one alert
    covers lower thresholds crossed at the same time, so a jump from 50 % to 120 % sends one)."""
    alerts = []
    for user in report.users:
        if user.limit_usd is None:
            continue
        for kind, amount in (("actual", user.usd), ("projected", user.projected_usd)):
            percent = user.percent(amount)
            if percent is None:
                continue
            # Compared unrounded: 79.95 % has not crossed 80 %, though it is shown as 80.0 %.
            crossed = [t for t in sorted(thresholds) if amount * 100 >= t * user.limit_usd]
            new = [t for t in crossed if user_alert_key(report.month, user.user, kind, t) not in already_fired]
            if not new:
                continue
            top = new[-1]
            verb = "has spent" if kind == "actual" else "is projected to spend"
            summary = (f"{user.user} {verb} {usd(amount)} on {report.cluster} in {report.month}: {percent}% of "
                       f"their {usd(user.limit_usd)} limit ({user.limit_source}); threshold {top.normalize():f}%")
            alerts.append(UserAlert(user.user, kind, top, user_alert_key(report.month, user.user, kind, top), summary,
                                    tuple(user_alert_key(report.month, user.user, kind, t) for t in new)))
    return alerts


def _money(amount: Decimal) -> str:
    return f"{amount.quantize(_CENT, ROUND_HALF_UP):f}"


def _hours(amount: Decimal) -> str:
    return f"{amount.quantize(Decimal('0.01'), ROUND_HALF_UP):f}"


def user_document(u: UserSpend) -> dict[str, Any]:
    """One user's line of report_document: money as strings."""
    actual, projected = u.percent(u.usd), u.percent(u.projected_usd)
    return {
        "user": u.user, "nodeHours": _hours(u.node_hours), "gpuHours": _hours(u.gpu_hours), "jobs": u.jobs,
        "usd": _money(u.usd), "unpricedNodeHours": _hours(u.unpriced_node_hours),
        "runRateUsdPerHour": _money(u.run_rate_usd_per_hour), "projectedUsd": _money(u.projected_usd),
        "limitUsd": None if u.limit_usd is None else _money(u.limit_usd), "limitSource": u.limit_source,
        "percentOfLimit": None if actual is None else f"{actual:f}",
        "projectedPercentOfLimit": None if projected is None else f"{projected:f}",
        "rateSources": list(u.sources),
    }


def report_document(report: SpendReport, thresholds: Sequence[Decimal] = (),
                    max_users: int | None = None) -> dict[str, Any]:
    """The report as JSON-safe data (Step Functions state, `hpops cost --json`): money as strings.
    ``max_users``: only the highest spenders' lines (the totals still count every user)."""
    users = [user_document(u) for u in report.users[:max_users]]
    # Rounded line by line, then idle as what is left, so the printed cents add up to the printed total.
    users_cents = sum((Decimal(_money(u.usd)) for u in report.users), Decimal(0))
    idle_cents = Decimal(_money(report.cluster_cost.usd)) - users_cents - Decimal(_money(report.other.usd))
    return {
        "cluster": report.cluster, "month": report.month, "asOf": report.as_of, "users": users,
        "usersUsd": f"{users_cents:f}",
        "idle": {"usd": f"{idle_cents:f}", "reason": report.idle.reason},
        "other": {"usd": _money(report.other.usd), "reason": report.other.reason},
        "clusterCost": {"usd": _money(report.cluster_cost.usd), "reason": report.cluster_cost.reason},
        "rates": list(report.rates), "warnings": list(report.warnings), "collector": report.collector,
        "thresholdsPercent": [f"{t.normalize():f}" for t in thresholds],
    }
