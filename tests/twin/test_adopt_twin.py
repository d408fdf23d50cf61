"""`hpops adopt` on a twin cluster launched 30 days ago whose nodes never got the agent: each Running login
node gets it through Session Manager, its key (read there as root) is approved by adopt itself, it enrolls,
the repair admits it, and nobody's session ends. Adopt says when a node is left, and what to run."""

from __future__ import annotations

import datetime as dt
import warnings

import boto3

from hpops.adopt import admission_lines
from hpops.main import adopt_admissions, adopt_stack
from hpops_twin.adopt_twin import TwinSessionRunner
from hpops_twin.doctor_twin import DoctorAccount, _Outputs
from hpops_twin.world import STACK_NAME, TwinWorld


def test_adopt_on_a_cluster_launched_30_days_ago_admits_every_login_node_with_no_further_step():
    with warnings.catch_warnings(), TwinWorld(agents_installed=False) as world:
        warnings.filterwarnings("ignore", message="No application metrics to publish")
        # Before: the cluster has run for 30 days, users are on it, and no login node can be verified.
        for node in world.sim.nodes(world.cluster_name):
            node.launch_time -= dt.timedelta(days=30)
        world.wait([world.run_schedule()])
        assert world.target_ips() == [] and world.hosts.agents == {}
        users = [world.sessions.start_session(user).session_id for user in ("alice", "bob")]
        account = DoctorAccount(world)
        runner = TwinSessionRunner(world)
        now = dt.datetime.now(dt.timezone.utc)
        login = sorted(n.instance_id for n in world.sim.nodes(world.cluster_name, world.login_group))
        with world.iam.operator(account.operator_policy("administrator")) as denials:
            session = boto3.session.Session(region_name=world.region)
            outputs, parameters = _Outputs(world), dict(world.resolver.parameters)
            # One node's session fails (its user may not sudo, say): adopt says so and what to run.
            broken = TwinSessionRunner(world)
            first = adopt_stack(session, STACK_NAME, outputs, parameters,
                                lambda target, command: (1, "sudo: a password is required")
                                if target.endswith(login[0]) else broken(target, command), now)
            # What `hpops adopt` then does: a repair (the same execution `hpops repair` starts), then the check.
            repair = world.wait([world.start_repair()])[0]
            left = adopt_admissions(session, STACK_NAME, outputs, parameters, first, repair.status == "SUCCEEDED")
            # Adopt again, every session working: everything is admitted, no approval or repair by hand.
            outcomes = adopt_stack(session, STACK_NAME, outputs, parameters, runner, now + dt.timedelta(minutes=1))
            repair = world.wait([world.start_repair()])[0]
            admitted = adopt_admissions(session, STACK_NAME, outputs, parameters, outcomes, repair.status == "SUCCEEDED")
            again = adopt_stack(session, STACK_NAME, outputs, parameters, runner, now + dt.timedelta(minutes=2))

        assert [(a.instance_id, a.admitted) for a in left] == [(i, i != login[0]) for i in login]
        lines = admission_lines(left)
        assert lines[0] == "2 of 3 node(s) admitted"
        assert login[0] in lines[1] and "sudo: a password is required" in lines[1] and "hpops adopt" in lines[1]

        assert [(o.adoption.instance_id, o.status) for o in outcomes] == [
            (i, "adopted" if i == login[0] else "skipped") for i in login]
        enrolled = [o for o in first + outcomes if o.status == "adopted"]
        assert all("enrolled" in o.detail and "approval" in o.detail for o in enrolled), [o.detail for o in enrolled]
        assert repair.status == "SUCCEEDED" and all(a.admitted for a in admitted)
        assert admission_lines(admitted) == ["3 of 3 node(s) admitted"]
        assert world.target_ips() == world.login_truth() and len(world.target_ips()) == len(login)
        assert all(world.presented_fingerprints(i) == world.canonical_fingerprints() for i in login)
        # Each approval was adopt's own, of the key read as root on that node, and used once.
        from hpops_core.node_channel import enrollment_store

        records, approvals = enrollment_store.list_enrollments(world.resolver.physical_ids["SyncStateTable"],
                                                              world.cluster_name, dynamodb=world.aws.client("dynamodb"))
        assert approvals == [] and {(r.instance_id, r.via, r.fingerprint) for r in records} == {
            (i, "approval", world.hosts.agents[i].proof.fingerprint()) for i in login}
        # Nobody's session ended; adopt's own sessions ended with their command, none by TerminateSession.
        assert [world.sessions.store.status(s) for s in users] == ["Connected", "Connected"]
        assert world.sessions.store.terminated_by_api() == []
        assert {world.sessions.store.status(s) for s in runner.sessions + broken.sessions} == {"Terminated"}
        # A run after that leaves nodes whose agent reports alone.
        assert {o.status for o in again} == {"skipped"} and all("reports" in o.detail for o in again)
        assert denials == [] and world.iam.errors == []
