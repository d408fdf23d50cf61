"""The operator's hourly rates (``RateOverridesJson``): the last resort of the rate choice. PURE.

``{"ml.p6-b200.48xlarge": "113.93"}`` gives a rate for an instance type that this cluster has
not been billed for yet and that the AWS Price List does not have (see ``rates``). It never
replaces a billed rate, which already reflects Savings Plans, reserved capacity and credits,
nor a list price. There is no built-in table: a figure typed from memory goes stale unnoticed.
"""

from __future__ import annotations

import json
from decimal import Decimal, InvalidOperation
from typing import Any

from hpops_core.budget_guard import BudgetGuardError

__all__ = ["InvalidRateOverrides", "rate_overrides"]

_MAX_ENTRIES = 200


class InvalidRateOverrides(BudgetGuardError, ValueError):
    """RateOverridesJson is not a JSON object of instance type -> non-negative USD amount."""


def _rate(instance_type: str, value: Any) -> Decimal:
    if isinstance(value, bool):
        raise InvalidRateOverrides(f"rate of {instance_type} must be a number, got {value!r}")
    try:
        rate = Decimal(str(value)) if isinstance(value, (int, str, Decimal)) else None
    except InvalidOperation:
        rate = None
    if rate is None or not rate.is_finite() or rate < 0:
        raise InvalidRateOverrides(f"rate of {instance_type} must be a non-negative USD amount, got {value!r}")
    return rate


def rate_overrides(text: str | None) -> dict[str, Decimal]:
    """Instance type -> USD per hour from ``text`` (a JSON object; empty means none).

    Numbers are read as Decimal (never float). Raises InvalidRateOverrides on anything else:
    a broken override is a deployment bug, not something to guess around.
    """
    text = (text or "").strip()
    if not text:
        return {}
    try:
        raw = json.loads(text, parse_float=Decimal, parse_int=Decimal)
    except ValueError as exc:
        raise InvalidRateOverrides(f"not valid JSON ({exc.msg} at position {exc.pos})") from None
    if not isinstance(raw, dict):
        raise InvalidRateOverrides("must be a JSON object of instance type -> USD per hour")
    if len(raw) > _MAX_ENTRIES:
        raise InvalidRateOverrides(f"at most {_MAX_ENTRIES} instance types")
    rates: dict[str, Decimal] = {}
    for instance_type, value in raw.items():
        if not instance_type.startswith("ml.") or len(instance_type) > 64:
            raise InvalidRateOverrides(f"{instance_type[:64]!r} is not a SageMaker instance type (ml.*)")
        rates[instance_type] = _rate(instance_type, value)
    return rates
