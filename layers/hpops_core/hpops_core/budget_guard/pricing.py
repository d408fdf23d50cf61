"""Where the projection's rates come from on AWS: Cost Explorer (billed) and the Price List (list).

The choice between them is pure (``rates.choose_rates``); this module only fetches. Clients are
passed in; the factory below makes the Price List client at call time, never at import.

Cost Explorer charges $0.01 per request, so the billed month is ONE GetCostAndUsage (plus its
pages) per evaluation, and it also gives the cluster's month-to-date total. The Price List API
is free but is asked only for the instance types that have no trustworthy billed rate.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterable, Mapping
from decimal import Decimal, InvalidOperation
from types import MappingProxyType
from typing import Any

import boto3

from hpops_core.budget_guard.aws_budgets import _amount, _period
from hpops_core.budget_guard.budget_spec import CLUSTER_TAG, METRIC, validate_cluster_name
from hpops_core.budget_guard.rates import (
    HOUR_UNITS,
    BilledMonth,
    BilledUsage,
    RateChoice,
    billed_rate,
    choose_rates,
    instance_type_of_usage,
    no_billed_month,
)
from hpops_core.common.clients import RETRY_CONFIG, transient_errors_named

__all__ = ["PRICE_LIST_REGION", "billed_month", "billed_request", "list_prices", "pricing_client", "rates_for"]

# The Price List API answers only in us-east-1, ap-south-1 and eu-central-1; the prices it
# returns are for any region (the regionCode filter below).
PRICE_LIST_REGION = "us-east-1"
SERVICE_CODE = "AmazonSageMaker"
USAGE_QUANTITY = "UsageQuantity"


def pricing_client(session: boto3.session.Session | None = None) -> Any:
    return (session or boto3).client("pricing", region_name=PRICE_LIST_REGION, config=RETRY_CONFIG)


# --------------------------------------------------------------------------- billed


def billed_request(cluster_name: str, now: dt.datetime) -> dict[str, Any] | None:
    """The GetCostAndUsage request for the cluster's bill this UTC month through yesterday, or None
    on the 1st (no complete day: CE rejects Start == End, and nothing is billed yet)."""
    validate_cluster_name(cluster_name)
    period = _period(now)
    if period is None:
        return None
    return {
        "TimePeriod": period,
        "Granularity": "MONTHLY",
        "Metrics": [METRIC, USAGE_QUANTITY],
        "Filter": {"Tags": {"Key": CLUSTER_TAG, "Values": [cluster_name], "MatchOptions": ["EQUALS"]}},
        "GroupBy": [{"Type": "DIMENSION", "Key": "USAGE_TYPE"}],
    }


def billed_month(ce: Any, cluster_name: str, now: dt.datetime) -> BilledMonth:
    """The cluster's bill this UTC month through yesterday, by instance type.

    One GetCostAndUsage grouped by USAGE_TYPE (UnblendedCost, UsageQuantity), filtered on the
    cost allocation tag ClusterName=<cluster>, like the budget. Usage types that bill hours of a
    HyperPod instance type are summed per type (``rates.instance_type_of_usage``); everything else
    the cluster was billed for (volumes, ...) is ``other_cost_usd``, so the parts add up to the
    cluster's month-to-date cost. On the 1st there is no complete day: no call, nothing billed.
    ``fetched_at`` is ``now``: the answer is as of this request (ce_cache keeps it for a day).
    """
    request = billed_request(cluster_name, now)
    if request is None:
        return no_billed_month()
    period = request["TimePeriod"]
    cost: dict[str, Decimal] = {}
    hours: dict[str, Decimal] = {}
    other = Decimal(0)
    while True:
        with transient_errors_named("ce:GetCostAndUsage"):
            response = ce.get_cost_and_usage(**request)
        for bucket in response.get("ResultsByTime", []):
            for group in bucket.get("Groups", []):
                usage_type = (group.get("Keys") or [""])[0]
                metrics = group.get("Metrics", {})
                amount = _amount(metrics.get(METRIC))
                quantity = metrics.get(USAGE_QUANTITY) or {}
                instance_type = instance_type_of_usage(usage_type, quantity.get("Unit"))
                if instance_type is None:
                    other += amount
                    continue
                cost[instance_type] = cost.get(instance_type, Decimal(0)) + amount
                hours[instance_type] = hours.get(instance_type, Decimal(0)) + Decimal(str(quantity.get("Amount", "0")))
        token = response.get("NextPageToken")
        if not token:
            break
        request["NextPageToken"] = token
    usage = {t: BilledUsage(t, cost[t], hours[t], period["Start"], period["End"]) for t in sorted(cost)}
    return BilledMonth(MappingProxyType(usage), other, period["Start"], period["End"], fetched_at=_iso(now))


def _iso(now: dt.datetime) -> str:
    return now.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# --------------------------------------------------------------------------- list


def _cluster_usage_type(instance_type: str) -> re.Pattern[str]:
    # On-demand HyperPod instance time only: "USE1-Cluster:ml.p5.48xlarge" (or no region prefix).
    # Not "...-ReservedCluster:..." or other purchase options that share the instanceType value.
    return re.compile(rf"(?:[A-Z0-9]+-)?Cluster:{re.escape(instance_type)}")


def _hourly_usd(product: Mapping[str, Any], instance_type: str, region: str) -> list[tuple[Decimal, str]]:
    """(USD per hour, SKU) of each on-demand hourly price dimension of a HyperPod cluster product."""
    attributes = (product.get("product") or {}).get("attributes") or {}
    if attributes.get("regionCode") != region:
        return []
    if not _cluster_usage_type(instance_type).fullmatch(attributes.get("usagetype", "")):
        return []
    sku = str((product.get("product") or {}).get("sku", ""))
    found = []
    for term in ((product.get("terms") or {}).get("OnDemand") or {}).values():
        for dimension in (term.get("priceDimensions") or {}).values():
            if str(dimension.get("unit", "")).lower() not in HOUR_UNITS:
                continue
            try:
                usd = Decimal(str((dimension.get("pricePerUnit") or {}).get("USD")))
            except InvalidOperation:
                continue
            if usd.is_finite() and usd > 0:
                found.append((usd, sku))
    return found


def list_prices(pricing: Any, instance_types: Iterable[str], region: str) -> dict[str, Decimal]:
    """On-demand USD per hour of HyperPod cluster instances in ``region``, from the Price List.

    What is matched, and why (AmazonSageMaker products carry one SKU per feature and instance
    type: training, hosting, notebooks, HyperPod clusters... at different prices):
      * Filters ``regionCode`` = region and ``instanceType`` = "<type>-Cluster". SageMaker's
        ``instanceType`` attribute carries the feature after the type ("ml.c5.xlarge-Cluster"
        for HyperPod, "ml.t3.medium-Notebook", ...: the same values as the Cost and Usage
        Report's product/instanceType column), so this filter keeps the query to the HyperPod
        SKUs of that type rather than every training, hosting and notebook SKU of it.
      * Then, in code, ``usagetype`` must be "<region prefix>-Cluster:<type>", the usage type
        HyperPod instance hours are billed under: this drops lookalikes sharing the instanceType
        value under other purchase options (e.g. "ReservedCluster"), and ``regionCode`` is
        checked again.
      * Of the OnDemand terms, price dimensions in hours with a positive USD price.
    If several products still match, the highest price wins (ties by SKU, so the same catalogue
    always gives the same figure): the projection is an early warning, so ambiguity errs high.
    A type with no match is left out; the caller falls back to RateOverridesJson.

    Where these names come from: public code that prices HyperPod nodes from the Price List
    (filters on usagetype "<prefix>-Cluster:ml.<type>"; offer-file fixtures with instanceType
    "ml.g5.8xlarge-Cluster", usagetype "USE1-Cluster:ml.g5.8xlarge" and a "USE1-ReservedCluster"
    lookalike), SageMaker pricing code using regionCode and productFamily "ML Instance", and a
    CUR parser stripping "-Cluster"/"-Notebook" suffixes. Not checked against a live answer: if
    AWS names them otherwise, the query finds nothing and the type falls through to the override
    or the MissingHourlyPrice warning, never to a wrong price.
    """
    paginator = pricing.get_paginator("get_products")
    prices: dict[str, Decimal] = {}
    for instance_type in dict.fromkeys(instance_types):
        candidates: list[tuple[Decimal, str]] = []
        filters = [
            {"Type": "TERM_MATCH", "Field": "regionCode", "Value": region},
            {"Type": "TERM_MATCH", "Field": "instanceType", "Value": f"{instance_type}-Cluster"},
        ]
        with transient_errors_named("pricing:GetProducts"):
            for page in paginator.paginate(ServiceCode=SERVICE_CODE, Filters=filters, FormatVersion="aws_v1"):
                for raw in page.get("PriceList", []):
                    # Each product is a JSON document in a string (botocore leaves jsonvalue as text).
                    product = json.loads(raw) if isinstance(raw, str) else raw
                    candidates.extend(_hourly_usd(product, instance_type, region))
        if candidates:
            prices[instance_type] = max(candidates, key=lambda c: (c[0], c[1]))[0]
    return prices


# --------------------------------------------------------------------------- both


def rates_for(
    instance_types: Iterable[str], *, pricing: Any, cluster_name: str, region: str,
    overrides: Mapping[str, Decimal], now: dt.datetime, ce: Any = None, billed: BilledMonth | None = None,
) -> tuple[RateChoice, BilledMonth]:
    """The rate of each instance type (billed, else list, else override) and the billed month
    it was chosen from. The Price List is asked only for types without a trustworthy billed rate.

    ``billed``: the billed month already at hand (ce_cache's kept answer); else asked of ``ce``."""
    types = list(dict.fromkeys(instance_types))
    if billed is None:
        billed = billed_month(ce, cluster_name, now)
    unbilled = [t for t in types if billed_rate(billed.by_instance_type.get(t)) is None]
    listed = list_prices(pricing, unbilled, region) if unbilled else {}
    return choose_rates(types, billed, listed, overrides), billed
