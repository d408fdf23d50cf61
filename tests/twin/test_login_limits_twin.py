"""Per-user limits pushed to the login nodes as pam_limits `maxlogins` (issue 4), in the twin.

The SessionSweep schedule from template.yaml starts the real ASL; after enforcement its
PushLoginLimits step sends the stack's LoginLimitsDocument with SSM Run Command, and the twin runs
the script *extracted from that document* against each simulated node's root directory
(tests/hpops_twin/node_hosts.py). Assertions are about the file each node ends up with.
"""

from __future__ import annotations

import pytest

from hpops_twin.template_model import TemplateModel
from hpops_twin.world import TwinWorld

LIMITS_DOCUMENT = "LoginLimitsDocument"


@pytest.fixture
def make_world():
    opened: list[TwinWorld] = []

    def make(**parameters: str) -> TwinWorld:
        template = TemplateModel()
        for name, value in parameters.items():
            template.raw["Parameters"][name]["Default"] = value
        world = TwinWorld(template=template)
        world.__enter__()
        opened.append(world)
        return world

    yield make
    for world in opened:
        world.__exit__(None, None, None)


def sweep(world: TwinWorld) -> dict:
    result = world.wait([world.sessions.sweep()], timeout=120)[0]
    assert result.status == "SUCCEEDED", (result.error, result.cause)
    return result.output["loginLimits"]["report"]


def running_login_nodes(world: TwinWorld) -> list[str]:
    return sorted(n.instance_id for n in world.sim.nodes(world.cluster_name, world.login_group) if n.status == "Running")


def limits_runs(world: TwinWorld) -> list[dict]:
    document = world.resolver.physical_ids[LIMITS_DOCUMENT]
    return [r for r in world.hosts.runs if r["DocumentName"] == document]


def maxlogins(world: TwinWorld, instance_id: str) -> dict[str, int]:
    path = world.hosts.limits_file(instance_id)
    assert path.exists(), f"{instance_id} has no limits file"
    assert path.stat().st_mode & 0o777 == 0o644
    lines = [line.split() for line in path.read_text().splitlines() if line and not line.startswith("#")]
    assert all(parts[1:3] == ["hard", "maxlogins"] for parts in lines)
    return {parts[0]: int(parts[3]) for parts in lines}


def test_sweep_pushes_default_overrides_and_exempt_users_to_every_running_login_node(make_world):
    world = make_world(MaxSessionsPerUser="3", SessionLimitOverrides='{"alice": 5, "intern": 0}', SessionExemptUsers="ops")
    nodes = running_login_nodes(world)
    assert len(nodes) == 3
    assert not any(world.hosts.limits_file(n).exists() for n in nodes)

    report = sweep(world)
    assert report["pushedCount"] == 3 and report["failedCount"] == 0
    for node in nodes:
        assert maxlogins(world, node) == {"*": 3, "alice": 5, "intern": 0, "ops": 65535}
    workers = [n.instance_id for n in world.sim.nodes(world.cluster_name, world.worker_group)]
    assert not any(r["InstanceId"] in workers for r in limits_runs(world)), "only login nodes get the limits"


def test_unchanged_nodes_are_not_pushed_again(world):
    sweep(world)
    sent = len(limits_runs(world))
    assert sent == 3
    world.counter.reset()
    report = sweep(world)
    assert report["pushedCount"] == 0 and report["unchangedCount"] == 3
    assert len(limits_runs(world)) == sent
    assert world.counter.calls_of({"PushLoginLimitsFunction"})["ssm.SendCommand"] == 0


def test_a_replaced_node_gets_the_limits_on_the_next_sweep(world):
    sweep(world)
    victim = running_login_nodes(world)[0]
    world.wait(world.publish(world.sim.replace_node(world.cluster_name, victim)), timeout=120)
    world.wait(world.publish(world.sim.finish_provisioning(world.cluster_name)), timeout=120)
    new = sorted(set(running_login_nodes(world)) - {victim})
    replacement = [n for n in new if not world.hosts.limits_file(n).exists()]
    assert len(replacement) == 1

    report = sweep(world)
    assert report["pushed"] == replacement and report["unchangedCount"] == 2
    assert report["forgottenCount"] == 1, "the replaced node's record is dropped"
    assert maxlogins(world, replacement[0]) == {"*": 2}


def test_an_unreachable_node_is_counted_and_retried_on_the_next_sweep(world):
    nodes = running_login_nodes(world)
    world.hosts.unreachable.add(nodes[1])
    report = sweep(world)
    assert report["failedCount"] == 1 and report["failed"][0]["instanceId"] == nodes[1]
    assert not world.hosts.limits_file(nodes[1]).exists()

    world.hosts.unreachable.discard(nodes[1])
    report = sweep(world)
    assert report["pushed"] == [nodes[1]] and report["failedCount"] == 0
    assert maxlogins(world, nodes[1]) == {"*": 2}


def test_changed_limits_are_pushed_again(world):
    sweep(world)
    # A stack update changing MaxSessionsPerUser changes the function's environment.
    binding = world.dispatcher.bindings[world.resolver.physical_ids["PushLoginLimitsFunction"]]
    binding.environment["MAX_SESSIONS_PER_USER"] = "4"
    report = sweep(world)
    assert report["pushedCount"] == 3
    assert all(maxlogins(world, n) == {"*": 4} for n in running_login_nodes(world))


def test_start_session_events_never_push(world):
    started = world.sessions.start_session("alice")
    result = world.wait(world.publish([started.event]), timeout=120)[0]
    assert result.status == "SUCCEEDED"
    assert "loginLimits" not in result.output
    assert limits_runs(world) == []


def test_dry_run_deployment_changes_no_node(make_world):
    world = make_world(SessionLimitsDryRun="true")
    result = world.wait([world.sessions.sweep()], timeout=120)[0]
    assert result.status == "SUCCEEDED"
    assert "dry run" in result.output["loginLimits"]["report"]["skipped"]
    assert limits_runs(world) == []
