"""The chaos suite (`make chaos`, twin/hpops_twin/chaos.py), reduced to what `make test` can afford:
one hostile input per entry point, one fault-injection seed, and the delivery scenarios that
exercise the lease (a Lambda timeout mid-apply, two sweeps at once). Same invariants as the full suite; `make chaos` runs all of it.
"""

from __future__ import annotations

import pytest

from hpops_twin import chaos
from hpops_twin.faults import ChaosTransport
from hpops_twin.world import ENFORCING, TwinWorld


@pytest.fixture(autouse=True)
def _quiet():
    chaos.quiet()


def sample(cases: list[chaos.Hostile]) -> list[chaos.Hostile]:
    """One case per entry point, alternating between a malformed input and a well-formed one for
    another cluster, so both kinds of strictness are sampled."""
    entries = list(dict.fromkeys(case.entry for case in cases))
    picked = []
    for index, entry in enumerate(entries):
        own = [c for c in cases if c.entry == entry]
        foreign = [c for c in own if c.expect == "UnknownClusterError"]
        picked.append(foreign[0] if index % 2 and foreign else own[0])
    return picked


def test_hostile_inputs_end_in_a_named_error_with_no_mutating_call():
    rejections = chaos.rejection_errors()
    with TwinWorld(parameters=ENFORCING) as world, ChaosTransport(world).installed() as transport:
        chaos.hostile_world_setup(world)
        cases = sample(chaos.hostile_cases(world))
        outcomes = [chaos.run_hostile(world, transport, case, rejections) for case in cases]
        lease = world.lease_item() or {}
    assert len({c.entry for c in cases}) >= 10, "every entry point is sampled"
    missed = [(o.entry, o.what, o.status, o.error, o.mutating) for o in outcomes if not o.survived]
    assert not missed, missed
    assert "holder" not in lease


def test_a_faulty_aws_converges_without_applying_anything_twice():
    # Real retry logic, compressed backoff: the delays only make the run longer, not different.
    run = chaos.fault_run(seed=3, backoff_scale=0.1)
    injected = sum(n for kinds in run.injected.values() for kind, n in kinds.items() if kind != "offered")
    assert injected > 0, "faults were injected"
    assert run.problems == [], run
    assert run.duplicates == [], run
    assert run.unnamed_failures == [], run


def test_timeout_mid_apply_and_concurrent_sweeps_keep_the_lease_and_targets_right():
    names = ["ApplyTargetChanges times out mid-apply (Sandbox.Timedout)", "two sweeps at once"]
    with TwinWorld(parameters=ENFORCING) as world, ChaosTransport(world).installed() as transport:
        outcomes = [chaos.run_scenario(name, world, transport) for name in names]
    timeout = outcomes[0]
    assert timeout.details["timed_out"], "the timeout hit mid-apply"
    # The task's Retry ran the idempotent change set again: the old IP left in the same execution.
    assert timeout.details["execution"] == [("SUCCEEDED", None)] and not timeout.details["old_ip_still_registered"]
    assert timeout.failed_executions == []
    bad = [(o.scenario, o.problems, o.duplicates) for o in outcomes if not o.survived]
    assert not bad, bad


def test_a_user_with_the_node_role_cannot_act_as_a_node_and_changes_nothing():
    from hpops_twin.chaos_attacker import part_attacker

    part = part_attacker()
    assert part["ok"], part["findings"]
    assert part["tried"] == part["survived"] >= 14 and part["side_effects"] == 0
