"""Balance as users really connect, in the twin: the stack's defaults spread users whatever their path,
idle sessions are kept alive on every login node, and the NLB has a security group.

The target choice is the NLB model (hpops_twin/nlb_model.py) over the target group the twin's real
sync produced and the stickiness attribute the stack gave it; the keepalive is the real agent's, on
each simulated node's sshd_config, and what its report (stored by RecordNodeReport) says.
"""

from __future__ import annotations

import json

import pytest

from hpops_twin import nlb_model
from hpops_twin.balance_bench import target_group_of
from hpops_twin.world import TwinWorld

USERS = 200


@pytest.fixture(scope="module")
def world():
    with TwinWorld(login_count=4, worker_count=4) as world:
        result = world.wait([world.run_schedule()])[0]
        assert result.status == "SUCCEEDED"
        world.agents_poll()
        yield world


def sessions_per_node(world: TwinWorld, path: str) -> list[int]:
    targets, sticky = target_group_of(world)
    return sorted(nlb_model.place_users(path, USERS, targets, sticky, seed=7).values(), reverse=True)


@pytest.mark.parametrize("path", list(nlb_model.ACCESS_PATHS))
def test_at_the_defaults_users_behind_one_nat_or_client_vpn_land_on_every_login_node(world, path):
    per_node = sessions_per_node(world, path)
    assert len(per_node) == 4 and sum(per_node) == USERS
    assert min(per_node) >= 30, per_node  # 50 each on average; 200 on one node with source_ip


def test_the_stacks_target_group_has_no_stickiness_which_behind_one_nat_would_be_one_node(world):
    attributes = {a["Key"]: a["Value"] for a in world.aws.client("elbv2").describe_target_group_attributes(
        TargetGroupArn=world.target_group_arn())["Attributes"]}
    assert attributes["stickiness.enabled"] == "false"
    targets, _ = target_group_of(world)
    assert sorted(nlb_model.place_users("nat", USERS, targets, True, seed=7).values()) == [0, 0, 0, USERS]


def test_every_login_nodes_sshd_keeps_idle_sessions_alive_under_the_listeners_idle_timeout(world):
    elbv2 = world.aws.client("elbv2")
    (listener,) = elbv2.describe_listeners(LoadBalancerArn=world.resolver.physical_ids["LoginLoadBalancer"])["Listeners"]
    attributes = {a["Key"]: a["Value"] for a in elbv2.describe_listener_attributes(ListenerArn=listener["ListenerArn"])["Attributes"]}
    assert attributes["tcp.idle_timeout.seconds"] == "350"
    table = world.resolver.physical_ids["SyncStateTable"]
    items = world.aws.client("dynamodb").query(
        TableName=table, KeyConditionExpression="pk = :pk AND begins_with(sk, :sk)",
        ExpressionAttributeValues={":pk": {"S": f"node-report#{world.cluster_name}"}, ":sk": {"S": "node-report#"}})["Items"]
    reports = {i["sk"]["S"].split("#", 1)[1]: json.loads(i["report"]["S"]) for i in items}
    login = [n.instance_id for n in world.sim.nodes(world.cluster_name, world.login_group) if n.status == "Running"]
    for instance_id in login:
        config = (world.hosts.roots[instance_id] / "etc/ssh/sshd_config").read_text().splitlines()
        assert "ClientAliveInterval 120" in config and "ClientAliveCountMax 3" in config
        keepalive = reports[instance_id]["sshKeepalive"]
        assert keepalive["clientAliveInterval"] == 120 and keepalive["idleTimeoutSeconds"] == 350
        assert keepalive["result"] in ("changed", "unchanged")


def test_the_created_nlb_has_a_security_group_admitting_ssh_from_the_clients_range_only(world):
    (balancer,) = world.aws.client("elbv2").describe_load_balancers(
        LoadBalancerArns=[world.resolver.physical_ids["LoginLoadBalancer"]])["LoadBalancers"]
    (group_id,) = balancer["SecurityGroups"]
    (group,) = world.aws.client("ec2").describe_security_groups(GroupIds=[group_id])["SecurityGroups"]
    assert sorted((p["IpProtocol"], p["FromPort"], p["ToPort"], [r["CidrIp"] for r in p["IpRanges"]])
                  for p in group["IpPermissions"]) == [("tcp", 22, 22, ["10.0.0.0/8"]), ("tcp", 2201, 2208, ["10.0.0.0/8"])]


def test_the_demo_shows_the_spread_before_and_after(world):
    from hpops_twin.demo import spread_line

    line = spread_line(world)
    before, now = line.split("before (source_ip stickiness) ")[1].split("; now (no stickiness) ")
    assert before == "200/0/0/0"
    assert len(now.split("/")) == 4 and all(int(n) >= 30 for n in now.split("/")), line
