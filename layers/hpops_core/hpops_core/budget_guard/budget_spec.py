"""What AWS Budget a cluster should have. PURE: no AWS calls.

``desired_budget`` returns the keyword arguments of ``budgets.create_budget``
(``AccountId``, ``Budget``, ``NotificationsWithSubscribers``); ``budget_changes``
compares that with what ``describe_budget`` returned and says what to do.

Budgets are scoped with ``FilterExpression`` on the ``ClusterName`` cost
allocation tag (``CostFilters`` is deprecated). ``FilterExpression`` requires
``Metrics``; we use UnblendedCost, the same metric ``aws_budgets`` reads from
Cost Explorer, so the Budget and our projection count the same dollars.
Note: the tag must be activated as a cost allocation tag in Billing, otherwise
both stay at $0.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from typing import Any, Literal

from hpops_core.common import validation
from hpops_core.budget_guard import BudgetGuardError
from hpops_core.budget_guard.projection import InvalidBudgetLimit

__all__ = [
    "BUDGET_TAG",
    "CLUSTER_TAG",
    "ACTUAL_THRESHOLDS",
    "FORECAST_THRESHOLDS",
    "METRIC",
    "BudgetChange",
    "BudgetWarning",
    "InvalidAccountId",
    "InvalidBudgetLimit",
    "InvalidClusterName",
    "InvalidTopicArn",
    "LimitResolution",
    "MalformedBudgetTag",
    "NoBudgetLimit",
    "budget_changes",
    "budget_name_for",
    "cluster_tag_filter",
    "desired_budget",
    "resolve_limit",
    "user_budget_prefix",
    "validate_cluster_name",
]

CLUSTER_TAG = "ClusterName"
BUDGET_TAG = "hpops:monthly-budget-usd"
ACTUAL_THRESHOLDS: tuple[int, ...] = (50, 80, 100)
FORECAST_THRESHOLDS: tuple[int, ...] = (100,)
METRIC = "UnblendedCost"

# fullmatch, not match + "$": "$" also matches before a trailing newline. Cluster names follow
# hpops_core/common/validation.py.
_ACCOUNT_ID = re.compile(r"\d{12}")
_TOPIC_ARN = re.compile(r"arn:aws[a-z-]*:sns:[a-z0-9-]+:\d{12}:[A-Za-z0-9_-]{1,256}")
# Plain dollars with at most cents: no signs, commas, exponents or currency marks.
_LIMIT_TAG_VALUE = re.compile(r"\d{1,12}(\.\d{1,2})?")
_CENT = Decimal("0.01")


# --------------------------------------------------------------------------- errors


class InvalidClusterName(BudgetGuardError, ValueError):
    """Not a HyperPod cluster name (hpops_core.common.validation: ``^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$``)."""


class InvalidTopicArn(BudgetGuardError, ValueError):
    """Not an SNS topic ARN."""


class InvalidAccountId(BudgetGuardError, ValueError):
    """Not a 12-digit AWS account id."""


# --------------------------------------------------------------------------- warnings
# Limit resolution never raises for bad *tags*: a typo in a tag must not stop the
# cluster from getting (default) guardrails. Callers log/surface these instead.


@dataclass(frozen=True)
class BudgetWarning:
    reason: str


@dataclass(frozen=True)
class MalformedBudgetTag(BudgetWarning):
    tag_key: str
    value: str


@dataclass(frozen=True)
class NoBudgetLimit(BudgetWarning):
    pass


@dataclass(frozen=True)
class LimitResolution:
    """``limit`` is None only when a ``NoBudgetLimit`` warning is present."""

    limit: Decimal | None
    source: Literal["tag", "default"] | None
    warnings: tuple[BudgetWarning, ...]
    reason: str


@dataclass(frozen=True)
class BudgetChange:
    """What to do to make the account's budget match the desired spec.

    ``new_budget`` is the ``NewBudget`` for UpdateBudget (only for update-limit).
    """

    action: Literal["create", "update-limit", "none"]
    budget_name: str
    current_limit: Decimal | None
    desired_limit: Decimal
    reason: str
    new_budget: dict[str, Any] | None = None


# --------------------------------------------------------------------------- validation


def validate_cluster_name(cluster_name: Any) -> str:
    """Return the name if it matches HyperPod's pattern, else raise InvalidClusterName.
    Names end up in budget names, tag filters and DynamoDB keys: never trust them."""
    try:
        return validation.check_cluster_name(cluster_name)
    except validation.InvalidValue as exc:
        raise InvalidClusterName(str(exc)) from None


def _check_topic(topic_arn: Any) -> str:
    if not isinstance(topic_arn, str) or not _TOPIC_ARN.fullmatch(topic_arn):
        raise InvalidTopicArn(f"{topic_arn!r} is not an SNS topic ARN")
    return topic_arn


def _check_account(account_id: Any) -> str:
    if not isinstance(account_id, str) or not _ACCOUNT_ID.fullmatch(account_id):
        raise InvalidAccountId(f"{account_id!r} is not a 12-digit account id")
    return account_id


def _limit(value: Any) -> Decimal:
    if isinstance(value, (bool, float)):
        raise InvalidBudgetLimit(f"budget limit {value!r}: use Decimal")
    try:
        limit = Decimal(value)
    except (InvalidOperation, TypeError, ValueError) as exc:
        raise InvalidBudgetLimit(f"budget limit {value!r} is not a number") from exc
    if not limit.is_finite() or limit <= 0:
        raise InvalidBudgetLimit(f"budget limit {value!r} must be > 0")
    # Budgets bills in cents; a sub-cent limit is meaningless.
    return limit.quantize(_CENT, rounding=ROUND_HALF_UP)


# --------------------------------------------------------------------------- names


def budget_name_for(cluster_name: str) -> str:
    return f"hpops-{validate_cluster_name(cluster_name)}"


def user_budget_prefix(cluster_name: str) -> str:
    """What the per-user budgets of earlier versions were named: ``hpops-<cluster>-u-<user>``."""
    return f"hpops-{validate_cluster_name(cluster_name)}-u-"


# --------------------------------------------------------------------------- specs


def _tag_expression(key: str, value: str) -> dict[str, Any]:
    return {"Tags": {"Key": key, "Values": [value], "MatchOptions": ["EQUALS"]}}


def cluster_tag_filter(cluster_name: str) -> dict[str, Any]:
    """The cost filter that scopes a budget to the cluster: its ClusterName tag."""
    return _tag_expression(CLUSTER_TAG, validate_cluster_name(cluster_name))


def _notifications(topic_arn: str) -> list[dict[str, Any]]:
    subscribers = [{"SubscriptionType": "SNS", "Address": topic_arn}]
    specs = [("ACTUAL", t) for t in ACTUAL_THRESHOLDS] + [
        ("FORECASTED", t) for t in FORECAST_THRESHOLDS
    ]
    return [
        {
            "Notification": {
                "NotificationType": kind,
                "ComparisonOperator": "GREATER_THAN",
                "Threshold": float(threshold),  # the API shape is a double (percent)
                "ThresholdType": "PERCENTAGE",
            },
            "Subscribers": copy.deepcopy(subscribers),
        }
        for kind, threshold in specs
    ]


def _spec(
    name: str, filter_expression: dict[str, Any], limit_usd: Any, topic_arn: Any, account_id: Any
) -> dict[str, Any]:
    limit = _limit(limit_usd)
    return {
        "AccountId": _check_account(account_id),
        "Budget": {
            "BudgetName": name,
            # Amount pattern is ([0-9]*\.)?[0-9]+ : fixed-point text, never "1E+3".
            "BudgetLimit": {"Amount": format(limit, "f"), "Unit": "USD"},
            "TimeUnit": "MONTHLY",
            "BudgetType": "COST",
            "FilterExpression": filter_expression,
            "Metrics": [METRIC],
        },
        "NotificationsWithSubscribers": _notifications(_check_topic(topic_arn)),
    }


def desired_budget(
    cluster_name: str, limit_usd: Decimal, topic_arn: str, account_id: str
) -> dict[str, Any]:
    """CreateBudget kwargs for the cluster budget ``hpops-<cluster>``: monthly cost
    on resources tagged ClusterName=<cluster>, SNS alerts at 50/80/100% actual and
    100% forecasted."""
    name = budget_name_for(cluster_name)
    return _spec(name, cluster_tag_filter(cluster_name), limit_usd, topic_arn, account_id)


# --------------------------------------------------------------------------- limits


def _tag_value(cluster_tags: Any, key: str) -> str | None:
    """Tags as a dict, or as SageMaker's ListTags list of {"Key", "Value"}."""
    if isinstance(cluster_tags, Mapping):
        value = cluster_tags.get(key)
        return value if value is None or isinstance(value, str) else str(value)
    for tag in cluster_tags or []:
        if isinstance(tag, Mapping) and tag.get("Key") == key:
            value = tag.get("Value")
            return value if value is None or isinstance(value, str) else str(value)
    return None


def resolve_limit(
    default_limit: Decimal | None, cluster_tags: Mapping[str, str] | list[dict[str, str]] | None
) -> LimitResolution:
    """Monthly limit for a cluster: the ``hpops:monthly-budget-usd`` tag wins over
    the deployment default. A malformed tag is a warning and falls back to the
    default; nothing at all is a ``NoBudgetLimit`` warning with ``limit=None``.
    A bad *default* is a deployment bug and raises InvalidBudgetLimit."""
    default = _limit(default_limit) if default_limit is not None else None
    warnings: list[BudgetWarning] = []

    raw = _tag_value(cluster_tags, BUDGET_TAG)
    if raw is not None:
        text = raw.strip()
        if _LIMIT_TAG_VALUE.fullmatch(text) and Decimal(text) > 0:
            limit = Decimal(text).quantize(_CENT)
            return LimitResolution(
                limit=limit,
                source="tag",
                warnings=(),
                reason=f"tag {BUDGET_TAG}={text} sets the limit to ${limit}",
            )
        warnings.append(
            MalformedBudgetTag(
                reason=(
                    f"tag {BUDGET_TAG}={raw!r} is not a positive dollar amount like "
                    "'1500' or '1500.50'; ignored"
                ),
                tag_key=BUDGET_TAG,
                value=raw,
            )
        )

    if default is not None:
        prefix = "; ".join(w.reason for w in warnings)
        return LimitResolution(
            limit=default,
            source="default",
            warnings=tuple(warnings),
            reason=(f"{prefix}; " if prefix else "") + f"using the default limit ${default}",
        )

    warnings.append(
        NoBudgetLimit(
            reason=f"no default limit configured and no valid {BUDGET_TAG} tag: no budget"
        )
    )
    return LimitResolution(
        limit=None,
        source=None,
        warnings=tuple(warnings),
        reason="; ".join(w.reason for w in warnings),
    )


# --------------------------------------------------------------------------- diff


def _existing_limit(existing: Mapping[str, Any]) -> tuple[Decimal | None, str | None]:
    spend = existing.get("BudgetLimit") or {}
    try:
        amount = Decimal(str(spend.get("Amount")))
    except (InvalidOperation, TypeError, ValueError):
        return None, spend.get("Unit")
    return (amount if amount.is_finite() else None), spend.get("Unit")


def budget_changes(existing: Mapping[str, Any] | None, desired: Mapping[str, Any]) -> BudgetChange:
    """Compare DescribeBudget's ``Budget`` (or None if absent) with a spec from
    :func:`desired_budget`. Amounts are compared as Decimals because Budgets echoes
    them reformatted (e.g. '1500' comes back as '1500.0').

    Only the limit is reconciled: notifications are not touched by UpdateBudget and
    are left as created (so operators may tune them in the console).
    """
    budget = desired["Budget"]
    name = budget["BudgetName"]
    desired_limit = Decimal(budget["BudgetLimit"]["Amount"])
    desired_unit = budget["BudgetLimit"]["Unit"]

    if existing is None:
        return BudgetChange(
            action="create",
            budget_name=name,
            current_limit=None,
            desired_limit=desired_limit,
            reason=f"budget {name} does not exist; create it with limit ${desired_limit}",
        )

    current, unit = _existing_limit(existing)
    if current == desired_limit and unit == desired_unit:
        return BudgetChange(
            action="none",
            budget_name=name,
            current_limit=current,
            desired_limit=desired_limit,
            reason=f"budget {name} already has limit ${desired_limit}",
        )

    new_budget = copy.deepcopy(dict(budget))
    # Keep the existing period: omitting it on update must not restart the budget.
    if existing.get("TimePeriod"):
        new_budget["TimePeriod"] = copy.deepcopy(existing["TimePeriod"])
    return BudgetChange(
        action="update-limit",
        budget_name=name,
        current_limit=current,
        desired_limit=desired_limit,
        reason=(
            f"budget {name} limit is {current if current is not None else 'unset'} "
            f"{unit or ''}".rstrip()
            + f", want ${desired_limit} {desired_unit}"
        ),
        new_budget=new_budget,
    )
