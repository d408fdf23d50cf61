"""Per-user CPU, memory and task caps from the stack parameter to every login node, in the twin.

`UserCaps` (template.yaml) -> the SessionSweep's PublishLoginLimits step publishes
/hpops/<cluster>/node/user-caps -> each login node's real agent writes the systemd user-slice
drop-ins under its root, checks them with the real `systemd-analyze verify`, and reports;
deleting the parameter (caps off) makes every agent remove what it wrote.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from hpops_twin.template_model import TemplateModel
from hpops_twin.world import ENFORCING, TwinWorld

CAPS = {"default": {"cpuQuota": "200%", "memoryMax": "8G", "tasksMax": 512},
        "overrides": {"nobody": {"memoryMax": "16G"}}, "exempt": []}


@pytest.fixture
def world():
    if not os.access(shutil.which("systemd-analyze") or "/usr/bin/systemd-analyze", os.X_OK):
        if os.environ.get("CI") == "true":
            pytest.fail("systemd-analyze needed (apt-get install -y systemd)", pytrace=False)
        pytest.skip("systemd-analyze needed (apt-get install -y systemd)")
    template = TemplateModel()
    template.raw["Parameters"]["UserCaps"]["Default"] = json.dumps(CAPS)
    with TwinWorld(template=template, parameters=ENFORCING) as twin:
        yield twin


def login_nodes(world: TwinWorld) -> list[str]:
    return sorted(n.instance_id for n in world.sim.nodes(world.cluster_name, world.login_group) if n.status == "Running")


def dropins(world: TwinWorld, instance_id: str) -> dict[str, list[str]]:
    root = world.hosts.root(instance_id)
    return {str(p.relative_to(root / "etc/systemd/system")): [line for line in p.read_text().splitlines()
                                                               if line and not line.startswith("#")]
            for p in sorted((root / "etc/systemd/system").glob("user-*.slice.d/90-hpops-caps.conf"))}


def node_report(world: TwinWorld, instance_id: str) -> dict:
    item = world.aws.client("dynamodb").get_item(
        TableName=world.output("SyncStateTableName"),
        Key={"pk": {"S": f"node-report#{world.cluster_name}"}, "sk": {"S": f"node-report#{instance_id}"}})["Item"]
    return json.loads(item["report"]["S"])


def test_caps_reach_every_login_node_and_are_removed_when_turned_off(world):
    result = world.wait([world.sessions.sweep()], timeout=120)[0]
    assert result.status == "SUCCEEDED", (result.error, result.cause)
    assert result.output["loginLimits"]["report"]["userCaps"] == "published"

    world.agents_poll()

    for instance_id in login_nodes(world):
        assert dropins(world, instance_id) == {
            "user-.slice.d/90-hpops-caps.conf": ["[Slice]", "CPUQuota=200%", "MemoryMax=8G", "TasksMax=512"],
            "user-0.slice.d/90-hpops-caps.conf": ["[Slice]", "CPUQuota=", "MemoryMax=infinity", "TasksMax=infinity"],
            "user-65534.slice.d/90-hpops-caps.conf": ["[Slice]", "CPUQuota=200%", "MemoryMax=16G", "TasksMax=512"],
        }
        stored = node_report(world, instance_id)
        assert stored["userCaps"]["result"] in ("changed", "unchanged"), stored.get("userCaps")

    again = world.wait([world.sessions.sweep()], timeout=120)[0]
    assert again.output["loginLimits"]["report"]["userCaps"] == "unchanged"

    # Turned off: what PublishLoginLimits does when UserCaps is empty (tests/unit: publish_user_caps).
    world.aws.client("ssm").delete_parameter(Name=f"/hpops/{world.cluster_name}/node/user-caps")
    world.agents_poll()

    for instance_id in login_nodes(world):
        assert dropins(world, instance_id) == {}
        assert node_report(world, instance_id)["userCaps"] == {"result": "changed", "reason": "per-user caps off"}
