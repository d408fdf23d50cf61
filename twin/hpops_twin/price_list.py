"""The AWS Price List (service "pricing") in the twin: moto 5.2.1 has no Price List service.

moto's in-process mock (``BotocoreStubber``, a ``before-send`` handler in botocore's built-in
handlers) answers every ``*.amazonaws.com`` URL it has no backend for with 404 "Not yet
implemented", and botocore takes the first answer, so a handler of our own would come too late
(faults.py explains the same for injected errors). While a world is active,
:meth:`PriceListTwin.installed` wraps ``BotocoreStubber.process_request``: requests to a Price
List endpoint (``api.pricing.{us-east-1,ap-south-1,eu-central-1}.amazonaws.com``) are answered
here, everything else goes on to moto. Our Lambda code calls it through plain boto3, so the world
counts those calls, botocore parses the answers against the real API model, and ChaosTransport
sees them like any other request.

``GetProducts`` only: ``ServiceCode``; ``Filters`` of type ``TERM_MATCH`` on product attributes,
all of which must match (other filter types raise NotImplementedError); ``FormatVersion``
``aws_v1``; ``MaxResults`` (botocore checks 1-100; default 100) and an opaque ``NextToken``
(a token from another query is ``InvalidNextTokenException``). Each ``PriceList`` entry is a JSON
document in a string, shaped like AWS's: ``product.{productFamily, attributes, sku}``,
``terms.OnDemand.<sku>.<offer term>.priceDimensions.<rate code>.{unit, pricePerUnit.USD, ...}``
(one key "<sku>.<offer term>" per term, as GetProducts sends it).

The catalogue holds, per region and instance type, a HyperPod cluster SKU (``instanceType``
"<type>-Cluster", ``usagetype`` "<prefix>-Cluster:<type>") next to SKUs that a careless match
would pick: a "ReservedCluster" lookalike with the same ``instanceType``, and training and
hosting SKUs of the same instance type at other prices. Its dollar figures are the twin's
(chosen to match earlier runs), not AWS's current prices.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from decimal import Decimal
from typing import Any
from unittest import mock
from urllib.parse import urlparse

from moto.core.botocore_stubber import BotocoreStubber

PRICE_LIST_HOST = re.compile(r"api\.pricing\.(us-east-1|ap-south-1|eu-central-1)\.amazonaws\.com")
ON_DEMAND_TERM = "JRTCKXETXF"  # AWS's offer term code for on-demand
HOURLY_RATE = "6YS6EN2CT7"  # AWS's rate code suffix for an on-demand hourly price
PUBLISHED = "2026-10-01T00:00:00Z"

REGIONS = {
    "us-east-1": ("USE1", "US East (N. Virginia)"),
    "us-west-2": ("USW2", "US West (Oregon)"),
}
# HyperPod cluster on-demand USD per instance-hour in the twin (illustrative figures).
CLUSTER_PRICES = {
    "ml.p5.48xlarge": "98.32",
    "ml.p4d.24xlarge": "37.69",
    "ml.g5.48xlarge": "20.36",
    "ml.g5.12xlarge": "7.09",
    "ml.trn1.32xlarge": "24.72",
    "ml.m5.xlarge": "0.23",
    "ml.m5.2xlarge": "0.461",
    "ml.m5.4xlarge": "0.922",
    "ml.m5.12xlarge": "2.765",
    "ml.c5.4xlarge": "0.816",
    "ml.t3.medium": "0.05",
}
# Other SKUs of the same instance types, at other prices, so that matching the wrong one shows.
LOOKALIKES = (
    # (usage type operation, instanceType suffix, price factor)
    ("ReservedCluster", "-Cluster", Decimal("0.60")),
    ("Train", "", Decimal("1.10")),
    ("Host", "", Decimal("1.25")),
)
_REGION_FACTOR = {"us-east-1": Decimal(1), "us-west-2": Decimal("1.05")}


class InvalidNextTokenException(Exception):
    pass


def _sku(*parts: str) -> str:
    digest = hashlib.sha256("|".join(parts).encode()).digest()
    alphabet = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"
    return "".join(alphabet[b % len(alphabet)] for b in digest[:16])


def product(region: str, instance_type_value: str, usage_type: str, usd: Decimal) -> dict[str, Any]:
    """One AmazonSageMaker product as the Price List returns it (aws_v1)."""
    prefix, location = REGIONS[region]
    sku = _sku(region, usage_type)
    term, rate = f"{sku}.{ON_DEMAND_TERM}", f"{sku}.{ON_DEMAND_TERM}.{HOURLY_RATE}"
    return {
        "product": {
            "productFamily": "ML Instance",
            "attributes": {
                "servicecode": "AmazonSageMaker",
                "servicename": "Amazon SageMaker",
                "location": location,
                "locationType": "AWS Region",
                "regionCode": region,
                "instanceType": instance_type_value,
                "usagetype": usage_type,
                "operation": "RunInstance",
            },
            "sku": sku,
        },
        "serviceCode": "AmazonSageMaker",
        # GetProducts keys terms by "<sku>.<offer term code>" (the bulk offer file nests by SKU first).
        "terms": {"OnDemand": {term: {
            "offerTermCode": ON_DEMAND_TERM, "sku": sku, "effectiveDate": PUBLISHED, "termAttributes": {},
            "priceDimensions": {rate: {
                "rateCode": rate, "unit": "Hrs", "beginRange": "0", "endRange": "Inf", "appliesTo": [],
                "description": f"${usd} per {instance_type_value} hour in {location} ({usage_type})",
                "pricePerUnit": {"USD": f"{usd:.10f}"},
            }},
        }}},
        "version": PUBLISHED.replace("-", "").replace(":", "").replace("T", "")[:14],
        "publicationDate": PUBLISHED,
    }


def default_catalogue() -> list[dict[str, Any]]:
    products = []
    for region, (prefix, _) in REGIONS.items():
        for instance_type, price in CLUSTER_PRICES.items():
            usd = Decimal(price) * _REGION_FACTOR[region]
            products.append(product(region, f"{instance_type}-Cluster", f"{prefix}-Cluster:{instance_type}", usd))
            for operation, suffix, factor in LOOKALIKES:
                products.append(product(region, f"{instance_type}{suffix}", f"{prefix}-{operation}:{instance_type}",
                                        (usd * factor).quantize(Decimal("0.0001"))))
    return products


class PriceListTwin:
    """world.budget.price_list: the Price List's SageMaker catalogue, which tests may change."""

    def __init__(self, sender: Callable[[], str | None] = lambda: None) -> None:
        self._lock = threading.Lock()
        self._sender = sender
        self.products: list[dict[str, Any]] = default_catalogue()
        # (who asked: the function whose handler was running, or None; GetProducts request body), in order
        self.requests: list[tuple[str | None, dict[str, Any]]] = []

    # ------------------------------------------------------------------ catalogue
    def set_cluster_price(self, instance_type: str, usd: str, region: str = "us-east-1") -> None:
        """The on-demand HyperPod price of `instance_type` in `region` (added or replaced)."""
        prefix, _ = REGIONS[region]
        usage_type = f"{prefix}-Cluster:{instance_type}"
        with self._lock:
            self.products = [p for p in self.products if p["product"]["attributes"]["usagetype"] != usage_type]
            self.products.append(product(region, f"{instance_type}-Cluster", usage_type, Decimal(usd)))

    def remove(self, instance_type: str) -> None:
        """Every SKU of `instance_type`, in every region (a type the Price List does not have)."""
        with self._lock:
            self.products = [p for p in self.products
                             if not p["product"]["attributes"]["usagetype"].endswith(f":{instance_type}")]

    # ------------------------------------------------------------------ the API
    def get_products(self, body: dict[str, Any]) -> dict[str, Any]:
        filters = body.get("Filters") or []
        for f in filters:
            if f.get("Type") != "TERM_MATCH":
                raise NotImplementedError(f"the twin's Price List matches TERM_MATCH filters only, not {f.get('Type')}")
        query = json.dumps({"ServiceCode": body["ServiceCode"], "Filters": filters}, sort_keys=True)
        query_id = hashlib.sha256(query.encode()).hexdigest()[:16]
        offset = 0
        if body.get("NextToken"):
            try:
                token = json.loads(base64.urlsafe_b64decode(body["NextToken"]))
                assert token["q"] == query_id
                offset = int(token["o"])
            except Exception:
                raise InvalidNextTokenException("The pagination token is invalid.") from None
        with self._lock:
            matches = [p for p in self.products if p["serviceCode"] == body["ServiceCode"]
                       and all(p["product"]["attributes"].get(f["Field"]) == f["Value"] for f in filters)]
        limit = int(body.get("MaxResults") or 100)
        page = matches[offset:offset + limit]
        answer: dict[str, Any] = {"FormatVersion": body.get("FormatVersion") or "aws_v1",
                                  "PriceList": [json.dumps(p) for p in page]}
        if offset + limit < len(matches):
            token = json.dumps({"q": query_id, "o": offset + limit}).encode()
            answer["NextToken"] = base64.urlsafe_b64encode(token).decode()
        return answer

    def answer(self, request: Any) -> tuple[int, dict[str, str], str]:
        headers = {name: (v.decode() if isinstance(v, bytes) else v) for name, v in request.headers.items()}
        target = headers.get("X-Amz-Target", "")
        if target != "AWSPriceListService.GetProducts":
            raise NotImplementedError(f"the twin's Price List answers GetProducts only, not {target}")
        raw = request.body.decode() if isinstance(request.body, bytes) else (request.body or "{}")
        body = json.loads(raw or "{}")
        self.requests.append((self._sender(), body))
        response_headers = {"Content-Type": "application/x-amz-json-1.1", "x-amzn-RequestId": str(uuid.uuid4())}
        try:
            return 200, response_headers, json.dumps(self.get_products(body))
        except InvalidNextTokenException as error:
            return 400, response_headers, json.dumps({"__type": "InvalidNextTokenException", "Message": str(error)})

    @contextmanager
    def installed(self) -> Iterator[PriceListTwin]:
        twin = self
        real_process_request = BotocoreStubber.process_request

        def process_request(stubber: BotocoreStubber, request: Any) -> Any:
            if PRICE_LIST_HOST.fullmatch(urlparse(request.url).netloc or ""):
                return twin.answer(request)
            return real_process_request(stubber, request)

        with mock.patch.object(BotocoreStubber, "process_request", process_request):
            yield self
