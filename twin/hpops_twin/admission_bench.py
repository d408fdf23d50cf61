"""`make bench`, admission: what load-aware admission costs and does, measured in the twin.

The twin deploys the stack with LoadAwareAdmission=on and 4 login nodes; each node's real agent
reads its pressure from the /proc files the twin writes (hpops_twin/admission_twin.py). Rows: the
scheduled run with nothing to move (what every 5 minutes costs), a node leaving rotation (the run and
the LoginNodeSync it starts) and coming back (the sync re-verifies its host identity before it takes
traffic again), each with its AWS calls, state transitions and Lambda invocations; the cost of a move
is priced from those. Then the floor: three of four nodes running hot, admission run until nothing
moves, the fewest nodes the target group ever held; and where 200 new connections land (the NLB's
flow hash, hpops_twin/nlb_model.py) while a node is out.
`python -m hpops_twin.admission_bench [--merge docs/bench.json]` runs this section alone.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from hpops_twin import nlb_model
from hpops_twin.admission_twin import minutes_pass, run_admission, set_pressure
from hpops_twin.template_model import REPO_ROOT
from hpops_twin.world import TwinWorld

KEY = "admission"
LOGIN_NODES = 4
FUNCTION = "LoginAdmissionFunction"


@dataclass
class AdmissionRow:
    scenario: str
    moves: list[str]
    calls: dict  # AWS calls by the admission function and the sync it started
    state_transitions: int
    lambda_invocations: int
    seconds: float
    targets_after: int


def _measure(world: TwinWorld, scenario: str) -> AdmissionRow:
    world.counter.reset()
    invoked = len(world.dispatcher.invocations)
    began = time.perf_counter()
    result, executions = run_admission(world)
    seconds = time.perf_counter() - began
    transitions = sum(world.state_transitions(e.arn) for e in executions)
    calls = {k: v for k, v in sorted(world.counter.calls.items())}
    return AdmissionRow(scenario, [f"{m['action']} {m['instanceId']}" for m in result["moves"]], calls, transitions,
                        len(world.dispatcher.invocations) - invoked, round(seconds, 3), len(world.target_ips()))


def admission_rows() -> tuple[list[AdmissionRow], dict]:
    with TwinWorld(login_count=LOGIN_NODES, worker_count=4, parameters={"LoadAwareAdmission": "on"}) as world:
        world.wait([world.run_schedule()])
        nodes = sorted((n for n in world.sim.nodes(world.cluster_name, world.login_group)), key=lambda n: n.ip)
        set_pressure(world, {})
        run_admission(world)
        rows = [_measure(world, "scheduled run, nothing to move")]
        hot = nodes[0]
        set_pressure(world, {hot.instance_id: 80.0})
        run_admission(world)
        minutes_pass(world, 10)
        rows.append(_measure(world, "hot node leaves rotation (run + sync)"))
        placed = nlb_model.place_users("nat", 200, world.target_ips(), sticky_source_ip=False, seed=0)
        on_hot = placed.get(hot.ip, 0)
        set_pressure(world, {})
        minutes_pass(world, 15)
        rows.append(_measure(world, "cooled node returns (run + sync, re-verified)"))

        fewest = len(world.target_ips())
        set_pressure(world, {n.instance_id: 95.0 for n in nodes[:3]} | {nodes[2].instance_id: 40.0})
        for _ in range(6):
            minutes_pass(world, 10)
            run_admission(world)
            fewest = min(fewest, len(world.target_ips()))
        set_pressure(world, {n.instance_id: 99.0 for n in nodes[:3]})
        for _ in range(3):
            minutes_pass(world, 10)
            run_admission(world)
            fewest = min(fewest, len(world.target_ips()))
    figures = {"new_connections_on_the_hot_node": on_hot, "new_connections": sum(placed.values()),
               "fewest_nodes_in_rotation": fewest, "login_nodes": LOGIN_NODES}
    return rows, figures


def render(rows: list[AdmissionRow], figures: dict) -> str:
    header = f"{'admission':<48} {'moves':<24} {'AWS calls':>9} {'transitions':>11} {'invocations':>11} {'seconds':>8}"
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(f"{r.scenario:<48} {', '.join(r.moves) or '-':<24.24} {sum(r.calls.values()):>9} "
                     f"{r.state_transitions:>11} {r.lambda_invocations:>11} {r.seconds:>8.2f}")
    lines.append(f"while a node is out: {figures['new_connections_on_the_hot_node']} of {figures['new_connections']} "
                 f"new connections land on it; three of {figures['login_nodes']} hot: never fewer than "
                 f"{figures['fewest_nodes_in_rotation']} nodes in rotation")
    return "\n".join(lines)


def admission_section() -> tuple[dict, dict[str, bool]]:
    rows, figures = admission_rows()
    print()
    print(render(rows, figures), flush=True)
    idle, leave, back = rows
    verdicts = {
        "admission: a run with nothing to move makes 3 AWS calls (DescribeTargetHealth, Query, GetItem) and a PutItem":
            sum(idle.calls.values()) == 4 and idle.state_transitions == 0,
        "admission: a hot node leaves and returns, one sync each": leave.moves and back.moves and leave.targets_after == 3
            and back.targets_after == 4,
        "admission: no new connection lands on a node out of rotation": figures["new_connections_on_the_hot_node"] == 0,
        "admission: never fewer than 2 nodes in rotation": figures["fewest_nodes_in_rotation"] >= 2,
    }
    return {"rows": [asdict(r) for r in rows]} | figures, {k: bool(v) for k, v in verdicts.items()}


def main(argv: list[str]) -> int:
    """Run this section alone; `--merge FILE` also replaces only its key in that bench JSON file."""
    record, verdicts = admission_section()
    for text, ok in verdicts.items():
        print(f"{'ok  ' if ok else 'MISS'} {text}", flush=True)
    if argv[:1] == ["--merge"]:
        path = Path(argv[1]) if len(argv) > 1 else REPO_ROOT / "docs" / "bench.json"
        data = json.loads(path.read_text(encoding="utf-8"))
        data[KEY] = record
        data["targets"] = {k: v for k, v in data.get("targets", {}).items() if k not in verdicts} | verdicts
        path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return 0 if all(verdicts.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
