"""Slurm usage reports as the stack receives them: what the agent sends parses, nothing else does. Pure.

Reports are built by the real agent code (node/hpops_node_agent/usage.py), so a change on either
side that breaks the other shows up here.
"""

from __future__ import annotations

import datetime

import pytest

from hpops_core.budget_guard.usage_reports import (
    MalformedUsageReport,
    UsageRecord,
    check_usage_origin,
    parse_usage_event,
)
from hpops_core.node_channel import contract
from hpops_node_agent import usage

CLUSTER = "lab"
INSTANCE_ID = "i-0123456789abcdef0"
HOUR = 3600
HOSTILE = "alice;rm -rf /"
LONG = "x" * 10_000
PARTITIONS = usage.PartitionGroups({"gpu": "gpu-workers", "cpu": "cpu-workers"}, 0, "")


def at(text: str) -> int:
    return int(datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=datetime.timezone.utc).timestamp())


W0 = at("2026-11-23T06:00:00")
NOW = at("2026-11-23T06:55:00")

SACCT = [
    "alice|101|gpu|2|billing=192,cpu=192,gres/gpu=16,mem=2000G,node=2|1800|2026-11-23T06:10:00|2026-11-23T06:40:00|COMPLETED",
    "bob|102|cpu|1|cpu=4,mem=8G,node=1|3000|2026-11-23T06:00:00|2026-11-23T06:50:00|COMPLETED",
    # root's jobs hold nodes that are billed like anyone's
    "root|103|cpu|1|cpu=2,node=1|600|2026-11-23T06:20:00|2026-11-23T06:30:00|COMPLETED",
]


def envelope(detail, source=contract.REPORT_SOURCE, detail_type=contract.USAGE_DETAIL_TYPE) -> dict:
    """What EventBridge hands the Lambda for one PutEvents entry of the agent."""
    return {"version": "0", "id": "6a7e8feb-b491-4cf7-a9f1-bf3703467718", "detail-type": detail_type,
            "source": source, "account": "123456789012", "time": "2026-11-23T06:55:01Z", "region": "us-east-1",
            "resources": [], "detail": detail}


def agent_report(window_start: int = W0, now: int = NOW, lines=SACCT, **options) -> dict:
    totals, skipped = usage.aggregate(lines, window_start, window_start + HOUR, now)
    return usage.build_report(CLUSTER, INSTANCE_ID, window_start, now, contract.USAGE_OK, totals=totals,
                              skipped=skipped, agent_version="1.4.0", partitions=PARTITIONS, **options)


def big_report(users: int, partitions: int = 3) -> dict:
    totals = {(f"user{u:04d}", f"partition{p}"): {"nodeSeconds": 3600, "cpuSeconds": 96 * 3600,
                                                  "gpuSeconds": 8 * 3600, "jobs": 3}
              for u in range(users) for p in range(partitions)}
    return usage.build_report(CLUSTER, INSTANCE_ID, W0, NOW, contract.USAGE_OK, totals=totals,
                              partitions=PARTITIONS)


def refused(event) -> str:
    with pytest.raises(MalformedUsageReport) as raised:
        parse_usage_event(event)
    return str(raised.value)


# --------------------------------------------------------------------------- what the agent sends


def test_a_report_the_agent_builds_parses_to_the_same_records():
    report = parse_usage_event(envelope(agent_report()))
    assert report.records == (
        UsageRecord("alice", "gpu", node_seconds=2 * 1800, cpu_seconds=192 * 1800, gpu_seconds=16 * 1800, jobs=1),
        UsageRecord("bob", "cpu", node_seconds=3000, cpu_seconds=4 * 3000, gpu_seconds=0, jobs=1),
        UsageRecord("root", "cpu", node_seconds=600, cpu_seconds=2 * 600, gpu_seconds=0, jobs=1),
    )
    assert (report.cluster, report.instance_id) == (CLUSTER, INSTANCE_ID)
    assert (report.window_start, report.window_end, report.month) == (
        "2026-11-23T06:00:00Z", "2026-11-23T07:00:00Z", "2026-11")
    assert report.final is False and report.status == contract.USAGE_OK
    assert report.collected_at == "2026-11-23T06:55:00Z"
    assert report.partition_groups == {"cpu": "cpu-workers", "gpu": "gpu-workers"}
    assert (report.part, report.parts) == (1, 1)


def test_roots_usage_is_kept_because_roots_jobs_cost_money_too():
    report = parse_usage_event(envelope(agent_report()))
    assert [r.node_seconds for r in report.records if r.user == "root"] == [600]


def test_a_final_report_after_the_settle_delay_says_so():
    late = W0 + HOUR + contract.USAGE_SETTLE_SECONDS
    assert parse_usage_event(envelope(agent_report(now=late))).final is True


@pytest.mark.parametrize("status", [contract.USAGE_NOT_ENABLED, contract.USAGE_SLURM_NOT_FOUND,
                                    contract.USAGE_SACCT_FAILED])
def test_a_status_report_without_records_parses_with_its_reason(status):
    detail = usage.build_report(CLUSTER, INSTANCE_ID, W0, NOW, status, "slurmdbd: Connection refused")
    report = parse_usage_event(envelope(detail))
    assert (report.status, report.reason, report.records) == (status, "slurmdbd: Connection refused", ())


def test_every_part_of_a_report_split_small_parses_and_together_they_are_the_report():
    whole = big_report(users=200)
    parts = usage.split_report(whole, max_bytes=20_000)
    assert len(parts) > 3
    parsed = [parse_usage_event(envelope(part)) for part in parts]
    assert [(p.part, p.parts) for p in parsed] == [(i, len(parts)) for i in range(1, len(parts) + 1)]
    assert [(r.user, r.partition) for p in parsed for r in p.records] == [
        (r["user"], r["partition"]) for r in whole["records"]]
    assert {p.collected_at for p in parsed} == {"2026-11-23T06:55:00Z"}


def test_every_part_of_a_report_split_at_the_agents_real_size_parses():
    # The agent fills each part up to contract.MAX_USAGE_REPORT_BYTES (compact JSON); the stack
    # must accept every part it sends, or that window's biggest users go missing.
    whole = big_report(users=1500)
    parts = usage.split_report(whole)
    assert len(parts) > 1
    received = []
    for part in parts:
        try:
            received.extend(parse_usage_event(envelope(part)).records)
        except MalformedUsageReport as error:
            pytest.fail(f"part {part['part']} of {part['parts']} ({len(usage.encoded(part))} bytes compact, within "
                        f"MAX_USAGE_REPORT_BYTES={contract.MAX_USAGE_REPORT_BYTES}) refused: {error}")
    assert len(received) == len(whole["records"])


# --------------------------------------------------------------------------- what it must not accept


def with_record(**change) -> dict:
    detail = agent_report()
    detail["records"][0] = {**detail["records"][0], **change}
    return detail


def with_field(**change) -> dict:
    return {**agent_report(), **change}


def replayed_from_previous_window() -> dict:
    # A record the agent really sent, but for the window before: its key says so.
    earlier = agent_report(window_start=W0 - HOUR, lines=[
        "alice|99|gpu|2|cpu=192,gres/gpu=16,node=2|3600|2026-11-23T05:00:00|2026-11-23T06:00:00|COMPLETED"])
    detail = agent_report()
    detail["records"][0] = earlier["records"][0]
    return detail


MALFORMED = {
    "wrong source": (envelope(agent_report(), source="aws.sagemaker"), "source", None),
    "wrong detail-type": (envelope(agent_report(), detail_type=contract.REPORT_DETAIL_TYPE), "detail-type", None),
    "hostile user": (envelope(with_record(user=HOSTILE)), "records[0].user", HOSTILE),
    "10 kB user": (envelope(with_record(user=LONG)), "records[0].user", LONG[:50]),
    "negative seconds": (envelope(with_record(nodeSeconds=-3600)), "records[0].nodeSeconds", "-3600"),
    "boolean seconds": (envelope(with_record(cpuSeconds=True)), "records[0].cpuSeconds", None),
    "float seconds": (envelope(with_record(gpuSeconds=1.5)), "records[0].gpuSeconds", "1.5"),
    "absurd seconds": (envelope(with_record(nodeSeconds=10**15)), "records[0].nodeSeconds", str(10**15)),
    "boolean jobs": (envelope(with_record(jobs=False)), "records[0].jobs", None),
    "record of another window": (envelope(replayed_from_previous_window()), "records[0].key", "05:00"),
    "record key of another user": (envelope(with_record(key=f"{CLUSTER}/2026-11-23T06:00:00Z/bob/gpu")),
                                   "records[0].key", "bob/gpu"),
    "record key of another cluster": (envelope(with_record(key="other/2026-11-23T06:00:00Z/alice/gpu")),
                                      "records[0].key", "other/"),
    "part beyond parts": (envelope(with_field(part=3, parts=2)), "part", None),
    "part zero": (envelope(with_field(part=0)), "part", None),
    "unknown report field": (envelope(with_field(costUsd=12)), "<1 unknown field(s)>", "costUsd"),
    "unknown record field": (envelope(with_record(costUsd=12)), "records[0].<1 unknown field(s)>", "costUsd"),
    "record not an object": (envelope(with_field(records=[HOSTILE])), "records[0]", HOSTILE),
    "records not a list": (envelope(with_field(records={"alice": 1})), "records", None),
    "detail not an object": (envelope(HOSTILE), "detail", HOSTILE),
    "hostile cluster": (envelope(with_field(cluster=HOSTILE)), "cluster", HOSTILE),
    "hostile partition group": (envelope(with_field(partitionGroups={"gpu": HOSTILE})), "partitionGroups", HOSTILE),
    "window not on a whole second": (envelope(with_field(windowStart="2026-11-23T06:00:00.5Z")), "windowStart",
                                     "06:00:00.5"),
    "unknown status": (envelope(with_field(status="free")), "status", "free"),
    "wrong format": (envelope(with_field(format="hpops.node.usage.v0")), "format", "v0"),
}


@pytest.mark.parametrize("event, field, hostile", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_report_is_refused_naming_the_field_never_the_value(event, field, hostile):
    message = refused(event)
    assert field in message.split("invalid field(s): ", 1)[1].split(", ")
    if hostile is not None:
        assert hostile not in message
    assert len(message) < 300


def test_many_bad_records_are_summarised_not_listed():
    detail = agent_report()
    detail["records"] = [dict(detail["records"][0], user=f"{HOSTILE}{i}") for i in range(50)]
    message = refused(envelope(detail))
    assert "records[0].user" in message and "and 45 more" in message
    assert HOSTILE not in message and len(message) < 300


@pytest.mark.parametrize("event", [None, [], "usage", 42, [envelope(agent_report())]],
                         ids=["none", "list", "string", "number", "wrapped"])
def test_an_event_that_is_not_an_object_is_refused(event):
    assert "EventBridge event" in refused(event)


def test_an_oversize_event_is_refused_without_echoing_it():
    detail = with_field(reason=HOSTILE * 20_000)
    message = refused(envelope(detail))
    assert HOSTILE not in message and len(message) < 200


def test_an_unknown_field_with_a_hostile_name_is_not_echoed():
    # Field names are attacker-chosen too: a node may send any key, and the message is logged.
    for name in (HOSTILE, "\nFAKE LOG LINE level=ERROR", LONG):
        message = refused(envelope(with_field(**{name: 1})))
        assert name not in message, f"{name[:30]!r} echoed"
        assert len(message) < 300
        message = refused(envelope(with_record(**{name: 1})))
        assert name not in message, f"{name[:30]!r} echoed from a record"


def test_a_report_without_an_instance_id_is_refused_since_its_origin_cannot_be_checked():
    detail = usage.build_report(CLUSTER, None, W0, NOW, contract.USAGE_OK)
    assert "instanceId" in refused(envelope(detail))


# --------------------------------------------------------------------------- where it comes from


CONTROLLER = {"InstanceId": INSTANCE_ID, "InstanceGroupName": "controller-machine",
              "InstanceStatus": {"Status": "Running"}}


def test_only_this_clusters_controller_node_may_report_usage():
    report = parse_usage_event(envelope(agent_report()))
    accepted = check_usage_origin(report, CLUSTER, "controller-machine", CONTROLLER)
    assert accepted.accepted is True

    other_cluster = check_usage_origin(report, "prod", "controller-machine", CONTROLLER)
    assert other_cluster.accepted is False and "prod" in other_cluster.reason

    unknown = check_usage_origin(report, CLUSTER, "controller-machine", None)
    assert unknown.accepted is False and INSTANCE_ID in unknown.reason

    # A login node's role may put events on the bus; it must not make up other users' spend.
    login = check_usage_origin(report, CLUSTER, "controller-machine", {**CONTROLLER, "InstanceGroupName": "login"})
    assert login.accepted is False and "login" in login.reason and "controller-machine" in login.reason

    no_group = check_usage_origin(report, CLUSTER, "controller-machine",
                                  {k: v for k, v in CONTROLLER.items() if k != "InstanceGroupName"})
    assert no_group.accepted is False
