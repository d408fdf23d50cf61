"""The real state machine (moto's interpreter) and handlers against the simulated HyperPod cluster.

Each test asserts what a user of the login tier sees: the target group's contents.
"""

import json
import time
from unittest import mock

import pytest
from moto.elbv2.models import ELBv2Backend

from hpops_core.login_sync import sync_lease
from hpops_core.host_identity import verifier


def login_node(world, index=0):
    return sorted(world.sim.nodes(world.cluster_name, world.login_group), key=lambda n: n.ip)[index]


def assert_all_succeeded(results):
    failed = [(r.name, r.error, r.cause) for r in results if r.status != "SUCCEEDED"]
    assert not failed, failed


def test_initial_event_registers_every_login_node_and_no_worker(world):
    results = world.wait(world.publish([world.sim.state_change_event(world.cluster_name)]))
    assert_all_succeeded(results)
    assert world.target_ips() == world.login_truth()
    assert len(world.target_ips()) == 3
    workers = {n.ip for n in world.sim.nodes(world.cluster_name, world.worker_group)}
    assert not workers & set(world.target_ips())


def test_node_replacement_moves_traffic_to_the_new_ip(synced_world):
    world = synced_world
    victim = login_node(world)
    old_ip = victim.ip

    assert_all_succeeded(world.wait(world.publish(world.sim.replace_node(world.cluster_name, victim.instance_id))))
    assert old_ip not in world.target_ips(), "the failing node stops taking new sessions at once"
    assert world.converged()
    # Its users are told, through the document its agent reads with its desired state.
    notices = json.loads(world.aws.client("ssm").get_parameter(Name="/hpops/ml-research/node/leave-notices")["Parameter"]["Value"])
    assert notices["graceMinutes"] == 10 and notices["host"].endswith(".elb.amazonaws.com")
    assert {i: (e["ip"], e["why"]) for i, e in notices["nodes"].items()} == {victim.instance_id: (old_ip, "stopping")}

    assert_all_succeeded(world.wait(world.publish(world.sim.finish_provisioning(world.cluster_name))))
    assert world.converged()
    assert len(world.target_ips()) == 3 and old_ip not in world.target_ips()


def test_scale_out_then_in(synced_world):
    world = synced_world
    world.wait(world.publish(world.sim.scale_group(world.cluster_name, world.login_group, 5)))
    world.wait(world.publish(world.sim.finish_provisioning(world.cluster_name)))
    assert len(world.target_ips()) == 5 and world.converged()

    world.wait(world.publish(world.sim.scale_group(world.cluster_name, world.login_group, 2)))
    assert_all_succeeded(world.wait(world.publish(world.sim.finish_provisioning(world.cluster_name))))
    assert len(world.target_ips()) == 2 and world.converged()


def test_duplicate_events_change_the_target_group_once(synced_world):
    world = synced_world
    events = world.sim.replace_node(world.cluster_name, login_node(world).instance_id)
    world.wait(world.publish(events))
    world.wait(world.publish(world.sim.finish_provisioning(world.cluster_name)))
    registered_once = world.target_ips()

    world.counter.reset()
    duplicate = world.sim.state_change_event(world.cluster_name)
    assert_all_succeeded(world.wait(world.publish([duplicate, duplicate, duplicate])))
    assert world.target_ips() == registered_once
    assert world.counter.calls["elastic-load-balancing-v2.RegisterTargets"] == 0
    assert world.counter.calls["elastic-load-balancing-v2.DeregisterTargets"] == 0


def test_burst_of_20_events_converges_and_releases_the_lease(synced_world):
    world = synced_world
    sim = world.sim
    events = sim.replace_node(world.cluster_name, login_node(world).instance_id)
    events += sim.scale_group(world.cluster_name, world.login_group, 4)
    events += sim.finish_provisioning(world.cluster_name)
    while len(events) < 20:
        events.append(sim.state_change_event(world.cluster_name))
    started = world.publish(events[:20])
    # Cluster state changes also start the BudgetGuard state machine; count the syncs.
    assert sum(arn.rsplit(":", 2)[-2].endswith("LoginNodeSyncStateMachine") for arn in started) == 20
    results = world.wait(started, timeout=120)
    assert_all_succeeded(results)
    assert world.converged() and len(world.target_ips()) == 4
    lease = world.lease_item()
    assert "holder" not in lease, "the lease is free once the burst is done"
    assert lease["pending"]["BOOL"] is False


def test_empty_listing_while_in_service_keeps_every_target_and_raises_the_alarm(synced_world):
    world = synced_world
    before = world.target_ips()
    with world.sim.listing_outage(world.cluster_name, world.login_group):
        result = world.wait([world.run_schedule()])[0]
    assert result.status == "FAILED"
    assert result.error == "EmptyListingGuardError"
    assert "InService" in result.cause
    assert world.target_ips() == before
    plan_logs = [i.logs for i in world.dispatcher.invocations if i.function.endswith("PlanTargetChangesFunction")][-1]
    emf = [json.loads(line) for line in plan_logs.splitlines() if line.startswith('{"_aws"')]
    assert any(m.get("SafetyGuardTripped") == [1.0] or m.get("SafetyGuardTripped") == 1.0 for m in emf), "the alarm's metric"
    assert "holder" not in world.lease_item(), "a failed execution frees the lease"


def test_cluster_being_deleted_drains_the_target_group(synced_world):
    world = synced_world
    world.sim.cluster(world.cluster_name).status = "Deleting"
    for node in world.sim.nodes(world.cluster_name):
        node.status = "ShuttingDown"
    assert_all_succeeded(world.wait([world.run_schedule()]))
    assert world.target_ips() == []


def test_deleted_cluster_drains_the_target_group_and_every_sweep_succeeds(synced_world):
    world = synced_world
    registered = world.target_ips()
    world.sim.delete_cluster(world.cluster_name)  # SageMaker now answers ResourceNotFound for it

    first = world.wait([world.run_schedule()])[0]
    assert first.status == "SUCCEEDED", (first.error, first.cause)
    assert world.targets() == [], "every SSH target drained; the deregistration delay covers open sessions"
    assert first.output["plan"]["reasons"] == [
        f"deregister {ip}: cluster {world.cluster_name} no longer exists" for ip in registered
    ]
    assert "holder" not in world.lease_item()

    world.counter.reset()
    second = world.wait([world.run_schedule()])[0]
    assert second.status == "SUCCEEDED", (second.error, second.cause)
    assert second.output["plan"]["hasChanges"] is False
    assert world.targets() == []
    assert world.counter.calls["elastic-load-balancing-v2.RegisterTargets"] == 0
    assert world.counter.calls["elastic-load-balancing-v2.DeregisterTargets"] == 0
    assert world.counter.calls["sagemaker.DescribeCluster"] == 0, "the listing already said the cluster is gone"


def test_a_cluster_never_seen_keeps_the_targets_it_did_not_register(world):
    """A stack pointed at a wrong ClusterName (or region) with an existing, populated target group:
    ResourceNotFound there means a typo, not a deletion, so nothing is drained and the guard pages."""
    world.aws.client("elbv2").register_targets(
        TargetGroupArn=world.target_group_arn(), Targets=[{"Id": "10.1.0.200", "Port": 22}])
    world.sim.delete_cluster(world.cluster_name)  # never listed by this stack: its IP cache is empty

    result = world.wait([world.run_schedule()])[0]
    assert result.status == "FAILED" and result.error == "EmptyListingGuardError"
    assert "never seen by this stack" in result.cause
    assert world.target_ips() == ["10.1.0.200"]
    assert "holder" not in world.lease_item()


def test_a_node_whose_verification_task_fails_stays_out_and_the_sync_succeeds(synced_world):
    """The verifier task fails (here: the Lambda crashes) before any verdict exists, so the map's
    Catch reaches StillAcceptable without $.before: that must route to Rejected, not States.Runtime."""
    world = synced_world
    if world.resolver.parameters["HostIdentityMode"] == "off":
        pytest.skip("host identity checks are off in this twin (no ssh-keygen)")
    victim = login_node(world)
    world.sim.replace_node(world.cluster_name, victim.instance_id)
    world.sim.finish_provisioning(world.cluster_name)
    new = next(n for n in world.sim.nodes(world.cluster_name, world.login_group) if n.ip not in world.target_ips())
    survivors = sorted(n.ip for n in world.sim.nodes(world.cluster_name, world.login_group) if n is not new)
    read_keys = verifier.read_presented_public_keys  # the twin's node hosts

    def crash_on_the_new_node(ip, *args, **kwargs):
        if ip == new.ip:
            raise RuntimeError("verifier crashed")
        return read_keys(ip, *args, **kwargs)

    with mock.patch.object(verifier, "read_presented_public_keys", crash_on_the_new_node):
        result = world.wait([world.run_schedule()])[0]
    assert result.status == "SUCCEEDED", (result.error, result.cause)
    assert world.target_ips() == survivors, "the old node left, the unverified one stayed out"
    entered = [e["stateEnteredEventDetails"]["name"] for e in world.history(result.arn)
               if e["type"].endswith("StateEntered")]
    assert "RejectOnError" in entered and "Rejected" in entered and "RememberFirstVerdict" not in entered

    assert_all_succeeded(world.wait([world.run_schedule()]))
    assert new.ip in world.target_ips() and world.converged(), "the next sync lets it in once it verifies"


def test_dry_run_reports_the_plan_and_changes_nothing(synced_world):
    world = synced_world
    lost = world.target_ips()[0]
    world.deregister_by_hand(lost)
    lease_before = world.lease_item()

    result = world.wait([world.start_repair(dry_run=True)])[0]
    assert result.status == "SUCCEEDED"
    assert result.output["plan"]["register"] == [lost]
    assert lost not in world.target_ips(), "dry run changed nothing"
    assert world.lease_item() == lease_before, "dry run wrote nothing, not even the cache"

    assert_all_succeeded(world.wait([world.start_repair(dry_run=False)]))
    assert lost in world.target_ips()


def test_manual_repair_trusts_no_cached_ip_and_sweep_uses_the_cache(synced_world):
    world = synced_world
    world.counter.reset()
    world.wait([world.run_schedule()])
    assert world.counter.calls["sagemaker.DescribeClusterNode"] == 0
    world.counter.reset()
    world.wait([world.start_repair()])
    assert world.counter.calls["sagemaker.DescribeClusterNode"] == 3


def test_targets_on_other_ports_are_left_alone(synced_world):
    world = synced_world
    world.aws.client("elbv2").register_targets(
        TargetGroupArn=world.target_group_arn(), Targets=[{"Id": "10.9.9.9", "Port": 2222}]
    )
    assert_all_succeeded(world.wait([world.run_schedule()]))
    assert {"ip": "10.9.9.9", "port": 2222, "state": "healthy"} in world.targets()


def test_events_for_other_clusters_match_no_rule(world, saved_event):
    event = saved_event("hyperpod-node-health.json")
    event["detail"]["ClusterName"] = "another-cluster"
    assert world.publish([event]) == []
    cluster_event = saved_event("hyperpod-cluster-event.json")
    assert len(world.publish([cluster_event])) == 1, "the nested EventDetails.ClusterName is matched too"


def test_a_busy_lease_coalesces_and_the_holder_runs_the_extra_pass(world):
    table = world.resolver.physical_ids["SyncStateTable"]
    with mock.patch.dict("os.environ", {"AWS_DEFAULT_REGION": "us-east-1"}):
        grant = sync_lease.acquire(table, world.cluster_name, "someone-else", int(time.time()), 600)
    assert grant.acquired

    result = world.wait(world.publish([world.sim.state_change_event(world.cluster_name)]))[0]
    assert result.status == "SUCCEEDED"
    assert result.output["lease"]["acquired"] is False
    assert world.lease_item()["pending"]["BOOL"] is True, "the event is remembered, not lost"
    assert world.target_ips() == [], "the holder, not this execution, does the work"

    outcome = sync_lease.release(table, world.cluster_name, "someone-else", {})
    assert outcome.rerun is True, "the holder is told to run one more pass"


def test_an_expired_lease_is_taken_over(world):
    table = world.resolver.physical_ids["SyncStateTable"]
    sync_lease.acquire(table, world.cluster_name, "crashed-execution", int(time.time()) - 2000, 600)
    assert_all_succeeded(world.wait([world.run_schedule()]))
    assert world.converged() and len(world.target_ips()) == 3


def test_an_aws_failure_fails_the_execution_and_frees_the_lease(world):
    def broken(*args, **kwargs):
        raise RuntimeError("elbv2 is down")

    with mock.patch.object(ELBv2Backend, "register_targets", broken):
        result = world.wait([world.run_schedule()])[0]
    assert result.status == "FAILED"
    assert world.target_ips() == []
    assert "holder" not in world.lease_item()
    # and the next sweep repairs it
    assert_all_succeeded(world.wait([world.run_schedule()]))
    assert world.converged()


@pytest.mark.parametrize("group_change, says", [
    # The stack's LoginGroupName names no group of the cluster (a typo, or the wrong cluster).
    ({"InstanceGroupName": "login-nodes"}, "is not an instance group of the cluster; its groups: "),
    # API-driven Slurm configuration: the named group exists but Slurm runs it as compute nodes.
    ({"SlurmConfig": {"NodeType": "Compute", "PartitionNames": ["dev"]}}, "has SlurmConfig NodeType 'Compute', not Login"),
])
def test_a_login_group_the_cluster_does_not_have_fails_the_sync_and_changes_nothing(synced_world, group_change, says):
    world = synced_world
    before = world.target_ips()
    assert len(before) == 3
    [group] = [g for g in world.sim.cluster(world.cluster_name).instance_groups
               if g["InstanceGroupName"] == world.login_group]
    original = dict(group)
    group.update(group_change)
    try:
        result = world.wait([world.run_schedule()])[0]
    finally:
        group.clear()
        group.update(original)
    assert result.status == "FAILED" and result.error == "LoginGroupError", (result.error, result.cause)
    assert says in result.cause and repr(world.worker_group) in result.cause
    assert world.target_ips() == before, "a sync that cannot trust its login group changes no target"
    assert "holder" not in world.lease_item()
    assert_all_succeeded(world.wait([world.run_schedule()]))
