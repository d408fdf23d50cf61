"""One SSH host identity: the node agent applies the published keys, reports, and the node is
verified over the network before it is registered.

Asserts what users see: the fingerprints a node presents, and whether it is in the target group.
"""

import json
import re

import pytest

from hpops_twin.world import TwinWorld


def login_nodes(world):
    return sorted(world.sim.nodes(world.cluster_name, world.login_group), key=lambda n: n.ip)


def succeeded(world, arns):
    results = world.wait(arns, timeout=120)
    bad = [(r.error, r.cause) for r in results if r.status != "SUCCEEDED"]
    assert not bad, bad
    assert not world.agent_errors, world.agent_errors[0]
    return results


def replace_and_provision(world, index=0):
    victim = login_nodes(world)[index]
    succeeded(world, world.publish(world.sim.replace_node(world.cluster_name, victim.instance_id)))
    new = next(n for n in login_nodes(world) if n.status == "Pending")
    succeeded(world, world.publish(world.sim.finish_provisioning(world.cluster_name)))
    return victim, new


def node_reports(world):
    """The latest report of every node, as RecordNodeReport stored it."""
    table = world.resolver.physical_ids["SyncStateTable"]
    items = world.aws.client("dynamodb").query(
        TableName=table, KeyConditionExpression="pk = :pk AND begins_with(sk, :sk)",
        ExpressionAttributeValues={":pk": {"S": f"node-report#{world.cluster_name}"}, ":sk": {"S": "node-report#"}})["Items"]
    return {i["sk"]["S"].split("#", 1)[1]: json.loads(i["report"]["S"]) for i in items}


def test_fresh_nodes_present_their_own_keys_until_their_agent_applies_the_published_ones(world):
    node = login_nodes(world)[0]
    assert world.presented_fingerprints(node.instance_id) != world.canonical_fingerprints()
    succeeded(world, [world.run_schedule()])
    desired = json.loads(world.aws.client("ssm").get_parameter(Name=f"/hpops/{world.cluster_name}/node/host-identity")["Parameter"]["Value"])
    assert desired["fingerprints"] == world.canonical_fingerprints() and desired["secretArn"] == world.output("HostIdentitySecretArn")
    for node in login_nodes(world):
        assert world.presented_fingerprints(node.instance_id) == world.canonical_fingerprints()
    assert len(world.target_ips()) == 3
    reports = node_reports(world)
    assert {n.instance_id for n in login_nodes(world)} == set(reports)
    assert all(r["hostIdentity"]["fingerprints"] == world.canonical_fingerprints() for r in reports.values())


def test_replaced_node_installs_the_keys_at_creation_and_is_verified_before_it_is_registered(synced_world):
    world = synced_world
    world.counter.reset()
    world.hosts.agent_calls.clear()
    _, new = replace_and_provision(world)
    assert world.presented_fingerprints(new.instance_id) == world.canonical_fingerprints()
    assert new.ip in world.target_ips()
    verified = [i for i in world.dispatcher.invocations if i.function.endswith("VerifyNodeIdentityFunction")
                and i.event["instanceId"] == new.instance_id]
    assert verified and verified[-1].result["ok"]
    assert node_reports(world)[new.instance_id]["trigger"] == "start"
    # the lifecycle's first agent run fetched the keys through NodeChannel with its enrolled key: the node
    # role read no secret, and NodeChannel read it once, for this agent
    assert "secrets-manager.GetSecretValue" not in world.hosts.agent_calls
    assert world.counter.calls["secrets-manager.GetSecretValue"] == 1


def test_node_that_already_presents_the_keys_costs_its_agent_nothing(synced_world):
    world = synced_world
    lost = world.target_ips()[0]
    world.deregister_by_hand(lost)
    world.hosts.agent_calls.clear()
    world.agents_poll()
    succeeded(world, [world.run_schedule()])
    assert lost in world.target_ips()
    assert world.hosts.agent_calls["secrets-manager.GetSecretValue"] == 0
    assert world.hosts.agent_calls["eventbridge.PutEvents"] == 0, "nothing changed, so nothing to report"


def test_node_whose_agent_is_down_stays_out_with_an_alarm_and_a_notification(synced_world):
    world = synced_world
    world.notifications()  # drain
    victim = login_nodes(world)[0]
    succeeded(world, world.publish(world.sim.replace_node(world.cluster_name, victim.instance_id)))
    new = next(n for n in login_nodes(world) if n.status == "Pending")
    world.hosts.lifecycle_installs_agent = False  # this node's on_create.sh lacks the hpops line
    succeeded(world, world.publish(world.sim.finish_provisioning(world.cluster_name)))

    assert new.ip not in world.target_ips()
    assert victim.ip not in world.target_ips()
    assert len(world.target_ips()) == 2
    notes = world.notifications()
    assert notes and new.instance_id in notes[0]["message"] and "hpops-node-agent" in notes[0]["message"]
    gate_logs = "".join(i.logs for i in world.dispatcher.invocations if i.function.endswith("GateTargetChangesFunction"))
    assert '"HostIdentityRejected":[1.0]' in gate_logs.replace(" ", "") or '"HostIdentityRejected":1.0' in gate_logs.replace(" ", "")

    world.hosts.lifecycle_installs_agent = True  # the platform team adds the line and re-runs it
    succeeded(world, [world.run_schedule()])
    assert new.ip in world.target_ips(), "admitted on the next sweep"


def test_repair_reverifies_every_registered_node_and_its_agent_fixes_a_drifted_one(synced_world):
    world = synced_world
    drifted = login_nodes(world)[1]
    ssh = world.hosts.root(drifted.instance_id) / "etc" / "ssh"
    from hpops_twin.node_hosts import node_bundle

    for pair in node_bundle(1).pairs():  # someone regenerated this node's keys by hand
        (ssh / f"ssh_host_{pair.name}_key").write_text(pair.private_openssh)
        (ssh / f"ssh_host_{pair.name}_key.pub").write_text(pair.public_line + "\n")
    assert world.presented_fingerprints(drifted.instance_id) != world.canonical_fingerprints()

    before = len([i for i in world.dispatcher.invocations if i.function.endswith("VerifyNodeIdentityFunction")])
    succeeded(world, [world.start_repair()])
    verifies = [i for i in world.dispatcher.invocations if i.function.endswith("VerifyNodeIdentityFunction")][before:]
    assert {i.event["ip"] for i in verifies} == set(world.target_ips())
    assert world.presented_fingerprints(drifted.instance_id) == world.canonical_fingerprints()
    assert drifted.ip in world.target_ips()


def test_repair_takes_out_a_registered_node_that_cannot_be_fixed(synced_world):
    world = synced_world
    drifted = login_nodes(world)[2]
    from hpops_twin.node_hosts import node_bundle

    ssh = world.hosts.root(drifted.instance_id) / "etc" / "ssh"
    for pair in node_bundle(2).pairs():
        (ssh / f"ssh_host_{pair.name}_key.pub").write_text(pair.public_line + "\n")
        (ssh / f"ssh_host_{pair.name}_key").write_text(pair.private_openssh)
    world.hosts.stopped.add(drifted.instance_id)
    succeeded(world, [world.start_repair()])
    assert drifted.ip not in world.target_ips()
    assert len(world.target_ips()) == 2


def test_rotation_is_published_applied_by_every_agent_and_reverified(synced_world):
    world = synced_world
    from hpops_twin.node_hosts import rotation_bundle

    old = world.canonical_fingerprints()
    world.install_canonical_host_keys(rotation_bundle())
    assert world.canonical_fingerprints() != old
    succeeded(world, [world.start_repair()])
    assert len(world.target_ips()) == 3
    for node in login_nodes(world):
        assert world.presented_fingerprints(node.instance_id) == world.canonical_fingerprints()
    assert all(r["hostIdentity"]["fingerprints"] == world.canonical_fingerprints() for r in node_reports(world).values())


def test_a_forged_report_is_refused_recorded_nowhere_and_lands_in_the_dlq(synced_world):
    world = synced_world
    node = login_nodes(world)[0]
    before = node_reports(world)[node.instance_id]
    forged = before | {"ip": "10.9.9.9", "trigger": "change"}
    world.aws.client("events").put_events(Entries=[{
        "Source": "hpops.node", "DetailType": "HyperPod Login Node Report", "EventBusName": world.output("NodeReportBusName"),
        "Detail": json.dumps(forged)}])
    # Sent with the node role alone: it carries no signature by the node's enrolled agent key.
    assert world.delivery_failures[-1]["error"] == "NodeProofMalformedError"
    assert node_reports(world)[node.instance_id] == before
    dlq = world.aws.client("sqs").receive_message(QueueUrl=world.output("EventDeliveryDLQUrl"), MaxNumberOfMessages=10)
    assert any("10.9.9.9" in m["Body"] for m in dlq.get("Messages", []))


def test_without_a_published_identity_new_nodes_stay_out_and_say_why(world):
    table = world.resolver.physical_ids["SyncStateTable"]
    world.aws.client("dynamodb").update_item(
        TableName=table, Key={"pk": {"S": f"cluster#{world.cluster_name}"}, "sk": {"S": "sync-lease"}},
        UpdateExpression="REMOVE hostIdentity",
    )
    result = succeeded(world, [world.run_schedule()])[0]
    assert world.target_ips() == []
    assert all("hpops host-keys" in r["reason"] for r in result.output["changes"]["rejected"])


def test_mode_off_registers_without_checks():
    with TwinWorld(parameters={"HostIdentityMode": "off"}) as world:
        own = {n.instance_id: world.presented_fingerprints(n.instance_id) for n in login_nodes(world)}
        succeeded(world, [world.run_schedule()])
        assert len(world.target_ips()) == 3
        assert "ssm.PutParameter" not in world.counter.calls, "mode off publishes no identity"
        assert {i: world.presented_fingerprints(i) for i in own} == own, "mode off: the agents change no node"


def _private_key_fragments(world) -> list[str]:
    secret = world.aws.client("secretsmanager").get_secret_value(SecretId=world.output("HostIdentitySecretArn"))["SecretString"]
    bodies = [key["private"] for key in json.loads(secret)["keys"].values()]
    # any 40-character run of a private key's base64 body is enough to call it a leak
    return [line[:40] for body in bodies for line in body.splitlines() if re.fullmatch(r"[A-Za-z0-9+/=]{60,}", line)]


def test_private_keys_never_leave_secrets_manager_and_the_node(synced_world):
    world = synced_world
    replace_and_provision(world)
    succeeded(world, [world.start_repair()])
    fragments = _private_key_fragments(world)
    assert fragments

    history = json.dumps([world.history(r.execution_arn) for r in world.routes], default=str)
    logs = "".join(i.logs for i in world.dispatcher.invocations)
    # The one designed path: NodeChannel's fetch answer, over the synchronous invoke, to the enrolled agent.
    fetches = [i for i in world.dispatcher.invocations if i.function.endswith("NodeChannelFunction")
               and isinstance(i.event, dict) and i.event.get("action") == "fetch"]
    assert fetches and all(i.event["request"]["what"] == ["hostKeys"] for i in fetches
                           if any(f in json.dumps(i.result) for f in fragments))
    lambda_io = json.dumps([[i.event, i.result] for i in world.dispatcher.invocations if i not in fetches]
                           + [[i.event] for i in fetches], default=str)
    ssm = world.aws.client("ssm")
    parameters = json.dumps([ssm.get_parameters_by_path(Path="/hpops", Recursive=True)["Parameters"]], default=str)
    reports = json.dumps(node_reports(world))
    notes = json.dumps(world.notification_log + world.notifications())
    for where, text in {"Step Functions history": history, "Lambda logs": logs, "Lambda input/output": lambda_io,
                        "SSM parameters": parameters, "node reports": reports, "notifications": notes}.items():
        leaked = [f for f in fragments if f in text]
        assert not leaked, f"private key material in {where}"


def test_no_fresh_node_ever_starts_with_the_canonical_keys(world):
    canonical = world.canonical_fingerprints()
    for index in range(12):
        from hpops_twin.node_hosts import node_bundle

        assert node_bundle(index).public_fingerprints() != canonical


def test_a_node_kept_out_is_notified_once_though_several_executions_see_it(synced_world):
    world = synced_world
    world.notifications()  # drain
    cluster, login = world.cluster_name, world.login_group
    world.wait(world.publish(world.sim.scale_group(cluster, login, len(login_nodes(world)) + 1)))
    broken = next(n for n in login_nodes(world) if n.status == "Pending")
    world.hosts.stopped.add(broken.instance_id)  # its agent is down: it never reports
    world.wait(world.publish(world.sim.finish_provisioning(cluster)))
    gates = sum(1 for i in world.dispatcher.invocations
                if i.function.endswith("GateTargetChangesFunction") and (i.result or {}).get("rejected"))
    assert broken.ip not in world.target_ips() and gates >= 2, "several executions kept the node out"
    kept_out = [n for n in world.notifications() if "kept out" in (n["subject"] or "")]
    assert len(kept_out) == 1 and broken.instance_id in kept_out[0]["message"]
