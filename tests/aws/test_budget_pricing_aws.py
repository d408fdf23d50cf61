"""The rate adapters against the real API models: Cost Explorer by usage type, the Price List.

botocore's Stubber checks every request against the service model and the exact parameters we
expect, and answers with what AWS would send (moto has no Price List at all, and its Cost Explorer
ignores the request). The Price List answers are JSON documents in strings, as the API sends them.
"""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal as D

import boto3
import pytest
from botocore.stub import Stubber

from hpops_core.budget_guard.aws_budgets import UnexpectedCurrency
from hpops_core.budget_guard.pricing import billed_month, list_prices, pricing_client, rates_for
from hpops_core.common.errors import TransientAwsError

UTC = dt.timezone.utc
NOV_22 = dt.datetime(2026, 11, 22, 9, 30, tzinfo=UTC)
P5, M5, NEW = "ml.p5.48xlarge", "ml.m5.xlarge", "ml.p6-b200.48xlarge"
PERIOD = {"Start": "2026-11-01", "End": "2026-11-22"}


@pytest.fixture
def ce():
    client = boto3.client("ce", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="y")
    with Stubber(client) as stub:
        client.stub = stub
        yield client
        stub.assert_no_pending_responses()


@pytest.fixture
def pricing():
    client = boto3.client("pricing", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="y")
    with Stubber(client) as stub:
        client.stub = stub
        yield client
        stub.assert_no_pending_responses()


def ce_request(token=None):
    request = {
        "TimePeriod": PERIOD,
        "Granularity": "MONTHLY",
        "Metrics": ["UnblendedCost", "UsageQuantity"],
        "Filter": {"Tags": {"Key": "ClusterName", "Values": ["lab"], "MatchOptions": ["EQUALS"]}},
        "GroupBy": [{"Type": "DIMENSION", "Key": "USAGE_TYPE"}],
    }
    if token:
        request["NextPageToken"] = token
    return request


def group(usage_type, usd, quantity, unit="Hrs", currency="USD"):
    return {"Keys": [usage_type], "Metrics": {"UnblendedCost": {"Amount": usd, "Unit": currency},
                                              "UsageQuantity": {"Amount": quantity, "Unit": unit}}}


def ce_page(*groups, token=None):
    page = {"GroupDefinitions": [{"Type": "DIMENSION", "Key": "USAGE_TYPE"}],
            "ResultsByTime": [{"TimePeriod": PERIOD, "Total": {}, "Groups": list(groups), "Estimated": True}],
            "DimensionValueAttributes": []}
    if token:
        page["NextPageToken"] = token
    return page


# --------------------------------------------------------------------------- billed


def test_one_request_by_usage_type_gives_billed_hours_per_type_and_the_rest(ce):
    ce.stub.add_response("get_cost_and_usage", ce_page(
        group("USE1-Cluster:ml.p5.48xlarge", "127814.40", "1440.0000000000"),
        group("USE1-Cluster:VolumeUsage.gp2", "812.30", "16240.5", unit="GB-Mo"),
        group("USE1-Cluster:ml.m5.xlarge", "99.36", "432"),
        token="page-2"), ce_request())
    ce.stub.add_response("get_cost_and_usage", ce_page(
        # The same instances under another purchase option, on the next page: summed with the first.
        group("USE1-ReservedCluster:ml.p5.48xlarge", "19065.60", "288"),
        group("USE1-Train:ml.p5.48xlarge", "400.00", "4"),  # a training job carrying the cluster tag
        group("USE1-DataTransfer-Out-Bytes", "3.10", "34.4", unit="GB"),
    ), ce_request("page-2"))

    month = billed_month(ce, "lab", NOV_22)

    assert (month.start, month.end) == ("2026-11-01", "2026-11-22")
    assert sorted(month.by_instance_type) == [M5, P5]
    p5 = month.by_instance_type[P5]
    assert (p5.cost_usd, p5.hours, p5.start, p5.end) == (D("146880.00"), D("1728"), "2026-11-01", "2026-11-22")
    assert (month.by_instance_type[M5].cost_usd, month.by_instance_type[M5].hours) == (D("99.36"), D("432"))
    assert month.other_cost_usd == D("812.30") + D("400.00") + D("3.10")
    assert month.total_usd == D("148194.76"), "what Cost Explorer bills the cluster, to the cent"


def test_the_first_of_the_month_asks_nothing(ce):
    month = billed_month(ce, "lab", dt.datetime(2026, 12, 1, 18, tzinfo=UTC))
    assert month.by_instance_type == {} and month.total_usd == 0 and month.start is None


def test_a_bill_in_another_currency_is_a_named_error(ce):
    ce.stub.add_response("get_cost_and_usage", ce_page(
        group("USE1-Cluster:ml.p5.48xlarge", "1000", "10", currency="EUR")), ce_request())
    with pytest.raises(UnexpectedCurrency):
        billed_month(ce, "lab", NOV_22)


def test_throttling_that_outlived_retries_is_transient(ce):
    ce.stub.add_client_error("get_cost_and_usage", "ThrottlingException", http_status_code=400)
    with pytest.raises(TransientAwsError, match="ce:GetCostAndUsage"):
        billed_month(ce, "lab", NOV_22)


# --------------------------------------------------------------------------- list


def price_list_product(instance_type_value, usage_type, usd, region="us-east-1", sku="AAAAAAAAAAAAAAAA", unit="Hrs"):
    """One AmazonSageMaker product as GetProducts returns it: a JSON document in a string."""
    location = {"us-east-1": "US East (N. Virginia)", "us-west-2": "US West (Oregon)"}[region]
    term, rate = f"{sku}.JRTCKXETXF", f"{sku}.JRTCKXETXF.6YS6EN2CT7"
    return json.dumps({
        "product": {"productFamily": "ML Instance", "sku": sku, "attributes": {
            "servicecode": "AmazonSageMaker", "location": location, "locationType": "AWS Region",
            "regionCode": region, "instanceType": instance_type_value, "usagetype": usage_type,
            "operation": "RunInstance", "servicename": "Amazon SageMaker"}},
        "serviceCode": "AmazonSageMaker",
        # GetProducts keys terms by "<sku>.<offer term code>" (the bulk offer file nests by SKU first).
        "terms": {"OnDemand": {term: {
            "priceDimensions": {rate: {"unit": unit, "endRange": "Inf", "beginRange": "0", "appliesTo": [],
                                       "rateCode": rate, "description": f"${usd} per hour",
                                       "pricePerUnit": {"USD": usd}}},
            "sku": sku, "effectiveDate": "2026-10-01T00:00:00Z", "offerTermCode": "JRTCKXETXF", "termAttributes": {}}}},
        "version": "20261001000000", "publicationDate": "2026-10-01T00:00:00Z",
    })


def products_request(instance_type, region="us-east-1", token=None):
    request = {"ServiceCode": "AmazonSageMaker", "FormatVersion": "aws_v1", "Filters": [
        {"Type": "TERM_MATCH", "Field": "regionCode", "Value": region},
        {"Type": "TERM_MATCH", "Field": "instanceType", "Value": f"{instance_type}-Cluster"}]}
    if token:
        request["NextToken"] = token
    return request


def test_the_on_demand_hyperpod_cluster_price_is_picked_out_of_its_lookalikes(pricing):
    pricing.stub.add_response("get_products", {"FormatVersion": "aws_v1", "NextToken": "t-2", "PriceList": [
        # Same instanceType value, another purchase option: not the on-demand rate.
        price_list_product("ml.p5.48xlarge-Cluster", "USE1-ReservedCluster:ml.p5.48xlarge", "58.9920000000", sku="RRRRRRRRRRRRRRRR"),
        # Another region's product (regionCode checked again, whatever the filter did).
        price_list_product("ml.p5.48xlarge-Cluster", "USW2-Cluster:ml.p5.48xlarge", "103.2360000000", region="us-west-2"),
    ]}, products_request(P5))
    pricing.stub.add_response("get_products", {"FormatVersion": "aws_v1", "PriceList": [
        price_list_product("ml.p5.48xlarge-Cluster", "USE1-Cluster:ml.p5.48xlarge", "98.3200000000", sku="CCCCCCCCCCCCCCCC"),
        # A monthly or per-GB dimension is not an hourly rate.
        price_list_product("ml.p5.48xlarge-Cluster", "USE1-Cluster:ml.p5.48xlarge", "9999", sku="MMMMMMMMMMMMMMMM", unit="Mo"),
    ]}, products_request(P5, token="t-2"))
    pricing.stub.add_response("get_products", {"FormatVersion": "aws_v1", "PriceList": [
        price_list_product("ml.m5.xlarge-Cluster", "USE1-Cluster:ml.m5.xlarge", "0.2300000000")]}, products_request(M5))
    pricing.stub.add_response("get_products", {"FormatVersion": "aws_v1", "PriceList": []}, products_request(NEW))

    assert list_prices(pricing, [P5, M5, NEW, P5], "us-east-1") == {P5: D("98.32"), M5: D("0.23")}


def test_two_matching_products_give_the_higher_price_whatever_their_order(pricing):
    for order in (("97.00", "98.32"), ("98.32", "97.00")):
        pricing.stub.add_response("get_products", {"FormatVersion": "aws_v1", "PriceList": [
            price_list_product("ml.p5.48xlarge-Cluster", "USE1-Cluster:ml.p5.48xlarge", usd, sku=f"SKU{usd}")
            for usd in order]}, products_request(P5))
        assert list_prices(pricing, [P5], "us-east-1") == {P5: D("98.32")}


def test_list_prices_are_asked_of_the_clusters_region(pricing):
    pricing.stub.add_response("get_products", {"FormatVersion": "aws_v1", "PriceList": [
        price_list_product("ml.p5.48xlarge-Cluster", "USW2-Cluster:ml.p5.48xlarge", "103.2360000000", region="us-west-2")]},
        products_request(P5, region="us-west-2"))
    assert list_prices(pricing, [P5], "us-west-2") == {P5: D("103.236")}


def test_a_throttled_price_list_is_transient(pricing):
    pricing.stub.add_client_error("get_products", "ThrottlingException", http_status_code=400)
    with pytest.raises(TransientAwsError, match="pricing:GetProducts"):
        list_prices(pricing, [P5], "us-east-1")


def test_the_price_list_client_is_in_us_east_1_with_standard_retries():
    client = pricing_client()
    assert client.meta.endpoint_url == "https://api.pricing.us-east-1.amazonaws.com"
    assert client.meta.config.retries["mode"] == "standard"


# --------------------------------------------------------------------------- both


def test_the_price_list_is_asked_only_for_types_without_a_billed_rate(ce, pricing):
    ce.stub.add_response("get_cost_and_usage", ce_page(
        group("USE1-Cluster:ml.p5.48xlarge", "146880.00", "1728"),
        group("USE1-Cluster:ml.m5.xlarge", "0.10", "0.4"),  # too little to trust
        group("USE1-Cluster:VolumeUsage.gp2", "1200.00", "24000", unit="GB-Mo"),
    ), ce_request())
    # Not p5 (billed): m5 (billed too little) and the two unbilled types reach the Price List.
    pricing.stub.add_response("get_products", {"FormatVersion": "aws_v1", "PriceList": [
        price_list_product("ml.m5.xlarge-Cluster", "USE1-Cluster:ml.m5.xlarge", "0.2300000000")]}, products_request(M5))
    pricing.stub.add_response("get_products", {"FormatVersion": "aws_v1", "PriceList": []}, products_request(NEW))
    pricing.stub.add_response("get_products", {"FormatVersion": "aws_v1", "PriceList": []}, products_request("ml.x9.huge"))

    choice, month = rates_for([P5, M5, NEW, "ml.x9.huge"], ce=ce, pricing=pricing, cluster_name="lab",
                              region="us-east-1", overrides={NEW: D("113.93"), P5: D("1")}, now=NOV_22)

    assert {t: (r.source, r.usd_per_hour) for t, r in choice.rates.items()} == {
        P5: ("billed", D(85)), M5: ("list", D("0.23")), NEW: ("override", D("113.93"))}
    assert choice.missing == ("ml.x9.huge",)
    assert month.total_usd == D("148080.10")


def test_a_fully_billed_cluster_never_asks_the_price_list(ce, pricing):
    ce.stub.add_response("get_cost_and_usage", ce_page(group("USE1-Cluster:ml.p5.48xlarge", "146880.00", "1728")), ce_request())
    choice, _ = rates_for([P5], ce=ce, pricing=pricing, cluster_name="lab", region="us-east-1", overrides={}, now=NOV_22)
    assert choice.rates[P5].source == "billed"  # the pricing Stubber has no answer queued: a call would fail
