"""Every state machine's timeout outlives its own retries and waits, and every timeout is alarmed.

The bound is computed from the ASL and template.yaml, not typed in:
  * a Task attempt lasts at most its Lambda's Timeout (a Task with its own TimeoutSeconds, that);
  * a Task's retry chain is (1 + MaxAttempts) attempts plus the largest backoff of each retry
    (FULL jitter only shortens it), taking the retrier with the longest chain;
  * single fault: along a path, at most one Task runs its whole retry chain, the others finish in
    one attempt (two independent faults in one execution is an outage, and the alarm says so);
  * a Wait loop runs its ASL bound (maxPolls x pollSeconds, at the template's largest allowed
    pace), each poll costing one attempt of the Task it loops back to;
  * a Map runs its items at once (login groups are smaller than its MaxConcurrency);
  * LoginNodeSync's "one more pass" loop is counted once: an extra pass only follows events that
    arrived during the first, and if it runs out of time the timeout alarm fires and the lease,
    which outlives the timeout, frees itself.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from hpops_twin.template_model import REPO_ROOT, TemplateModel

TEMPLATE = TemplateModel()
MACHINES = TEMPLATE.state_machines()
GLOBAL_TIMEOUT = int(TEMPLATE.globals["Function"]["Timeout"])

# Wait states that loop back to a Task, with the ASL fields (from the ParseTrigger output) that
# bound them and the template parameters that set those fields.
WAIT_LOOPS = {
    "WaitForNodeReport": {"loops_to": "CheckNodeReport", "polls": "NodeReportMaxPolls", "seconds": "NodeReportPollSeconds"},
}
# States a path may pass more than once: in certificate mode a node is awaited twice (its key
# report, then its certificate install), each time through the same check-and-wait loop, and
# each Wait is followed by one more check. Every other state is entered once per path.
VISITS = {"CheckNodeReport": 4, "NodeAcknowledged": 4, "WaitForNodeReport": 2}


def _parameter_max(name: str) -> int:
    parameter = TEMPLATE.raw["Parameters"][name]
    return int(parameter.get("MaxValue", parameter["Default"]))


def _function_timeout(substitution: str, machine) -> int:
    arn = machine.substitutions[substitution]
    if "Fn::If" in arn:  # a function that exists only with a parameter (UserSpendEnabled): bound it when it does
        arn = arn["Fn::If"][1]
    logical_id = arn["Fn::GetAtt"][0]
    return int(TEMPLATE.raw["Resources"][logical_id]["Properties"].get("Timeout", GLOBAL_TIMEOUT))


@dataclass(frozen=True)
class Cost:
    clean: float  # the longest path with every Task in one attempt
    one_fault: float  # the longest path with one Task running its whole retry chain


def _attempt_seconds(state: dict, machine) -> int:
    if "TimeoutSeconds" in state:
        return int(state["TimeoutSeconds"])
    function = state.get("Parameters", {}).get("FunctionName", "")
    assert function.startswith("${"), f"{state.get('Comment')}: only Lambda tasks are modelled"
    return _function_timeout(function[2:-1], machine)


def _retry_chain(state: dict, attempt: int) -> float:
    longest = 0.0
    for retrier in state.get("Retry", []):
        interval, rate = retrier.get("IntervalSeconds", 1), retrier.get("BackoffRate", 2.0)
        cap = retrier.get("MaxDelaySeconds", float("inf"))
        attempts = retrier.get("MaxAttempts", 3)
        backoff = sum(min(interval * rate**k, cap) for k in range(attempts))
        longest = max(longest, attempts * attempt + backoff)
    return attempt + longest


def _path_cost(states: dict, start: str, machine, visited: tuple = ()) -> Cost:
    state = states[start]
    kind = state["Type"]
    if kind == "Task":
        attempt = _attempt_seconds(state, machine)
        here = Cost(attempt, _retry_chain(state, attempt))
    elif kind == "Wait" and start in WAIT_LOOPS:
        loop = WAIT_LOOPS[start]
        polls, seconds = _parameter_max(loop["polls"]), _parameter_max(loop["seconds"])
        check = _attempt_seconds(states[loop["loops_to"]], machine)
        here = Cost(polls * (seconds + check), polls * (seconds + check))
    elif kind == "Wait":
        assert "Seconds" in state, f"{start}: a Wait without a static bound needs an entry in WAIT_LOOPS"
        here = Cost(state["Seconds"], state["Seconds"])
    elif kind in ("Map", "Parallel"):
        branches = [state["ItemProcessor"]] if kind == "Map" else state["Branches"]
        inner = [_path_cost(b["States"], b["StartAt"], machine) for b in branches]
        here = Cost(max(c.clean for c in inner), max(c.one_fault for c in inner))
    else:
        here = Cost(0, 0)

    following = [state.get("Next"), state.get("Default")]
    following += [choice.get("Next") for choice in state.get("Choices", [])]
    following += [catch.get("Next") for catch in state.get("Catch", [])]
    # A back edge is a loop: the Wait loop is costed at its bound above, the pass loop once.
    visited = visited + (start,)
    following = {n for n in following if n and visited.count(n) < VISITS.get(n, 1)}
    if not following:
        return here
    rest = [_path_cost(states, n, machine, visited) for n in sorted(following)]
    clean = max(r.clean for r in rest)
    one_fault = max(max(r.one_fault for r in rest) + here.clean, clean + here.one_fault)
    return Cost(here.clean + clean, one_fault)


def worst_case_seconds(logical_id: str) -> Cost:
    machine = MACHINES[logical_id]
    definition = json.loads(machine.definition_path.read_text())
    return _path_cost(definition["States"], definition["StartAt"], machine)


@pytest.mark.parametrize("logical_id", sorted(MACHINES))
def test_timeout_outlives_a_retry_chain_and_the_waits(logical_id):
    definition = json.loads(MACHINES[logical_id].definition_path.read_text())
    cost = worst_case_seconds(logical_id)
    assert definition["TimeoutSeconds"] > cost.one_fault, (
        f"{logical_id}: TimeoutSeconds {definition['TimeoutSeconds']} but one retry chain plus the waits "
        f"can take {cost.one_fault:.0f} s"
    )


def test_the_model_counts_retries_and_waits():
    # Guards the calculator itself: a chain is longer than one attempt, and the node-report wait
    # loop (18 polls x 10 s at the defaults, more at the parameter maxima) is in the sync's bound.
    sync = worst_case_seconds("LoginNodeSyncStateMachine")
    assert sync.one_fault > sync.clean
    polls, seconds = _parameter_max("NodeReportMaxPolls"), _parameter_max("NodeReportPollSeconds")
    assert sync.clean > polls * seconds


@pytest.mark.parametrize("metric", ["ExecutionsFailed", "ExecutionsTimedOut"])
@pytest.mark.parametrize("logical_id", sorted(MACHINES))
def test_every_state_machine_alarms_on_failures_and_timeouts(logical_id, metric):
    alarms = [
        a["Properties"] for a in TEMPLATE.of_type("AWS::CloudWatch::Alarm").values()
        if a["Properties"].get("Namespace") == "AWS/States" and a["Properties"].get("MetricName") == metric
    ]
    watched = [d["Value"] for a in alarms for d in a.get("Dimensions", []) if d.get("Name") == "StateMachineArn"]
    assert {"Ref": logical_id} in watched, f"no {metric} alarm on {logical_id}"
    assert all(a.get("AlarmActions") for a in alarms)


def test_the_model_reads_the_real_files():
    assert (REPO_ROOT / "statemachines").is_dir() and len(MACHINES) >= 3
