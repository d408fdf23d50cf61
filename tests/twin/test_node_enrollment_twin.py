"""Enrollment and signed reports in the twin: a cluster user holding only the node role (the twin's
"agent" principal, IAM enforced) and none of the agent's files cannot act as a node, and is seen.

Asserts what users and the team see: the target group, the stored node reports, the enrollment
records, the refusals (named errors in the DLQ path) and the alarm metrics.
"""

from __future__ import annotations

import datetime as dt
import json
from unittest import mock

import pytest

from hpops_core.common.errors import TransientAwsError
from hpops_core.node_channel import report_store
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
    # Each with its node's instance identity document, verified with the Region's certificate.
    assert {(r.role, r.status, r.via) for r in records.values()} == {("login", "enrolled", "document")}
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


def test_a_second_key_for_an_enrolled_node_is_refused_inside_its_window_or_out_and_the_team_told(synced_world):
    world = synced_world
    attacker = Attacker(world)
    node = login_nodes(world)[0]
    enrolled = enrollments(world)[node.instance_id]

    # A new node (inside the window) whose agent enrolled with its verified document: never contested.
    answer = attacker.enroll(node.instance_id, node.ip)
    assert (answer["ok"], answer["error"]) == (False, "EnrollmentConflictError")
    assert enrollments(world)[node.instance_id] == enrolled
    told = [n for n in world.notifications() if node.instance_id in (n["subject"] or "")]
    assert len(told) == 1 and attacker.fingerprint in told[0]["message"] and enrolled.fingerprint in told[0]["message"]
    assert "enrolled key stands" in told[0]["message"]
    # A flood of keys: no record grows, no SageMaker call, still one message an hour, the node serves.
    describes = world.counter.calls["sagemaker.DescribeClusterNode"]
    for _ in range(5):
        assert Attacker(world).enroll(node.instance_id, node.ip)["error"] == "EnrollmentConflictError"
    assert enrollments(world)[node.instance_id] == enrolled
    assert world.counter.calls["sagemaker.DescribeClusterNode"] == describes
    assert [n for n in world.notifications() if node.instance_id in (n["subject"] or "")] == []
    succeeded(world, [world.run_schedule()])
    assert world.target_ips() == world.login_truth() and len(world.target_ips()) == 3


def test_racing_a_new_login_node_from_another_node_wins_nothing_and_its_agent_enrolls_alone(synced_world):
    world = synced_world
    attacker = Attacker(world)
    # A fourth login node comes up; the attacker, on another node, names it before its agent runs.
    world.hosts.lifecycle_installs_agent = False
    world.sim.scale_group(world.cluster_name, world.login_group, 4)
    world.sim.finish_provisioning(world.cluster_name)
    new = next(n for n in login_nodes(world) if n.instance_id not in world.hosts.agents)
    answer = attacker.enroll(new.instance_id, new.ip)
    assert answer["ok"] and answer["via"] == "window", "inside the window, first presenter: enrolled, unproven"
    # It gets no key byte, and nothing it signs for the node counts.
    fetched = attacker.fetch(new.instance_id, ["hostKeys"])
    assert (fetched["ok"], fetched["error"]) == (False, "FetchRefusedError") and "not proven" in fetched["message"]
    assert "items" not in fetched
    report = forged_sessions(world, login_nodes(world)[0]) | {"instanceId": new.instance_id, "ip": new.ip}
    attacker.put_report(REPORT, report)
    assert refusals(world)[-1] == "UnprovenEnrollmentError" and new.instance_id not in node_reports(world)

    # The node's own agent runs (on_create): its verified document replaces the attacker's key, no operator.
    world.hosts.lifecycle_installs_agent = True
    world.hosts.ensure_agents()
    record = enrollments(world)[new.instance_id]
    assert (record.fingerprint, record.via, record.status) == (
        world.hosts.agents[new.instance_id].proof.fingerprint(), "document", "enrolled")
    told = [n for n in world.notifications() if new.instance_id in (n["subject"] or "")]
    assert len(told) == 1 and "replaced it" in told[0]["message"] and attacker.fingerprint in told[0]["message"]
    succeeded(world, [world.run_schedule()])
    assert new.ip in world.target_ips() and len(world.target_ips()) == 4
    assert world.presented_fingerprints(new.instance_id) == world.canonical_fingerprints()
    assert attacker.enroll(new.instance_id, new.ip)["error"] == "EnrollmentConflictError"

    # A user on the new node itself, after its agent (the lifecycle line enrolls first): its document
    # is the node's, and still the first verified key stands.
    from hpops_twin.identity_documents import served

    local = Attacker(world).enroll(new.instance_id, new.ip, document=served(new, world.document_account_id))
    assert local["error"] == "EnrollmentConflictError"
    assert enrollments(world)[new.instance_id] == record


def test_a_forged_or_foreign_identity_document_is_refused_by_name_and_changes_nothing(synced_world):
    world = synced_world
    from hpops_twin.identity_documents import served

    world.hosts.lifecycle_installs_agent = False
    world.sim.scale_group(world.cluster_name, world.login_group, 4)
    world.sim.finish_provisioning(world.cluster_name)
    new = next(n for n in login_nodes(world) if n.instance_id not in world.hosts.agents)
    other = login_nodes(world)[0]
    attacker = Attacker(world)
    # Its own node's document (all an attacker on another node can read) names another instance.
    assert attacker.enroll(new.instance_id, new.ip, document=served(other, world.document_account_id))["error"] == \
        "EnrollmentRefusedError"
    # A document edited to name the new node no longer verifies.
    forged = served(other, world.document_account_id)
    forged["document"] = forged["document"].replace(other.instance_id, new.instance_id).replace(other.ip, new.ip)
    answer = attacker.enroll(new.instance_id, new.ip, document=forged)
    assert answer["error"] == "IdentityDocumentRefusedError" and "does not verify" in answer["message"]
    assert new.instance_id not in enrollments(world)


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


def test_where_imds_serves_no_document_a_lost_race_takes_no_working_node_out_and_an_approval_restores_it_fully():
    """The UNCONFIRMED case: HyperPod's IMDS serves no identity document. Enrollment works as before
    documents; a user's keys contest nodes but take no serving node out of the load balancer, a pinned
    sequence is refused, and the operator's approval of the real key restores a raced node fully.
    Certificate mode, as recommended: in keys mode a node enrolled without a document waits for its
    window to end before it gets the shared keys (tests/unit/test_enrollment.py)."""
    import warnings

    from hpops.enrollments import approve
    from hpops_twin.world import TwinWorld

    with warnings.catch_warnings(), TwinWorld(identity_documents=False,
                                              parameters={"HostIdentityMode": "certificate",
                                                          "HostCertificatePrincipals": "login.hpc.example.edu"}) as world:
        warnings.filterwarnings("ignore", message="No application metrics to publish")
        succeeded(world, [world.run_schedule()])
        assert {r.via for r in enrollments(world).values()} == {"window"} and len(world.target_ips()) == 3
        attacker = Attacker(world)
        # Any user contests the three working (new, inside their window) nodes: none leaves the NLB.
        for node in login_nodes(world):
            assert attacker.enroll(node.instance_id, node.ip)["error"] == "EnrollmentConflictError"
        assert {r.status for r in enrollments(world).values()} == {"contested"}
        succeeded(world, [world.run_schedule()])
        assert world.target_ips() == world.login_truth() and len(world.target_ips()) == 3

        # A fourth node: the attacker names it first, then pins its sequence and asks for the host keys.
        world.hosts.lifecycle_installs_agent = False
        world.sim.scale_group(world.cluster_name, world.login_group, 4)
        world.sim.finish_provisioning(world.cluster_name)
        new = next(n for n in login_nodes(world) if n.instance_id not in world.hosts.agents)
        assert attacker.enroll(new.instance_id, new.ip)["ok"]
        report = forged_sessions(world, login_nodes(world)[0]) | {"instanceId": new.instance_id, "ip": new.ip}
        attacker.put_report(REPORT, report, sequence=2**63 - 1)
        assert refusals(world)[-1] == "ReportFromFutureError" and new.instance_id not in node_reports(world)
        assert attacker.fetch(new.instance_id, ["hostKeys"])["error"] == "FetchRefusedError"
        attacker.put_report(REPORT, report)  # counted for now (no document here to tell): dropped at approval
        assert new.instance_id in node_reports(world)
        # Its agent comes: two keys without documents, the node is contested and not admitted.
        world.hosts.lifecycle_installs_agent = True
        world.hosts.ensure_agents()
        assert enrollments(world)[new.instance_id].status == "contested"
        succeeded(world, [world.run_schedule()])
        assert new.ip not in world.target_ips()

        # The operator approves each real key (read as root on the node): everything is restored.
        table = world.resolver.physical_ids["SyncStateTable"]
        for node in login_nodes(world):
            agent = world.hosts.agents[node.instance_id]
            approve(world.aws.client("dynamodb"), world.aws.client("sagemaker"), table, world.cluster_name,
                    world.login_group, "controller-machine", node.instance_id, agent.proof.fingerprint())
            if node.instance_id == new.instance_id:
                # NodeChannel fails after storing the approved key, before the impostor's report is dropped:
                # the record names the key it replaced, and the agent's next enroll call finishes the discard.
                throttled = TransientAwsError("dynamodb:DeleteItem throttled")
                with mock.patch.object(report_store, "forget_report", side_effect=throttled), \
                        pytest.raises(Exception):
                    agent.proof.ensure_enrolled(node.instance_id, node.ip, force=True)
                assert enrollments(world)[new.instance_id].replaced_key == attacker.fingerprint
                assert new.instance_id in node_reports(world)
            assert agent.proof.ensure_enrolled(node.instance_id, node.ip, force=True)
        assert not any(r.replaced_key for r in enrollments(world).values())
        assert {(r.status, r.via) for r in enrollments(world).values()} == {("enrolled", "approval")}
        assert new.instance_id not in node_reports(world), "what the impostor left was dropped"
        world.agents_poll()
        succeeded(world, [world.run_schedule()])
        assert new.ip in world.target_ips() and len(world.target_ips()) == 4
        # Its agent's own reports count now, and none of the impostor's invented sessions are left.
        kept = node_reports(world)[new.instance_id]
        assert kept["instanceId"] == new.instance_id and "5eed0b07" not in json.dumps(kept)
