"""The twin's commands behind `hpops demo`, `hpops twin send`, `hpops bench` and `--twin` (status, repair, cost).

The operator CLI (package hpops) dispatches here only when the twin is installed (the development
install); an operator's `pip install .` has neither this package nor moto.
"""

from __future__ import annotations

import argparse
import json
import re
from typing import Any

from hpops.output import describe_result, print_targets
from hpops_twin.world import StuckExecutionError, TwinWorld


def demo(args: argparse.Namespace) -> int:
    from hpops_twin.demo import run_demo  # the demo's modules load only for the demo

    return run_demo(args.json)


def _cluster_hints(event: dict, world: Any) -> list[str]:
    """Why an event may have matched no rule: it names another cluster, cluster id or login group."""
    detail = event.get("detail") if isinstance(event.get("detail"), dict) else {}
    named = detail.get("EventDetails") if isinstance(detail.get("EventDetails"), dict) else detail
    hints = []
    if named.get("ClusterName") and named["ClusterName"] != world.cluster_name:
        hints.append(f"it names cluster {named['ClusterName']}, the twin's is {world.cluster_name} (--cluster)")
    target = str((detail.get("requestParameters") or {}).get("target") or "")
    session = re.fullmatch(r"sagemaker-cluster:([^_]+)_(.+)-(i-[^-]+)", target)
    if session and (session[1], session[2]) != (world.cluster_id, world.login_group):
        hints.append(f"its target is cluster id {session[1]}, group {session[2]}; the twin's are "
                     f"{world.cluster_id}, {world.login_group} (--cluster-id, --login-group)")
    return hints


def send(args: argparse.Namespace) -> int:
    events = []
    for path in args.events:
        with open(path, encoding="utf-8") as handle:
            loaded = json.load(handle)
        events.extend(loaded if isinstance(loaded, list) else [loaded])
    try:
        twin = TwinWorld(cluster_name=args.cluster, cluster_id=args.cluster_id, login_group=args.login_group,
                         worker_group="workers" if args.login_group == "gpu" else "gpu")
    except ValueError as error:
        print(f"twin send: {error}")
        return 2
    with twin as world:
        running = sorted(n.ip for n in world.sim.nodes(world.cluster_name, world.login_group) if n.status == "Running")
        print(f"twin cluster {world.cluster_name} (id {world.cluster_id}), login group {world.login_group}: "
              f"Running login nodes {', '.join(running)}")
        failed = 0
        for event in events:  # one at a time, so each plan reads the previous one's result
            label = f"event {event.get('id', '?')} ({event.get('detail-type', 'input')})"
            if "detail-type" in event:
                outcome = world.put_events([event])
                refused = outcome.entries[0]
                if "ErrorCode" in refused:
                    print(f"{label}: refused, not delivered: {refused['ErrorCode']}: {refused['ErrorMessage']}")
                    failed += 1
                    continue
                started = outcome.started
            else:
                started = [world.start_raw(event)]
            if not started:
                print(f"{label}: matched no rule" + "".join(f"; {hint}" for hint in _cluster_hints(event, world)))
            try:
                results = world.wait(started)
            except StuckExecutionError as error:
                print(f"{label}: {error}")
                failed += 1
                continue
            for result in results:
                failed += result.status != "SUCCEEDED"
                describe_result(vars(result))
        print_targets(world.targets(), world.login_truth())
        return 1 if failed else 0


def bench(args: argparse.Namespace) -> int:
    from hpops_twin.bench import run_bench

    return run_bench(args.json)


def cost(args: argparse.Namespace) -> int:
    """`hpops cost --twin`: the demo's month (user_spend_demo.py) in a fresh twin, then the report."""
    from hpops.output import cost_exit_status, print_cost
    from hpops_twin.user_spend_demo import month_world, play, prepare

    with month_world() as world:
        document = play(prepare(world))
    print_cost(document, "json" if args.json else "csv" if args.csv else "table")
    return cost_exit_status(document)


def status(args: argparse.Namespace) -> int:
    """`hpops status --twin`: a fresh twin after one sweep."""
    with TwinWorld() as world:
        world.wait([world.run_schedule()])
        print_targets(world.targets(), world.login_truth())
    return 0


def repair(args: argparse.Namespace) -> int:
    """`hpops repair --twin`: a manual repair execution in a fresh twin."""
    with TwinWorld() as world:
        result = world.wait([world.start_repair(dry_run=args.dry_run)])[0]
        describe_result(vars(result))
        print_targets(world.targets(), world.login_truth())
        return 0 if result.status == "SUCCEEDED" else 1
