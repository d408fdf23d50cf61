"""Back to your own node: with LoginNodeSlots=4, port 2200+N of the NLB forwards to one login node alone.

The twin's real sync keeps each slot's single-target target group equal to one registered login
node, for that node's life; a replacement takes a free slot and the old slot stops answering for
the old node. Each node's real agent reads the published map and tells users at login which slot
it is (etc/profile.d/hpops-login-slot.sh on the node's root).
"""

from __future__ import annotations

import json

import pytest

from hpops_twin.world import TwinWorld

SLOTS = 4


@pytest.fixture(scope="module")
def world():
    with TwinWorld(login_count=3, worker_count=2, parameters={"LoginNodeSlots": str(SLOTS)}) as world:
        assert world.wait([world.run_schedule()])[0].status == "SUCCEEDED"
        world.agents_poll()
        yield world


def slot_targets(world: TwinWorld) -> dict[int, list[str]]:
    elbv2 = world.aws.client("elbv2")
    found = {}
    for n in range(1, SLOTS + 1):
        health = elbv2.describe_target_health(TargetGroupArn=world.resolver.physical_ids[f"LoginSlot{n}TargetGroup"])
        found[n] = sorted(d["Target"]["Id"] for d in health["TargetHealthDescriptions"]
                          if d["TargetHealth"]["State"] != "draining")
    return found


def login_message(world: TwinWorld, ip: str) -> str:
    node = next(n for n in world.sim.nodes(world.cluster_name, world.login_group) if n.ip == ip)
    path = world.hosts.roots[node.instance_id] / "etc/profile.d/hpops-login-slot.sh"
    return path.read_text() if path.exists() else ""


def published(world: TwinWorld) -> dict:
    name = f"/hpops/{world.cluster_name}/node/login-slots"
    return json.loads(world.aws.client("ssm").get_parameter(Name=name)["Parameter"]["Value"])


def test_each_registered_login_node_has_its_own_slot_and_is_told_at_login(world):
    slots = slot_targets(world)
    held = [ips for ips in slots.values() if ips]
    assert sorted(ip for ips in held for ip in ips) == world.target_ips() and all(len(ips) == 1 for ips in held)
    assert slots[SLOTS] == []  # 3 nodes, 4 slots: the last is free
    assert published(world)["slots"] == {ips[0]: n for n, ips in slots.items() if ips}
    for n, ips in slots.items():
        if ips:
            assert f"you are on login-{n:02d}; come back to this node with: ssh -p {2200 + n} " in login_message(world, ips[0])


def test_a_replacement_takes_a_free_slot_and_the_old_slot_stops_answering_for_the_old_node(world):
    before = slot_targets(world)
    cluster, sim = world.cluster_name, world.sim
    victim = sorted(sim.nodes(cluster, world.login_group), key=lambda n: n.ip)[0]
    victim_slot = next(n for n, ips in before.items() if victim.ip in ips)
    world.wait(world.publish(sim.replace_node(cluster, victim.instance_id)))
    world.wait(world.publish(sim.finish_provisioning(cluster)))
    world.agents_poll()

    after = slot_targets(world)
    new_ip = next(ip for ip in world.target_ips() if ip not in sum(before.values(), []))
    assert victim.ip not in sum(after.values(), [])
    (new_slot,) = [n for n, ips in after.items() if new_ip in ips]
    assert new_slot in [n for n, ips in before.items() if not ips] + [victim_slot]  # a free one
    assert {n: ips for n, ips in after.items() if n != new_slot and ips} == {
        n: ips for n, ips in before.items() if n not in (new_slot, victim_slot) and ips}  # the others kept theirs
    assert f"login-{new_slot:02d}" in login_message(world, new_ip)


def test_the_nlbs_security_group_admits_the_slot_ports_from_the_clients_range(world):
    (balancer,) = world.aws.client("elbv2").describe_load_balancers(
        LoadBalancerArns=[world.resolver.physical_ids["LoginLoadBalancer"]])["LoadBalancers"]
    (group,) = world.aws.client("ec2").describe_security_groups(GroupIds=balancer["SecurityGroups"])["SecurityGroups"]
    assert sorted((p["FromPort"], p["ToPort"]) for p in group["IpPermissions"]) == [(22, 22), (2201, 2208)]
