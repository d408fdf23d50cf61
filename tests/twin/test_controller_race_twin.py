"""The controller race, lost and then mended, in a twin of its own (holds on): a module of its own
because two twins cannot be open at once in a process, and test_user_spend_twin.py keeps its month's
twin open for its whole module."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from test_user_spend_twin import expected_dollars

from hpops_twin import user_spend_demo as chapter
from hpops_twin.user_spend_demo import MONTH, PARTITIONS, SWEEPS


def test_an_impostor_that_held_the_controllers_enrollment_past_its_window_leaves_no_dollar_after_approval():
    """The controller race, lost: a new controller comes up four days before the sweep; a user's copy
    of the agent on another node enrolls its id first and, uncontested past the window (the real agent
    came late), sends those days with alice's GPU jobs under carol's name: carol is held, alice charged
    nothing. The operator approves the real agent's key (read as root on the controller): the
    impostor's windows are voided at once, the real agent re-collects the same hours from Slurm
    accounting, and the next sweep charges each user the truth in dollars, holds nobody wrongly, and
    counts the real agent's windows: no hour dropped."""
    from dataclasses import replace

    from hpops.enrollments import ReplacedKeyUsageRequired, approve
    from hpops_core.budget_guard import usage_store
    from hpops_twin.holds_twin import HOLD_PARAMETERS, holds_world
    from hpops_twin.user_spend_twin import CONTROLLER_GROUP

    came_up = SWEEPS[0] - dt.timedelta(days=4)  # the controller's accounting starts here
    with holds_world() as world:
        played = chapter.prepare(world)
        start = int(came_up.timestamp())
        played.jobs[:] = [replace(job, start=max(job.start, start)) for job in played.jobs if job.end > start]
        real, table, dynamodb = played.controller, world.resolver.physical_ids["SyncStateTable"], world.aws.client("dynamodb")
        real.sacct.jobs = list(played.jobs)
        controller_id = real.instance_id
        swapped = [replace(job, user="carol") if job.user == "alice" else job for job in played.jobs]
        impostor = played.spend.controller(swapped, PARTITIONS)  # same instance id, its own key, no IMDS
        impostor.agent.proof.identity_document = lambda: None
        first_run = came_up + dt.timedelta(minutes=15)
        impostor.run_agent(first_run)
        [record] = [r for r in enrollments_of(world) if r.instance_id == controller_id]
        assert (record.fingerprint, record.via) == (impostor.agent.proof.fingerprint(), "window")
        # Its window ends with no other key presented: the impostor's enrollment is proven.
        dynamodb.update_item(TableName=table, Key={"pk": {"S": f"enroll#{world.cluster_name}"},
                                                   "sk": {"S": f"node#{controller_id}"}},
                             UpdateExpression="SET windowEndsAt = :past",
                             ExpressionAttributeValues={":past": {"S": "2026-01-01T00:00:00Z"}})
        when = first_run
        while when < SWEEPS[0] - chapter.AGENT_BEFORE_SWEEP:
            impostor.run_agent(when)
            when += chapter.AGENT_EVERY
        impostor.run_agent(SWEEPS[0] - chapter.AGENT_BEFORE_SWEEP)
        raced = sweep(world, SWEEPS[0])
        assert raced["carol"] and "alice" not in raced, "the race as it stood: carol held, alice charged nothing"

        # The real agent comes: refused (a proven key stands), then approved by the operator.
        real.run_agent(SWEEPS[0])
        assert not real.agent.proof.enrolled
        # Enrolled by its window alone: the approval needs the operator's word on its windows, and the
        # operator, who found a key that is not the node's, discards them.
        with pytest.raises(ReplacedKeyUsageRequired):
            approve(dynamodb, world.aws.client("sagemaker"), table, world.cluster_name, world.login_group,
                    CONTROLLER_GROUP, controller_id, real.agent.proof.fingerprint())
        approve(dynamodb, world.aws.client("sagemaker"), table, world.cluster_name, world.login_group,
                CONTROLLER_GROUP, controller_id, real.agent.proof.fingerprint(), "discard")
        node = next(n for n in world.sim.nodes(world.cluster_name, CONTROLLER_GROUP))
        assert real.agent.proof.ensure_enrolled(controller_id, node.ip, force=True)
        # The first window the impostor had kept (its first run's were refused: not proven yet).
        first = first_run.replace(minute=0).strftime("%Y-%m-%dT%H:%M:%SZ")
        assert real.agent.proof.state["recollectFrom"] == first
        assert usage_store.voided_writers(table, world.cluster_name, dynamodb) == {impostor.agent.proof.fingerprint(): first}
        # Voided at once: read before the real agent sent anything, carol owes nothing she did not run.
        interim = played.spend.cost_document(SWEEPS[0] + dt.timedelta(minutes=5))
        assert "carol" not in {u["user"] for u in interim["users"]}

        # The real agent re-collects every voided hour from Slurm accounting (4 days: 96 hours, as many as
        # a run reads beside its due windows): the next runs send only the open window.
        collected_until = SWEEPS[1] - chapter.AGENT_BEFORE_SWEEP
        runs = [real.run_agent(collected_until).windows_sent for _ in range(3)]
        assert runs[0] >= 96 and runs[1:] == [1, 1], runs
        restored = sweep(world, SWEEPS[1])
        truth = expected_dollars(played.jobs, collected_until)
        document = played.spend.cost_document(SWEEPS[1])
        assert {u["user"]: Decimal(u["usd"]) for u in document["users"]} == truth
        limits = {"alice": Decimal(HOLD_PARAMETERS["UserBudgetOverrides"].split("=")[1])}
        over = {u for u, usd in truth.items() if usd >= limits.get(u, Decimal(HOLD_PARAMETERS["UserMonthlyBudgetUsd"]))
                and u != HOLD_PARAMETERS["UserBudgetExemptUsers"]}
        assert {u for u, held in restored.items() if held} == over and not restored.get("carol")
        hours = int((SWEEPS[1] - came_up).total_seconds()) // 3600
        assert played.spend.stored_windows(MONTH) >= hours


def test_a_reimaged_controllers_new_key_approved_keeps_every_dollar_and_every_held_user_held():
    """UpdateClusterSoftware re-images the controller: same instance id, its agent's key gone. The new
    agent is refused (the old key stands, proven), and the operator approves the new key with no flag:
    the old key was proven, the node's own, so its windows stay counted. Right after the approval the
    month's spend is what it was, nothing is voided or re-collected, and the next sweep holds exactly
    whom the last one held (nobody released), every dollar equal to the jobs'."""
    from hpops.enrollments import approve
    from hpops_core.budget_guard import usage_store
    from hpops_twin.holds_twin import holds_world
    from hpops_twin.user_spend_twin import CONTROLLER_GROUP

    with holds_world() as world:
        played = chapter.prepare(world)
        table, dynamodb = world.resolver.physical_ids["SyncStateTable"], world.aws.client("dynamodb")
        controller_id = played.controller.instance_id
        played.deliver_until(SWEEPS[0] - chapter.AGENT_BEFORE_SWEEP)
        before = sweep(world, SWEEPS[0])
        held = {user for user, hold in before.items() if hold}
        assert held, "someone is over their limit before the re-image"
        [record] = [r for r in enrollments_of(world) if r.instance_id == controller_id]
        assert record.via in ("document", "approval")
        dollars = {u["user"]: u["usd"] for u in played.spend.cost_document(SWEEPS[0])["users"]}

        reimaged = played.spend.controller(played.jobs, PARTITIONS)  # same instance, a new disk: a new key
        reimaged.run_agent(SWEEPS[0] + dt.timedelta(minutes=15))
        assert not reimaged.agent.proof.enrolled
        said = approve(dynamodb, world.aws.client("sagemaker"), table, world.cluster_name, world.login_group,
                       CONTROLLER_GROUP, controller_id, reimaged.agent.proof.fingerprint())
        assert f"{record.fingerprint}, stay counted" in said
        node = next(n for n in world.sim.nodes(world.cluster_name, CONTROLLER_GROUP))
        assert reimaged.agent.proof.ensure_enrolled(controller_id, node.ip, force=True)
        assert "recollectFrom" not in reimaged.agent.proof.state
        assert usage_store.voided_writers(table, world.cluster_name, dynamodb) == {}
        assert {u["user"]: u["usd"] for u in played.spend.cost_document(SWEEPS[0])["users"]} == dollars

        collected_until = SWEEPS[1] - chapter.AGENT_BEFORE_SWEEP
        reimaged.run_agent(collected_until)
        after = sweep(world, SWEEPS[1])
        assert {user for user, hold in after.items() if hold} == held
        document = played.spend.cost_document(SWEEPS[1])
        assert {u["user"]: Decimal(u["usd"]) for u in document["users"]} == expected_dollars(played.jobs, collected_until)


def sweep(world, when):
    """One budget sweep at ``when``: user -> held."""
    from hpops_twin.user_spend_twin import execution_clock

    with execution_clock(when):
        [result] = world.budget.run([world.budget.sweep()])
    assert result.status == "SUCCEEDED", result
    return {d["user"]: d["hold"] for d in result.output["userSpend"]["holds"]["decisions"]}


def enrollments_of(world):
    from hpops_core.node_channel import enrollment_store

    records, _ = enrollment_store.list_enrollments(world.resolver.physical_ids["SyncStateTable"], world.cluster_name,
                                                   dynamodb=world.aws.client("dynamodb"))
    return records
