"""Hourly rates for the month-end projection, each saying where it came from. PURE: no AWS.

What a scale-out will cost is rate x nodes x hours, so the rate should be what this account
pays for that instance type. In order of preference, per instance type:

    billed    this cluster's own bill this month: Cost Explorer cost / hours of the instance type
              (UTC month to date, complete days, cluster tag). The same metric as the budget
              (UnblendedCost), so the projection and the budget count dollars the same way.
    list      the AWS Price List on-demand USD price of a HyperPod cluster instance in the
              cluster's region (nothing billed yet, e.g. a new instance type or the 1st).
    override  the operator's RateOverridesJson: the last resort, for a type that is neither
              billed nor listed (a type too new for the Price List, a region it lacks).

A type with none of the three is *missing*: the projection leaves its nodes out and says so.
The AWS calls that gather billed usage and list prices live in ``pricing``.

What "billed" includes is what UnblendedCost includes: credits and reserved or discounted
capacity billed on the cluster's own usage lines. Hours covered by a Savings Plan are, in the
unblended view, offset by a negation line of the same usage type while the plan's fee carries no
cluster tag, so they count about $0 here, as they do in the budget itself. A type wholly covered
therefore falls through to the list price (no cost, see ``billed_rate``); a partly covered one
gets a rate below the plan's effective rate. AmortizedCost would spread the fee onto the hours;
it would have to change for the budget and the rates together.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from types import MappingProxyType

__all__ = [
    "HOUR_UNITS",
    "MIN_BILLED_HOURS",
    "SOURCES",
    "BilledMonth",
    "BilledUsage",
    "Rate",
    "RateChoice",
    "billed_rate",
    "choose_rates",
    "instance_type_of_usage",
    "no_billed_month",
]

SOURCES = ("billed", "list", "override")
# Below an hour of billed time, cost / hours says more about billing granularity than about the
# rate; with no cost (credits, Savings Plan negation) it says nothing. Such a type falls through.
MIN_BILLED_HOURS = Decimal(1)

_CENT = Decimal("0.01")
_INSTANCE_TYPE = re.compile(r"ml\.[a-z0-9]+(?:-[a-z0-9]+)*\.[a-z0-9]+")
# Usage types Cost Explorer reports for HyperPod cluster instance time look like
# "USE1-Cluster:ml.p5.48xlarge": a region prefix, "Cluster", then the instance type after the
# last ':'. Source: awslabs "AI on SageMaker HyperPod", Slurm chargeback, "GPU cost allocation
# from CUR": compute nodes bill under AmazonSageMaker as "<region>-Cluster:ml.p4d.24xlarge", their
# EBS volumes as "<region>-Cluster:VolumeUsage.gp2"; public Price List users match the same
# "<prefix>-Cluster:ml.<type>" usagetype. Not confirmed on a live bill here, hence some leeway:
# the prefix is optional, and any operation containing "Cluster" counts (a reserved-capacity
# "...-ReservedCluster:ml.<type>" appears in third-party rate parsers), while other SageMaker
# features of the same type (Train:, Host:, notebooks) do not: their prices differ. Anything not
# recognised still counts in other_cost_usd, so the month-to-date total is right either way.
_CLUSTER_OPERATION = re.compile(r"(?:[A-Za-z0-9]+-)?[A-Za-z-]*Cluster[A-Za-z-]*")
# Units Cost Explorer and the Price List give instance time in (compared lowercased).
HOUR_UNITS = frozenset({"hrs", "hr", "hours", "hour"})


def instance_type_of_usage(usage_type: str, unit: str | None = "Hrs") -> str | None:
    """The instance type a Cost Explorer usage type bills hours of, or None (storage, data
    transfer, anything not measured in hours, SageMaker features other than clusters)."""
    head, sep, tail = usage_type.rpartition(":")
    if not sep or not _INSTANCE_TYPE.fullmatch(tail) or not _CLUSTER_OPERATION.fullmatch(head):
        return None
    if (unit or "").strip().lower() not in HOUR_UNITS:
        return None
    return tail


@dataclass(frozen=True)
class BilledUsage:
    """One instance type's billed time this month (all its usage types summed)."""

    instance_type: str
    cost_usd: Decimal
    hours: Decimal
    start: str  # ISO date, inclusive
    end: str  # ISO date, exclusive


@dataclass(frozen=True)
class BilledMonth:
    """What Cost Explorer billed the cluster this UTC month, complete days only."""

    by_instance_type: Mapping[str, BilledUsage]
    other_cost_usd: Decimal  # billed cost of the cluster that is not instance time (storage, ...)
    start: str | None  # None when no complete day yet (the 1st)
    end: str | None
    fetched_at: str | None = None  # when Cost Explorer gave this answer (ISO UTC); None: nothing asked

    @property
    def instance_cost_usd(self) -> Decimal:
        return sum((u.cost_usd for u in self.by_instance_type.values()), Decimal(0))

    @property
    def total_usd(self) -> Decimal:
        """The cluster's month-to-date bill: instance time + everything else."""
        return self.instance_cost_usd + self.other_cost_usd


def no_billed_month() -> BilledMonth:
    """Nothing billed yet (the 1st of the month: no complete day to ask about)."""
    return BilledMonth(by_instance_type=MappingProxyType({}), other_cost_usd=Decimal(0), start=None, end=None)


@dataclass(frozen=True)
class Rate:
    instance_type: str
    usd_per_hour: Decimal
    source: str  # "billed" | "list" | "override"
    detail: str  # one line: where the figure comes from


@dataclass(frozen=True)
class RateChoice:
    rates: Mapping[str, Rate]
    missing: tuple[str, ...]

    def usd_per_hour(self, instance_type: str) -> Decimal | None:
        rate = self.rates.get(instance_type)
        return rate.usd_per_hour if rate is not None else None


def _usd(amount: Decimal) -> str:
    return f"${amount.quantize(_CENT, rounding=ROUND_HALF_UP):,.2f}"


def billed_rate(usage: BilledUsage | None) -> Decimal | None:
    """cost / hours, if there is enough billed time to trust it (MIN_BILLED_HOURS, cost > 0)."""
    if usage is None or usage.hours < MIN_BILLED_HOURS or usage.cost_usd <= 0:
        return None
    return usage.cost_usd / usage.hours


def _billed_detail(usage: BilledUsage) -> str:
    hours = usage.hours.quantize(Decimal("0.1"), rounding=ROUND_HALF_UP)
    return f"Cost Explorer {usage.start}..{usage.end}: {_usd(usage.cost_usd)} over {hours} h"


def _too_little(usage: BilledUsage) -> str:
    return f"billed {_billed_detail(usage).removeprefix('Cost Explorer ')}, too little to trust"


def choose_rates(
    instance_types: Iterable[str],
    billed: BilledMonth,
    listed: Mapping[str, Decimal],
    overrides: Mapping[str, Decimal],
) -> RateChoice:
    """Per instance type, the first of billed, list, override that has a figure (module docstring).

    ``listed`` and ``overrides`` map instance type -> USD per hour (Decimal). Each type is
    considered once, in the order given; the ones with no figure anywhere are ``missing``.
    """
    rates: dict[str, Rate] = {}
    missing: list[str] = []
    for instance_type in dict.fromkeys(instance_types):
        usage = billed.by_instance_type.get(instance_type)
        billed_usd = billed_rate(usage)
        if billed_usd is not None and usage is not None:
            rates[instance_type] = Rate(instance_type, billed_usd, "billed", _billed_detail(usage))
            continue
        # A billed figure passed over is still worth a word: the operator sees why it was not used.
        note = f"; {_too_little(usage)}" if usage is not None else ""
        if instance_type in listed:
            rates[instance_type] = Rate(instance_type, listed[instance_type], "list",
                                        f"AWS Price List, on-demand HyperPod cluster instance{note}")
        elif instance_type in overrides:
            rates[instance_type] = Rate(instance_type, overrides[instance_type], "override",
                                        f"RateOverridesJson (neither billed nor in the Price List){note}")
        else:
            missing.append(instance_type)
    return RateChoice(rates=MappingProxyType(rates), missing=tuple(missing))
