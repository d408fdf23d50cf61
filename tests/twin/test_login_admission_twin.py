"""Load-aware admission in the twin: a hot login node leaves rotation for new connections, its users
keep their sessions and their slot, and it comes back once cooled; never fewer than two nodes take
new connections.

Everything between is the real code: each node's agent reads its pressure (PSI) from its /proc (the
twin writes the files a kernel would), signs and sends its report; RecordNodeReport keeps it; the
LoginAdmission function (its schedule fired by the test) decides and starts LoginNodeSync, whose
real ASL and handlers change the target group. Ten or fifteen minutes passing is played by moving the
admission record's clock back (hpops_twin/admission_twin.py).
"""

from __future__ import annotations

import time

import pytest

from hpops_twin import nlb_model
from hpops_twin.admission_twin import admission_record as record, minutes_pass, run_admission, set_pressure
from hpops_twin.ssh_logins import SshLogins
from hpops_twin.world import TwinWorld

HOT = 75.0


@pytest.fixture(scope="module")
def world():
    with TwinWorld(login_count=4, worker_count=1, parameters={"LoadAwareAdmission": "on", "LoginNodeSlots": "4"}) as world:
        assert world.wait([world.run_schedule()])[0].status == "SUCCEEDED"
        world.agents_poll()
        yield world


def login_nodes(world: TwinWorld) -> list:
    return sorted((n for n in world.sim.nodes(world.cluster_name, world.login_group) if n.status == "Running"),
                  key=lambda n: n.ip)


def admission(world: TwinWorld) -> dict:
    return run_admission(world)[0]


def slot_of(world: TwinWorld, ip: str) -> int | None:
    elbv2 = world.aws.client("elbv2")
    for n in range(1, 5):
        health = elbv2.describe_target_health(TargetGroupArn=world.resolver.physical_ids[f"LoginSlot{n}TargetGroup"])
        if any(d["Target"]["Id"] == ip and d["TargetHealth"]["State"] != "draining" for d in health["TargetHealthDescriptions"]):
            return n
    return None


def new_connections(world: TwinWorld) -> set[str]:
    """Where 200 users' new SSH connections land (the NLB's flow hash over the registered targets)."""
    placed = nlb_model.place_users("nat", 200, world.target_ips(), sticky_source_ip=False, seed=7)
    return {ip for ip, count in placed.items() if count}


def test_a_hot_node_leaves_rotation_for_new_connections_keeps_its_users_and_returns_once_cooled(world):
    nodes = login_nodes(world)
    hot = nodes[0]
    set_pressure(world, {})
    admission(world)
    with SshLogins(world).installed() as logins:
        alice = logins.open("alice", hot.instance_id, time.time())
        set_pressure(world, {hot.instance_id: HOT})
        first = admission(world)
        assert first["moves"] == [] and hot.instance_id in record(world)["hotSince"]
        assert sorted(world.target_ips()) == sorted(n.ip for n in nodes)
        slot = slot_of(world, hot.ip)

        minutes_pass(world, 10)
        left = admission(world)
        (move,) = left["moves"]
        assert (move["action"], move["instanceId"]) == ("leave", hot.instance_id) and "pressure 75%" in move["reason"]
        assert left["syncStarted"]
        assert hot.ip not in world.target_ips() and len(world.target_ips()) == 3
        assert hot.ip not in new_connections(world)  # nobody new lands on the hot node
        assert slot_of(world, hot.ip) == slot  # its users come back to it by its slot
        world.agents_poll()
        assert alice in logins.connected()  # nothing ended alice's session

        # The periodic sweep reads the record too: it does not put the node back.
        assert world.wait([world.run_schedule()])[0].status == "SUCCEEDED"
        assert hot.ip not in world.target_ips()

        set_pressure(world, {})
        minutes_pass(world, 15)
        back = admission(world)
        (move,) = back["moves"]
        assert (move["action"], move["instanceId"]) == ("return", hot.instance_id) and "cooled" in move["reason"]
        assert sorted(world.target_ips()) == sorted(n.ip for n in nodes)
        assert hot.ip in new_connections(world) and slot_of(world, hot.ip) == slot


def test_never_fewer_than_two_nodes_take_new_connections(world):
    nodes = login_nodes(world)
    hot = {n.instance_id: 90.0 for n in nodes[:3]}  # three of four nodes hot: their mean is high
    set_pressure(world, hot)
    admission(world)
    # The tier's mean is 68%: none is 20 points above it. One stays calm, the others' pressure climbs apart.
    set_pressure(world, {nodes[0].instance_id: 95.0, nodes[1].instance_id: 95.0, nodes[2].instance_id: 40.0})
    admission(world)
    for _ in range(4):
        minutes_pass(world, 10)
        admission(world)
        assert len(world.target_ips()) >= 2
    out = record(world)["out"]
    assert sorted(out) == sorted([nodes[0].instance_id, nodes[1].instance_id])
    assert sorted(world.target_ips()) == sorted([nodes[2].ip, nodes[3].ip])
    # Now the third one runs hot too: the floor keeps it in rotation, and says so.
    set_pressure(world, {nodes[0].instance_id: 95.0, nodes[1].instance_id: 95.0, nodes[2].instance_id: 99.0})
    minutes_pass(world, 10)
    result = admission(world)
    assert result["moves"] == [] and len(world.target_ips()) == 2
    set_pressure(world, {})
    minutes_pass(world, 20)
    admission(world)
    minutes_pass(world, 5)
    admission(world)
    assert sorted(world.target_ips()) == sorted(n.ip for n in nodes)



def test_an_unreadable_admission_record_never_stops_the_sync_and_keeps_nobody_out(world):
    nodes = login_nodes(world)
    admission(world)  # the record the sync reads: every admission run writes it, whichever test ran before
    ddb, table = world.aws.client("dynamodb"), world.output("SyncStateTableName")
    key = {"pk": {"S": f"admission#{world.cluster_name}"}, "sk": {"S": "login-admission"}}
    item = ddb.get_item(TableName=table, Key=key)["Item"]
    ddb.put_item(TableName=table, Item=item | {"state": {"S": "not json"}})
    try:
        assert world.wait([world.run_schedule()])[0].status == "SUCCEEDED"
        assert sorted(world.target_ips()) == sorted(n.ip for n in nodes)
    finally:
        ddb.put_item(TableName=table, Item=item)  # the module's world: the next test reads a good record
