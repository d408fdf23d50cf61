"""The controller race, lost and then mended, in a twin of its own (holds on): a module of its own
because two twins cannot be open at once in a process, and test_user_spend_twin.py keeps its month's
twin open for its whole module."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

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

    from hpops.enrollments import approve
    from hpops_core.budget_guard import usage_store
    from hpops_twin.holds_twin import HOLD_PARAMETERS, holds_world
    from hpops_twin.user_spend_twin import CONTROLLER_GROUP, execution_clock

    def sweep(world, when):
        with execution_clock(when):
            [result] = world.budget.run([world.budget.sweep()])
        assert result.status == "SUCCEEDED", result
        return {d["user"]: d["hold"] for d in result.output["userSpend"]["holds"]["decisions"]}

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
        approve(dynamodb, world.aws.client("sagemaker"), table, world.cluster_name, world.login_group,
                CONTROLLER_GROUP, controller_id, real.agent.proof.fingerprint())
        node = next(n for n in world.sim.nodes(world.cluster_name, CONTROLLER_GROUP))
        assert real.agent.proof.ensure_enrolled(controller_id, node.ip, force=True)
        # The first window the impostor had kept (its first run's were refused: not proven yet).
        first = first_run.replace(minute=0).strftime("%Y-%m-%dT%H:%M:%SZ")
        assert real.agent.proof.state["recollectFrom"] == first
        assert usage_store.voided_writers(table, world.cluster_name, dynamodb) == {impostor.agent.proof.fingerprint(): first}
        # Voided at once: read before the real agent sent anything, carol owes nothing she did not run.
        interim = played.spend.cost_document(SWEEPS[0] + dt.timedelta(minutes=5))
        assert "carol" not in {u["user"] for u in interim["users"]}

        # The real agent re-collects every voided hour from Slurm accounting, 24 windows a run.
        collected_until = SWEEPS[1] - chapter.AGENT_BEFORE_SWEEP
        runs = 1
        while real.run_agent(collected_until).windows_sent > 1:
            runs += 1
        assert runs >= 4
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


def enrollments_of(world):
    from hpops_core.node_channel import enrollment_store

    records, _ = enrollment_store.list_enrollments(world.resolver.physical_ids["SyncStateTable"], world.cluster_name,
                                                   dynamodb=world.aws.client("dynamodb"))
    return records
