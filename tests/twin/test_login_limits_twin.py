"""Per-user limits on the login nodes as pam_limits `maxlogins`, through the node channel, in the twin.

The SessionSweep schedule from template.yaml starts the real ASL; after enforcement its
PublishLoginLimits step publishes the limits, every simulated login node's real agent applies
them when it polls (world.agents_poll(): 30 s on a cluster) and reports, and the next sweep reads
the reports back. Assertions are about the file each node ends up with and what the sweep says.
"""

from __future__ import annotations

import json

import pytest

from hpops_twin.template_model import TemplateModel
from hpops_twin.world import ENFORCING, TwinWorld


@pytest.fixture
def make_world():
    opened: list[TwinWorld] = []

    def make(**parameters: str) -> TwinWorld:
        template = TemplateModel()
        for name, value in (ENFORCING | parameters).items():
            template.raw["Parameters"][name]["Default"] = value
        world = TwinWorld(template=template)
        world.__enter__()
        opened.append(world)
        return world

    yield make
    for world in opened:
        world.__exit__(None, None, None)


@pytest.fixture
def world(make_world):
    """The stack with limits enforced (a new stack's are in dry run: test_dry_run_deployment_publishes_nothing)."""
    return make_world()


def sweep(world: TwinWorld) -> dict:
    result = world.wait([world.sessions.sweep()], timeout=120)[0]
    assert result.status == "SUCCEEDED", (result.error, result.cause)
    return result.output["loginLimits"]["report"]


def running_login_nodes(world: TwinWorld) -> list[str]:
    return sorted(n.instance_id for n in world.sim.nodes(world.cluster_name, world.login_group) if n.status == "Running")


def published(world: TwinWorld) -> dict:
    name = f"/hpops/{world.cluster_name}/node/login-limits"
    return json.loads(world.aws.client("ssm").get_parameter(Name=name)["Parameter"]["Value"])


def maxlogins(world: TwinWorld, instance_id: str) -> dict[str, int]:
    path = world.hosts.limits_file(instance_id)
    assert path.exists(), f"{instance_id} has no limits file"
    assert path.stat().st_mode & 0o777 == 0o644
    lines = [line.split() for line in path.read_text().splitlines() if line and not line.startswith("#")]
    assert all(parts[1:3] == ["hard", "maxlogins"] for parts in lines)
    return {parts[0]: int(parts[3]) for parts in lines}


def test_sweep_publishes_and_every_running_login_nodes_agent_applies_the_limits(make_world):
    world = make_world(MaxSessionsPerUser="3", SessionLimitOverrides='{"alice": 5, "intern": 0}', SessionExemptUsers="ops")
    nodes = running_login_nodes(world)
    assert len(nodes) == 3

    first = sweep(world)
    assert first["published"] and first["appliedCount"] == 0 and sorted(first["pending"]) == nodes
    assert published(world)["limits"] == {"default": 3, "overrides": {"alice": 5, "intern": 0}, "exempt": ["ops"]}
    assert not any(world.hosts.limits_file(n).exists() for n in nodes), "nothing is pushed to a node"

    world.agents_poll()
    for node in nodes:
        assert maxlogins(world, node) == {"*": 3, "alice": 5, "intern": 0, "ops": 65535}
    second = sweep(world)
    assert not second["published"] and sorted(second["applied"]) == nodes and second["failedCount"] == 0
    workers = [n.instance_id for n in world.sim.nodes(world.cluster_name, world.worker_group)]
    assert not any(world.hosts.limits_file(w).exists() for w in workers), "only login nodes run the agent"


def test_unchanged_limits_cost_a_read_each_and_no_write(world):
    sweep(world)
    world.agents_poll()
    world.counter.reset()
    world.hosts.agent_calls.clear()
    report = sweep(world)
    assert report["appliedCount"] == 3
    calls = world.counter.calls_of({"PublishLoginLimitsFunction"})
    # One read for the limits, one for the per-user caps (off here: nothing to delete either).
    assert calls["ssm.GetParameter"] == 2 and calls["ssm.PutParameter"] == 0
    world.agents_poll()
    assert world.hosts.agent_calls["eventbridge.PutEvents"] == 0, "the agents had nothing new to report"


def test_a_replaced_node_applies_the_limits_when_it_is_provisioned(world):
    sweep(world)
    world.agents_poll()
    victim = running_login_nodes(world)[0]
    world.wait(world.publish(world.sim.replace_node(world.cluster_name, victim)), timeout=120)
    world.wait(world.publish(world.sim.finish_provisioning(world.cluster_name)), timeout=120)
    (replacement,) = [n for n in running_login_nodes(world) if world.hosts.polls[n] == 1]  # only its on_create run
    # on_create ran the agent once: the limits are in place before any sweep
    assert maxlogins(world, replacement) == {"*": 2}
    report = sweep(world)
    assert report["appliedCount"] == 3 and replacement in report["applied"] and victim not in report["applied"]


def test_a_node_whose_agent_cannot_write_the_file_is_counted_with_its_reason(world):
    nodes = running_login_nodes(world)
    sweep(world)
    broken = world.hosts.root(nodes[1]) / "etc" / "security"
    broken.mkdir(parents=True, exist_ok=True)
    (broken / "limits.d").write_text("not a directory")  # the node cannot hold the file
    world.agents_poll()
    report = sweep(world)
    assert report["failedCount"] == 1 and report["failed"][0]["instanceId"] == nodes[1]
    assert "cannot write limits" in report["failed"][0]["reason"]
    logs = "".join(i.logs for i in world.dispatcher.invocations if i.function.endswith("PublishLoginLimitsFunction"))
    assert '"LoginLimitsPushFailed":[1.0]' in logs.replace(" ", "") or '"LoginLimitsPushFailed":1.0' in logs.replace(" ", "")

    (broken / "limits.d").unlink()
    world.agents_poll()
    report = sweep(world)
    assert report["failedCount"] == 0 and maxlogins(world, nodes[1]) == {"*": 2}


def test_changed_limits_are_published_again_and_applied(world):
    sweep(world)
    world.agents_poll()
    # A stack update changing MaxSessionsPerUser changes the function's environment.
    binding = world.dispatcher.bindings[world.resolver.physical_ids["PublishLoginLimitsFunction"]]
    binding.environment["MAX_SESSIONS_PER_USER"] = "4"
    report = sweep(world)
    assert report["published"] and report["appliedCount"] == 0 and len(report["pending"]) == 3
    world.agents_poll()
    assert all(maxlogins(world, n) == {"*": 4} for n in running_login_nodes(world))


def test_start_session_events_never_publish(world):
    started = world.sessions.start_session("alice")
    result = world.wait(world.publish([started.event]), timeout=120)[0]
    assert result.status == "SUCCEEDED"
    assert "loginLimits" not in result.output
    assert "ssm.PutParameter" not in world.counter.calls


def test_dry_run_deployment_publishes_nothing(make_world):
    world = make_world(SessionLimitsDryRun="true")
    result = world.wait([world.sessions.sweep()], timeout=120)[0]
    assert result.status == "SUCCEEDED"
    assert "dry run" in result.output["loginLimits"]["report"]["skipped"]
    assert "ssm.PutParameter" not in world.counter.calls
