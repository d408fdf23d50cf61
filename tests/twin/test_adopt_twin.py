"""`hpops adopt` on a running twin cluster whose nodes never got the agent: each Running login node gets
it through Session Manager, the repair that follows verifies and admits them, and nobody's session ends."""

from __future__ import annotations

import datetime as dt
import warnings

from hpops.main import adopt_stack
from hpops_twin.adopt_twin import TwinSessionRunner
from hpops_twin.doctor_twin import DoctorAccount, _Outputs
from hpops_twin.world import STACK_NAME, TwinWorld


def test_adopt_installs_the_agent_on_running_nodes_which_are_then_admitted_and_no_session_ends():
    with warnings.catch_warnings(), TwinWorld(agents_installed=False) as world:
        warnings.filterwarnings("ignore", message="No application metrics to publish")
        # Before: the cluster runs, users are on it, and no login node can be verified.
        world.wait([world.run_schedule()])
        assert world.target_ips() == [] and world.hosts.agents == {}
        users = [world.sessions.start_session(user).session_id for user in ("alice", "bob")]
        account = DoctorAccount(world)
        runner = TwinSessionRunner(world)
        now = dt.datetime.now(dt.timezone.utc)
        with world.iam.operator(account.operator_policy("administrator")) as denials:
            import boto3

            session = boto3.session.Session(region_name=world.region)
            outcomes = adopt_stack(session, STACK_NAME, _Outputs(world), dict(world.resolver.parameters), runner, now)
            # What `hpops adopt` then does: a repair (the same execution `hpops repair` starts).
            repair = world.wait([world.start_repair()])[0]
            again = adopt_stack(session, STACK_NAME, _Outputs(world), dict(world.resolver.parameters), runner,
                                now + dt.timedelta(minutes=1))

        login = sorted(n.instance_id for n in world.sim.nodes(world.cluster_name, world.login_group))
        assert [(o.adoption.instance_id, o.status) for o in outcomes] == [(i, "adopted") for i in login]
        assert all(o.adoption.target == world.sessions.target(o.adoption.instance_id) for o in outcomes)
        assert repair.status == "SUCCEEDED"
        assert world.target_ips() == world.login_truth() and len(world.target_ips()) == len(login)
        assert all(world.presented_fingerprints(i) == world.canonical_fingerprints() for i in login)
        # Nobody's session ended; adopt's own sessions ended with their command, none by TerminateSession.
        assert [world.sessions.store.status(s) for s in users] == ["Connected", "Connected"]
        assert world.sessions.store.terminated_by_api() == []
        assert [world.sessions.store.status(s) for s in runner.sessions] == ["Terminated"] * len(login)
        # A second run leaves nodes whose agent reports alone.
        assert {o.status for o in again} == {"skipped"} and all("reports" in o.detail for o in again)
        assert denials == [] and world.iam.errors == []
