"""Pure gate: only verified nodes take traffic."""

from hpops_core.host_identity.gate import gate_registrations

PLAN = {"register": ["10.0.0.4", "10.0.0.5"], "deregister": ["10.0.0.1"], "keep": ["10.0.0.2", "10.0.0.3"]}


def verdict(ip, ok, reason="all 3 host keys match"):
    return {"ip": ip, "instanceId": "i-" + ip.replace(".", ""), "ok": ok, "reason": reason}


def test_only_verified_new_nodes_are_registered_and_the_rest_are_reported():
    gated = gate_registrations(PLAN, [verdict("10.0.0.4", True), verdict("10.0.0.5", False, "key push Failed: Undeliverable")], repair=False)
    assert gated.register == ("10.0.0.4",)
    assert gated.deregister == ("10.0.0.1",)
    assert gated.rejected == ({"ip": "10.0.0.5", "instanceId": "i-10005", "reason": "key push Failed: Undeliverable"},)
    assert "keep 10.0.0.5 out: key push Failed: Undeliverable" in gated.reasons


def test_a_node_without_a_verdict_is_kept_out():
    gated = gate_registrations(PLAN, [], repair=False)
    assert gated.register == () and len(gated.rejected) == 2


def test_repair_deregisters_registered_nodes_that_fail_reverification():
    verdicts = [verdict("10.0.0.2", True), verdict("10.0.0.3", False, "wrong keys"), verdict("10.0.0.4", True), verdict("10.0.0.5", True)]
    gated = gate_registrations(PLAN, verdicts, repair=True)
    assert gated.deregister == ("10.0.0.1", "10.0.0.3")
    assert gated.register == ("10.0.0.4", "10.0.0.5")


def test_repair_never_empties_the_target_group_because_of_identity():
    plan = {"register": [], "deregister": [], "keep": ["10.0.0.2"]}
    gated = gate_registrations(plan, [verdict("10.0.0.2", False, "wrong keys")], repair=True)
    assert gated.deregister == ()
    assert gated.rejected and "would empty the target group" in gated.reasons[0]


def test_outside_a_repair_registered_nodes_are_not_touched():
    gated = gate_registrations(PLAN, [verdict("10.0.0.2", False)], repair=False)
    assert gated.deregister == ("10.0.0.1",)
