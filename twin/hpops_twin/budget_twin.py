"""The budget guard in the twin: what moto lacks for it, and what tests and the demo look at.

Where moto 5.2.1 differs from AWS here, and what the twin does about it:
  * Budgets has no UpdateBudget (NotImplementedError). The twin adds it to moto's Budgets
    backend for the world's lifetime: NewBudget replaces the stored budget (same name), its
    notifications stay, a missing budget is NotFoundException, as on AWS.
  * Cost Explorer returns nothing unless results are queued through moto's
    POST /moto-api/static/ce/cost-and-usage-results, and it answers each distinct request
    body once from the queue (then memoises it), whatever the request's period, filter or
    grouping. `set_billed_usage` forgets the memo and queues one answer grouped by usage type
    (UnblendedCost and UsageQuantity, as the budget guard asks), so every GetCostAndUsage after
    it (any day, any month) sees that bill until it is set again. `set_month_to_date_cost` is
    the same with the whole amount billed as something other than instance time (no billed
    rate: the projection then takes Price List prices).
  * There is no Price List service at all: price_list.py stands in for GetProducts
    (`world.budget.price_list`).
  * SageMaker AddTags appends a duplicate key instead of replacing the value; `tag_cluster`
    deletes the key first, as AWS's AddTags (overwrite) behaves.
  * SageMaker ListTags/AddTags/DeleteTags find a cluster by the last ARN segment, which moto
    takes to be the cluster *name*; the simulator gives clusters HyperPod's id-shaped ARN, so
    the twin resolves cluster ARNs by ARN (an unknown ARN is a ValidationException, not a crash).
  * EventBridge and SNS deliveries are observed the way an operator would: an SQS queue
    subscribed to the AlertTopic, and a rule on the default bus for the alert events with an
    SQS target (moto delivers both).

The harness's calls use the world's own session, so `world.counter` counts only our Lambdas'.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
from typing import Any
from unittest import mock

import requests
from moto.budgets.exceptions import NotFoundException
from moto.budgets.models import BudgetsBackend
from moto.budgets.responses import BudgetsResponse
from moto.ce.models import ce_backends
from moto.core.utils import unix_time
from moto.sagemaker.exceptions import ValidationError as SageMakerValidationError
from moto.sagemaker.models import SageMakerModelBackend

from hpops_core.budget_guard.guard import ALERT_DETAIL_TYPE, ALERT_SOURCE
from hpops_twin.price_list import PriceListTwin

CE_RESULTS_URL = "http://motoapi.amazonaws.com/moto-api/static/ce/cost-and-usage-results"
# Each distinct GetCostAndUsage request (one per "today") takes one queued result.
_CE_COPIES = 64
# The usage types HyperPod bills under (see hpops_core.budget_guard.rates): instance hours and
# the instances' EBS volumes, with the us-east-1 prefix (the twin's region).
CLUSTER_USAGE = "USE1-Cluster:{instance_type}"
VOLUME_USAGE = "USE1-Cluster:VolumeUsage.gp2"


def _backend_update_budget(self: BudgetsBackend, account_id: str, new_budget: dict[str, Any]) -> None:
    name = new_budget["BudgetName"]
    if name not in self.budgets[account_id]:
        raise NotFoundException(f"Unable to update budget: {name} - the budget doesn't exist.")
    stored = self.budgets[account_id][name]
    updated = copy.deepcopy(new_budget)
    updated.setdefault("TimePeriod", stored.budget.get("TimePeriod"))
    updated["LastUpdatedTime"] = unix_time()
    stored.budget = updated


def _response_update_budget(self: BudgetsResponse) -> str:
    self.backend.update_budget(account_id=self._get_param("AccountId"), new_budget=self._get_param("NewBudget"))
    return json.dumps({})


_REAL_RESOURCE_FROM_ARN = SageMakerModelBackend._get_resource_from_arn


def _resource_from_arn(self: SageMakerModelBackend, arn: str) -> Any:
    if ":cluster/" in arn:
        cluster = next((c for c in self.clusters.values() if c.arn == arn), None)
        if cluster is None:
            raise SageMakerValidationError(message=f"Could not find cluster with ARN {arn}")
        return cluster
    return _REAL_RESOURCE_FROM_ARN(self, arn)


def at(event: dict, when: dt.datetime) -> dict:
    """A copy of an EventBridge event with its `time` set: the budget guard's "now" is the event's time."""
    stamped = copy.deepcopy(event)
    stamped["time"] = when.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return stamped


class BudgetTwin:
    """world.budget: configure the cluster's bill, list prices and tags, observe budgets and alerts."""

    def __init__(self, world: Any):
        self.world = world
        self._alerts: list[dict] = []
        self._events: list[dict] = []
        self.price_list = PriceListTwin(sender=lambda: world.dispatcher.current_function)

    @classmethod
    def install(cls, world: Any) -> BudgetTwin:
        twin = cls(world)
        for target, name, replacement in (
            (BudgetsBackend, "update_budget", _backend_update_budget),
            (BudgetsResponse, "update_budget", _response_update_budget),
            (SageMakerModelBackend, "_get_resource_from_arn", _resource_from_arn),
        ):
            patch = mock.patch.object(target, name, replacement, create=True)
            patch.start()
            world._stack.append(patch)
        price_list = twin.price_list.installed()
        price_list.__enter__()
        world._stack.append(price_list)
        twin._observe()
        return twin

    # ------------------------------------------------------------------ observers (the harness's own session)
    def _observe(self) -> None:
        aws = self.world.aws
        sqs = aws.client("sqs")

        def queue(name: str) -> tuple[str, str]:
            url = sqs.create_queue(QueueName=name)["QueueUrl"]
            return url, sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]

        self._alert_queue, alert_arn = queue("twin-alert-inbox")
        aws.client("sns").subscribe(TopicArn=self.world.output("AlertTopicArn"), Protocol="sqs", Endpoint=alert_arn)
        self._event_queue, event_arn = queue("twin-budget-alert-events")
        events = aws.client("events")
        events.put_rule(Name="twin-budget-alerts", EventPattern=json.dumps(
            {"source": [ALERT_SOURCE], "detail-type": [ALERT_DETAIL_TYPE]}))
        events.put_targets(Rule="twin-budget-alerts", Targets=[{"Id": "inbox", "Arn": event_arn}])

    def _drain(self, url: str) -> list[dict]:
        sqs = self.world.aws.client("sqs")
        bodies = []
        while True:
            messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", [])
            if not messages:
                return bodies
            for message in messages:
                bodies.append(json.loads(message["Body"]))
                sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])

    def sns_messages(self) -> list[dict]:
        """Every SNS envelope the AlertTopic delivered so far (budget alerts and anything else)."""
        self._alerts.extend(self._drain(self._alert_queue))
        return list(self._alerts)

    def alerts(self) -> list[dict]:
        """The projected-overrun alerts sent to the AlertTopic: the JSON document (what every
        non-e-mail subscriber gets), with the SNS subject under "_subject"."""
        out = []
        for envelope in self.sns_messages():
            attributes = envelope.get("MessageAttributes") or {}
            if attributes.get("kind", {}).get("Value") == "budget-projection-alert":
                out.append(json.loads(envelope["Message"]) | {"_subject": envelope.get("Subject")})
        return out

    def alert_events(self) -> list[dict]:
        """The hpops.budget-guard events another team's rule on the default bus received."""
        self._events.extend(self._drain(self._event_queue))
        return list(self._events)

    # ------------------------------------------------------------------ world configuration
    def set_billed_usage(self, instances: dict[str, tuple[str, str]], other: dict[str, str] | None = None) -> None:
        """What Cost Explorer answers for the cluster's bill this month from now on.

        `instances`: instance type -> (USD, hours), billed as "USE1-Cluster:<type>" in Hrs;
        `other`: usage type -> USD for the rest (volumes, ...), e.g. {VOLUME_USAGE: "1200"}."""
        groups = [{"Keys": [CLUSTER_USAGE.format(instance_type=t)],
                   "Metrics": {"UnblendedCost": {"Amount": str(usd), "Unit": "USD"},
                               "UsageQuantity": {"Amount": str(hours), "Unit": "Hrs"}}}
                  for t, (usd, hours) in instances.items()]
        groups += [{"Keys": [usage_type],
                    "Metrics": {"UnblendedCost": {"Amount": str(usd), "Unit": "USD"},
                                "UsageQuantity": {"Amount": "1", "Unit": "N/A"}}}
                   for usage_type, usd in (other or {}).items()]
        self._queue_cost_and_usage({
            "ResultsByTime": [{
                "TimePeriod": {"Start": "2000-01-01", "End": "2000-01-02"},  # moto does not look
                "Total": {},  # grouped results carry their metrics in Groups, as on AWS
                "Groups": groups,
                "Estimated": True,
            }],
            "GroupDefinitions": [{"Type": "DIMENSION", "Key": "USAGE_TYPE"}],
            "DimensionValueAttributes": [],
        })

    def set_month_to_date_cost(self, usd: str) -> None:
        """The cluster's month-to-date cost from now on, all of it billed as volumes: no instance
        hours, so no billed rate and the projection prices nodes from the Price List."""
        self.set_billed_usage({}, other={VOLUME_USAGE: usd})

    def _queue_cost_and_usage(self, result: dict) -> None:
        backend = ce_backends[self.world_account]["aws"]
        backend.cost_usage_results.clear()
        backend.cost_usage_results_queue.clear()
        response = requests.post(CE_RESULTS_URL, json={"results": [result] * _CE_COPIES}, timeout=10)
        response.raise_for_status()

    @property
    def world_account(self) -> str:
        return self.world.resolver.account_id

    def tag_cluster(self, key: str, value: str) -> None:
        """AddTags with AWS's overwrite semantics (see the module docstring)."""
        sagemaker = self.world.aws.client("sagemaker")
        arn = self.world.sim.cluster(self.world.cluster_name).arn
        sagemaker.delete_tags(ResourceArn=arn, TagKeys=[key])
        sagemaker.add_tags(ResourceArn=arn, Tags=[{"Key": key, "Value": value}])

    def untag_cluster(self, key: str) -> None:
        arn = self.world.sim.cluster(self.world.cluster_name).arn
        self.world.aws.client("sagemaker").delete_tags(ResourceArn=arn, TagKeys=[key])

    # ------------------------------------------------------------------ inspection
    def budgets(self) -> dict[str, dict]:
        """The account's budgets (moto), by name."""
        found = self.world.aws.client("budgets", region_name="us-east-1").describe_budgets(AccountId=self.world_account)
        return {b["BudgetName"]: b for b in found.get("Budgets", [])}

    def notifications(self, budget_name: str) -> list[dict]:
        client = self.world.aws.client("budgets", region_name="us-east-1")
        return client.describe_notifications_for_budget(AccountId=self.world_account, BudgetName=budget_name)["Notifications"]

    def state_items(self) -> dict[str, dict]:
        """The budget guard's DynamoDB items for the cluster (alert keys, last-seen), by sort key."""
        table = self.world.resolver.physical_ids["SyncStateTable"]
        items = self.world.aws.client("dynamodb").query(
            TableName=table, KeyConditionExpression="pk = :pk",
            ExpressionAttributeValues={":pk": {"S": f"budget#{self.world.cluster_name}"}},
        )["Items"]
        return {i["sk"]["S"]: i for i in items}

    def executions(self, started: list[str]) -> list[str]:
        """The BudgetGuard executions among `started` (an event also starts LoginNodeSync)."""
        return [arn for arn in started if arn.rsplit(":", 2)[-2].endswith("BudgetGuardStateMachine")]

    def sweep(self) -> str:
        """What the BudgetSweep schedule starts (template.yaml)."""
        return self.world.run_schedule("BudgetSweep")

    def start_raw(self, payload: Any) -> str:
        """Start BudgetGuard with any input, as someone with states:StartExecution could."""
        return self.world._start(self.world.output("BudgetGuardStateMachineArn"), payload, "manual", None)

    def run(self, started: list[str], timeout: float = 120) -> list[Any]:
        """Wait for every execution in `started` (both state machines) and return BudgetGuard's results."""
        results = self.world.wait(started, timeout=timeout)
        return [r for r in results if r.arn in self.executions(started)]
