"""Hourly prices used by the month-end projection. PURE: no AWS calls.

Why a table and not the AWS Price List API: the projection runs on the hot path of a
scale-out event and must work without extra permissions, network calls or pagination
through a multi-megabyte price file; and what a research group actually pays is often
not the list price (Savings Plans, reserved capacity, credits). So the stack ships a
small, explicit default table and the ``HourlyPricesJson`` parameter overrides or extends
it per deployment (``{"ml.p5.48xlarge": "55.04"}``).

The defaults are approximate SageMaker on-demand list prices in us-east-1 (USD per
instance-hour) for instance types commonly used in HyperPod Slurm clusters: the GPU and
Trainium types that dominate the bill, and the CPU types used for controller and login
nodes. They were written down by hand, not fetched, and prices change: check them against
the SageMaker pricing page for your region and put your own figures in ``HourlyPricesJson``.
An instance type missing from both is not a crash: the projection leaves its nodes out and
reports a ``MissingHourlyPrice`` warning (the real projection is then higher).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from types import MappingProxyType
from typing import Any

from hpops_core.budget_guard import BudgetGuardError

__all__ = ["DEFAULT_HOURLY_PRICES_USD", "InvalidPriceTable", "hourly_prices"]

DEFAULT_HOURLY_PRICES_USD: Mapping[str, Decimal] = MappingProxyType(
    {
        # accelerated compute nodes (what the projection is about)
        "ml.p5.48xlarge": Decimal("98.32"),
        "ml.p4d.24xlarge": Decimal("37.69"),
        "ml.g5.48xlarge": Decimal("20.36"),
        "ml.g5.12xlarge": Decimal("7.09"),
        "ml.trn1.32xlarge": Decimal("24.72"),
        # controller and login nodes
        "ml.m5.xlarge": Decimal("0.23"),
        "ml.m5.2xlarge": Decimal("0.461"),
        "ml.m5.4xlarge": Decimal("0.922"),
        "ml.m5.12xlarge": Decimal("2.765"),
        "ml.c5.4xlarge": Decimal("0.816"),
        "ml.t3.medium": Decimal("0.05"),
    }
)

_MAX_ENTRIES = 200


class InvalidPriceTable(BudgetGuardError, ValueError):
    """The configured price table is not a JSON object of instance type -> non-negative USD amount."""


def _price(instance_type: str, value: Any) -> Decimal:
    if isinstance(value, bool):
        raise InvalidPriceTable(f"price of {instance_type} must be a number, got {value!r}")
    try:
        price = Decimal(str(value)) if isinstance(value, (int, str, Decimal)) else None
    except InvalidOperation:
        price = None
    if price is None or not price.is_finite() or price < 0:
        raise InvalidPriceTable(f"price of {instance_type} must be a non-negative USD amount, got {value!r}")
    return price


def hourly_prices(override_json: str | None) -> dict[str, Decimal]:
    """The default table with ``override_json`` (a JSON object, may be empty) laid over it.

    Numbers are read as Decimal (never float). Raises InvalidPriceTable on anything else:
    a broken price table is a deployment bug, not something to guess around.
    """
    prices = dict(DEFAULT_HOURLY_PRICES_USD)
    text = (override_json or "").strip()
    if not text:
        return prices
    try:
        raw = json.loads(text, parse_float=Decimal, parse_int=Decimal)
    except ValueError as exc:
        raise InvalidPriceTable(f"not valid JSON ({exc.msg} at position {exc.pos})") from None
    if not isinstance(raw, dict):
        raise InvalidPriceTable("must be a JSON object of instance type -> USD per hour")
    if len(raw) > _MAX_ENTRIES:
        raise InvalidPriceTable(f"at most {_MAX_ENTRIES} instance types")
    for instance_type, value in raw.items():
        if not instance_type.startswith("ml.") or len(instance_type) > 64:
            raise InvalidPriceTable(f"{instance_type[:64]!r} is not a SageMaker instance type (ml.*)")
        prices[instance_type] = _price(instance_type, value)
    return prices
