"""The twin's commands behind `hpops demo`, `hpops twin send`, `hpops bench` and `--twin` (status, repair, cost, doctor).

The operator CLI (package hpops) dispatches here only when the twin is installed (the development
install); an operator's `pip install .` has neither this package nor moto.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import warnings
from typing import Any

from hpops.output import describe_result, print_targets
from hpops_twin.explain import Route, did, first_line, matches, nearest_rule, routes
from hpops_twin.template_model import TemplateModel
from hpops_twin.world import ACCOUNT_ID, REGION, StuckExecutionError, TwinWorld, entry_of
from hpops_twin.world_diff import AlertInbox, changes, login_nodes, snapshot


def demo(args: argparse.Namespace) -> int:
    from hpops_twin.demo_story import run_demo  # the demo's modules load only for the demo

    return run_demo(args.json)


# The cluster's identity is the simulator's too, so it is set with --cluster, --cluster-id, --login-group.
IDENTITY_PARAMETERS = {"ClusterName": "--cluster", "ClusterArn": "--cluster-id", "LoginGroupName": "--login-group"}


def _parameters(settings: list[str], world_template: Any) -> dict[str, str]:
    """NAME=VALUE stack parameters (as `sam deploy --parameter-overrides`), checked as CloudFormation
    would: the name must be the template's and the value within its AllowedPattern/AllowedValues."""
    parameters = {}
    for setting in settings:
        name, equals, value = setting.partition("=")
        declared = world_template.raw["Parameters"].get(name)
        if not equals or declared is None:
            raise ValueError(f"--parameter {setting}: expected NAME=VALUE with NAME a parameter of template.yaml")
        if name in IDENTITY_PARAMETERS:
            raise ValueError(f"--parameter {setting}: set it with {IDENTITY_PARAMETERS[name]}")
        allowed = [str(v) for v in declared.get("AllowedValues", [])]
        if (allowed and value not in allowed) or not re.fullmatch(declared.get("AllowedPattern", ".*"), value):
            raise ValueError(f"--parameter {setting}: template.yaml allows "
                             f"{', '.join(allowed) if allowed else declared['AllowedPattern']}")
        parameters[name] = value
    return parameters


def _labelled_events(paths: list[str]) -> list[tuple[str, dict]]:
    labelled = []
    for path in paths:
        with open(path, encoding="utf-8") as handle:
            loaded = json.load(handle)
        if isinstance(loaded, list):
            labelled += [(f"{path}[{number}]", event) for number, event in enumerate(loaded)]
        else:
            labelled.append((path, loaded))
    return labelled


def _inputs_are_accepted(labelled: list[tuple[str, dict]]) -> None:
    """Each object without a detail-type is started as a sweep/repair input: refuse, before the twin is
    built, one the state machine's first step would refuse (valid JSON that is neither kind, say)."""
    from hpops_core.common.errors import MalformedEventError
    from hpops_core.login_sync.trigger import parse_sync_input

    for label, event in labelled:
        if isinstance(event, dict) and "detail-type" in event:
            continue
        try:
            parse_sync_input(event)
        except MalformedEventError as error:
            raise ValueError(f"{label}: not an event (no detail-type) and not a sweep/repair input "
                             f"(MalformedEventError: {error}); see events/*.json") from None


def _account_and_region(labelled: list[tuple[str, dict]]) -> tuple[str, str]:
    """The account and region a twin must be to receive these events: an event captured in the
    user's account, or copied from AWS's documentation (111122223333), is replayed there. An event
    reaches only the buses of its own account and region, so events of two are refused."""
    accounts = {e["account"] for _, e in labelled if isinstance(e, dict) and isinstance(e.get("account"), str)}
    regions = {e["region"] for _, e in labelled if isinstance(e, dict) and isinstance(e.get("region"), str)}
    if len(accounts) > 1:
        raise ValueError(f"the events are from accounts {', '.join(sorted(accounts))}: EventBridge delivers an "
                         "event only to its own account's buses, so send each account's events separately")
    if len(regions) > 1:
        raise ValueError(f"the events are from regions {', '.join(sorted(regions))}: an event bus is regional, "
                         "so send each region's events separately")
    return (accounts.pop() if accounts else ACCOUNT_ID), (regions.pop() if regions else REGION)


def send(args: argparse.Namespace) -> int:
    """Every event through one twin, in order (each sees what the previous ones did): per event the
    rules it matched, what each execution or function did, and what changed in the world.
    Exit 0 when every event matched a rule and everything it started succeeded, else 1."""
    labelled = _labelled_events(args.events)
    try:
        _inputs_are_accepted(labelled)
        account_id, region = _account_and_region(labelled)
        template = TemplateModel()
        twin = TwinWorld(cluster_name=args.cluster, cluster_id=args.cluster_id, login_group=args.login_group,
                         worker_group="workers" if args.login_group == "gpu" else "gpu", template=template,
                         parameters=_parameters(getattr(args, "parameter", None) or [], template),
                         account_id=account_id, region=region)
    except ValueError as error:
        print(f"twin send: {error}")
        return 2
    print("twin send: building the twin from template.yaml ...", file=sys.stderr, flush=True)
    # Powertools warns on every invocation that publishes no metric; it says nothing about the event.
    with warnings.catch_warnings(), twin as world:
        warnings.filterwarnings("ignore", message="No application metrics to publish")
        running = sorted(n.ip for n in world.sim.nodes(world.cluster_name, world.login_group) if n.status == "Running")
        print(f"twin account {world.account_id}, region {world.region}, "
              f"cluster {world.cluster_name} (id {world.cluster_id}), login group {world.login_group}: "
              f"Running login nodes {', '.join(running)}")
        inbox = AlertInbox(world)
        inbox.new()  # what the world's setup sent is no event's doing
        succeeded = [_replay(world, inbox, label, event) for label, event in labelled]
        for line in login_nodes(world):
            print(line)
    return 0 if all(succeeded) else 1


def _replay(world: TwinWorld, inbox: AlertInbox, label: str, event: dict) -> bool:
    """One event (or state machine input) through the world; prints what happened; True if all succeeded."""
    before = snapshot(world)
    print(f"{label}: {event.get('detail-type') or 'state machine input'}")
    functions: list[Route] = []
    if "detail-type" in event:
        by_name = {r.source_name: r for r in routes(world) if r.kind == "state machine"}
        first_route, first_failure = len(world.routes), len(world.delivery_failures)
        entry = world.put_events([event]).entries[0]
        if "ErrorCode" in entry:
            print(f"  refused, not delivered: {entry['ErrorCode']}: {entry['ErrorMessage']}")
            return False
        started = [(by_name[r.rule].describe(), r.execution_arn) for r in world.routes[first_route:]]
        # EventBridge also delivers to the function targets, on whichever bus their rule listens.
        functions = [r for r in routes(world) if r.kind == "function" and matches(r.pattern, event)]
        for bus in dict.fromkeys(r.bus for r in functions):
            world.deliver_to_functions(bus, entry_of(event))
        failures = world.delivery_failures[first_failure:]
    else:
        started = [("input -> state machine LoginNodeSyncStateMachine (StartExecution)", world.start_raw(event))]
    if not started and not functions:
        nearest = nearest_rule(event, world)
        print("  matched no rule")
        print("  " + (nearest.describe() if nearest else
                      f"no rule takes source {event.get('source')} with detail-type {event.get('detail-type')}"))
        return False
    ok = True
    for described, arn in started:
        try:
            result = world.wait([arn])[0]
        except StuckExecutionError as error:
            print(f"  {described}: {error}")
            ok = False
            continue
        line = f"  {described}: execution {result.name[:8]} {result.status}"
        if result.status == "SUCCEEDED":
            summary = did(result.output)
            print(line + (f": {summary}" if summary else ""))
        else:
            print(f"{line}: {result.error}: {first_line(result.cause)}")
            ok = False
    for route in functions:
        name = world.function_rules[route.source_name]["function"]
        failure = next((f for f in failures if f["function"] == name), None)
        if failure:
            print(f"  {route.describe()}: {failure['error']}: {first_line(failure['message'])} (event to the DLQ)")
            ok = False
        else:
            print(f"  {route.describe()}: invoked")
    for line in changes(before, snapshot(world), inbox.new()) or ["nothing changed in the world"]:
        print(f"  {line}")
    return ok


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


def doctor(args: argparse.Namespace) -> int:
    """`hpops doctor --twin`: a fresh twin with the account around it set up as a working install has it."""
    from hpops.doctor import print_doctor
    from hpops_twin.doctor_twin import DoctorAccount, doctor_world

    with warnings.catch_warnings(), doctor_world() as world:
        warnings.filterwarnings("ignore", message="No application metrics to publish")
        account = DoctorAccount(world).prepare()
        return print_doctor(account.target(), account.run(), args.json)
