"""Load-aware admission's default, dry-run: every move it would make is decided and said, nothing changes.
(A world of its own: two twins cannot be open at once in one process.)"""

from __future__ import annotations

from hpops_twin.admission_twin import admission_record as record, minutes_pass, run_admission, set_pressure
from hpops_twin.world import TwinWorld


def login_nodes(world: TwinWorld) -> list:
    return sorted((n for n in world.sim.nodes(world.cluster_name, world.login_group) if n.status == "Running"),
                  key=lambda n: n.ip)


def test_the_default_dry_run_says_what_it_would_do_and_changes_nothing():
    with TwinWorld(login_count=3, worker_count=1) as world:  # LoadAwareAdmission's default: dry-run
        assert world.wait([world.run_schedule()])[0].status == "SUCCEEDED"
        nodes = login_nodes(world)
        set_pressure(world, {nodes[0].instance_id: 90.0})
        run_admission(world)
        minutes_pass(world, 10)
        result, started = run_admission(world)
        assert result["mode"] == "dry-run" and [m["action"] for m in result["moves"]] == ["leave"]
        assert started == [] and sorted(world.target_ips()) == sorted(n.ip for n in nodes)
        assert record(world)["mode"] == "dry-run" and nodes[0].instance_id in record(world)["out"]
        # A sweep reads a dry-run record and keeps every node in rotation.
        assert world.wait([world.run_schedule()])[0].status == "SUCCEEDED"
        assert sorted(world.target_ips()) == sorted(n.ip for n in nodes)
