"""Thin boto3 adapter for AWS Budgets and Cost Explorer.

Decisions live in the pure modules (``budget_spec``, ``projection``); this module
only fetches, applies and translates AWS errors. Clients are passed in (tests use
moto) and the factories below create them at call time, never at import time, so
a Lambda cold start does no AWS work and tests can patch the environment first.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

from hpops_core.budget_guard import BudgetGuardError
from hpops_core.budget_guard.budget_spec import (
    CLUSTER_TAG,
    METRIC,
    budget_changes,
    validate_cluster_name,
)
from hpops_core.budget_guard.projection import month_bounds

__all__ = [
    "RETRY_CONFIG",
    "AccountMismatch",
    "EnsureResult",
    "UnexpectedCurrency",
    "budgets_client",
    "ce_client",
    "delete_budget",
    "describe_budget",
    "ensure_budget",
    "month_to_date_cost",
    "month_to_date_costs_by_cluster",
]

# Budgets and Cost Explorer throttle hard; standard mode adds jittered retries
# for throttling and transient errors.
RETRY_CONFIG = Config(retries={"mode": "standard"})
# Both are global services whose endpoints live in us-east-1 (aws partition).
BILLING_REGION = "us-east-1"


class AccountMismatch(BudgetGuardError, ValueError):
    """The spec was built for a different account than the one being changed."""


class UnexpectedCurrency(BudgetGuardError):
    """Cost Explorer answered in a currency other than USD; limits are USD."""


@dataclass(frozen=True)
class EnsureResult:
    action: Literal["created", "updated", "unchanged"]
    budget_name: str
    reason: str


def budgets_client(session: boto3.session.Session | None = None, region: str = BILLING_REGION) -> Any:
    return (session or boto3).client("budgets", region_name=region, config=RETRY_CONFIG)


def ce_client(session: boto3.session.Session | None = None, region: str = BILLING_REGION) -> Any:
    return (session or boto3).client("ce", region_name=region, config=RETRY_CONFIG)


def _code(exc: ClientError) -> str:
    return exc.response.get("Error", {}).get("Code", "")


# --------------------------------------------------------------------------- budgets


def describe_budget(budgets_client: Any, account_id: str, budget_name: str) -> dict[str, Any] | None:
    """DescribeBudget's ``Budget``, or None if there is no such budget."""
    try:
        return budgets_client.describe_budget(AccountId=account_id, BudgetName=budget_name)["Budget"]
    except ClientError as exc:
        if _code(exc) == "NotFoundException":
            return None
        raise


def old_user_budget_names(budgets_client: Any, account_id: str, prefix: str, cluster_tag: Mapping[str, Any]) -> list[str]:
    """The per-user budgets earlier versions made for a cluster: named ``prefix``..., filtered on the
    cluster's tag AND one more tag. The name alone is not enough: the cluster budget of a cluster
    called "<cluster>-u-x" has that name too, and its filter is the cluster tag alone."""
    names: list[str] = []
    pages = budgets_client.get_paginator("describe_budgets").paginate(AccountId=account_id, ShowFilterExpression=True)
    for page in pages:
        for budget in page.get("Budgets", []):
            parts = (budget.get("FilterExpression") or {}).get("And") or []
            if (budget.get("BudgetName", "").startswith(prefix) and len(parts) == 2 and cluster_tag in parts
                    and all("Tags" in part for part in parts)):
                names.append(budget["BudgetName"])
    return sorted(names)


def ensure_budget(budgets_client: Any, account_id: str, spec: Mapping[str, Any]) -> EnsureResult:
    """Make the account's budget match ``spec`` (from ``desired_budget``).

    Idempotent: describe first, then create or update only what differs, so
    repeated or concurrent invocations converge on one budget.
    """
    if spec.get("AccountId", account_id) != account_id:
        raise AccountMismatch(
            f"spec is for account {spec.get('AccountId')}, asked to apply to {account_id}"
        )
    name = spec["Budget"]["BudgetName"]
    change = budget_changes(describe_budget(budgets_client, account_id, name), spec)

    if change.action == "create":
        try:
            budgets_client.create_budget(
                AccountId=account_id,
                Budget=spec["Budget"],
                NotificationsWithSubscribers=spec.get("NotificationsWithSubscribers", []),
            )
            return EnsureResult("created", name, change.reason)
        except ClientError as exc:
            if _code(exc) != "DuplicateRecordException":
                raise
        # Lost a race with a concurrent event between describe and create:
        # the budget exists now, so reconcile against what the winner made.
        change = budget_changes(describe_budget(budgets_client, account_id, name), spec)
        if change.action == "create":  # pragma: no cover - would mean AWS is inconsistent
            raise BudgetGuardError(f"budget {name} reported both duplicate and missing")

    if change.action == "update-limit":
        budgets_client.update_budget(AccountId=account_id, NewBudget=change.new_budget)
        return EnsureResult("updated", name, change.reason)
    return EnsureResult("unchanged", name, change.reason)


def delete_budget(budgets_client: Any, account_id: str, budget_name: str) -> bool:
    """Delete a budget; True if deleted, False if it was already gone (idempotent)."""
    try:
        budgets_client.delete_budget(AccountId=account_id, BudgetName=budget_name)
    except ClientError as exc:
        if _code(exc) == "NotFoundException":
            return False
        raise
    return True


# --------------------------------------------------------------------------- cost explorer


def _period(now: dt.datetime) -> dict[str, str] | None:
    start, _ = month_bounds(now)
    today = now.astimezone(dt.timezone.utc).date()
    # End is exclusive, so the window is [1st, today): complete days only. On the
    # 1st it would be empty and CE rejects Start == End, so there is nothing to ask.
    if today == start.date():
        return None
    return {"Start": start.date().isoformat(), "End": today.isoformat()}


def _amount(metric: Mapping[str, Any] | None) -> Decimal:
    if not metric:
        return Decimal(0)
    unit = metric.get("Unit", "USD")
    if unit != "USD":
        raise UnexpectedCurrency(f"Cost Explorer returned {unit}, expected USD")
    return Decimal(str(metric.get("Amount", "0")))


def month_to_date_cost(ce_client: Any, cluster_name: str, now: dt.datetime) -> Decimal:
    """Unblended cost this UTC month of resources tagged ClusterName=<cluster>,
    through the end of yesterday (UTC). Cost Explorer itself lags by up to a day,
    so this under-counts recent hours; the projection's alerts are early anyway."""
    validate_cluster_name(cluster_name)
    period = _period(now)
    if period is None:
        return Decimal(0)
    request: dict[str, Any] = {
        "TimePeriod": period,
        "Granularity": "MONTHLY",
        "Metrics": [METRIC],
        "Filter": {
            "Tags": {"Key": CLUSTER_TAG, "Values": [cluster_name], "MatchOptions": ["EQUALS"]}
        },
    }
    total = Decimal(0)
    while True:
        response = ce_client.get_cost_and_usage(**request)
        for bucket in response.get("ResultsByTime", []):
            total += _amount(bucket.get("Total", {}).get(METRIC))
        token = response.get("NextPageToken")
        if not token:
            return total
        request["NextPageToken"] = token


def month_to_date_costs_by_cluster(ce_client: Any, now: dt.datetime) -> dict[str, Decimal]:
    """Month-to-date unblended cost per ClusterName tag value, one CE call for all
    clusters (CE charges per request). Untagged spend (empty tag value) is left out."""
    period = _period(now)
    if period is None:
        return {}
    request: dict[str, Any] = {
        "TimePeriod": period,
        "Granularity": "MONTHLY",
        "Metrics": [METRIC],
        "GroupBy": [{"Type": "TAG", "Key": CLUSTER_TAG}],
    }
    prefix = f"{CLUSTER_TAG}$"
    costs: dict[str, Decimal] = {}
    while True:
        response = ce_client.get_cost_and_usage(**request)
        for bucket in response.get("ResultsByTime", []):
            for group in bucket.get("Groups", []):
                key = (group.get("Keys") or [""])[0]
                # Group keys look like "ClusterName$<value>"; "ClusterName$" is untagged.
                cluster = key[len(prefix):] if key.startswith(prefix) else ""
                if not cluster:
                    continue
                amount = _amount(group.get("Metrics", {}).get(METRIC))
                costs[cluster] = costs.get(cluster, Decimal(0)) + amount
        token = response.get("NextPageToken")
        if not token:
            return costs
        request["NextPageToken"] = token
