"""Load-aware admission in the twin: the kernel's pressure on each login node, time passing for the
admission record, and the scheduled run with the sync it starts. Used by its tests, `make bench` and the demo.

The twin's nodes have no kernel: `set_pressure` writes the /proc/pressure files a kernel with PSI
provides under each node's root, which the real agent reads. Minutes passing are played by moving the
admission record's times back: the agents would have kept reporting meanwhile, so their reports stay
fresh, and nothing else in the stack depends on the wall clock between two runs.
"""

from __future__ import annotations

import json
from typing import Any

CALM = 3.0


def set_pressure(world: Any, pressures: dict[str, float], calm: float = CALM) -> None:
    """Each Running login node's CPU pressure (avg60, percent; `calm` when not named); then the agents poll."""
    for node in world.sim.nodes(world.cluster_name, world.login_group):
        if node.status != "Running" or node.instance_id not in world.hosts.roots:
            continue
        value = pressures.get(node.instance_id, calm)
        pressure = world.hosts.roots[node.instance_id] / "proc" / "pressure"
        pressure.mkdir(parents=True, exist_ok=True)
        line = f"avg10={value:.2f} avg60={value:.2f} avg300={value:.2f} total=1234"
        (pressure / "cpu").write_text(f"some {line}\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
        (pressure / "memory").write_text("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
                                         "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    world.agents_poll()


def _key(world: Any) -> dict:
    return {"pk": {"S": f"admission#{world.cluster_name}"}, "sk": {"S": "login-admission"}}


def admission_record(world: Any) -> dict:
    item = world.aws.client("dynamodb").get_item(TableName=world.output("SyncStateTableName"), Key=_key(world))["Item"]
    return json.loads(item["state"]["S"])


def minutes_pass(world: Any, minutes: int) -> None:
    """Move every time in the admission record `minutes` back."""
    ddb, table = world.aws.client("dynamodb"), world.output("SyncStateTableName")
    item = ddb.get_item(TableName=table, Key=_key(world))["Item"]
    state, shift = json.loads(item["state"]["S"]), minutes * 60
    state["hotSince"] = {i: t - shift for i, t in state["hotSince"].items()}
    for entry in state["out"].values():
        entry["since"] -= shift
    state["decidedAt"] -= shift
    if state["imbalanceSince"]:
        state["imbalanceSince"] -= shift
    ddb.put_item(TableName=table, Item=item | {"state": {"S": json.dumps(state)}})


def run_admission(world: Any, timeout: float = 120) -> tuple[dict, list]:
    """The schedule fires; returns the function's result and the sync executions it started (ended).
    The function calls StartExecution itself, not through the twin's router: they are found by listing."""
    sfn = world.aws.client("stepfunctions")
    machine = world.output("LoginNodeSyncStateMachineArn")
    before = {e["executionArn"] for e in sfn.list_executions(stateMachineArn=machine)["executions"]}
    result = world.run_function_schedule("AdmissionSchedule")
    started = [e["executionArn"] for e in sfn.list_executions(stateMachineArn=machine)["executions"]
               if e["executionArn"] not in before]
    executions = world.wait(started, timeout=timeout)
    for execution in executions:
        if execution.status != "SUCCEEDED":
            raise RuntimeError(f"the sync admission started ended {execution.status}: {execution.error} {execution.cause}")
    return result, executions
