"""Who is held for spend, and the alerts of each transition (budget_guard.holds); the holds document."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest

from hpops_core.budget_guard import holds
from hpops_core.budget_guard.config import UserSpendConfig
from hpops_core.budget_guard.holds import HoldPolicy, Release, decide_holds, holds_document, transitions
from hpops_core.budget_guard.user_spend import CostLine, SpendReport, UserSpend
from hpops_core.common.errors import ConfigurationError
from hpops_core.node_channel import user_holds

NOW = dt.datetime(2026, 11, 20, 12, 0, tzinfo=dt.timezone.utc)
HOLD = HoldPolicy("hold")
ZERO = CostLine(Decimal(0), "")


def spender(user: str, usd: str, limit: str | None, projected: str | None = None) -> UserSpend:
    return UserSpend(user, Decimal(1), Decimal(0), 1, Decimal(usd), Decimal(0), Decimal(0),
                     Decimal(projected or usd), None if limit is None else Decimal(limit),
                     None if limit is None else "default", ("billed",))


def report(*users: UserSpend) -> SpendReport:
    return SpendReport("lab", "2026-11", "2026-11-20T12:00:00Z", users, ZERO, ZERO, ZERO, (), (), None)


def decided(*users: UserSpend, policy: HoldPolicy = HOLD, releases=None) -> dict[str, holds.HoldDecision]:
    return {d.user: d for d in decide_holds(report(*users), policy, releases or {}, NOW)}


def test_actual_spend_at_or_over_the_limit_holds_and_a_projection_only_warns():
    d = decided(spender("alice", "500.00", "500"), spender("bob", "499.99", "500", projected="900"),
                spender("carol", "10", None))
    assert d["alice"].hold and "spent $500.00 of their $500.00 limit" in d["alice"].reason
    assert not d["bob"].hold and "a projected crossing only warns" in d["bob"].reason
    assert "carol" not in d  # no limit: nothing to decide


def test_exempt_users_and_root_are_never_held_and_alert_mode_holds_no_one():
    policy = HoldPolicy("hold", exempt=frozenset({"ops"}))
    d = decided(spender("ops", "900", "100"), spender("root", "900", "100"), policy=policy)
    assert not d["ops"].hold and not d["root"].hold and "exempt" in d["root"].reason
    d = decided(spender("alice", "900", "100"), policy=HoldPolicy("alert"))
    assert not d["alice"].hold and "UserBudgetAction is alert" in d["alice"].reason


def test_a_release_lasts_the_month_and_names_who_and_why():
    release = Release("alice", "2026-11", "arn:aws:iam::1:user/ops", "grant renewed", "2026-11-20T11:00:00Z")
    d = decided(spender("alice", "900", "100"), releases={"alice": release})
    assert not d["alice"].hold
    assert "released for the rest of 2026-11 by arn:aws:iam::1:user/ops" in d["alice"].reason
    assert "grant renewed" in d["alice"].reason


def test_the_document_expires_at_the_months_turn_and_a_dry_run_holds_no_one():
    decisions = decide_holds(report(spender("alice", "900", "100")), HOLD, {}, NOW)
    document = holds_document(decisions, HOLD, NOW)
    assert document["users"] == ["alice"] and document["expiresAt"] == "2026-12-01T00:00:00Z"
    assert user_holds.parse_document(user_holds.canonical_json(document)) == document
    dry = holds_document(decisions, HoldPolicy("hold", dry_run=True), NOW)
    assert dry["users"] == [] and dry["dryRun"] is True and dry["version"] != document["version"]


def test_a_document_changed_by_anyone_but_the_stack_is_refused():
    document = user_holds.desired_document("2026-11", "2026-12-01T00:00:00Z", False, ["alice"])
    for forged in (dict(document, users=["bob"]), dict(document, users=["root"]), dict(document, extra=1),
                   dict(document, dryRun=True)):
        with pytest.raises(user_holds.BadHolds):
            user_holds.parse_document(user_holds.canonical_json(forged))
    with pytest.raises(ValueError):
        user_holds.desired_document("2026-11", "2026-12-01T00:00:00Z", False, ["root"])


def alerts_of(previous, users, agent=None, policy=HOLD, now=NOW):
    decisions = decide_holds(report(*users), policy, {}, now)
    return transitions(previous, decisions, policy, agent, now, "lab", "stack")


def test_each_transition_alerts_once():
    state, alerts = alerts_of({}, [spender("alice", "900", "100")])
    assert [(a["user"], a["transition"]) for a in alerts] == [("alice", "held")]
    assert "QOSGrpJobsLimit" in alerts[0]["text"] and "month turns (2026-12-01 00:00 UTC)" in alerts[0]["text"]
    assert "hpops cost release --stack-name stack" in alerts[0]["text"]
    again, none = alerts_of(state, [spender("alice", "950", "100")])
    assert none == [] and again["alice"]["since"] == state["alice"]["since"]
    failed, alerts = alerts_of(state, [spender("alice", "950", "100")], agent={"alice": ("failed", "no limits")})
    assert [a["transition"] for a in alerts] == ["could not apply"] and failed["alice"]["state"] == "failed"
    _, alerts = alerts_of(failed, [spender("alice", "950", "100")], agent={"alice": ("failed", "no limits")})
    assert alerts == []
    _, alerts = alerts_of(failed, [spender("alice", "950", "100")], agent={"alice": ("held", "ok")})
    assert [a["transition"] for a in alerts] == ["held"]
    kept, alerts = alerts_of(failed, [spender("alice", "950", "100")], agent=None)  # no report of this version yet
    assert alerts == [] and kept["alice"]["state"] == "failed"


def test_a_release_says_why_the_hold_ended():
    state, _ = alerts_of({}, [spender("alice", "900", "100")])
    _, alerts = alerts_of(state, [spender("alice", "900", "1000")])  # an override raised her limit
    assert alerts[0]["transition"] == "released" and "under the limit" in alerts[0]["text"]
    _, alerts = alerts_of(state, [], now=dt.datetime(2026, 12, 1, 0, 5, tzinfo=dt.timezone.utc))
    assert "the month turned (2026-12 started)" in alerts[0]["text"]
    _, alerts = alerts_of(state, [spender("alice", "900", "100")], policy=HoldPolicy("hold", dry_run=True))
    assert "UserBudgetHoldDryRun is true" in alerts[0]["text"]


def test_a_dry_run_decides_but_sends_no_hold_alert():
    state, alerts = alerts_of({}, [spender("alice", "900", "100")], policy=HoldPolicy("hold", dry_run=True))
    assert state == {} and alerts == []


def test_the_hold_policy_is_read_from_the_environment():
    env = {"CLUSTER_NAME": "lab", "STATE_TABLE_NAME": "t", "PROJECTION_THRESHOLDS_PERCENT": "80",
           "USER_THRESHOLDS_PERCENT": "80,100", "AWS_REGION": "us-east-1"}
    assert UserSpendConfig.from_env(env).hold_policy == HoldPolicy("alert")
    config = UserSpendConfig.from_env(env | {"USER_BUDGET_ACTION": "hold", "USER_BUDGET_HOLD_DRY_RUN": "true",
                                             "USER_BUDGET_EXEMPT_USERS": "ops,svc-ci"})
    assert config.hold_policy == HoldPolicy("hold", True, frozenset({"ops", "svc-ci"}))
    for bad in ({"USER_BUDGET_ACTION": "kill"}, {"USER_BUDGET_EXEMPT_USERS": "-rf"}):
        with pytest.raises(ConfigurationError):
            UserSpendConfig.from_env(env | bad)


def test_hpops_cost_and_status_say_who_is_held_and_when_holds_cannot_apply():
    from hpops.output import hold_lines

    view = {"action": "hold", "dryRun": False, "decidedAt": "2026-11-20T12:00:00Z", "wouldHold": ["alice", "dave"],
            "held": [{"user": "alice", "state": "held", "since": "2026-11-20T12:00:00Z", "reason": "spent $900",
                      "agent": "failed", "agentReason": "not enforced"}],
            "releases": [{"user": "bob", "by": "arn:aws:iam::1:user/ops", "reason": "grant", "at": "2026-11-19T10:00:00Z"}],
            "agent": {"enforced": False, "enforceReason": "AccountingStorageEnforce = associations: ..."},
            "ends": "it ends when the month turns"}
    text = "\n".join(hold_lines(view))
    assert "held alice since 2026-11-20T12:00:00Z: spent $900; controller: failed (not enforced)" in text
    assert "next sweep holds: dave" in text and "released bob at 2026-11-19T10:00:00Z by arn:aws:iam::1:user/ops" in text
    assert "HOLDS CANNOT APPLY: AccountingStorageEnforce = associations" in text
    assert hold_lines(dict(view, action="alert", held=[], releases=[])) == []
