"""`make bench`, sessions at scale: login-node session limits and targets at 4 / 12 / 50 login nodes and
200 / 2,000 / 10,000 users, the product's own functions fed that much stored data.

A twin run of 50 agents with thousands of sessions would take far longer than the rest of the bench, so
each size stores the nodes' reports the way RecordNodeReport does (the agent's own report section,
hpops_node_agent.ssh_sessions.reported_sessions; the real parse and store, and the per-user items kept from
it, node_channel/user_sessions.py), in moto's DynamoDB, then:

* a user at the default limit of 2 opens a third session, the newest, on the busiest node (half of the
  logged-in users sit there, as a campus NAT sends them): the real CheckReportedSessions handler reads
  that user's items alone and must start a check naming that user; the run's decision (read_cluster_state,
  decide_cluster_wide, instruct_nodes) must tell that node to end exactly that session, and the node's
  agent must accept the instruction (parse_end_sessions);
* one login node is replaced: the sync's plan_targets must register the new IP, deregister the old and
  keep the rest.

Per size it prints the calls, each function's peak memory (the process after its imports, measured in a
fresh interpreter, plus tracemalloc's peak for the work, which counts moto's side of the calls too: an
upper bound) against its MemorySize in template.yaml, the
largest report and stored item against EventBridge's, Lambda's and DynamoDB's limits, what one check
reads (items, bytes, read units: measured through botocore's hooks, beside what the same change read
when the check read every node's report), what the change writes beyond the report item, and the
month's cost (cost_model.activity_cost) priced by those reads and writes. The twin test
tests/twin/test_cluster_session_limit_twin.py runs a 1,000-session node end to end.
`python -m hpops_twin.scale_sessions_bench [--merge docs/bench.json]` runs this section alone.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import subprocess
import sys
import time
import tracemalloc
from collections import Counter
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import Any
from unittest import mock

from hpops_twin.bench_section import run_alone
from hpops_twin.template_model import REPO_ROOT, TemplateModel

KEY = "scale_sessions"
CLUSTER = "ml-research"
LOGIN_GROUP = "login"
# (login nodes, users, users logged in at once); each logged-in user holds 2 sessions, the default limit.
SIZES = ((4, 200, 100), (12, 2_000, 500), (50, 10_000, 2_000))
SESSIONS_PER_USER = 2
OVER_USER = "overlimit"
EVENTBRIDGE_ENTRY_BYTES = 256 * 1024
LAMBDA_ASYNC_PAYLOAD_BYTES = 256 * 1024
DYNAMODB_ITEM_BYTES = 400 * 1024
PRESENCE_ITEM_BYTES = 200  # a node's presence item (user_sessions.py), a bound on the ~170 bytes measured
FUNCTIONS = {  # logical id -> (code directory, handler module)
    "RecordNodeReportFunction": ("functions/node_reports", "app"),
    "CheckReportedSessionsFunction": ("functions/session_limits", "check_reported_sessions"),
    "EnforceSessionLimitsFunction": ("functions/session_limits", "enforce_session_limits"),
}


@dataclass
class ScaleRow:
    login_nodes: int
    users: int
    logged_in: int
    sessions: int
    busiest_node_sessions: int
    busiest_node_listed: int  # entries in its report; the rest counted per user (omittedByUser)
    max_report_bytes: int  # the EventBridge entry's Detail
    max_event_bytes: int  # the event as Lambda receives it (asynchronous invocation payload)
    max_item_bytes: int  # the stored DynamoDB item
    mean_item_bytes: int
    check_calls: dict
    check_read_units: float  # one CheckReportedSessions run, by item size and read kind (measured)
    check_items_read: int
    check_bytes_read: int
    before_read_units: float  # the same change read the way the check did before per-user items
    before_items_read: int
    before_bytes_read: int
    change_write_units: float  # what RecordNodeReport writes for the change beyond the report item
    change_writes: dict  # its DynamoDB calls beyond the report item
    heartbeat_extra_units: dict  # what each report (a heartbeat too) adds: the node's presence read and written
    check_started: bool
    ended: list  # [node, handle] the run told a node to end
    ended_right: bool
    targets_right: bool
    peak_mb: dict  # function -> MB at its peak
    memory_mb: dict  # function -> MemorySize
    check_log_bytes: int
    monthly_usd: float
    cost: dict


def _item_bytes(item: dict) -> int:
    """DynamoDB's item size: attribute names plus values (strings by UTF-8 length, numbers ~ digits)."""
    size = 0
    for name, value in item.items():
        (kind, data), = value.items()
        size += len(name.encode()) + (len(str(data).encode()) if kind in ("S", "N") else len(json.dumps(data)))
    return size


def _node_ids(count: int) -> list[str]:
    return [f"i-{n:017x}" for n in range(1, count + 1)]


def _placement(nodes: list[str], logged_in: int) -> dict[str, list[tuple[str, float]]]:
    """node -> [(user, started_at)]: half the users on the first node (one NAT address), the rest spread."""
    base = 1_764_000_000.0
    placed: dict[str, list[tuple[str, float]]] = {n: [] for n in nodes}
    for u in range(logged_in - 1):
        user = f"u{u:05d}"
        for k in range(SESSIONS_PER_USER):
            node = nodes[0] if u % 2 == 0 else nodes[(u + k) % len(nodes)]
            placed[node].append((user, base + u + k * 0.5))
    placed[nodes[0]].append((OVER_USER, base - 600))
    placed[nodes[1]].append((OVER_USER, base - 300))
    return placed


def _sessions(node_index: int, placed: list[tuple[str, float]]):
    from hpops_node_agent.ssh_sessions import NodeSession

    return sorted((NodeSession(f"5eed0b07:{1000 + i}:{node_index * 10_000_000 + i}", user, "ssh", True, started)
                   for i, (user, started) in enumerate(placed)), key=lambda s: (s.started_at, s.handle))


def _event(instance: str, index: int, section: dict, sequence: int) -> dict:
    from hpops_core.node_channel import contract

    detail = {"format": contract.REPORT_FORMAT, "cluster": CLUSTER, "instanceId": instance, "ip": f"10.1.{index // 250}.{index % 250 + 4}",
              "role": "login", "agentVersion": "0.1.0", "reportedAt": "2026-11-23T08:00:01Z", "trigger": "change",
              "hostIdentity": {"mode": "keys", "version": "3", "result": "unchanged", "reason": "keys already installed",
                               "fingerprints": {t: "SHA256:" + "A" * 43 for t in ("ssh-ed25519", "ecdsa-sha2-nistp256", "rsa-sha2-512")}},
              "loginLimits": {"version": "7", "result": "unchanged", "reason": "limits already applied"},
              "sessions": section}
    return {"version": "0", "id": f"{index:08d}-{sequence:04d}-0000-0000-000000000000", "source": contract.REPORT_SOURCE,
            "detail-type": contract.REPORT_DETAIL_TYPE, "account": "123456789012", "time": "2026-11-23T08:00:01Z",
            "region": "us-east-1", "resources": [], "detail": detail}


class _Calls:
    """AWS calls made through botocore, by service.operation (a before-call hook on every client), and
    DynamoDB's units for them: reads by the bytes of the items returned (4 KB a unit per request, half
    for an eventually consistent read), writes by the larger of the item's old and new size (1 KB a unit)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.read_units = 0.0
        self.write_units = 0.0
        self.items_read = 0
        self.bytes_read = 0
        self._params: dict = {}

    def hook(self, model, **_: Any) -> None:
        self.counts[f"{model.service_model.service_name}.{model.name}"] += 1

    def capture(self, params, **_: Any) -> None:  # the call's own parameters (before-call has the wire form)
        self._params = params

    def after(self, model, parsed, **_: Any) -> None:
        if model.service_model.service_name != "dynamodb":
            return
        items = parsed.get("Items") or ([parsed["Item"]] if "Item" in parsed else [])
        size = sum(_item_bytes(i) for i in items)
        if model.name in ("Query", "GetItem"):
            self.items_read += len(items)
            self.bytes_read += size
            self.read_units += max(1, math.ceil(size / 4096)) * (1 if self._params.get("ConsistentRead") else 0.5)
        elif model.name in ("PutItem", "DeleteItem", "UpdateItem"):
            written = _item_bytes(self._params.get("Item") or {})
            self.write_units += max(1, math.ceil(max(written, _item_bytes(parsed.get("Attributes") or {})) / 1024))

    def register(self, client_) -> None:
        client_.meta.events.register("provide-client-params.*.*", self.capture)
        client_.meta.events.register("before-call.*.*", self.hook)
        client_.meta.events.register("after-call.*.*", self.after)

    def unregister(self, client_) -> None:
        client_.meta.events.unregister("provide-client-params.*.*", self.capture)
        client_.meta.events.unregister("before-call.*.*", self.hook)
        client_.meta.events.unregister("after-call.*.*", self.after)


class _Context:
    function_name = "CheckReportedSessionsFunction"
    memory_limit_in_mb = 256
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:CheckReportedSessionsFunction"
    aws_request_id = "00000000-0000-0000-0000-000000000000"


def import_peaks_mb() -> dict[str, float]:
    """Each function's resident memory once its handler module is imported, in a fresh interpreter."""
    env = dict(os.environ, AWS_DEFAULT_REGION="us-east-1", POWERTOOLS_TRACE_DISABLED="true")
    procs = {}
    for name, (code, module) in FUNCTIONS.items():
        env_one = dict(env, PYTHONPATH=os.pathsep.join([str(REPO_ROOT / "layers/hpops_core"), str(REPO_ROOT / code)]))
        procs[name] = subprocess.Popen(
            [sys.executable, "-c", f"import resource, {module}; print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"],
            env=env_one, stdout=subprocess.PIPE, text=True, cwd=str(REPO_ROOT / code))
    return {name: int(proc.communicate(timeout=120)[0].strip()) / 1024 for name, proc in procs.items()}


def _traced(work) -> tuple[Any, float]:
    """work()'s result and tracemalloc's peak in MB while it ran."""
    tracemalloc.start()
    try:
        result = work()
        return result, tracemalloc.get_traced_memory()[1] / 1e6
    finally:
        tracemalloc.stop()


def measure_size(login_nodes: int, users: int, logged_in: int, baseline_mb: dict[str, float]) -> ScaleRow:
    import boto3
    from moto import mock_aws

    from hpops_core.common.clients import reset_clients
    from hpops_core.common.state_table import node_report_partition
    from hpops_core.common.clients import client
    from hpops_core.node_channel import report_store, session_changes, user_sessions
    from hpops_core.node_channel.reports import parse_report_event
    from hpops_core.session_limits import node_sessions
    from hpops_core.session_limits.cluster_sessions import decide_cluster_wide
    from hpops_core.session_limits.policy import LimitPolicy
    from hpops_node_agent.ssh_sessions import parse_end_sessions, reported_sessions
    from hpops_twin.cost_model import scale_row_cost

    template = TemplateModel()
    default_limit = int(template.parameter_defaults()["MaxSessionsPerUser"])
    nodes = _node_ids(login_nodes)
    placed = _placement(nodes, logged_in)
    env = {"AWS_DEFAULT_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "CLUSTER_NAME": CLUSTER, "STATE_TABLE_NAME": "state", "MAX_SESSIONS_PER_USER": str(default_limit),
           "SESSION_EXCESS_POLICY": "newest", "POWERTOOLS_TRACE_DISABLED": "true", "POWERTOOLS_SERVICE_NAME": "session-limits",
           "POWERTOOLS_METRICS_NAMESPACE": "HyperPodLoginAutopilot"}
    with mock_aws(), mock.patch.dict(os.environ, env):  # one thread here: patch.dict's refill is safe
        reset_clients()
        ddb = boto3.client("dynamodb")
        ddb.create_table(TableName="state", BillingMode="PAY_PER_REQUEST",
                         AttributeDefinitions=[{"AttributeName": k, "AttributeType": "S"} for k in ("pk", "sk")],
                         KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}])
        machine = boto3.client("stepfunctions").create_state_machine(
            name="SessionLimits", roleArn="arn:aws:iam::123456789012:role/sfn",
            definition=json.dumps({"StartAt": "Done", "States": {"Done": {"Type": "Succeed"}}}))["stateMachineArn"]
        os.environ["SESSION_LIMITS_STATE_MACHINE_ARN"] = machine
        now = datetime.now(timezone.utc)
        received = now.strftime("%Y-%m-%dT%H:%M:%S.000Z")

        sequences = Counter()

        def store(index: int, listed, calls: _Calls | None = None) -> tuple[dict, Any, dict | None, int, Any]:
            # As RecordNodeReport: the report stored, then its users' items and the node's presence.
            sequences[index] += 1
            event = _event(nodes[index], index, reported_sessions(listed) | {"ended": []}, sequences[index])
            report = parse_report_event(event)
            previous = report_store.store_report("state", CLUSTER, report, received, int(now.timestamp()), event["id"],
                                                 sequences[index])
            if calls is not None:
                calls.register(client("dynamodb"))
            sync = user_sessions.keep_user_sessions("state", CLUSTER, report, previous, received, int(now.timestamp()),
                                                    event["id"], sequences[index])
            if calls is not None:
                calls.unregister(client("dynamodb"))
            return event, report, previous, len(json.dumps(event["detail"], separators=(",", ":"))), sync

        report_bytes, event_bytes = [], []
        listed_by_node = {}
        for index, node in enumerate(nodes):
            listed_by_node[node] = _sessions(index, placed[node])
            event, _, _, size, _ = store(index, listed_by_node[node])
            report_bytes.append(size)
            event_bytes.append(len(json.dumps(event)))
        # A heartbeat: the same sessions again; what it adds to the report item's write.
        heartbeat = _Calls()
        store(0, listed_by_node[nodes[0]], heartbeat)
        # The crossing: the over-limit user's third session, the newest, on the busiest node.
        from hpops_node_agent.ssh_sessions import NodeSession

        crossing = NodeSession("5eed0b07:999999:999999999", OVER_USER, "ssh", True, 1_764_000_000.0 + 10 * logged_in)
        listed_by_node[nodes[0]] = listed_by_node[nodes[0]] + [crossing]
        change_calls = _Calls()
        (event, report, previous, size, sync), record_peak = _traced(
            lambda: store(0, listed_by_node[nodes[0]], change_calls))
        report_bytes.append(size)
        event_bytes.append(len(json.dumps(event)))
        change = session_changes.sessions_change(previous, report, event["id"], sync.grew)
        busiest_listed = len(report.sessions.list)
        items = ddb.query(TableName="state", KeyConditionExpression="pk = :pk",
                          ExpressionAttributeValues={":pk": {"S": node_report_partition(CLUSTER)}})["Items"]
        item_sizes = [_item_bytes(i) for i in items]

        # CheckReportedSessions, the real handler, on the stored reports.
        calls = _Calls()
        announcement = {"source": "hpops.node-reports", "detail-type": "HyperPod Login Node Sessions Changed",
                        "detail": json.loads(session_changes.announcement(
                            CLUSTER, report, received, user_sessions.announced_users(sync))["Detail"])}
        sys.path.insert(0, str(REPO_ROOT / "functions/session_limits"))
        try:
            import check_reported_sessions
        finally:
            sys.path.pop(0)
        # A warm container's clients, built before the work; moto's SSM backend loads its own data on first use.
        client("ssm").describe_parameters(MaxResults=1)
        for service in ("dynamodb", "stepfunctions", "ssm"):
            calls.register(client(service))
        logs = io.StringIO()
        handler = check_reported_sessions.logger.registered_handler
        stream = handler.setStream(logs)
        try:
            checked, check_peak = _traced(lambda: check_reported_sessions.check_reported_sessions(announcement, _Context()))
        finally:
            handler.setStream(stream)
        check_calls = dict(sorted(calls.counts.items()))
        for service in ("dynamodb", "stepfunctions", "ssm"):
            calls.unregister(client(service))
        # Before per-user items, the check read every node's report: the eventually consistent Query of
        # the node-report partition (half a 4 KB unit per 4 KB of the page), the announcing node's item
        # strongly consistent, the ledger's Query (empty: one unit).
        busy_item = next(size for item, size in zip(items, item_sizes) if item["sk"]["S"].endswith(nodes[0]))
        before_units = 0.5 * math.ceil(sum(item_sizes) / 4096) + math.ceil(busy_item / 4096) + 1

        # The run's SSH half, fed the same store: what it tells each node.
        def run_decision():
            state = node_sessions.read_cluster_state("state", CLUSTER, now)
            decision = decide_cluster_wide(state.nodes.ssh, (), LimitPolicy(default_max=default_limit), (),
                                           state.nodes.unlisted)
            written = node_sessions.instruct_nodes(CLUSTER, decision.ssh_to_end, state.nodes.ssh, [])
            return decision, written
        (decision, written), run_peak = _traced(run_decision)
        ended = [[s.instance_id, s.handle] for s in decision.ssh_to_end]
        from hpops_core.node_channel import contract

        document = json.loads(boto3.client("ssm").get_parameter(
            Name=contract.end_sessions_parameter(CLUSTER, nodes[0]))["Parameter"]["Value"])
        ended_right = (change.changed and ended == [[nodes[0], crossing.handle]] and written == {nodes[0]: 1}
                       and parse_end_sessions(document) == [(crossing.handle, OVER_USER)])
        reset_clients()

    targets_right = _targets_right(login_nodes)
    peaks = {"RecordNodeReportFunction": record_peak, "CheckReportedSessionsFunction": check_peak,
             "EnforceSessionLimitsFunction": run_peak}
    functions = template.functions()
    default_memory = template.raw["Globals"]["Function"]["MemorySize"]
    memory = {name: int(functions[name].properties.get("MemorySize", default_memory)) for name in FUNCTIONS}
    log_bytes = len(logs.getvalue().encode())
    heartbeat_units = {"read": heartbeat.read_units, "write": heartbeat.write_units}
    change_units = change_calls.write_units - heartbeat.write_units  # the users' items, beyond the presence
    row = ScaleRow(
        login_nodes, users, logged_in, sum(len(v) for v in placed.values()) + 1, len(listed_by_node[nodes[0]]),
        busiest_listed, max(report_bytes), max(event_bytes), max(item_sizes), round(sum(item_sizes) / len(item_sizes)),
        check_calls, calls.read_units, calls.items_read, calls.bytes_read, before_units, len(items), sum(item_sizes),
        change_units, {k: v for k, v in sorted(change_calls.counts.items())}, heartbeat_units,
        bool(checked["start"] and checked["users"] == [OVER_USER] and checked["read"] == [OVER_USER]),
        ended, ended_right, targets_right,
        {name: round(baseline_mb[name] + peaks[name], 1) for name in FUNCTIONS}, memory, log_bytes, 0.0, {})
    # Priced from the stored figures alone, as `python -m hpops_twin.cost_model` prices them again.
    row.cost = scale_row_cost(asdict(row))
    row.monthly_usd = row.cost["automation_usd"]
    return row


def _targets_right(login_nodes: int) -> bool:
    """LoginNodeSync's plan at this many login nodes, one replaced: the new IP in, the old out, the rest kept."""
    from hpops_core.cluster.login_group import LoginNode
    from hpops_core.login_sync.target_plan import Target, plan_targets

    ips = [f"10.1.{n // 250}.{n % 250 + 4}" for n in range(login_nodes)]
    nodes = [LoginNode(f"i-{n:017x}", "Running", ip) for n, ip in enumerate(ips[1:], start=1)]
    nodes.append(LoginNode("i-0ffffffffffffffff", "Running", "10.9.9.9"))
    plan = plan_targets(nodes, [Target(ip, 22, "healthy") for ip in ips], 22, "InService", CLUSTER)
    return (plan.register, plan.deregister, set(plan.keep)) == (("10.9.9.9",), (ips[0],), set(ips[1:]))


def scale_rows() -> list[ScaleRow]:
    baseline = import_peaks_mb()
    return [measure_size(nodes, users, logged_in, baseline) for nodes, users, logged_in in SIZES]


def render(rows: list[ScaleRow]) -> str:
    header = (f"{'sessions at scale':<30} {'sessions':>8} {'busiest':>7} {'listed':>6} {'report KB':>9} {'item KB':>7} "
              f"{'check reads before':>22} {'check reads now':>18} {'WU/change':>9} {'ended':>5} {'targets':>7} "
              f"{'USD/month':>9}  peak MB / MemorySize")
    lines = [header, "-" * len(header)]
    for r in rows:
        peaks = ", ".join(f"{name.removesuffix('Function')} {r.peak_mb[name]:.0f}/{r.memory_mb[name]}" for name in FUNCTIONS)
        before = f"{r.before_items_read} it {r.before_bytes_read / 1024:.0f} KB {r.before_read_units:.1f} RU"
        now = f"{r.check_items_read} it {r.check_bytes_read / 1024:.1f} KB {r.check_read_units:.1f} RU"
        lines.append(f"{f'{r.login_nodes} login nodes, {r.users:,} users':<30} {r.sessions:>8,} {r.busiest_node_sessions:>7,} "
                     f"{r.busiest_node_listed:>6,} {r.max_report_bytes / 1024:>9.1f} {r.max_item_bytes / 1024:>7.1f} "
                     f"{before:>22} {now:>18} {r.change_write_units:>9.0f} "
                     f"{'yes' if r.ended_right else 'NO':>5} {'yes' if r.targets_right else 'NO':>7} "
                     f"{r.monthly_usd:>9.2f}  {peaks}")
    lines.append(f"(limits: EventBridge entry {EVENTBRIDGE_ENTRY_BYTES // 1024} KB, Lambda asynchronous payload "
                 f"{LAMBDA_ASYNC_PAYLOAD_BYTES // 1024} KB, DynamoDB item {DYNAMODB_ITEM_BYTES // 1024} KB; every report "
                 f"also reads and writes its node's presence: {rows[0].heartbeat_extra_units}; check calls: "
                 + "; ".join(f"{r.login_nodes} nodes " + ", ".join(f"{k}={v}" for k, v in r.check_calls.items()) for r in rows)
                 + "; the change's writes: " + "; ".join(f"{r.login_nodes} nodes " + ", ".join(
                     f"{k}={v}" for k, v in r.change_writes.items()) for r in rows) + ")")
    return "\n".join(lines)


def verdicts_of(rows: list[ScaleRow]) -> dict[str, bool]:
    sizes = " / ".join(f"{r.login_nodes}" for r in rows)
    return {
        f"sessions at scale: at {sizes} login nodes a login over the limit on the busiest node is checked and ended, nobody else's":
            all(r.check_started and r.ended_right for r in rows),
        "sessions at scale: a session change reads that user's items, the ledger and a small presence item per "
        "login node, far less than every node's report":
            all(r.check_items_read == r.login_nodes + 2  # the presences and the user's items on 2 nodes (ledger empty)
                and r.check_read_units <= 2 + math.ceil(r.login_nodes * PRESENCE_ITEM_BYTES / 4096)
                and r.check_read_units < r.before_read_units / 2 for r in rows),
        f"sessions at scale: targets right at {sizes} login nodes": all(r.targets_right for r in rows),
        "sessions at scale: every report and stored item within EventBridge's, Lambda's and DynamoDB's limits":
            all(r.max_report_bytes < EVENTBRIDGE_ENTRY_BYTES and r.max_event_bytes < LAMBDA_ASYNC_PAYLOAD_BYTES
                and r.max_item_bytes < DYNAMODB_ITEM_BYTES for r in rows),
        "sessions at scale: each function's peak memory under its MemorySize at every size":
            all(r.peak_mb[n] < r.memory_mb[n] for r in rows for n in FUNCTIONS),
    }


def record(rows: list[ScaleRow]) -> dict[str, Any]:
    return {"rows": [asdict(r) for r in rows], "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def scale_sessions_section() -> tuple[list[ScaleRow], dict[str, bool]]:
    rows = scale_rows()
    print()
    print(render(rows), flush=True)
    return rows, verdicts_of(rows)


def main(argv: list[str]) -> int:
    """Run this section alone; `--merge FILE` also replaces only its key in that bench JSON file."""
    rows, verdicts = scale_sessions_section()
    return run_alone(argv, verdicts, {KEY: record(rows)})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
