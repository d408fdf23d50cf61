"""Enrollment and signed reports in the twin: a cluster user holding only the node role (the twin's
"agent" principal, IAM enforced) and none of the agent's files cannot act as a node, and is seen.

Asserts what users and the team see: the target group, the stored node reports, the enrollment
records, the refusals (named errors in the DLQ path) and the alarm metrics.
"""

from __future__ import annotations

import datetime as dt
import json

import pytest

from hpops_twin.attacker import Attacker, far_future

REPORT = "HyperPod Login Node Report"


def login_nodes(world):
    return sorted((n for n in world.sim.nodes(world.cluster_name, world.login_group) if n.status == "Running"),
                  key=lambda n: n.ip)


def node_reports(world):
    table = world.resolver.physical_ids["SyncStateTable"]
    items = world.aws.client("dynamodb").query(
        TableName=table, KeyConditionExpression="pk = :pk",
        ExpressionAttributeValues={":pk": {"S": f"node-report#{world.cluster_name}"}})["Items"]
    return {i["sk"]["S"].split("#", 1)[1]: json.loads(i["report"]["S"]) for i in items}


def enrollments(world):
    from hpops_core.node_channel import enrollment_store

    records, _ = enrollment_store.list_enrollments(world.resolver.physical_ids["SyncStateTable"], world.cluster_name,
                                                   dynamodb=world.aws.client("dynamodb"))
    return {r.instance_id: r for r in records}


def refusals(world):
    return [f["error"] for f in world.delivery_failures]


def emitted(world, metric):
    return sum(1 for i in world.dispatcher.invocations if f'"{metric}"' in i.logs)


def succeeded(world, arns):
    results = world.wait(arns, timeout=120)
    assert all(r.status == "SUCCEEDED" for r in results), [(r.error, r.cause) for r in results]
    return results


def forged_sessions(world, node, user="bob"):
    stored = dict(node_reports(world)[node.instance_id])
    stored.pop("receivedAt", None)
    return stored | {"trigger": "change", "reportedAt": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                     "sessions": {"list": [{"handle": f"5eed0b07:{pid}:{pid * 10}", "user": user, "path": "ssh",
                                            "tty": True, "startedAt": "2026-01-01T08:00:00Z"} for pid in (100, 101)]}}


def test_every_agent_enrolls_its_own_key_and_its_reports_are_signed(synced_world):
    world = synced_world
    records = enrollments(world)
    nodes = login_nodes(world)
    assert set(records) == {n.instance_id for n in nodes}
    assert {(r.role, r.status, r.via) for r in records.values()} == {("login", "enrolled", "window")}
    assert len({r.fingerprint for r in records.values()}) == 3, "one key per agent"
    for node in nodes:
        assert world.hosts.agents[node.instance_id].proof.fingerprint() == records[node.instance_id].fingerprint


def test_a_report_signed_with_another_key_is_refused_and_changes_nothing(synced_world):
    world = synced_world
    attacker = Attacker(world)
    victim = login_nodes(world)[0]
    before = node_reports(world)[victim.instance_id]
    attacker.put_report(REPORT, forged_sessions(world, victim))  # invents sessions for bob there
    attacker.put_report(REPORT, forged_sessions(world, victim), sign=False)
    assert refusals(world)[-2:] == ["NodeProofKeyMismatchError", "NodeProofMalformedError"]
    assert node_reports(world)[victim.instance_id] == before
    assert emitted(world, "SignedReportRefused") >= 2


def test_a_replayed_or_reordered_report_is_refused(synced_world):
    world = synced_world
    node = login_nodes(world)[0]
    agent = world.hosts.agents[node.instance_id]
    older = agent.proof.sign_report(forged_sessions(world, node, user="carol"))
    newer = agent.proof.sign_report(forged_sessions(world, node, user="dave"))
    events = world.aws.client("events")

    def put(detail):
        events.put_events(Entries=[{"Source": "hpops.node", "DetailType": REPORT, "Detail": json.dumps(detail),
                                    "EventBusName": world.output("NodeReportBusName")}])

    put(newer)
    assert node_reports(world)[node.instance_id]["sessions"]["list"][0]["user"] == "dave"
    failures = len(refusals(world))
    put(newer)  # the same event again: EventBridge delivers at least once; it changes nothing
    assert len(refusals(world)) == failures
    put(older)  # an older one arriving late (reordered), or replayed by someone who captured it
    assert refusals(world)[failures:] == ["ReportReplayError"]
    assert node_reports(world)[node.instance_id]["sessions"]["list"][0]["user"] == "dave"


def test_a_report_dated_in_the_future_is_refused_even_when_signed(synced_world):
    world = synced_world
    node = login_nodes(world)[0]
    before = node_reports(world)[node.instance_id]
    signed = world.hosts.agents[node.instance_id].proof.sign_report(forged_sessions(world, node) | {"reportedAt": far_future()})
    world.aws.client("events").put_events(Entries=[{"Source": "hpops.node", "DetailType": REPORT, "Detail": json.dumps(signed),
                                                    "EventBusName": world.output("NodeReportBusName")}])
    assert refusals(world)[-1] == "ReportFromFutureError"
    assert node_reports(world)[node.instance_id] == before


def test_a_second_key_for_an_enrolled_node_is_refused_the_race_for_a_new_node_contests_it(synced_world):
    world = synced_world
    attacker = Attacker(world)
    node = login_nodes(world)[0]
    enrolled = enrollments(world)[node.instance_id]

    # Launched long ago (outside the window): the enrolled key stands, the attempt is refused and alarmed.
    node.launch_time = dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=5)
    answer = attacker.enroll(node.instance_id, node.ip)
    assert (answer["ok"], answer["error"]) == (False, "EnrollmentConflictError")
    assert enrollments(world)[node.instance_id] == enrolled
    told = [n for n in world.notifications() if node.instance_id in (n["subject"] or "")]
    assert len(told) == 1 and attacker.fingerprint in told[0]["message"] and enrolled.fingerprint in told[0]["message"]
    assert "enrolled key stands" in told[0]["message"]

    # A new node (inside the window): two keys raced, the stack cannot tell which is the agent.
    node.launch_time = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=3)
    answer = attacker.enroll(node.instance_id, node.ip)
    assert (answer["ok"], answer["error"]) == (False, "EnrollmentConflictError")
    record = enrollments(world)[node.instance_id]
    assert (record.status, record.fingerprint, record.contested_by) == ("contested", enrolled.fingerprint,
                                                                       (attacker.fingerprint,))
    # Told once an hour per node: the second attempt within the hour sends nothing new (no inbox flood).
    assert [n for n in world.notifications() if node.instance_id in (n["subject"] or "")] == []
    # Kept out of the load balancer, the team told; its reports (anyone's) count for nothing.
    succeeded(world, [world.run_schedule()])
    assert node.ip not in world.target_ips() and len(world.target_ips()) == 2
    signed = world.hosts.agents[node.instance_id].proof.sign_report(forged_sessions(world, node))
    world.aws.client("events").put_events(Entries=[{"Source": "hpops.node", "DetailType": REPORT, "Detail": json.dumps(signed),
                                                    "EventBusName": world.output("NodeReportBusName")}])
    assert refusals(world)[-1] == "NotEnrolledError"

    # The operator re-enrolls the real agent's key (read as root on the node) on purpose.
    from hpops.enrollments import approve

    table = world.resolver.physical_ids["SyncStateTable"]
    approve(world.aws.client("dynamodb"), world.aws.client("sagemaker"), table, world.cluster_name, world.login_group,
            "controller-machine", node.instance_id, enrolled.fingerprint)
    assert world.hosts.agents[node.instance_id].proof.ensure_enrolled(node.instance_id, node.ip, force=True)
    record = enrollments(world)[node.instance_id]
    assert (record.status, record.via, record.fingerprint) == ("enrolled", "approval", enrolled.fingerprint)
    assert attacker.enroll(node.instance_id, node.ip)["error"] == "EnrollmentConflictError", "approval was single use"


def test_upgrade_running_nodes_keep_their_users_and_enroll_only_by_an_operators_approval(synced_world):
    """A cluster upgraded to enrollment: nodes launched long ago, registered, with an old agent that
    signs nothing. They keep serving; nothing unsigned counts; no user can enroll for them (the window
    is long closed); each enrolls when the operator approves the fingerprint read as root on it."""
    world = synced_world
    table = world.resolver.physical_ids["SyncStateTable"]
    dynamodb = world.aws.client("dynamodb")
    nodes = login_nodes(world)
    # The previous version had no enrollments and its agents signed nothing.
    for instance_id in enrollments(world):
        dynamodb.delete_item(TableName=table, Key={"pk": {"S": f"enroll#{world.cluster_name}"},
                                                   "sk": {"S": f"node#{instance_id}"}})
    upgraded = {}
    for node in nodes:
        node.launch_time = dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=30)
        agent = world.hosts.agents[node.instance_id]
        upgraded[node.instance_id], agent.proof = agent.proof, None
    targets = world.target_ips()
    assert len(targets) == 3

    # A sweep and a repair keep the registered, not yet enrolled nodes: logged-in users are not disturbed.
    succeeded(world, [world.run_schedule()])
    assert world.target_ips() == targets
    # The old agents' unsigned reports count for nothing.
    before = node_reports(world)
    agent = world.hosts.agents[nodes[0].instance_id]
    agent._pending_start = True
    world.agents_poll()
    assert refusals(world) == ["NotEnrolledError"]
    assert node_reports(world) == before
    # A user cannot enroll a key for a running node: its window closed long ago.
    attacker = Attacker(world)
    answer = attacker.enroll(nodes[0].instance_id, nodes[0].ip)
    assert (answer["ok"], answer["error"]) == (False, "EnrollmentRefusedError")
    assert enrollments(world) == {}

    # The operator installs the new agent; it asks, is refused until the fingerprint read on the node is approved.
    from hpops.enrollments import approve

    agent.proof = upgraded[nodes[0].instance_id]
    assert not agent.proof.ensure_enrolled(nodes[0].instance_id, nodes[0].ip, force=True)
    approve(dynamodb, world.aws.client("sagemaker"), table, world.cluster_name, world.login_group, "controller-machine",
            nodes[0].instance_id, agent.proof.fingerprint())
    assert agent.proof.ensure_enrolled(nodes[0].instance_id, nodes[0].ip, force=True)
    assert (enrollments(world)[nodes[0].instance_id].via, enrollments(world)[nodes[0].instance_id].status) == (
        "approval", "enrolled")
    agent._pending_start = True
    world.agents_poll()
    assert node_reports(world)[nodes[0].instance_id] != before[nodes[0].instance_id]
    assert world.target_ips() == targets
