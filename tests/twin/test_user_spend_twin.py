"""Per-user spend in the twin: the demo's month (twin/hpops_twin/user_spend_demo.py), end to end.

The controller's real node agent reads a generated month of sacct and sends it over the node-report
bus; RecordUsageReport keeps it; two hourly sweeps of the real BudgetGuard machine price it. What
an operator would see is asserted: the messages on the AlertTopic and on the UserSpendAlertTopic
(SQS queues subscribed to them, one per user with `hpops cost subscribe`'s filter policy), the
events on the default bus, and `hpops cost`. The expected dollars come from the generated jobs
and the bill the twin set, not from the product's code.
"""

from __future__ import annotations

import datetime as dt
import io
import json
from decimal import ROUND_HALF_UP, Decimal
from types import SimpleNamespace

import pytest

from hpops_twin import user_spend_demo as chapter
from hpops_twin.user_spend_demo import (
    BILLED_HOURS,
    GROUPS,
    MONTH,
    MONTH_START,
    PARTITIONS,
    RATES,
    SWEEPS,
    USERS,
    VOLUMES_BILLED,
)

UTC = dt.timezone.utc
CENT = Decimal("0.01")


def cents(amount: Decimal) -> Decimal:
    return amount.quantize(CENT, ROUND_HALF_UP)


def expected_dollars(jobs, collected_until: dt.datetime) -> dict[str, Decimal]:
    """Allocated node-hours this month up to the agent's last run x the partition's instance type's rate."""
    until, start = int(collected_until.timestamp()), int(MONTH_START.timestamp())
    dollars: dict[str, Decimal] = {}
    for job in jobs:
        seconds = max(0, min(job.end, until) - max(job.start, start))
        rate = RATES[GROUPS[PARTITIONS[job.partition]][0]]
        dollars[job.user] = dollars.get(job.user, Decimal(0)) + Decimal(job.nodes * seconds) / 3600 * rate
    return {user: cents(amount) for user, amount in dollars.items()}


def expected_cluster_cost(now: dt.datetime) -> Decimal:
    """Cost Explorer's bill for the complete days (every node's hours) + the nodes up since the sweeps' midnight."""
    hours = Decimal(int((now - (MONTH_START + dt.timedelta(hours=BILLED_HOURS))).total_seconds())) / 3600
    per_hour = sum(count * RATES[instance_type] for instance_type, count in GROUPS.values())
    return cents(per_hour * (BILLED_HOURS + hours) + VOLUMES_BILLED)


@pytest.fixture(scope="module")
def month():
    """The chapter's twin after both sweeps (12:00 and 13:00), kept for every test below."""
    with chapter.month_world() as world:
        played = chapter.prepare(world)
        for when in SWEEPS:
            played.sweeps.extend(world.wait([played.start_sweep(when)], timeout=120))
        # What was refused while the month was played (a later test sends a login node's reports on purpose).
        yield SimpleNamespace(world=world, month=played, spend=played.spend, refused=played.spend.rejected_reports(),
                              document=played.spend.cost_document(SWEEPS[-1]))


def test_every_hour_of_the_month_reached_the_table_from_the_controller(month):
    # Nov 1 00:00 through the sweeps' day 12:00 (collected at 12:51): one report part per hourly window, no gap.
    hours = int((SWEEPS[-1] - MONTH_START).total_seconds()) // 3600
    assert month.spend.stored_windows(MONTH) == hours
    assert month.refused == []
    assert [(r.status, r.error) for r in month.month.sweeps] == [("SUCCEEDED", None)] * 2


def test_the_one_user_projected_past_80_percent_gets_one_alert_once(month):
    first, second = (r.output["userSpend"] for r in month.month.sweeps)
    assert (first["alertCount"], second["alertCount"]) == (1, 0)
    # The alert waits in the outbox, not in the execution's state; the event carries it whole.
    assert "alerts" not in first
    [event] = month.spend.alert_events()
    alert = event["detail"]
    assert (alert["user"], alert["kind"], alert["thresholdPercent"]) == ("alice", "projected", "80")
    assert 80 <= Decimal(alert["spend"]["projectedPercentOfLimit"]) < 100
    assert Decimal(alert["spend"]["percentOfLimit"]) < 80

    [platform] = month.spend.platform_messages()
    [on_topic] = month.spend.topic_messages()
    for envelope in (platform, on_topic):
        assert envelope["MessageAttributes"]["user"] == {"Type": "String", "Value": "alice"}
        assert envelope["Subject"] == "[hpops] ml-research: alice at 80% (projected)"
        assert envelope["Message"].startswith("alice is projected to spend $")
    # Each user's subscription filters on the attribute: only alice's inbox has it.
    assert {user: len(month.spend.user_inbox(user)) for user in USERS} == {"alice": 1, "bob": 0, "carol": 0}
    assert (event["source"], event["detail-type"]) == ("hpops.budget-guard", "HyperPod User Spend Alert")
    assert (event["detail"]["user"], event["detail"]["kind"]) == ("alice", "projected")


def test_each_users_dollars_are_their_node_hours_times_the_billed_rate(month):
    users = {u["user"]: u for u in month.document["users"]}
    collected_until = SWEEPS[-1] - chapter.AGENT_BEFORE_SWEEP
    assert {user: Decimal(u["usd"]) for user, u in users.items()} == expected_dollars(month.month.jobs, collected_until)
    assert users["carol"]["gpuHours"] == "0.00" and users["carol"]["rateSources"] == ["billed"]
    assert Decimal(users["alice"]["gpuHours"]) == 8 * Decimal(users["alice"]["nodeHours"])
    assert [(u["limitUsd"], u["limitSource"]) for u in month.document["users"]] == [
        ("280000.00", "override"), ("35000.00", "default"), ("35000.00", "default")]


def test_users_idle_and_other_add_up_to_the_cluster_cost_in_cents(month):
    document = month.document
    cluster = Decimal(document["clusterCost"]["usd"])
    assert cluster == expected_cluster_cost(SWEEPS[-1])
    users = sum(Decimal(u["usd"]) for u in document["users"])
    assert Decimal(document["other"]["usd"]) == VOLUMES_BILLED
    assert users + Decimal(document["idle"]["usd"]) + Decimal(document["other"]["usd"]) == cluster
    assert Decimal(document["idle"]["usd"]) > 0 and document["warnings"] == []
    # The same in what `hpops cost` prints.
    buffer = io.StringIO()
    from contextlib import redirect_stdout

    from hpops.output import print_cost

    with redirect_stdout(buffer):
        print_cost(document)
    printed = chapter.table_figures(buffer.getvalue().splitlines())
    assert printed["cluster cost"] == cluster
    assert printed["users"] + printed["idle"] + printed["other"] == printed["cluster cost"]


def test_a_usage_report_from_a_login_node_is_refused_and_stores_nothing(month):
    world, spend = month.world, month.spend
    stored = spend.stored_windows(MONTH)
    status_before = world.aws.client("dynamodb").get_item(
        TableName=world.resolver.physical_ids["SyncStateTable"],
        Key={"pk": {"S": f"usage#{world.cluster_name}"}, "sk": {"S": "status"}})["Item"]
    login = world.sim.nodes(world.cluster_name, world.login_group)[0]
    impostor = spend.controller(month.month.jobs, PARTITIONS, instance_id=login.instance_id)

    sent = impostor.run_agent(SWEEPS[-1] + dt.timedelta(minutes=30)).windows_sent

    assert sent >= 1, "EventBridge took the events: the refusal is the stack's"
    refused = spend.rejected_reports()
    assert len(refused) == sent
    # The login node's own agent, enrolled as a login node (AWS's group): its key does not speak for the controller.
    assert {(r["error"], r["message"]) for r in refused} == {
        ("ReportRoleError", f"{login.instance_id} is enrolled as a login node (group login); controller reports come "
                            "only from the controller group")}
    sqs = world.aws.client("sqs")
    dead = sqs.receive_message(QueueUrl=world.output("EventDeliveryDLQUrl"), MaxNumberOfMessages=10)["Messages"]
    assert {json.loads(m["Body"])["detail"]["instanceId"] for m in dead} == {login.instance_id}
    assert spend.stored_windows(MONTH) == stored
    status_after = world.aws.client("dynamodb").get_item(
        TableName=world.resolver.physical_ids["SyncStateTable"],
        Key={"pk": {"S": f"usage#{world.cluster_name}"}, "sk": {"S": "status"}})["Item"]
    assert status_after == status_before
