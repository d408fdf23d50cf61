"""Budget holds in the twin, end to end: the demo's month with UserBudgetAction=hold.

alice's limit is below what she spent by the sweeps and bob is over the default but exempt, so the
real BudgetGuard sweep holds alice only: the holds parameter names her, she and the platform team
get one "held" alert, and the controller's real agent sets her association limits to 0 and
reports it. A hold removed by hand comes back at the next poll; a login node's forged report and
a replayed old one change nothing; when Slurm stops enforcing limits the agent says so and one
"could not apply" alert follows; the operator's release (as `hpops cost release` records it)
lifts her at the next sweep with one "released" alert, and `hpops cost` shows who and why.
"""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace

import pytest

from hpops.main import release_user
from hpops_core.budget_guard import hold_state
from hpops_twin import user_spend_demo as chapter
from hpops_twin.holds_twin import FREE, HELD, OPERATOR, attach, holds_world, published_holds, run_holds
from hpops_twin.user_spend_twin import execution_clock



def hold_messages(messages: list[dict]) -> list[tuple[str, str]]:
    return [(m["MessageAttributes"]["user"]["Value"], m["Subject"]) for m in messages
            if m["MessageAttributes"]["kind"]["Value"] == "user-hold"]


@pytest.fixture(scope="module")
def twin():
    with holds_world() as world:
        month = chapter.prepare(world)
        slurm = attach(month.controller, chapter.USERS)
        yield SimpleNamespace(world=world, month=month, spend=month.spend, slurm=slurm,
                              table=world.resolver.physical_ids["SyncStateTable"])


def platform(twin) -> list[dict]:
    """What the AlertTopic (the platform team's) received."""
    return [m for m in twin.world.budget.sns_messages() if m.get("MessageAttributes")]


def published(twin) -> dict:
    return published_holds(twin.world)


def sweep(twin, when: dt.datetime):
    [result] = twin.world.budget.run([twin.month.start_sweep(when)])
    assert result.status == "SUCCEEDED", result
    return result.output["userSpend"]["holds"]


def test_a_user_over_the_limit_is_held_released_by_the_operator_and_every_step_shows(twin):
    first, second = chapter.SWEEPS
    holds = sweep(twin, first)
    decisions = {d["user"]: d for d in holds["decisions"]}
    assert decisions["alice"]["hold"] and "at or over the limit" in decisions["alice"]["reason"]
    assert not decisions["bob"]["hold"] and "exempt" in decisions["bob"]["reason"]
    assert not decisions["carol"]["hold"] and "under the limit" in decisions["carol"]["reason"]
    assert published(twin)["users"] == ["alice"] and holds["held"] == ["alice"]
    assert hold_messages(twin.spend.user_inbox("alice")) == [("alice", f"[hpops] {twin.world.cluster_name}: alice held")]
    assert hold_messages(twin.spend.user_inbox("bob")) == []
    assert hold_messages(platform(twin)) == [("alice", f"[hpops] {twin.world.cluster_name}: alice held")]

    # The controller's agent polls: alice's associations are held, nobody else's; the report is kept.
    report = run_holds(twin.month.controller, first + dt.timedelta(minutes=1))
    assert twin.slurm.limits("alice") == HELD
    assert twin.slurm.limits("bob") == twin.slurm.limits("carol") == FREE
    assert report["enforced"] is True and report["users"][0]["state"] == "held"
    stored = hold_state.read_agent_report(twin.table, twin.world.cluster_name, twin.world.aws.client("dynamodb"))
    assert stored["version"] == published(twin)["version"] and stored["users"][0]["user"] == "alice"

    # Removed by hand while she is still over: set again at the next poll.
    twin.slurm.associations["alice"].update(qos=None, defaultQos=None)
    run_holds(twin.month.controller, first + dt.timedelta(minutes=2))
    assert twin.slurm.limits("alice") == HELD

    # A login node's forged report is refused and a replayed older one is not kept: nothing changes.
    login = twin.world.sim.nodes(twin.world.cluster_name, twin.world.login_group)[0]
    impostor = twin.spend.controller(twin.month.jobs, chapter.PARTITIONS, instance_id=login.instance_id)
    impostor_slurm = attach(impostor, chapter.USERS)
    run_holds(impostor, first + dt.timedelta(minutes=3))
    # It never gets the holds list (NodeChannel serves it to the controller's enrolled agent only), so it
    # holds no one and has nothing to report.
    assert impostor_slurm.limits("alice") != twin.slurm.limits("alice")
    old = dict(stored, reportedAt="2026-11-01T00:00:00Z", users=[])
    old.pop("receivedAt")
    assert hold_state.store_agent_report(twin.table, old, "2026-11-20T12:04:00Z") is False
    assert hold_state.read_agent_report(twin.table, twin.world.cluster_name)["users"] == stored["users"]
    assert published(twin)["users"] == ["alice"]

    # Slurm stops enforcing limits (AccountingStorageEnforce without limits): the agent says so, and
    # the next sweep sends one "could not apply"; a sweep after that, none more.
    twin.slurm.enforce = "associations"
    report = run_holds(twin.month.controller, first + dt.timedelta(minutes=4))
    assert report["enforced"] is False and report["users"][0]["state"] == "failed"
    assert "cannot apply" in report["users"][0]["reason"]
    holds = sweep(twin, second)
    assert holds["failed"] == ["alice"] and holds["held"] == []
    sweep(twin, second + dt.timedelta(minutes=10))
    twin.slurm.enforce = "associations,limits,qos"
    run_holds(twin.month.controller, second + dt.timedelta(minutes=11))

    # The operator releases her; the next sweep lifts the hold, the agent restores her limits.
    release_user(twin.world.aws.client("dynamodb"), twin.table, twin.world.cluster_name, "alice",
                 "grant renewed, department pays the overrun", OPERATOR, second + dt.timedelta(minutes=30))
    second += dt.timedelta(hours=1)
    holds = sweep(twin, second)
    assert published(twin)["users"] == [] and holds["held"] == []
    assert "released for the rest of 2026-11 by " + OPERATOR in {d["user"]: d for d in holds["decisions"]}["alice"]["reason"]
    subjects = [f"[hpops] {twin.world.cluster_name}: alice {what}" for what in ("held", "could not apply", "released")]
    assert [s for _, s in hold_messages(twin.spend.user_inbox("alice"))] == subjects
    assert [s for _, s in hold_messages(platform(twin))] == subjects
    run_holds(twin.month.controller, second + dt.timedelta(minutes=1))
    assert twin.slurm.limits("alice") == FREE
    assert not twin.month.controller.agent.slurm_holds().state["users"]

    with execution_clock(second):
        document = twin.spend.cost_document(second + dt.timedelta(minutes=5))
    assert document["holds"]["held"] == [] and document["holds"]["releases"][0]["by"] == OPERATOR
    assert document["holds"]["agent"]["enforced"] is True

