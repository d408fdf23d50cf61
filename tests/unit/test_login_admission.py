"""Load-aware admission's decision (login_sync/admission.py): who leaves rotation, who comes back, why.

Pure: nodes as the admission function observes them, the previous record, a policy and the time.
"""

from __future__ import annotations

import pytest

from hpops_core.login_sync.admission import (
    AdmissionPolicy,
    AdmissionState,
    NodeLoad,
    OutOfRotation,
    decide_admission,
    held_out,
    imbalance_now,
    node_loads,
    rotation_changed,
)

POLICY = AdmissionPolicy(pressure_margin=20, session_margin=0.5, sustain_seconds=600, min_out_seconds=900,
                         imbalance_sustain_seconds=1800)
T0 = 1_800_000_000


def tier(*pressures, sessions=None, **changes):
    sessions = sessions or [10] * len(pressures)
    nodes = [NodeLoad(f"i-{n:017x}", f"10.0.0.{n + 10}", True, s, p) for n, (p, s) in enumerate(zip(pressures, sessions))]
    return [NodeLoad(**(vars(n) | changes.get(n.instance_id, {}))) for n in nodes]


def run(nodes, state=AdmissionState(), now=T0, mode="on", policy=POLICY):
    return decide_admission(nodes, state, policy, now, mode)


def first(nodes):
    return nodes[0].instance_id


def test_a_node_hot_for_the_sustain_time_leaves_rotation_with_its_reason():
    nodes = tier(80, 5, 5, 5)
    started = run(nodes)
    assert started.moves == () and started.state.hot_since == {first(nodes): T0}
    assert any("hot (pressure 80%" in r and "for 0 of 10 min" in r for r in started.reasons)
    left = run(nodes, started.state, T0 + 600)
    (move,) = left.moves
    assert (move.action, move.instance_id, move.ip) == ("leave", first(nodes), "10.0.0.10")
    assert "pressure 80% against the tier's mean 24%" in move.reason and "for 10 min" in move.reason
    assert left.state.out[first(nodes)].since == T0 + 600 and rotation_changed(started.state, left.state)


def test_a_break_in_the_heat_restarts_the_clock():
    nodes = tier(80, 5, 5, 5)
    started = run(nodes, now=T0)
    cooled = run(tier(30, 5, 5, 5), started.state, T0 + 300)
    assert cooled.state.hot_since == {}
    again = run(nodes, cooled.state, T0 + 600)
    assert again.moves == () and again.state.hot_since == {first(nodes): T0 + 600}


def test_no_node_is_hot_when_the_whole_tier_is_equally_busy_or_all_idle():
    for pressures in ((90, 85, 88, 92), (15, 0, 0, 0)):
        state = AdmissionState(hot_since={f"i-{n:017x}": T0 - 3600 for n in range(4)})
        assert run(tier(*pressures), state).moves == ()


def test_sessions_alone_make_a_node_hot_only_well_above_the_mean():
    assert run(tier(5, 5, 5, 5, sessions=[30, 10, 10, 10]), AdmissionState(hot_since={"i-" + "0" * 17: T0 - 600})).moves
    # 14 against a mean of 11: above by half? no (bar 16.5); 5 sessions above? no
    assert not run(tier(5, 5, 5, 5, sessions=[14, 10, 10, 10]), AdmissionState(hot_since={"i-" + "0" * 17: T0 - 600})).moves
    # few sessions: 6 against a mean of 2.25 is not 5 above it
    assert not run(tier(5, 5, 5, 5, sessions=[6, 1, 1, 1]), AdmissionState(hot_since={"i-" + "0" * 17: T0 - 600})).moves


def test_pressure_is_not_compared_when_a_node_reports_no_psi():
    nodes = tier(80, 5, 5, 5, **{"i-" + "0" * 16 + "3": {"pressure": None}})
    decision = run(nodes, AdmissionState(hot_since={first(nodes): T0 - 3600}))
    assert decision.moves == () and any("pressure not compared" in r for r in decision.reasons)


def test_never_below_two_nodes_in_rotation_or_all_when_fewer():
    two = tier(90, 5)
    decision = run(two, AdmissionState(hot_since={first(two): T0 - 3600}))
    assert decision.moves == () and any("the floor keeps 2" in r for r in decision.reasons)
    three = tier(90, 80, 5)
    state = AdmissionState(hot_since={n.instance_id: T0 - 3600 for n in three})
    left = run(three, state)
    assert [m.instance_id for m in left.moves] == [first(three)]  # one per run, the hottest
    second = run(three, left.state, T0 + 300)
    assert second.moves == () and len(second.state.out) == 1


def test_an_unhealthy_node_in_rotation_brings_an_out_node_back_to_keep_the_floor():
    nodes = tier(90, 5, 5)
    state = AdmissionState(out={first(nodes): OutOfRotation("10.0.0.10", T0 - 60, "hot")})
    sick = [NodeLoad(**(vars(n) | ({"healthy": False} if n.ip == "10.0.0.11" else {}))) for n in nodes]
    (move,) = run(sick, state).moves
    assert move.action == "return" and move.instance_id == first(nodes) and move.reason.startswith("floor")


def test_an_out_node_returns_only_once_cooled_below_half_the_margin_and_after_the_minimum_time():
    out = AdmissionState(out={"i-" + "0" * 17: OutOfRotation("10.0.0.10", T0, "hot")})
    assert run(tier(10, 5, 5, 5), out, T0 + 600).moves == ()  # cool, but out only 10 of 15 min
    # 20% against a mean of 8.75: above mean + 10 (half the margin): stays out
    stays = run(tier(20, 5, 5, 5), out, T0 + 3600)
    assert stays.moves == () and any("stays out" in r for r in stays.reasons)
    (move,) = run(tier(12, 5, 5, 5), out, T0 + 900).moves
    assert move.action == "return" and "cooled after 15 min out" in move.reason


def test_an_out_node_without_a_fresh_report_returns_at_once():
    nodes = tier(90, 5, 5, 5, **{"i-" + "0" * 17: {"fresh": False, "pressure": None, "sessions": None}})
    out = AdmissionState(out={first(nodes): OutOfRotation("10.0.0.10", T0, "hot")})
    (move,) = run(nodes, out, T0 + 60).moves
    assert move.action == "return" and "never kept out on missing data" in move.reason


def test_a_node_never_leaves_on_missing_data():
    nodes = tier(5, 5, 5, 5, **{"i-" + "0" * 17: {"fresh": False, "pressure": None, "sessions": None}})
    assert run(nodes, AdmissionState(hot_since={first(nodes): T0 - 3600})).moves == ()


def test_imbalance_is_what_chance_would_not_do_and_is_alarmed_only_when_sustained():
    spread = tier(5, 5, 5, 5, sessions=[60, 50, 45, 45])  # 200 sessions: the bar is 50 + 4 x 6.1
    assert imbalance_now(spread, {}) is None
    piled = tier(5, 5, 5, 5, sessions=[120, 30, 25, 25])
    assert "holds 120 of 200 sessions" in imbalance_now(piled, {})
    assert imbalance_now(tier(5, 5, sessions=[3, 0]), {}) is None  # 3 sessions: chance does that
    first_seen = run(piled, AdmissionState(), T0, "dry-run")
    assert first_seen.imbalance is None and first_seen.state.imbalance_since == T0
    assert run(piled, first_seen.state, T0 + 1800, "dry-run").imbalance
    assert run(spread, first_seen.state, T0 + 1800, "dry-run").state.imbalance_since is None
    # With admission on, the piled node leaves rotation for new connections: handled, not alarmed.
    handled = run(piled, first_seen.state, T0 + 1800, "on")
    assert [m.action for m in handled.moves] == ["leave"] and handled.imbalance is None


def test_the_sync_applies_only_a_recent_record_written_in_mode_on():
    state = AdmissionState(out={"i-1": OutOfRotation("10.0.0.10", T0, "hot")}, mode="on", decided_at=T0)
    assert set(held_out(state, T0 + 60, 1200)) == {"10.0.0.10"}
    assert held_out(state, T0 + 1201, 1200) == {}  # the admission function stopped: nobody kept out
    assert held_out(AdmissionState(out=state.out, mode="dry-run", decided_at=T0), T0, 1200) == {}


def test_switching_dry_run_to_on_applies_what_the_dry_run_holds_out():
    out = {"i-1": OutOfRotation("10.0.0.10", T0, "hot")}
    assert rotation_changed(AdmissionState(out=out, mode="dry-run"), AdmissionState(out=out, mode="on"))
    assert not rotation_changed(AdmissionState(mode="dry-run"), AdmissionState(mode="on"))


def test_a_record_the_sync_stopped_applying_is_applied_again_when_admission_runs_again():
    out = {"i-1": OutOfRotation("10.0.0.10", T0, "hot")}
    previous = AdmissionState(out=out, mode="on", decided_at=T0)
    assert not rotation_changed(previous, AdmissionState(out=out, mode="on", decided_at=T0 + 300), 1200)
    assert rotation_changed(previous, AdmissionState(out=out, mode="on", decided_at=T0 + 3600), 1200)
    assert rotation_changed(previous, AdmissionState(mode="on", decided_at=T0 + 3600), 1200)
    assert not rotation_changed(AdmissionState(mode="on", decided_at=T0), AdmissionState(mode="on", decided_at=T0 + 3600), 1200)


def test_an_out_node_is_back_before_the_deregistration_delay_ends_hot_or_not():
    from hpops_core.login_sync.admission import max_out_for

    policy = AdmissionPolicy(**(vars(POLICY) | {"max_out_seconds": max_out_for(3600)}))
    assert policy.max_out_seconds == 3000
    out = AdmissionState(out={"i-" + "0" * 17: OutOfRotation("10.0.0.10", T0, "hot")})
    assert run(tier(90, 5, 5, 5), out, T0 + 2999, policy=policy).moves == ()
    (move,) = run(tier(90, 5, 5, 5), out, T0 + 3000, policy=policy).moves
    assert move.action == "return" and "before the target group's deregistration delay ends" in move.reason
    # The target group's default delay (300 s) leaves no time out at all: nobody leaves, and it says why.
    short = AdmissionPolicy(**(vars(POLICY) | {"max_out_seconds": max_out_for(300)}))
    hot = run(tier(90, 5, 5, 5), AdmissionState(hot_since={"i-" + "0" * 17: T0 - 3600}), policy=short)
    assert hot.moves == () and any("too short to help" in r for r in hot.reasons)


def test_the_record_round_trips():
    state = AdmissionState({"i-1": OutOfRotation("10.0.0.10", T0, "hot")}, {"i-2": T0}, T0, "on", T0 + 5)
    assert AdmissionState.from_json(state.to_json()) == state


@pytest.mark.parametrize("registered", [{"10.0.0.10": "healthy", "10.0.0.11": "unhealthy"}])
def test_node_loads_reads_the_stored_reports_and_the_target_health(registered):
    reports = {
        "i-a": {"ip": "10.0.0.10", "role": "login", "receivedAt": "2027-01-15T07:59:00.000Z",
                "load": {"cpuSome60": 40.0, "memorySome60": 55.5, "memoryFull60": 1.0},
                "sessions": {"list": [{"user": "alice"}, {"user": "bob"}]}},
        "i-b": {"ip": "10.0.0.11", "role": "login", "receivedAt": "2027-01-15T06:36:40.000Z", "load": {}, "sessions": {"list": []}},
        "i-c": {"ip": "10.0.0.12", "role": "login", "receivedAt": "2027-01-15T08:00:00.000Z", "load": {}},  # neither registered nor out
    }
    a, b = node_loads(reports, registered, AdmissionState(), T0, 1230)
    assert (a.instance_id, a.fresh, a.pressure, a.sessions, a.healthy) == ("i-a", True, 55.5, 2, True)
    assert (b.instance_id, b.fresh, b.pressure, b.sessions, b.healthy) == ("i-b", False, None, None, False)
    unreadable = reports | {"i-a": reports["i-a"] | {"receivedAt": None}}
    assert not node_loads(unreadable, registered, AdmissionState(), T0, 1230)[0].fresh  # never judged on it
