"""`hpops cost` and `hpops cost subscribe` against a (moto) deployment.

The stack carries a CheckUserSpendFunction whose environment is what template.yaml gives it (the
test resolves the template's variables), a SyncStateTable holding usage windows stored with
usage_store.store_usage (reports built by the real agent code and parsed by the stack's parser),
a HyperPod cluster (the twin's simulator), Cost Explorer's bill (moto's queued results) and the
Price List (the twin's stand-in). "Now" is fixed: the CLI's clock is an input.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import re
from decimal import ROUND_HALF_UP, Decimal

import boto3
import pytest
import requests
from botocore.exceptions import ClientError
from moto import mock_aws
from moto.core import DEFAULT_ACCOUNT_ID

from hpops.main import main
from hpops.output import COST_CSV_FIELDS
from hpops_core.budget_guard.usage_reports import parse_usage_event
from hpops_core.budget_guard.usage_store import store_usage
from hpops_core.common import clients
from hpops_core.node_channel import contract
from hpops_node_agent import usage
from hpops_twin.hyperpod_sim import HyperPodSimulator
from hpops_twin.price_list import PriceListTwin
from hpops_twin.template_model import TemplateModel
from operator_policy import run_as_operator

UTC = dt.timezone.utc
STACK = "hpops-ml"
CLUSTER = "ml-research"
TABLE = "hpops-ml-SyncStateTable"
NOW = dt.datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
CE_RESULTS_URL = "http://motoapi.amazonaws.com/moto-api/static/ce/cost-and-usage-results"
# group -> (instance type, nodes); partition -> group (provisioning_parameters.json)
GROUPS = {"gpu": ("ml.p5.48xlarge", 2), "cpu": ("ml.c5.4xlarge", 2), "g5": ("ml.g5.8xlarge", 1),
          "controller-machine": ("ml.m5.xlarge", 1)}
PARTITIONS = {"gpu": "gpu", "cpu": "cpu", "g5": "g5"}
# Cost Explorer's bill for Nov 1-19 (19 days x 24 h per node): the gpu and controller types only,
# so ml.c5.4xlarge takes the Price List's price and ml.g5.8xlarge (not listed) the override.
BILLED = {"ml.p5.48xlarge": (Decimal("77520.00"), Decimal(912)), "ml.m5.xlarge": (Decimal("104.88"), Decimal(456))}
VOLUMES = Decimal("300.00")
RATES = {"ml.p5.48xlarge": Decimal("85"), "ml.c5.4xlarge": Decimal("0.816"), "ml.g5.8xlarge": Decimal("2.72"),
         "ml.m5.xlarge": Decimal("0.23")}
PARAMETERS = {"UserMonthlyBudgetUsd": "1000", "UserBudgetOverrides": "alice=5000",
              "RateOverridesJson": '{"ml.g5.8xlarge": "2.72"}'}
CENT = Decimal("0.01")


def at(text: str) -> int:
    return int(dt.datetime.strptime(text, "%Y-%m-%dT%H:%M").replace(tzinfo=UTC).timestamp())


# (window start, user, partition, node-seconds, GPUs per node): alice twice on the gpu nodes,
# bob and carol today only on the types nobody billed yet (so the bill has nothing of theirs).
USAGE = [
    ("2026-11-03T10:00", "alice", "gpu", 7200, 8),
    ("2026-11-20T10:00", "alice", "gpu", 3600, 8),
    ("2026-11-20T08:00", "bob", "cpu", 3600, 0),
    ("2026-11-20T09:00", "bob", "cpu", 3600, 0),
    ("2026-11-20T11:00", "carol", "g5", 3600, 1),
]


def deployed_environment(parameters: dict[str, str]) -> dict[str, str]:
    """CheckUserSpendFunction's variables as template.yaml sets them (what the stack would deploy)."""
    template = TemplateModel()
    values = template.parameter_defaults() | {"ClusterName": CLUSTER} | parameters
    environment = {}
    for name, value in template.function_environment("CheckUserSpendFunction").items():
        if isinstance(value, dict) and set(value) == {"Ref"}:
            ref = value["Ref"]
            value = values[ref] if ref in values else {"SyncStateTable": TABLE}.get(ref, f"not-used-by-cost-{ref}")
        # CloudFormation hands a Number parameter to the function as its text.
        environment[name] = str(value) if isinstance(value, (str, int)) else "not-used-by-cost"
    return environment


def queue_bill(bill: dict[str, tuple[Decimal, Decimal]], other: Decimal) -> None:
    """What Cost Explorer answers (moto answers GetCostAndUsage from this queue)."""
    groups = [{"Keys": [f"USE1-Cluster:{t}"], "Metrics": {"UnblendedCost": {"Amount": str(usd), "Unit": "USD"},
                                                          "UsageQuantity": {"Amount": str(hours), "Unit": "Hrs"}}}
              for t, (usd, hours) in bill.items()]
    groups.append({"Keys": ["USE1-Cluster:VolumeUsage.gp2"], "Metrics": {
        "UnblendedCost": {"Amount": str(other), "Unit": "USD"}, "UsageQuantity": {"Amount": "1", "Unit": "N/A"}}})
    result = {"ResultsByTime": [{"TimePeriod": {"Start": "2026-11-01", "End": "2026-11-20"}, "Total": {},
                                 "Groups": groups, "Estimated": True}],
              "GroupDefinitions": [{"Type": "DIMENSION", "Key": "USAGE_TYPE"}], "DimensionValueAttributes": []}
    requests.post(CE_RESULTS_URL, json={"results": [result] * 8}, timeout=10).raise_for_status()


# DescribeCluster's groups: room for every window stored here (the bound itself: test_usage_store.py).
ROOMY = [{"InstanceGroupName": group, "CurrentCount": 10_000} for group in sorted(set(PARTITIONS.values()))]


def store_window(start: str, records: dict, *, status: str = contract.USAGE_OK, reason: str = "",
                 partitions: dict[str, str] = PARTITIONS, collected: int | None = None) -> None:
    window = at(start)
    # Collected once final (settled), or, for a window still open at NOW, just before NOW.
    collected = collected if collected is not None else min(window + 3600 + contract.USAGE_SETTLE_SECONDS,
                                                            int(NOW.timestamp()) - 300)
    detail = usage.build_report(CLUSTER, "i-0123456789abcdef0", window, collected, status, reason, totals=records,
                                partitions=usage.PartitionGroups(partitions, 0, ""))
    for part in usage.split_report(detail):
        event = {"source": contract.REPORT_SOURCE, "detail-type": contract.USAGE_DETAIL_TYPE, "detail": part}
        store_usage(TABLE, parse_usage_event(event), now_epoch=collected, instance_groups=ROOMY)


def store(rows=USAGE) -> None:
    for start, user, partition, seconds, gpus in rows:
        store_window(start, {(user, partition): {"nodeSeconds": seconds, "cpuSeconds": 96 * seconds,
                                                  "gpuSeconds": gpus * seconds, "jobs": 1}})


def create_stack(region: str, environment: dict[str, str] | None, outputs: bool = True) -> None:
    resources = {"UserSpendAlertTopic": {"Type": "AWS::SNS::Topic"}}
    if environment is not None:
        resources |= {
            "Role": {"Type": "AWS::IAM::Role", "Properties": {"AssumeRolePolicyDocument": {
                "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                        "Principal": {"Service": "lambda.amazonaws.com"}}]}}},
            "CheckUserSpendFunction": {"Type": "AWS::Lambda::Function", "Properties": {
                "Runtime": "python3.11", "Handler": "user_spend.check_user_spend", "Code": {"ZipFile": "# in the layer"},
                "Role": {"Fn::GetAtt": ["Role", "Arn"]}, "Environment": {"Variables": environment}}},
        }
    # The cluster's ARN and the table's name, as template.yaml's stack has them: the operator's policy names both.
    try:
        cluster_arn = boto3.client("sagemaker", region_name=region).describe_cluster(ClusterName=CLUSTER)["ClusterArn"]
    except ClientError:
        cluster_arn = f"arn:aws:sagemaker:{region}:{DEFAULT_ACCOUNT_ID}:cluster/none"
    template = {"Resources": resources,
                "Parameters": {"ClusterName": {"Type": "String"}, "ClusterArn": {"Type": "String"}},
                "Outputs": {"UserSpendAlertTopicArn": {"Value": {"Ref": "UserSpendAlertTopic"}},
                            "SyncStateTableName": {"Value": TABLE}} if outputs else {}}
    boto3.client("cloudformation", region_name=region).create_stack(
        StackName=STACK, TemplateBody=json.dumps(template),
        Parameters=[{"ParameterKey": "ClusterName", "ParameterValue": CLUSTER},
                    {"ParameterKey": "ClusterArn", "ParameterValue": cluster_arn}])


@pytest.fixture
def aws(monkeypatch):
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
    monkeypatch.setattr("hpops.main._utc_now", lambda: NOW)
    with mock_aws(), PriceListTwin().installed():
        clients.reset_clients()
        yield monkeypatch
        clients.reset_clients()


def deploy(monkeypatch, region: str = "us-east-1", parameters: dict[str, str] | None = None,
           with_function: bool = True) -> HyperPodSimulator:
    """The cluster, the state table, the bill and the stack, in ``region``."""
    monkeypatch.setenv("AWS_DEFAULT_REGION", region)  # store_usage writes through hpops_core's client
    clients.reset_clients()
    sim = HyperPodSimulator(region, DEFAULT_ACCOUNT_ID, clock=lambda: NOW)
    sim.create_cluster(CLUSTER, GROUPS)
    boto3.client("dynamodb", region_name=region).create_table(
        TableName=TABLE, BillingMode="PAY_PER_REQUEST",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}, {"AttributeName": "sk", "AttributeType": "S"}])
    queue_bill(BILLED, VOLUMES)
    create_stack(region, deployed_environment(PARAMETERS | (parameters or {})) if with_function else None)
    return sim


@pytest.fixture
def deployed(aws):
    deploy(aws)
    store()
    return aws


def run(capsys, *argv: str) -> tuple[int, str, str]:
    return run_as_operator(capsys, main, *argv)


def cents(amount: Decimal) -> Decimal:
    return amount.quantize(CENT, ROUND_HALF_UP)


def expected_users() -> dict[str, Decimal]:
    """Node-hours x the rate of the partition's instance type, per user (independent of the product)."""
    dollars: dict[str, Decimal] = {}
    for _, user, partition, seconds, _ in USAGE:
        instance_type = GROUPS[PARTITIONS[partition]][0]
        dollars[user] = dollars.get(user, Decimal(0)) + Decimal(seconds) / 3600 * RATES[instance_type]
    return {user: cents(amount) for user, amount in dollars.items()}


def expected_cluster_cost(now: dt.datetime = NOW) -> Decimal:
    """The bill for Nov 1-19 + every node up now x its rate for the hours since (Nov 20 00:00)."""
    hours = Decimal(int((now - dt.datetime(2026, 11, 20, tzinfo=UTC)).total_seconds())) / 3600
    estimate = sum(count * RATES[instance_type] * hours for instance_type, count in GROUPS.values())
    return cents(sum(usd for usd, _ in BILLED.values()) + VOLUMES + estimate)


# --------------------------------------------------------------------------- the report


def test_the_table_prices_each_user_and_its_lines_add_up_to_the_cluster_cost(deployed, capsys):
    status, out, err = run(capsys, "cost", "--stack-name", STACK, "--region", "us-east-1")

    assert (status, err) == (0, ""), out
    rows = {m[0]: m[1:] for m in re.findall(
        r"^(\w+)\s+([\d,.]+)\s+([\d,.]+)\s+(\d+)\s+([\d,.]+)\s+([\d.]+)\s+([\d,.]+)\s+([\d.]+)\s+([\d,.]+) \((\w+)\)$",
        out, flags=re.MULTILINE)}
    assert list(rows) == ["alice", "carol", "bob"], "highest spend first"
    assert rows["alice"][:4] == ("3.00", "24.00", "2", "255.00")
    assert rows["alice"][7:] == ("5,000.00", "override") and rows["bob"][7:] == ("1,000.00", "default")
    assert {user: Decimal(row[3].replace(",", "")) for user, row in rows.items()} == expected_users()
    totals = {label: Decimal(amount.replace(",", "")) for label, amount in
              re.findall(r"^(users|idle|other|cluster cost)\s+([\d,.-]+)\s", out, flags=re.MULTILINE)}
    assert totals["cluster cost"] == expected_cluster_cost() == Decimal("80019.86")
    assert totals["users"] + totals["idle"] + totals["other"] == totals["cluster cost"]
    assert totals["other"] == VOLUMES
    # Each rate with where it came from.
    assert re.search(r"ml\.p5\.48xlarge\s+\$85\.00/h\s+billed\s+"
                     r"Cost Explorer 2026-11-01\.\.2026-11-20: \$77,520\.00 over 912\.0 h", out)
    assert re.search(r"ml\.c5\.4xlarge\s+\$0\.816/h\s+list\s+AWS Price List", out)
    assert re.search(r"ml\.g5\.8xlarge\s+\$2\.72/h\s+override\s+RateOverridesJson", out)
    assert "warning" not in out and "over a threshold" not in out


def test_json_users_are_hours_times_rate_and_the_lines_add_up(deployed, capsys):
    status, out, _ = run(capsys, "cost", "--stack-name", STACK, "--json")

    document = json.loads(out)
    assert status == 0
    assert (document["cluster"], document["month"], document["asOf"]) == (CLUSTER, "2026-11", "2026-11-20T12:00:00Z")
    users = {u["user"]: u for u in document["users"]}
    assert {user: Decimal(u["usd"]) for user, u in users.items()} == expected_users()
    assert [users[u]["rateSources"] for u in ("alice", "bob", "carol")] == [["billed"], ["list"], ["override"]]
    assert (users["bob"]["nodeHours"], users["bob"]["gpuHours"]) == ("2.00", "0.00")
    # alice's last 24 hours ($85.00 at 10:00 today) run on until the month ends: 252 hours.
    assert Decimal(users["alice"]["projectedUsd"]) == cents(Decimal(255) + Decimal(85) / 24 * 252)
    assert users["alice"]["percentOfLimit"] == "5.1" and users["alice"]["limitSource"] == "override"
    cluster = Decimal(document["clusterCost"]["usd"])
    assert cluster == expected_cluster_cost()
    lines = sum(Decimal(u["usd"]) for u in document["users"]) + Decimal(document["idle"]["usd"]) \
        + Decimal(document["other"]["usd"])
    assert lines == cluster
    assert {r["instanceType"]: r["source"] for r in document["rates"]} == {
        "ml.p5.48xlarge": "billed", "ml.m5.xlarge": "billed", "ml.c5.4xlarge": "list", "ml.g5.8xlarge": "override"}
    assert document["thresholdsPercent"] == ["80", "100"] and document["findings"] == [] and document["warnings"] == []
    assert document["collector"]["status"] == "ok"


def test_csv_has_a_header_a_row_per_user_and_the_three_lines(deployed, capsys):
    status, out, _ = run(capsys, "cost", "--stack-name", STACK, "--csv")

    rows = list(csv.DictReader(io.StringIO(out)))
    assert status == 0
    assert out.splitlines()[0].split(",") == list(COST_CSV_FIELDS)
    assert [(r["line"], r["user"]) for r in rows] == [("user", "alice"), ("user", "carol"), ("user", "bob"),
                                                      ("idle", ""), ("other", ""), ("cluster", "")]
    assert {r["user"]: Decimal(r["usd"]) for r in rows if r["line"] == "user"} == expected_users()
    assert rows[2]["limit_usd"] == "1000.00" and rows[2]["limit_source"] == "default" and rows[2]["rate_sources"] == "list"
    assert sum(Decimal(r["usd"]) for r in rows[:-1]) == Decimal(rows[-1]["usd"]) == expected_cluster_cost()


def test_a_user_at_a_threshold_exits_1_and_is_named(aws, capsys):
    deploy(aws, parameters={"UserBudgetOverrides": "alice=300"})
    store()

    status, out, _ = run(capsys, "cost", "--stack-name", STACK)

    assert status == 1
    findings = [line for line in out.splitlines() if line.startswith("over a threshold:")]
    # $255 is 85 % of $300; her last 24 hours project far past 100 %: per kind, the highest threshold crossed.
    assert len(findings) == 2
    assert findings[0].startswith("over a threshold: alice has spent $255.00") and findings[0].endswith("threshold 80%")
    assert findings[1].startswith("over a threshold: alice is projected to spend") and findings[1].endswith("threshold 100%")


def test_accounting_not_enabled_and_unpriced_partitions_are_warnings(aws, capsys):
    deploy(aws)
    store()
    store_window("2026-11-20T10:00", {("dave", "dev"): {"nodeSeconds": 5400, "cpuSeconds": 0, "gpuSeconds": 0, "jobs": 1}},
                 partitions=PARTITIONS, collected=at("2026-11-20T11:20"))
    # The latest collection: sacct says accounting storage is off (the windows before it are kept).
    store_window("2026-11-20T11:00", {}, status=contract.USAGE_NOT_ENABLED,
                 reason="Slurm accounting storage is disabled (AccountingStorageType)", collected=at("2026-11-20T11:58"))

    status, out, _ = run(capsys, "cost", "--stack-name", STACK, "--json")

    document = json.loads(out)
    assert status == 1
    warnings = {w["name"]: w["reason"] for w in document["warnings"]}
    assert "accounting not enabled" in warnings["UsageNotCollected"]
    assert "dev" in warnings["UnpricedPartition"]
    dave = next(u for u in document["users"] if u["user"] == "dave")
    assert (dave["usd"], dave["unpricedNodeHours"]) == ("0.00", "1.50")


def test_no_usage_report_yet_is_a_warning_not_a_crash(aws, capsys):
    deploy(aws)

    status, out, _ = run(capsys, "cost", "--stack-name", STACK)

    assert status == 1
    assert "(no Slurm usage this month)" in out
    assert re.search(r"^warning NoUsageReport: no usage report from the controller yet", out, flags=re.MULTILINE)


def test_a_controller_that_stopped_reporting_is_a_warning(aws, capsys):
    deploy(aws)
    store(USAGE[:1])  # Nov 3's window, collected that day: nothing since

    status, out, _ = run(capsys, "cost", "--stack-name", STACK, "--json")

    assert status == 1
    [stale] = [w["reason"] for w in json.loads(out)["warnings"] if w["name"] == "UsageReportsStale"]
    assert stale.startswith("the controller's last usage report was collected at 2026-11-03T11:10:00Z, 408 h ago")


def test_the_stack_region_is_used_for_the_usage_table_too(aws, capsys):
    deploy(aws, region="us-west-2")
    store()
    aws.setenv("AWS_DEFAULT_REGION", "us-east-1")  # the operator's default region is another one
    clients.reset_clients()
    default_session = boto3.DEFAULT_SESSION

    status, out, _ = run(capsys, "cost", "--stack-name", STACK, "--region", "us-west-2", "--json")

    assert status == 0, out
    users = {u["user"]: Decimal(u["usd"]) for u in json.loads(out)["users"]}
    assert users["alice"] == Decimal("255.00")
    # us-west-2's list price of ml.c5.4xlarge (the twin's catalogue: 5 % over us-east-1's)
    assert users["bob"] == cents(2 * Decimal("0.816") * Decimal("1.05"))
    assert boto3.DEFAULT_SESSION is default_session, "the default session is put back"


# --------------------------------------------------------------------------- errors: one line, exit 2


@pytest.mark.parametrize("argv, says", [
    (("cost", "--stack-name", "no-such-stack"),
     "DescribeStackResource: ValidationError: Stack with id no-such-stack does not exist"),
    (("cost", "--stack-name", STACK, "--month", "2026-10"), "--month 2026-10: only the current UTC month"),
    (("cost", "--stack-name", STACK, "--month", "nov"), "--month nov (YYYY-MM): only the current UTC month"),
    (("cost",), "give --stack-name S (or --twin)"),
])
def test_usage_and_setup_errors_exit_2_with_one_line(deployed, capsys, argv, says):
    status, out, err = run(capsys, *argv)

    assert status == 2
    assert out.count("\n") == 1 and out.startswith("hpops cost: ") and says in out, out
    assert err == ""


def test_the_current_month_may_be_named(deployed, capsys):
    assert run(capsys, "cost", "--stack-name", STACK, "--month", "2026-11")[0] == 0


def test_a_stack_without_the_spend_function_exits_2_naming_it(aws, capsys):
    deploy(aws, with_function=False)

    status, out, _ = run(capsys, "cost", "--stack-name", STACK)

    assert status == 2 and out.count("\n") == 1
    assert f"stack {STACK} has no CheckUserSpendFunction: it was deployed with UserSpendEnabled=false" in out


def test_a_broken_deployed_configuration_exits_2_naming_the_variable(aws, capsys):
    deploy(aws, parameters={"RateOverridesJson": "{not json"})

    status, out, _ = run(capsys, "cost", "--stack-name", STACK)

    assert status == 2 and out.count("\n") == 1
    assert "RATE_OVERRIDES_JSON" in out and "{not json" not in out


# --------------------------------------------------------------------------- subscribe


def test_subscribe_filters_the_users_topic_on_the_user(deployed, capsys):
    status, out, _ = run(capsys, "cost", "subscribe", "--stack-name", STACK, "alice", "alice@example.edu")

    assert status == 0
    sns = boto3.client("sns")
    topic = boto3.client("cloudformation").describe_stacks(StackName=STACK)["Stacks"][0]["Outputs"][0]["OutputValue"]
    [subscription] = sns.list_subscriptions_by_topic(TopicArn=topic)["Subscriptions"]
    assert (subscription["Protocol"], subscription["Endpoint"]) == ("email", "alice@example.edu")
    attributes = sns.get_subscription_attributes(SubscriptionArn=subscription["SubscriptionArn"])["Attributes"]
    assert json.loads(attributes["FilterPolicy"]) == {"user": ["alice"]}
    assert attributes["FilterPolicyScope"] == "MessageAttributes"
    assert subscription["SubscriptionArn"] in out
    assert "confirmation" in out and "Confirm subscription" in out


@pytest.mark.parametrize("user, email, says", [
    ("-rf", "alice@example.edu", "USER: '-rf' is not a valid user name"),
    ("alice bob", "alice@example.edu", "is not a valid user name"),
    ("alice", "alice.example.edu", "is not an e-mail address"),
])
def test_subscribe_refuses_a_bad_user_or_address_and_subscribes_nobody(deployed, capsys, user, email, says):
    status, out, _ = run(capsys, "cost", "subscribe", "--stack-name", STACK, "--", user, email)

    assert status == 2 and out.count("\n") == 1 and says in out
    assert boto3.client("sns").list_subscriptions()["Subscriptions"] == []


def test_subscribe_to_a_stack_without_the_users_topic_exits_2(aws, capsys):
    create_stack("us-east-1", environment=None, outputs=False)

    status, out, _ = run(capsys, "cost", "subscribe", "--stack-name", STACK, "alice", "alice@example.edu")

    assert status == 2 and "has no output UserSpendAlertTopicArn" in out and out.count("\n") == 1


# --------------------------------------------------------------------------- release


def test_release_records_the_release_and_starts_a_sweep_under_the_operators_policy(aws, capsys):
    deploy(aws)
    machine = boto3.client("stepfunctions").create_state_machine(
        name="hpops-budget-guard", roleArn=f"arn:aws:iam::{DEFAULT_ACCOUNT_ID}:role/guard",
        definition=json.dumps({"StartAt": "Done", "States": {"Done": {"Type": "Succeed"}}}))["stateMachineArn"]
    stack = boto3.client("cloudformation").describe_stacks(StackName=STACK)["Stacks"][0]
    boto3.client("cloudformation").update_stack(
        StackName=STACK, TemplateBody=json.dumps({
            "Parameters": {"ClusterName": {"Type": "String"}, "ClusterArn": {"Type": "String"}},
            "Resources": {"UserSpendAlertTopic": {"Type": "AWS::SNS::Topic"}},
            "Outputs": {"SyncStateTableName": {"Value": TABLE}, "BudgetGuardStateMachineArn": {"Value": machine}}}),
        Parameters=[{"ParameterKey": p["ParameterKey"], "UsePreviousValue": True} for p in stack["Parameters"]])

    status, out, _ = run(capsys, "cost", "release", "--stack-name", STACK, "alice", "--reason", "paper deadline")

    assert status == 0, out
    releases = [i for i in boto3.client("dynamodb").scan(TableName=TABLE)["Items"] if "hold-release#" in i["sk"]["S"]]
    assert [(r["sk"]["S"].split("hold-release#")[1], r["reason"]["S"]) for r in releases] == [
        (f"{NOW:%Y-%m}#alice", "paper deadline")]
    executions = boto3.client("stepfunctions").list_executions(stateMachineArn=machine)["executions"]
    assert len(executions) == 1 and executions[0]["executionArn"] in out


def test_the_report_says_how_old_its_cost_explorer_answer_is_and_fresh_asks_again(deployed, capsys):
    from hpops_core.budget_guard.aws_budgets import ce_client
    from hpops_core.budget_guard.ce_cache import billed_month_cached

    # What the hourly sweep kept three hours ago.
    billed_month_cached(ce_client(), TABLE, CLUSTER, NOW - dt.timedelta(hours=3), 24)
    status, out, _ = run(capsys, "cost", "--stack-name", STACK, "--region", "us-east-1")
    assert status == 0
    assert ("billed month from cache: kept answer fetched at 2026-11-20T09:00:00Z, 3.0 h old (max 24 h) "
            "(--fresh asks again)") in out
    assert "Cost Explorer 2026-11-01..2026-11-20 (exclusive, asked at 2026-11-20T09:00:00Z)" in out
    status, out, _ = run(capsys, "cost", "--stack-name", STACK, "--region", "us-east-1", "--fresh")
    assert status == 0 and "billed month from cost-explorer: a fresh answer was asked for" in out
    assert "asked at 2026-11-20T12:00:00Z" in out
