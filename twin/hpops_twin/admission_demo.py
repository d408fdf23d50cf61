"""`make demo`'s load-aware admission chapter: a login node runs hot, leaves rotation for new
connections while its users keep working, and comes back once cooled (hpops_twin/admission_twin.py
plays the kernel's pressure and the minutes passing)."""

from __future__ import annotations

from typing import Any

from hpops_twin import nlb_model
from hpops_twin.admission_twin import minutes_pass, run_admission, set_pressure


def admission_steps(demo: Any) -> None:
    world, sim = demo.world, demo.world.sim
    nodes = sorted((n for n in sim.nodes(world.cluster_name, world.login_group) if n.status == "Running"),
                   key=lambda n: n.ip)
    hot = nodes[0]
    set_pressure(world, {})
    run_admission(world)

    def runs_hot() -> list[str]:
        set_pressure(world, {hot.instance_id: 85.0})
        run_admission(world)
        minutes_pass(world, 10)
        return [e.arn for e in run_admission(world)[1]]

    demo.step(f"login node {hot.instance_id} runs hot for 10 minutes (CPU pressure 85%, the others 3%)", runs_hot,
              "out of rotation for new connections; its users keep their sessions",
              lambda: hot.ip not in world.target_ips() and len(world.target_ips()) == len(nodes) - 1,
              drift_expected=True)
    placed = nlb_model.place_users("nat", 200, world.target_ips(), sticky_source_ip=False, seed=7)
    demo.say(f"        200 new logins meanwhile: {'/'.join(str(n) for n in sorted(placed.values(), reverse=True))} "
             f"over the {len(placed)} nodes in rotation, 0 on {hot.instance_id}")

    def cools() -> list[str]:
        set_pressure(world, {})
        minutes_pass(world, 15)
        return [e.arn for e in run_admission(world)[1]]

    demo.step(f"{hot.instance_id} cools; 15 minutes later load-aware admission brings it back (re-verified)", cools,
              "back in rotation", lambda: hot.ip in world.target_ips())
