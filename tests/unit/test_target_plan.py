"""The pure decision: no AWS, every reason checked."""

from hpops_core.login_sync.target_plan import LoginNode, Target, plan_targets, still_to_apply

PORT = 22


def node(i: int, status: str = "Running", ip: str | None = "auto") -> LoginNode:
    return LoginNode(instance_id=f"i-{i:017x}", status=status, ip=f"10.0.0.{i}" if ip == "auto" else ip)


def target(i: int, state: str = "healthy", port: int = PORT) -> Target:
    return Target(ip=f"10.0.0.{i}", port=port, state=state)


def test_registers_new_running_nodes_and_says_why():
    plan = plan_targets([node(1), node(2)], [target(1)], PORT, None)
    assert plan.register == ("10.0.0.2",)
    assert plan.deregister == ()
    assert plan.keep == ("10.0.0.1",)
    assert any("register 10.0.0.2" in r and "not in the target group" in r for r in plan.reasons)


def test_replacement_registers_new_ip_and_deregisters_old():
    plan = plan_targets([node(2), node(3), node(4)], [target(1), target(2), target(3)], PORT, None)
    assert plan.register == ("10.0.0.4",)
    assert plan.deregister == ("10.0.0.1",)
    assert "deregister 10.0.0.1: no Running login node has this IP" in plan.reasons


def test_nodes_that_are_not_running_are_not_registered():
    nodes = [node(1), node(2, "Pending", ip=None), node(3, "ShuttingDown"), node(4, "SystemUpdating")]
    plan = plan_targets(nodes, [target(3), target(4)], PORT, None)
    assert plan.register == ("10.0.0.1",)
    assert plan.deregister == ("10.0.0.3", "10.0.0.4")
    assert any(r.startswith("skip i-") and "Pending, no IP yet" in r for r in plan.reasons)


def test_in_sync_has_no_changes():
    plan = plan_targets([node(1), node(2)], [target(1), target(2, "unhealthy")], PORT, None)
    assert not plan.has_changes
    assert plan.summary == "in sync (2 targets)"


def test_draining_target_of_a_wanted_ip_is_registered_again():
    plan = plan_targets([node(1)], [target(1, "draining")], PORT, None)
    assert plan.register == ("10.0.0.1",)
    assert "draining" in plan.reasons[0]


def test_draining_target_of_an_unwanted_ip_is_left_alone():
    plan = plan_targets([node(1)], [target(1), target(2, "draining")], PORT, None)
    assert plan.deregister == ()


def test_targets_on_other_ports_are_never_touched():
    plan = plan_targets([node(1)], [target(1), target(9, port=2222)], PORT, None)
    assert plan.deregister == ()
    assert "leave 10.0.0.9:2222: not the SSH port 22" in plan.reasons


def test_empty_listing_while_in_service_refuses_to_deregister_everything():
    plan = plan_targets([], [target(1), target(2)], PORT, "InService")
    assert plan.guard is not None and "InService" in plan.guard
    assert plan.deregister == () and plan.register == ()
    assert plan.summary.startswith("refused")


def test_all_login_nodes_down_but_cluster_live_is_also_guarded():
    plan = plan_targets([node(1, "ShuttingDown")], [target(1)], PORT, "Updating")
    assert plan.guard is not None


def test_empty_listing_when_cluster_is_gone_drains_everything():
    for status in ("Deleting", "NotFound"):
        plan = plan_targets([], [target(1), target(2)], PORT, status)
        assert plan.guard is None
        assert plan.deregister == ("10.0.0.1", "10.0.0.2")


def test_empty_listing_and_empty_target_group_is_fine():
    plan = plan_targets([], [], PORT, "InService")
    assert plan.guard is None and not plan.has_changes


def test_plan_is_deterministic_whatever_the_input_order():
    nodes = [node(3), node(1), node(2)]
    assert plan_targets(nodes, [], PORT, None) == plan_targets(list(reversed(nodes)), [], PORT, None)


def test_draining_a_gone_cluster_says_why_in_each_reason():
    plan = plan_targets([], [target(1), target(2)], PORT, "NotFound", "ml-research")
    assert plan.reasons == (
        "deregister 10.0.0.1: cluster ml-research no longer exists",
        "deregister 10.0.0.2: cluster ml-research no longer exists",
    )
    deleting = plan_targets([], [target(1)], PORT, "Deleting", "ml-research")
    assert deleting.reasons == ("deregister 10.0.0.1: cluster ml-research is being deleted",)


def test_a_retried_apply_sends_only_what_did_not_take_effect():
    # The first attempt registered 10.0.0.9 and died before deregistering 10.0.0.1.
    now = [Target("10.0.0.1", 22, "healthy"), Target("10.0.0.9", 22, "initial"), Target("10.0.0.5", 22, "draining")]
    register, deregister = still_to_apply(["10.0.0.9"], ["10.0.0.1", "10.0.0.5"], now, 22)
    assert register == [] and deregister == ["10.0.0.1"], "10.0.0.5 is already draining"


def test_a_retried_apply_with_nothing_done_sends_everything():
    now = [Target("10.0.0.1", 22, "healthy"), Target("10.0.0.9", 2222, "healthy")]
    assert still_to_apply(["10.0.0.9"], ["10.0.0.1"], now, 22) == (["10.0.0.9"], ["10.0.0.1"])


def test_a_node_load_aware_admission_holds_out_leaves_rotation_and_stays_out_while_draining():
    nodes = [node(1), node(2), node(3)]
    plan = plan_targets(nodes, [target(1), target(2), target(3)], PORT, None, held_out={"10.0.0.1": "pressure 80%"})
    assert plan.deregister == ("10.0.0.1",) and plan.held_out == ("10.0.0.1",) and plan.keep == ("10.0.0.2", "10.0.0.3")
    assert any("leaves rotation for new connections, its sessions stay (pressure 80%)" in r for r in plan.reasons)
    draining = plan_targets(nodes, [target(1, "draining"), target(2), target(3)], PORT, None,
                            held_out={"10.0.0.1": "pressure 80%"})
    assert draining.register == () and draining.deregister == () and draining.held_out == ("10.0.0.1",)
    back = plan_targets(nodes, [target(1, "draining"), target(2), target(3)], PORT, None, held_out={})
    assert back.register == ("10.0.0.1",)  # no longer held out: re-registered (after verification)


def test_the_sync_keeps_two_running_nodes_in_rotation_whatever_the_admission_record_says():
    held = {"10.0.0.1": "hot", "10.0.0.2": "hot", "10.0.0.3": "hot"}
    plan = plan_targets([node(1), node(2), node(3)], [target(1), target(2), target(3)], PORT, None, held_out=held)
    assert plan.held_out == ("10.0.0.1",) and plan.keep == ("10.0.0.2", "10.0.0.3")
    assert sum("despite load-aware admission" in r for r in plan.reasons) == 2
    gone = plan_targets([node(2), node(3)], [target(1), target(2), target(3)], PORT, None, held_out={"10.0.0.1": "hot"})
    assert gone.deregister == ("10.0.0.1",) and gone.held_out == ()  # a node that left is simply gone
