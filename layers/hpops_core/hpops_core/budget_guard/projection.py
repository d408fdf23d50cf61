"""Month-end cost projection and early-alert decisions. PURE: no AWS, no clock.

Why this exists: AWS Budgets alerts trail real usage by hours (Cost Explorer data
lags), so a grant can be blown by a scale-out long before Budgets notices. When a
HyperPod instance group scales out we project the month end ourselves:

    projected = month-to-date cost + (sum over groups of rate x nodes) x hours left

and alert when the projection crosses a threshold of the cluster's limit. Each group's rate
comes with its source (billed, list or override: see ``rates``) and the projection's texts
name it, so every dollar figure says where it came from.

Conventions: money is ``Decimal`` (floats are refused: binary noise in money is
a bug), time is always passed in and must be tz-aware, and AWS billing months are
UTC months, so every boundary is computed in UTC whatever zone the caller uses.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from typing import Any, NamedTuple

from hpops_core.budget_guard import BudgetGuardError
from hpops_core.budget_guard.rates import RateChoice

__all__ = [
    "Alert",
    "GroupCost",
    "GroupLoad",
    "InvalidBudgetLimit",
    "InvalidGroup",
    "InvalidMoney",
    "InvalidThreshold",
    "NaiveDatetimeError",
    "Projection",
    "ScaleOut",
    "alert_key",
    "compact_groups",
    "decide_alerts",
    "describe_groups",
    "groups_from_detail",
    "month_bounds",
    "observed_from_describe",
    "project_month_end",
    "scale_out_groups",
    "usd_rate",
]

_US_PER_HOUR = Decimal(3_600_000_000)
_CENT = Decimal("0.01")
# A cluster in these states is going away / not running nodes: it cannot scale out
# and contributes no forward-looking run rate.
_NOT_RUNNING_STATUSES = frozenset({"Deleting", "Failed"})


# --------------------------------------------------------------------------- errors


class NaiveDatetimeError(BudgetGuardError, ValueError):
    """A datetime without tzinfo: we cannot know which UTC billing month it is in."""


class InvalidMoney(BudgetGuardError, ValueError):
    """A money amount that is not a finite, non-negative Decimal/int/str (floats refused)."""


class InvalidGroup(BudgetGuardError, ValueError):
    """An instance group entry that is not (instance_type, node_count[, name])."""


class InvalidBudgetLimit(BudgetGuardError, ValueError):
    """A budget limit that is not a positive amount."""


class InvalidThreshold(BudgetGuardError, ValueError):
    """A threshold percentage that is not a positive number."""


# --------------------------------------------------------------------------- types


class GroupLoad(NamedTuple):
    """Nodes of one instance type expected to run. A plain ``(type, count)`` tuple
    is accepted wherever this is; the optional name only improves messages."""

    instance_type: str
    node_count: int
    name: str | None = None


@dataclass(frozen=True)
class GroupCost:
    """One priced instance group's share of the projection, and where its rate came from."""

    name: str | None
    instance_type: str
    node_count: int
    hourly_cost: Decimal
    cost_to_month_end: Decimal
    usd_per_hour: Decimal
    rate_source: str  # "billed" | "list" | "override"
    rate_detail: str


@dataclass(frozen=True)
class Projection:
    """Projected month-end cost of one cluster.

    ``month_end`` is the first instant of the next month (exclusive bound), UTC.
    ``drivers`` are sorted by hourly cost, biggest first. Groups whose instance
    type had no rate are left out of every total and listed in ``missing_prices``,
    so the projection is then a lower bound. ``month_to_date_source`` says where the
    month-to-date figure came from.
    """

    now: dt.datetime
    projected_total: Decimal
    month_to_date: Decimal
    run_rate_per_hour: Decimal
    hours_left: Decimal
    month_start: dt.datetime
    month_end: dt.datetime
    drivers: tuple[GroupCost, ...]
    missing_prices: tuple[str, ...]
    reason: str
    month_to_date_source: str = "given"

    @property
    def month(self) -> str:
        """Billing month as ``YYYY-MM`` (UTC)."""
        return f"{self.month_start:%Y-%m}"

    @property
    def last_day(self) -> dt.date:
        """Last calendar day of the billing month."""
        return (self.month_end - dt.timedelta(days=1)).date()


@dataclass(frozen=True)
class ScaleOut:
    """An instance group whose TargetCount went up."""

    group_name: str
    instance_type: str | None
    previous_target: int
    new_target: int

    @property
    def delta(self) -> int:
        return self.new_target - self.previous_target


@dataclass(frozen=True)
class Alert:
    """A projected-overrun alert that has not fired yet this cluster-month."""

    key: str
    month: str
    threshold: Decimal
    projected: Decimal
    limit: Decimal
    percent_of_limit: Decimal
    summary: str


# --------------------------------------------------------------------------- helpers


def _utc(now: dt.datetime) -> dt.datetime:
    if not isinstance(now, dt.datetime):
        raise NaiveDatetimeError(f"expected a tz-aware datetime, got {type(now).__name__}")
    if now.tzinfo is None or now.utcoffset() is None:
        raise NaiveDatetimeError(
            f"{now.isoformat()} has no time zone; billing months are UTC, pass a tz-aware time"
        )
    return now.astimezone(dt.timezone.utc)


def month_bounds(now: dt.datetime) -> tuple[dt.datetime, dt.datetime]:
    """(first instant of the UTC month containing ``now``, first instant of the next)."""
    now_utc = _utc(now)
    start = now_utc.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    if start.month == 12:
        end = start.replace(year=start.year + 1, month=1)
    else:
        end = start.replace(month=start.month + 1)
    return start, end


def _money(value: Any, what: str) -> Decimal:
    # bool is an int subclass and float carries binary noise: refuse both.
    if isinstance(value, bool) or isinstance(value, float):
        raise InvalidMoney(f"{what}: {value!r} is a {type(value).__name__}; use Decimal")
    if isinstance(value, Decimal):
        amount = value
    elif isinstance(value, (int, str)):
        try:
            amount = Decimal(value)
        except InvalidOperation as exc:
            raise InvalidMoney(f"{what}: {value!r} is not a number") from exc
    else:
        raise InvalidMoney(f"{what}: {value!r} is not a Decimal")
    if not amount.is_finite() or amount < 0:
        raise InvalidMoney(f"{what}: {value!r} must be a finite amount >= 0")
    return amount


def _group(raw: Any) -> GroupLoad:
    try:
        group = raw if isinstance(raw, GroupLoad) else GroupLoad(*raw)
    except TypeError as exc:
        raise InvalidGroup(f"{raw!r} is not (instance_type, node_count[, name])") from exc
    if not isinstance(group.instance_type, str) or not group.instance_type:
        raise InvalidGroup(f"{raw!r}: instance_type must be a non-empty string")
    count = group.node_count
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise InvalidGroup(f"{raw!r}: node_count must be an int >= 0")
    return group


def _usd(amount: Decimal) -> str:
    return f"${amount.quantize(_CENT, rounding=ROUND_HALF_UP):,.2f}"


def usd_rate(amount: Decimal) -> str:
    """A rate per hour: cents at least, up to 4 places (0.922 stays 0.922, 98.3200 is 98.32)."""
    rounded = amount.quantize(Decimal("0.0001"), rounding=ROUND_HALF_UP)
    text = f"{rounded:,.4f}".rstrip("0")
    return "$" + (text + "0" * (2 - len(text.split(".")[1])))


def _number(value: Decimal) -> str:
    """Canonical text for a percentage: 80 -> '80', Decimal('80.0') -> '80', 12.5 -> '12.5'."""
    if value == value.to_integral_value():
        return str(int(value))
    return format(value.normalize(), "f")


def alert_key(month: str, threshold: Any) -> str:
    """Dedupe key, e.g. ``2026-11:projected:100``; one per threshold per cluster-month."""
    return f"{month}:projected:{_number(_threshold(threshold))}"


def _threshold(value: Any) -> Decimal:
    if isinstance(value, bool) or isinstance(value, float):
        raise InvalidThreshold(f"threshold {value!r}: use int or Decimal")
    try:
        threshold = Decimal(value)
    except (InvalidOperation, TypeError, ValueError) as exc:
        raise InvalidThreshold(f"threshold {value!r} is not a number") from exc
    if not threshold.is_finite() or threshold <= 0:
        raise InvalidThreshold(f"threshold {value!r} must be > 0 (percent of the limit)")
    return threshold


# --------------------------------------------------------------------------- projection


def project_month_end(
    now: dt.datetime,
    month_to_date_cost: Decimal,
    groups: Iterable[GroupLoad | tuple[Any, ...]],
    rates: RateChoice,
    *,
    month_to_date_source: str = "given",
) -> Projection:
    """Project the cluster's cost at the end of the current UTC billing month.

    ``groups`` are ``(instance_type, node_count)`` or ``(instance_type, node_count,
    name)``; use the target node count (where the cluster is heading). ``rates`` is
    the chosen rate per instance type (``rates.choose_rates``). A group whose type
    has no rate is left out and reported in ``missing_prices`` rather than failing
    the whole projection: an unknown new instance type must not silence alerts for
    the priced ones.
    """
    now_utc = _utc(now)
    month_start, month_end = month_bounds(now_utc)
    month_to_date = _money(month_to_date_cost, "month_to_date_cost")

    left = month_end - now_utc
    left_us = Decimal(left // dt.timedelta(microseconds=1))
    hours_left = left_us / _US_PER_HOUR

    drivers: list[GroupCost] = []
    missing: list[str] = []
    for raw in groups:
        group = _group(raw)
        rate = rates.rates.get(group.instance_type)
        if rate is None:
            # Zero nodes cost nothing whatever the rate, so they are not "missing".
            if group.node_count > 0 and group.instance_type not in missing:
                missing.append(group.instance_type)
            continue
        per_hour = _money(rate.usd_per_hour, f"hourly rate of {group.instance_type}")
        hourly = per_hour * group.node_count
        drivers.append(
            GroupCost(
                name=group.name,
                instance_type=group.instance_type,
                node_count=group.node_count,
                hourly_cost=hourly,
                # Multiply before dividing so whole-hour cases stay exact.
                cost_to_month_end=hourly * left_us / _US_PER_HOUR,
                usd_per_hour=per_hour,
                rate_source=rate.source,
                rate_detail=rate.detail,
            )
        )
    drivers.sort(key=lambda d: d.hourly_cost, reverse=True)

    run_rate = sum((d.hourly_cost for d in drivers), Decimal(0))
    projected = month_to_date + sum((d.cost_to_month_end for d in drivers), Decimal(0))

    month = f"{month_start:%Y-%m}"
    reason = (
        f"{month}: month-to-date {_usd(month_to_date)} ({month_to_date_source}) + {_usd(run_rate)}/h x "
        f"{hours_left.quantize(_CENT, rounding=ROUND_HALF_UP)} h left = "
        f"{_usd(projected)} projected by {(month_end - dt.timedelta(days=1)).date()}"
    )
    if drivers:
        reason += "; rates: " + ", ".join(dict.fromkeys(
            f"{d.instance_type} {usd_rate(d.usd_per_hour)}/h {d.rate_source} ({d.rate_detail})" for d in drivers))
    if missing:
        reason += (
            f"; no hourly rate (billed, list or override) for {', '.join(missing)}, those groups "
            "are left out so the real projection is higher"
        )
    return Projection(
        now=now_utc,
        projected_total=projected,
        month_to_date=month_to_date,
        run_rate_per_hour=run_rate,
        hours_left=hours_left,
        month_start=month_start,
        month_end=month_end,
        drivers=tuple(drivers),
        missing_prices=tuple(missing),
        reason=reason,
        month_to_date_source=month_to_date_source,
    )


# --------------------------------------------------------------------------- alerts


def _cause(projection: Projection, scale_outs: Sequence[ScaleOut]) -> str:
    if scale_outs:
        parts = [
            f"group '{s.group_name}' to {s.new_target} x {s.instance_type or 'unknown type'}"
            f" (+{s.delta})"
            for s in scale_outs
        ]
        return "scale-out of " + ", ".join(parts)
    if projection.drivers:
        top = projection.drivers[0]
        label = f" (group '{top.name}')" if top.name else ""
        return (
            f"run rate {_usd(projection.run_rate_per_hour)}/h, mostly "
            f"{top.node_count} x {top.instance_type}{label}"
        )
    return "month-to-date spend"


def decide_alerts(
    projection: Projection,
    budget_limit: Decimal,
    thresholds_percent: Iterable[Any] = (80, 100),
    already_fired: Iterable[str] = frozenset(),
    *,
    scale_outs: Sequence[ScaleOut] = (),
) -> list[Alert]:
    """Alerts for thresholds the projection exceeds and that have not fired yet.

    A threshold T fires when projected > limit x T/100 (strictly, like Budgets'
    GREATER_THAN). Keys embed the UTC month, so a new month starts clean.
    ``already_fired`` is this cluster's fired keys (any month; others never match).
    ``scale_outs`` (from :func:`scale_out_groups`) only make the summary say why.
    """
    if isinstance(budget_limit, (bool, float)):
        raise InvalidBudgetLimit(f"budget limit {budget_limit!r}: use Decimal")
    try:
        limit = Decimal(budget_limit)
    except (InvalidOperation, TypeError, ValueError) as exc:
        raise InvalidBudgetLimit(f"budget limit {budget_limit!r} is not a number") from exc
    if not limit.is_finite() or limit <= 0:
        raise InvalidBudgetLimit(f"budget limit {budget_limit!r} must be > 0")

    fired = set(already_fired)
    thresholds = sorted({_threshold(t) for t in thresholds_percent})
    percent = (projection.projected_total * 100 / limit).quantize(
        Decimal("0.1"), rounding=ROUND_HALF_UP
    )
    cause = _cause(projection, scale_outs)
    # Every rate behind the figure, with its source: a billed rate and a list price are not
    # equally sure, and the reader should not have to open the JSON to know which it was.
    sources = ", ".join(dict.fromkeys(
        f"{d.instance_type} {usd_rate(d.usd_per_hour)}/h {d.rate_source}" for d in projection.drivers))
    sources = f"; rates: {sources}" if sources else ""
    caveat = (
        f" [excludes unpriced {', '.join(projection.missing_prices)}: real projection is higher]"
        if projection.missing_prices
        else ""
    )

    alerts: list[Alert] = []
    for threshold in thresholds:
        key = alert_key(projection.month, threshold)
        if key in fired:
            continue
        if projection.projected_total <= limit * threshold / 100:
            continue
        alerts.append(
            Alert(
                key=key,
                month=projection.month,
                threshold=threshold,
                projected=projection.projected_total,
                limit=limit,
                percent_of_limit=percent,
                summary=(
                    f"{cause}: projected {_usd(projection.projected_total)} by "
                    f"{projection.last_day} vs limit {_usd(limit)} ({_number(percent)}%, "
                    f"threshold {_number(threshold)}%){sources}{caveat}"
                ),
            )
        )
    return alerts


# --------------------------------------------------------------------------- events


def _as_count(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    return None


def _instance_groups(detail: Mapping[str, Any] | None) -> dict[str, Mapping[str, Any]]:
    groups: dict[str, Mapping[str, Any]] = {}
    for group in (detail or {}).get("InstanceGroups") or []:
        if isinstance(group, Mapping) and isinstance(group.get("InstanceGroupName"), str):
            groups[group["InstanceGroupName"]] = group
    return groups


def _target(group: Mapping[str, Any]) -> int:
    target = _as_count(group.get("TargetCount"))
    if target is None:
        target = _as_count(group.get("CurrentCount"))
    return target or 0


def scale_out_groups(
    previous_detail: Mapping[str, Any] | None, detail: Mapping[str, Any]
) -> list[ScaleOut]:
    """Instance groups whose TargetCount went up between two cluster events.

    Baselines: a group present in ``previous_detail`` is compared with its previous
    TargetCount; a group new in this event starts from 0. Without a previous event
    (first sighting, state lost) the baseline is the group's own CurrentCount, so a
    group mid-scale-out (Target > Current, e.g. at creation) still counts while a
    steady cluster seen for the first time does not. A Deleting/Failed cluster
    never scales out.
    """
    if (detail or {}).get("ClusterStatus") in _NOT_RUNNING_STATUSES:
        return []
    before = _instance_groups(previous_detail) if previous_detail is not None else None
    result: list[ScaleOut] = []
    for name, group in _instance_groups(detail).items():
        new_target = _target(group)
        if before is None:
            baseline = _as_count(group.get("CurrentCount")) or 0
        elif name in before:
            baseline = _target(before[name])
        else:
            baseline = 0
        if new_target > baseline:
            instance_type = group.get("InstanceType")
            result.append(
                ScaleOut(
                    group_name=name,
                    instance_type=instance_type if isinstance(instance_type, str) else None,
                    previous_target=baseline,
                    new_target=new_target,
                )
            )
    return result


def groups_from_detail(detail: Mapping[str, Any]) -> list[GroupLoad]:
    """The cluster's forward-looking node load from an event detail (TargetCount per
    group, where the cluster is heading; CurrentCount if no target). Nothing runs
    for a Deleting/Failed cluster. Groups without an InstanceType are skipped."""
    if (detail or {}).get("ClusterStatus") in _NOT_RUNNING_STATUSES:
        return []
    loads: list[GroupLoad] = []
    for name, group in _instance_groups(detail).items():
        instance_type = group.get("InstanceType")
        if isinstance(instance_type, str) and instance_type:
            loads.append(GroupLoad(instance_type, _target(group), name))
    return loads


# The compact cluster state the guard compares and remembers: {"ClusterStatus", "InstanceGroups":
# [{InstanceGroupName, InstanceType, CurrentCount, TargetCount}]}, from an event or DescribeCluster.

def compact_groups(groups: list[Any]) -> list[dict[str, Any]]:
    keys = ("InstanceGroupName", "InstanceType", "CurrentCount", "TargetCount")
    return [{k: g.get(k) for k in keys} for g in groups]


def observed_from_describe(described: dict[str, Any]) -> dict[str, Any]:
    """The same compact state as an event gives, from a DescribeCluster response."""
    groups = [g for g in described.get("InstanceGroups") or [] if isinstance(g, dict)]
    return {"ClusterStatus": described.get("ClusterStatus"), "InstanceGroups": compact_groups(groups)}


def describe_groups(observed: dict[str, Any] | None) -> str:
    groups = (observed or {}).get("InstanceGroups") or []
    return ", ".join(f"{g.get('InstanceGroupName')} {g.get('CurrentCount')}/{g.get('TargetCount')}" for g in groups)
