"""What the stack costs to run a month, at its default settings, for one cluster.

Computed from docs/bench.json's measured counts (calls, state transitions and seconds per
execution, agent calls per poll) times how often each thing happens at the template's default
schedules, times list prices (list_prices.json: us-east-1, with their date and source), over a
730-hour month and without free tiers. Where the bench does not count something (Lambda
invocations per execution, log bytes), the line says how it is estimated. `make bench` writes the
table into docs/bench.json under "cost"; `python -m hpops_twin.cost_model docs/bench.json`
recomputes only the costs from the counts already there: that key, and each sessions-at-scale
size's month (scale_row_cost), without measuring again.
"""

from __future__ import annotations

import json
import math
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from hpops_core.common.observability import ALARMED_METRICS
from hpops_twin.template_model import REPO_ROOT, Resolver, TemplateModel

PRICES_PATH = Path(__file__).with_name("list_prices.json")
HOURS_PER_MONTH = 730
LOGIN_NODES = 4
# Not counted by the bench: bytes written to CloudWatch Logs per Lambda invocation (Powertools'
# JSON log lines plus one figures line), an estimate from the handlers' log calls.
LOG_BYTES_PER_INVOCATION = 1024
# An SSH front door moves little: the NLB's capacity units are estimated at 0.1 an hour.
NLCU_PER_HOUR = 0.1


@dataclass(frozen=True)
class Line:
    item: str
    quantity: float
    unit: str
    usd: float
    how: str
    optional: str = ""  # the parameter that switches this line off, if any


def per_month(schedule: str) -> float:
    """How many times a `rate(N unit)` schedule fires in a 730-hour month."""
    match = re.fullmatch(r"rate\((\d+) (minute|minutes|hour|hours|day|days)\)", schedule.strip())
    if not match:
        raise ValueError(f"not a rate() schedule: {schedule!r}")
    minutes = int(match.group(1)) * {"minute": 1, "hour": 60, "day": 1440}[match.group(2).rstrip("s")]
    return HOURS_PER_MONTH * 60 / minutes


def emitted_metrics(root: Path = REPO_ROOT, parameters: dict | None = None) -> list[tuple[str, str]]:
    """Distinct (service, metric name) pairs the handlers emit through Powertools: every metric
    carries the dimensions service and cluster, so each pair is one CloudWatch custom metric.
    ``parameters``: only the functions the stack creates with them (default: every function)."""
    template = TemplateModel()
    default_service = template.raw["Globals"]["Function"]["Environment"]["Variables"]["POWERTOOLS_SERVICE_NAME"]
    live = set(_resources(template, "AWS::Serverless::Function", parameters)) if parameters else None
    found: set[tuple[str, str]] = set()
    for logical_id, resource in template.of_type("AWS::Serverless::Function").items():
        if live is not None and logical_id not in live:
            continue
        props = resource["Properties"]
        service = props.get("Environment", {}).get("Variables", {}).get("POWERTOOLS_SERVICE_NAME", default_service)
        module = props["Handler"].rsplit(".", 1)[0].replace(".", "/") + ".py"
        source = (root / props["CodeUri"] / module).read_text(encoding="utf-8")
        names = re.findall(r'add_metric\(name="(\w+)"(?: if .*? else "(\w+)")?', source)
        names += re.findall(r'\(\("(\w+)", "\w+"\), \("(\w+)", "\w+"\), \("(\w+)", "\w+"\)\)', source)
        for group in names:
            found |= {(service, name) for name in group if name}
        if "TaskResult" in source or ".emit(metrics" in source:
            found |= {(service, name) for name in _task_result_metrics(root, source)}
    return sorted(found)


def _task_result_metrics(root: Path, source: str) -> set[str]:
    """Metric names the session-limits sweep hands back in its TaskResult (EnforcementReport.metrics)."""
    if "enforce" not in source:
        return set()
    enforce = (root / "layers/hpops_core/hpops_core/session_limits/enforce.py").read_text(encoding="utf-8")
    return set(re.findall(r'^\s+"([A-Z]\w+)": (?:len\(|self\.)', enforce, re.M))


def _resources(template: TemplateModel, resource_type: str, parameters: dict) -> list[str]:
    """Logical ids of a type that the stack creates with these parameters (Conditions resolved)."""
    resolver = Resolver(template.raw, parameters, "us-east-1", "123456789012", "hpops")
    return [name for name, resource in template.of_type(resource_type).items()
            if not resource.get("Condition") or resolver.condition(resource["Condition"])]


def _dimension(template: TemplateModel, alarm: str, name: str) -> str:
    return next(d["Value"] for d in template.raw["Resources"][alarm]["Properties"]["Dimensions"] if d["Name"] == name)


def _lambda_tasks(asl: str, skipped: int = 0) -> int:
    """Task states of an ASL file, less ``skipped`` ones the parameters keep an execution out of."""
    return (REPO_ROOT / "statemachines" / asl).read_text(encoding="utf-8").count('"Type": "Task"') - skipped


# The month as it was priced before the cost work (docs/bench.json of 2026-11-24): 46 custom metrics, one per
# name a handler counted; SweepSchedule every 10 minutes, SessionSweepSchedule every 5 and a session sweep
# priced at every state of its ASL (10). Kept so the table shows, per line, what each change gave.
_BEFORE_LINES = {  # item: (USD at the defaults, USD with the optional parts off)
    "Step Functions standard state transitions": (4.01, 3.98), "Lambda requests": (0.02, 0.02),
    "Lambda compute (arm64)": (0.08, 0.08), "DynamoDB on-demand writes": (0.05, 0.02), "DynamoDB on-demand reads": (0.0, 0.0),
    "EventBridge custom-bus events": (0.02, 0.02), "CloudWatch custom metrics": (13.8, 11.4), "CloudWatch alarms": (1.0, 1.0),
    "CloudWatch dashboard": (3.0, 0.0), "CloudWatch Logs ingestion": (0.06, 0.05), "X-Ray traces": (0.54, 0.52),
    "KMS": (1.0, 1.0), "Secrets Manager": (0.8, 0.8), "Cost Explorer requests": (0.3, 0.0),
    "SSM parameters and GetParameters": (0.0, 0.0), "Network Load Balancer": (16.86, 16.86),
}
BEFORE = {
    "defaults": {"lines": {item: usd[0] for item, usd in _BEFORE_LINES.items()},
                 "automation_usd": 24.69, "with_load_balancer_usd": 41.55},
    "lean": {"lines": {item: usd[1] for item, usd in _BEFORE_LINES.items()},
             "automation_usd": 18.89, "with_load_balancer_usd": 35.75},
}
# The goals: every feature on (dashboard, per-user spend, session limits, certificates) and the optional parts off.
GOAL_EVERY_FEATURE_USD, GOAL_LEAN_USD = 10.0, 5.0
# At a real cluster's size (activity_cost), from the KMS key's year 3 on, in a healthy month: the defaults with
# 100 users logged in, and 12 login nodes with 2,000 users (500 logged in).
GOAL_100_USERS_USD, GOAL_2000_USERS_USD = 10.0, 20.0

# A metric is billed only for the hours it is sent, and sent only when non-zero (ALARMED_METRICS). Sent in normal
# operation, so priced all month in a healthy month: LoginImbalance, which load-aware admission's default dry-run
# reports whenever the nodes' load is uneven (conservatively: all month). The others are failures: a month one of
# them is sent is a month the operator is paged, so a healthy month has none; "every alarm all month" (the upper
# bound) prices every one of them all month as well.
SENT_IN_A_HEALTHY_MONTH = frozenset({"LoginImbalance"})
SENT_ONLY_ON_FAILURE = frozenset({"HostIdentityRejected", "LoginLimitsPushFailed", "SafetyGuardTripped",
                                  "LeaveNoticesFailed", "HostCertificateRenewalFailed"})


def cost_table(bench: dict, overrides: dict | None = None, prices: dict | None = None) -> dict:
    """The month's lines and totals with the template's defaults, changed by `overrides`
    (parameter -> value, e.g. {"CreateDashboard": "false"})."""
    recorded = prices or json.loads(PRICES_PATH.read_text(encoding="utf-8"))
    p = {k: v["usd"] for k, v in recorded["prices"].items()}
    template = TemplateModel()
    defaults = template.parameter_defaults() | (overrides or {})
    memory_gb = template.raw["Globals"]["Function"]["MemorySize"] / 1024

    sync = next(r for r in bench["rows"] if r["scenario"] == "idle sweep")
    session = next(r for r in bench["session_limits"] if r["scenario"].startswith("sweep, warm"))
    # The session-limit bound's sweep-only row is one idle-enough sweep execution, its transitions counted.
    session_transitions = next(r["transitions"] for r in bench["session_limit_bound"]["rows"] if r["checks"] == "sweep only")
    user_spend = defaults["UserSpendEnabled"] == "true"
    # Without per-user spend the sweep skips CheckUserSpend (measured in a stack of its own), the
    # controller ships no usage, and nothing asks Cost Explorer on the hourly path.
    budget = next(r for r in bench["budget_guard"] if r["scenario"] == (
        "hourly sweep (DescribeCluster)" if user_spend else "hourly sweep, UserSpendEnabled=false"))
    budget_day = next(r for r in bench["budget_guard"] if r["scenario"].startswith("day of hourly sweeps"))
    usage = bench["usage"]["sweeps"][0]
    sweeps, session_sweeps, budget_sweeps = (per_month(defaults[k]) for k in
                                             ("SweepSchedule", "SessionSweepSchedule", "BudgetSweepSchedule"))
    heartbeats = LOGIN_NODES * HOURS_PER_MONTH * 3600 / 600  # each agent's report every 10 minutes
    polls = LOGIN_NODES * HOURS_PER_MONTH * 3600 / 30  # each agent reads its desired state every 30 s
    usage_runs = HOURS_PER_MONTH * 3600 / 900 if user_spend else 0  # the controller ships usage every 15 minutes
    # Load-aware admission's scheduled run (its schedule in template.yaml), measured with nothing to move.
    admission_fn = "LoginAdmissionFunction"
    admission_runs = (per_month(template.functions()[admission_fn].events[0].properties["Schedule"])
                      if admission_fn in _resources(template, "AWS::Serverless::Function", defaults) else 0)
    admission_idle = bench["admission"]["rows"][0]
    # Each usage part is written with its window's running total in one transaction (twice the write units
    # of each item, by size: 1 KB a unit), then the collector's status, and before it its writer's
    # first-window marker (a conditional Put: a unit even when it writes nothing): per run, over its parts.
    usage_part_writes = usage["events"] * (2 * (math.ceil(usage["bytes_shipped"] / usage["events"] / 1024) + 1) + 2)
    user_tasks = 0 if user_spend else 2  # CheckUserSpend, PublishUserSpendAlert

    # Certificate mode adds its daily check of every registered node (measured with nothing due).
    daily = per_month("rate(1 day)") if defaults["HostIdentityMode"] == "certificate" else 0
    check = next(r for r in bench["rows"] if r["scenario"].startswith("cert mode: daily check"))
    transitions = (sweeps * sync["state_transitions"] + budget_sweeps * budget["state_transitions"]
                   + session_sweeps * session_transitions + daily * check["state_transitions"])
    invocations = (sweeps * _lambda_tasks("login_node_sync.asl.json") + budget_sweeps * _lambda_tasks("budget_guard.asl.json", user_tasks)
                   + session_sweeps * _lambda_tasks("session_limits.asl.json") + heartbeats + usage_runs + admission_runs)
    gb_seconds = memory_gb * (sweeps * sync["seconds"] + budget_sweeps * budget["seconds"]
                              + session_sweeps * session["lambda_seconds"] + (heartbeats + usage_runs) * 0.1
                              + admission_runs * admission_idle["seconds"])

    def calls(row: dict, prefix: str, kinds: tuple[str, ...]) -> int:
        return sum(v for k, v in row["calls"].items() if k.startswith(prefix) and k.split(".")[1] in kinds)

    writes = ("UpdateItem", "PutItem", "BatchWriteItem", "DeleteItem")
    reads = ("GetItem", "Query", "Scan", "BatchGetItem")
    ddb_writes = (sweeps * calls(sync, "dynamodb.", writes) + budget_sweeps * calls(budget, "dynamodb.", writes)
                  + session_sweeps * calls(session, "dynamodb.", writes) + heartbeats + usage_runs * usage_part_writes
                  + admission_runs * calls(admission_idle, "dynamodb.", writes))
    ddb_reads = (sweeps * calls(sync, "dynamodb.", reads) + budget_sweeps * calls(budget, "dynamodb.", reads)
                 + session_sweeps * calls(session, "dynamodb.", reads) + admission_runs * calls(admission_idle, "dynamodb.", reads)
                 + usage_runs * usage["events"])  # each part reads its window's running total
    # Measured over a day of hourly sweeps at CostExplorerMaxAgeHours' default; a shorter max age asks
    # proportionally more often, never more than once a sweep.
    ce_per_day = budget_day["calls"].get("cost-explorer.GetCostAndUsage", 0) if user_spend else 0
    ce_default_age = int(template.parameter_defaults()["CostExplorerMaxAgeHours"])
    ce_age = int(defaults["CostExplorerMaxAgeHours"])
    ce_requests = min(budget_sweeps, ce_per_day * ce_default_age / ce_age * HOURS_PER_MONTH / 24)
    metrics = emitted_metrics(parameters=defaults)
    alarms = _resources(template, "AWS::CloudWatch::Alarm", defaults)
    watched = {(_dimension(template, a, "service"), template.raw["Resources"][a]["Properties"]["MetricName"]) for a in alarms
               if template.raw["Resources"][a]["Properties"].get("Namespace") == "HyperPodLoginAutopilot"}
    # A metric is published only when ALARMED_METRICS names it, and billed only where an alarm of this stack
    # can want it: HostCertificateRenewalFailed is never non-zero outside certificate mode.
    published = [m for m in metrics if m[1] in ALARMED_METRICS and m in watched]
    healthy = [m for m in published if m[1] in SENT_IN_A_HEALTHY_MONTH]
    failures = sorted(name for _, name in published if name in SENT_ONLY_ON_FAILURE)
    metric_usd = p["cloudwatch_metric_per_month"]
    dashboards = _resources(template, "AWS::CloudWatch::Dashboard", defaults)
    keys = _resources(template, "AWS::KMS::Key", defaults)
    secrets = _resources(template, "AWS::SecretsManager::Secret", defaults)
    log_gb = invocations * LOG_BYTES_PER_INVOCATION / 1e9
    traces = invocations - heartbeats * (1 - _traced("RecordNodeReportFunction", template))
    nlb = _resources(template, "AWS::ElasticLoadBalancingV2::LoadBalancer", defaults)

    lines = [
        Line("Step Functions standard state transitions", transitions, "transitions",
             transitions / 1000 * p["stepfunctions_standard_per_1k_transitions"],
             f"measured: {sync['state_transitions']} per idle LoginNodeSync sweep, {budget['state_transitions']} per hourly "
             f"budget sweep, {session_transitions} per session sweep"
             + (f", {check['state_transitions']} per daily certificate check" if daily else "")),
        Line("Lambda requests", invocations, "invocations", invocations / 1e6 * p["lambda_per_1m_requests"],
             "estimate: every Task state of each swept state machine once, plus one per node report and usage report"
             + (", plus load-aware admission's run every 5 minutes" if admission_runs else "")),
        Line("Lambda compute (arm64)", gb_seconds, "GB-seconds", gb_seconds * p["lambda_arm64_per_gb_second"],
             f"measured seconds per sweep in the twin x {memory_gb * 1024:.0f} MB; reports 0.1 s each (estimate)"),
        Line("DynamoDB on-demand writes", ddb_writes, "write units", ddb_writes / 1e6 * p["dynamodb_on_demand_per_1m_write_units"],
             "measured per sweep; one per node report; per usage part, its item and its window's total in a "
             "transaction (2x), the collector's status and its writer's first-window marker"
             + ("; one per admission run" if admission_runs else "")),
        Line("DynamoDB on-demand reads", ddb_reads, "read units", ddb_reads / 1e6 * p["dynamodb_on_demand_per_1m_read_units"],
             "measured per sweep" + (" and admission run" if admission_runs else "")),
        Line("EventBridge custom-bus events", heartbeats + usage_runs, "events",
             (heartbeats + usage_runs) / 1e6 * p["eventbridge_custom_per_1m_events"],
             f"{LOGIN_NODES} login-node agents report every 10 minutes; the controller ships usage every 15 minutes; "
             "scheduled rules are free"),
        Line("CloudWatch custom metrics", len(healthy), "metrics", len(healthy) * metric_usd,
             f"only the metrics an alarm watches, sent only when non-zero and billed by the hours they are sent: "
             + (f"{', '.join(n for _, n in healthy)} all month (normal operation); " if healthy else "")
             + (f"{', '.join(failures)} $0 in a healthy month (one sent pages the operator; every alarm all month: "
                f"{len(published)} metrics, ${len(published) * metric_usd:.2f}); " if failures else "")
             + f"the other {len(metrics) - len(published)} figures are one log line per invocation, which the dashboard "
             "queries"),
        Line("CloudWatch alarms", len(alarms), "alarms", len(alarms) * p["cloudwatch_standard_alarm_per_month"],
             "the template's alarms at its defaults"),
        Line("CloudWatch dashboard", len(dashboards), "dashboards", len(dashboards) * p["cloudwatch_dashboard_per_month"],
             "the operator dashboard", optional="CreateDashboard"),
        Line("CloudWatch Logs ingestion", log_gb, "GB", log_gb * p["cloudwatch_logs_ingest_per_gb"],
             f"estimate: {LOG_BYTES_PER_INVOCATION} bytes per Lambda invocation; state machines log errors only"),
        Line("X-Ray traces", traces, "traces", traces / 1e6 * p["xray_per_1m_traces"],
             "Tracing: Active but on the per-report functions (PassThrough); at most one trace per traced "
             "invocation (before the free 100,000)"),
        Line("KMS", len(keys), "keys", len(keys) * p["kms_key_per_month"],
             "one customer managed key; requests only when a node fetches changed keys (a few a month)"),
        Line("Secrets Manager", len(secrets), "secrets", len(secrets) * p["secretsmanager_secret_per_month"],
             "agents read the secret only when its version changes (a few calls a month)"),
        Line("Cost Explorer requests", ce_requests, "requests", ce_requests * p["cost_explorer_per_request"],
             f"measured: {ce_per_day} per day of hourly budget sweeps (the answer is kept "
             f"CostExplorerMaxAgeHours={ce_age} h); plus one per scale-out, not counted (a few a month)",
             optional="UserSpendEnabled"),
        Line("SSM parameters and GetParameters", polls, "agent polls", 0.0,
             "standard parameters and standard-throughput calls are free"),
    ]
    automation = sum(line.usd for line in lines)
    every_alarm = automation + (len(published) - len(healthy)) * metric_usd  # the failure metrics sent all month
    lb = [Line("Network Load Balancer", len(nlb) * HOURS_PER_MONTH, "hours",
               len(nlb) * HOURS_PER_MONTH * (p["nlb_per_hour"] + NLCU_PER_HOUR * p["nlb_per_nlcu_hour"]),
               f"hourly charge plus {NLCU_PER_HOUR} NLCU an hour (estimate for SSH traffic); none with ExistingTargetGroupArn")]
    return {"parameters": dict(sorted((overrides or {}).items())),
            "lines": [asdict(line) | {"usd": round(line.usd, 2)} for line in lines + lb],
            "per_1000_events": per_1000_events(bench, p, memory_gb),
            "metrics": [f"{service}/{name}" for service, name in metrics],
            "automation_usd": round(automation, 2),
            "with_load_balancer_usd": round(automation + lb[0].usd, 2),
            # The upper bound: every alarmed metric sent all month (a month of pages).
            "every_alarm_all_month": {"metrics": len(published), "automation_usd": round(every_alarm, 2),
                                      "with_load_balancer_usd": round(every_alarm + lb[0].usd, 2)},
            "login_nodes": LOGIN_NODES, "hours_per_month": HOURS_PER_MONTH,
            "prices_recorded": recorded["recorded"], "region": recorded["region"]}


def per_1000_events(bench: dict, p: dict, memory_gb: float) -> dict[str, float]:
    """What users' logins add, which the month's table cannot count (it depends on how often they log
    in), in USD per 1,000: a node leaving or rejoining rotation by load-aware admission (the sync it
    starts: measured transitions and Lambda tasks, about 0.1 s each), a session list that changed on a node (one default-bus event, one
    CheckReportedSessions invocation of about 0.1 s, its 3 strongly consistent reads: the ledger, the nodes' presence
    and the user's items; the user's item written; the scale bench measures them by item size at more nodes,
    activity_cost) and a crossing of a limit (one
    SessionLimits execution: its measured transitions and its 2 Lambda tasks, about 0.5 s)."""
    bound = bench.get("session_limit_bound")
    if not bound:
        return {}
    moves = [r for r in bench.get("admission", {}).get("rows", []) if r["moves"]]
    move = (sum(r["state_transitions"] for r in moves) / len(moves) / 1000 * p["stepfunctions_standard_per_1k_transitions"]
            # the sync's Lambda tasks: the admission run that started it happens every 5 minutes anyway
            + sum(r["lambda_invocations"] - 1 for r in moves) / len(moves) * (p["lambda_per_1m_requests"] / 1e6
                                                                         + 0.1 * memory_gb * p["lambda_arm64_per_gb_second"])
            ) if moves else None
    change = (p["eventbridge_custom_per_1m_events"] / 1e6 + p["lambda_per_1m_requests"] / 1e6
              + 0.1 * memory_gb * p["lambda_arm64_per_gb_second"] + 3 * p["dynamodb_on_demand_per_1m_read_units"] / 1e6
              + p["dynamodb_on_demand_per_1m_write_units"] / 1e6)
    crossing = (bound["transitions_per_crossing"] / 1000 * p["stepfunctions_standard_per_1k_transitions"]
                + 2 * p["lambda_per_1m_requests"] / 1e6 + 0.5 * memory_gb * p["lambda_arm64_per_gb_second"])
    return {"session_list_changes": round(1000 * change, 4), "crossings": round(1000 * crossing, 4)} | (
        {"admission_moves": round(1000 * move, 4)} if move is not None else {})


# What grows with login nodes and logged-in users (scale_sessions_bench measures the sizes it takes).
# Assumed, not measured: how often users log in and out, how often the dashboard is opened, how many bytes
# an SSH session moves. Everything else comes from the bench's measured items, reads and log lines.
SESSION_CHANGES_PER_ACTIVE_USER_PER_MONTH = 4 * 30  # a login and a logout, twice a day
DASHBOARD_VIEWS_PER_MONTH = 100
DASHBOARD_HOURS = 3  # CloudWatch's default time range: each view's queries scan the last 3 hours
SSH_MB_PER_ACTIVE_USER_HOUR = 20  # interactive shells, editors, small copies; large copies go elsewhere
HEARTBEAT_SECONDS = 600
RECORD_LOG_BYTES = 400  # RecordNodeReport's "node report recorded" line (JSON, Powertools' keys)
LAMBDA_SECONDS_PER_REPORT = 0.1


def _write_units(item_bytes: float) -> int:
    return max(1, math.ceil(item_bytes / 1024))


def activity_cost(login_nodes: int, active_users: int, mean_item_bytes: float, max_report_bytes: int,
                  check_read_units: float, check_log_bytes: int, bench: dict | None = None,
                  prices: dict | None = None, report_extra_units: dict | None = None,
                  change_write_units: float = 0.0) -> dict:
    """The month at the defaults with `login_nodes` and `active_users` logged in: the default table's
    automation (4 login nodes' heartbeats taken out) plus every login node's heartbeats and users'
    session changes by measured item size, read kind and log bytes; the dashboard's Logs Insights
    scans; the KMS key by year of rotation; the load balancer's capacity units by bytes.

    ``report_extra_units``: {"read", "write"} units every report adds beyond its own item (the node's
    presence, node_channel/user_sessions.py); ``change_write_units``: what a session change writes
    beyond that (the changed users' items). Both measured by scale_sessions_bench."""
    extra = report_extra_units or {"read": 0.0, "write": 0.0}
    recorded = prices or json.loads(PRICES_PATH.read_text(encoding="utf-8"))
    p = {k: v["usd"] for k, v in recorded["prices"].items()}
    bench = bench if bench is not None else json.loads((REPO_ROOT / "docs" / "bench.json").read_text(encoding="utf-8"))
    template = TemplateModel()
    memory_gb = template.raw["Globals"]["Function"]["MemorySize"] / 1024
    base = cost_table(bench)
    per_heartbeat_base = (p["lambda_per_1m_requests"] / 1e6 + p["dynamodb_on_demand_per_1m_write_units"] / 1e6
                          + p["eventbridge_custom_per_1m_events"] / 1e6 + _traced("RecordNodeReportFunction", template)
                          * p["xray_per_1m_traces"] / 1e6 + LOG_BYTES_PER_INVOCATION / 1e9 * p["cloudwatch_logs_ingest_per_gb"]
                          + LAMBDA_SECONDS_PER_REPORT * memory_gb * p["lambda_arm64_per_gb_second"])
    base_heartbeats = LOGIN_NODES * HOURS_PER_MONTH * 3600 / HEARTBEAT_SECONDS
    heartbeats = login_nodes * HOURS_PER_MONTH * 3600 / HEARTBEAT_SECONDS
    changes = active_users * SESSION_CHANGES_PER_ACTIVE_USER_PER_MONTH
    chunks = math.ceil(max_report_bytes / (64 * 1024))  # EventBridge bills an event per 64 KB chunk
    record_traced = _traced("RecordNodeReportFunction", template)
    check_traced = _traced("CheckReportedSessionsFunction", template)

    def report(count: float) -> float:  # one report: its event, RecordNodeReport, its item written, its log line
        return count * (chunks * p["eventbridge_custom_per_1m_events"] / 1e6 + p["lambda_per_1m_requests"] / 1e6
                        + LAMBDA_SECONDS_PER_REPORT * memory_gb * p["lambda_arm64_per_gb_second"]
                        + (_write_units(mean_item_bytes) + extra["write"]) * p["dynamodb_on_demand_per_1m_write_units"] / 1e6
                        + extra["read"] * p["dynamodb_on_demand_per_1m_read_units"] / 1e6
                        + record_traced * p["xray_per_1m_traces"] / 1e6
                        + RECORD_LOG_BYTES / 1e9 * p["cloudwatch_logs_ingest_per_gb"])
    per_change = (report(1) + change_write_units * p["dynamodb_on_demand_per_1m_write_units"] / 1e6
                  + p["eventbridge_custom_per_1m_events"] / 1e6 + p["lambda_per_1m_requests"] / 1e6
                  + LAMBDA_SECONDS_PER_REPORT * memory_gb * p["lambda_arm64_per_gb_second"]
                  + check_read_units * p["dynamodb_on_demand_per_1m_read_units"] / 1e6
                  + check_traced * p["xray_per_1m_traces"] / 1e6
                  + check_log_bytes / 1e9 * p["cloudwatch_logs_ingest_per_gb"])
    base_logs = next(line["quantity"] for line in base["lines"] if line["item"] == "CloudWatch Logs ingestion")
    logged_gb = (base_logs - base_heartbeats * LOG_BYTES_PER_INVOCATION / 1e9
                 + (heartbeats + changes) * RECORD_LOG_BYTES / 1e9 + changes * check_log_bytes / 1e9)
    dashboards = len(_resources(template, "AWS::CloudWatch::Dashboard", template.parameter_defaults()))
    queries = template.raw["Resources"]["OperatorDashboard"]["Properties"]["DashboardBody"]["Fn::Sub"][0].count('"query": "SOURCE')
    scanned_gb = dashboards * DASHBOARD_VIEWS_PER_MONTH * queries * logged_gb * DASHBOARD_HOURS / HOURS_PER_MONTH
    rotation_days = int(template.parameter_defaults()["KeyRotationPeriodDays"])
    kms_by_year = kms_rotation_by_year(rotation_days, p)
    ssh_gb_hours = active_users * SSH_MB_PER_ACTIVE_USER_HOUR / 1024
    nlcu = max(ssh_gb_hours, NLCU_PER_HOUR)  # TCP: 1 GB an hour per NLCU (connections and flows stay far below theirs)
    lines = [
        Line("the default table, less 4 login nodes' heartbeats", 1, "month", base["automation_usd"] - base_heartbeats * per_heartbeat_base,
             "cost_table at the defaults, a healthy month"),
        Line("login-node heartbeats", heartbeats, "reports", report(heartbeats),
             f"{login_nodes} agents every {HEARTBEAT_SECONDS} s: event ({chunks} x 64 KB), RecordNodeReport, "
             f"{_write_units(mean_item_bytes)} write units (mean item {mean_item_bytes / 1024:.1f} KB) and the node's "
             f"presence ({extra['read']:g} read, {extra['write']:g} write units, measured), its log line"),
        Line("session changes", changes, "changes", changes * per_change,
             f"{active_users} users logged in, {SESSION_CHANGES_PER_ACTIVE_USER_PER_MONTH} changes each (assumed): a report "
             f"and {change_write_units:g} write units of the changed user's items (measured), "
             f"the announcement, CheckReportedSessions with {check_read_units:.1f} read units (measured) and "
             f"{check_log_bytes} log bytes (measured)"),
        Line("Logs Insights scans", scanned_gb, "GB scanned", scanned_gb * p["cloudwatch_logs_insights_per_gb_scanned"],
             f"{DASHBOARD_VIEWS_PER_MONTH} dashboard views (assumed) x {queries} queries over {DASHBOARD_HOURS} h of "
             f"{logged_gb:.2f} GB a month of logs"),
        Line("KMS key rotation", kms_by_year[3], "USD in year 3", kms_by_year[3],
             f"rotated every {rotation_days} days: +${kms_by_year[1]:.0f} in year 1, +${kms_by_year[2]:.0f} in year 2, "
             f"+${kms_by_year[3]:.0f} in year 3, +${kms_by_year[10]:.0f} in year 10 (the first two rotations add $1 a month each)"),
    ]
    automation = sum(line.usd for line in lines)
    # The upper bound: the default table's failure metrics sent all month too.
    paged = base["every_alarm_all_month"]["automation_usd"] - base["automation_usd"]
    lb = Line("Network Load Balancer", HOURS_PER_MONTH, "hours",
              HOURS_PER_MONTH * (p["nlb_per_hour"] + nlcu * p["nlb_per_nlcu_hour"]),
              f"hourly charge plus {nlcu:.2f} NLCU an hour: {active_users} users x {SSH_MB_PER_ACTIVE_USER_HOUR} MB an hour (assumed)")
    return {"lines": [asdict(line) | {"usd": round(line.usd, 2)} for line in lines + [lb]],
            "automation_usd": round(automation, 2),
            "automation_by_year_usd": {str(y): round(automation - kms_by_year[3] + kms_by_year[y], 2) for y in kms_by_year},
            "every_alarm_all_month_by_year_usd": {str(y): round(automation + paged - kms_by_year[3] + kms_by_year[y], 2)
                                                  for y in kms_by_year},
            # The same month with the key rotated at KMS's shortest default (a year) and its longest period.
            "automation_by_rotation_usd": {str(days): {str(y): round(automation - kms_by_year[3] + usd, 2)
                                                      for y, usd in kms_rotation_by_year(days, p).items()}
                                           for days in ROTATION_CHOICES_DAYS},
            "with_load_balancer_usd": round(automation + lb.usd, 2),
            "per_1000_session_changes_usd": round(1000 * per_change, 4),
            "per_active_user_usd": round(SESSION_CHANGES_PER_ACTIVE_USER_PER_MONTH * per_change, 4),
            "load_balancer_per_active_user_usd": round(SSH_MB_PER_ACTIVE_USER_HOUR / 1024 * HOURS_PER_MONTH
                                                       * p["nlb_per_nlcu_hour"], 4)}


def scale_row_cost(row: dict, bench: dict | None = None, prices: dict | None = None) -> dict:
    """activity_cost for one size of the sessions-at-scale section (docs/bench.json's scale_sessions rows), from
    the figures it measured and stored: the month can be priced again without measuring again."""
    return activity_cost(login_nodes=row["login_nodes"], active_users=row["logged_in"],
                         mean_item_bytes=row["mean_item_bytes"], max_report_bytes=row["max_report_bytes"],
                         check_read_units=row["check_read_units"], check_log_bytes=row["check_log_bytes"], bench=bench,
                         prices=prices, report_extra_units=row["heartbeat_extra_units"],
                         change_write_units=row["change_write_units"])


def budget_sweep_cost(read_units: float, write_units: float, prices: dict | None = None) -> dict:
    """A month of hourly budget sweeps (BudgetSweepSchedule's default) whose check and SendUserAlerts'
    Query take these DynamoDB units each (scale_budget_bench measures them per size: the running total
    read, the windows settled since folded in and kept again, the last day's windows, the empty queue)."""
    recorded = prices or json.loads(PRICES_PATH.read_text(encoding="utf-8"))
    p = {k: v["usd"] for k, v in recorded["prices"].items()}
    sweeps = per_month(TemplateModel().parameter_defaults()["BudgetSweepSchedule"])
    usd = sweeps * (read_units * p["dynamodb_on_demand_per_1m_read_units"]
                    + write_units * p["dynamodb_on_demand_per_1m_write_units"]) / 1e6
    return {"sweeps": sweeps, "read_units": sweeps * read_units, "write_units": sweeps * write_units, "usd": round(usd, 4)}


YEARS = (1, 2, 3, 10)
ROTATION_CHOICES_DAYS = (365, 2560)  # KeyRotationPeriodDays' default, and KMS's longest period


def kms_rotation_by_year(rotation_days: int, p: dict) -> dict[int, float]:
    """What the key's rotations add a month in each year (the first two rotations add $1 a month each, for good)."""
    return {year: p["kms_rotation_per_month"] * min(2, (year - 1) * 365 // rotation_days) for year in YEARS}


def _traced(function: str, template: TemplateModel) -> int:
    """1 when the function's invocations are X-Ray traces (Tracing: Active, its own or the Globals')."""
    props = template.raw["Resources"][function]["Properties"]
    return int(props.get("Tracing", template.raw["Globals"]["Function"].get("Tracing")) == "Active")


# What a platform team can switch off by parameter, losing only that part.
SWITCHES = ({"CreateDashboard": "false"}, {"UserSpendEnabled": "false"}, {"LoadAwareAdmission": "off"},
            {"LeaveNoticeMinutes": "off"})
LEAN = {k: v for switch in SWITCHES for k, v in switch.items()}
# Every feature on: the defaults already have the dashboard, per-user spend and session limits.
EVERY_FEATURE = {"HostIdentityMode": "certificate"}


def with_before(table: dict, before: dict) -> dict:
    """The table with each line's and total's figure before the cost work beside it."""
    lines = [line | {"before_usd": before["lines"].get(line["item"])} for line in table["lines"]]
    return table | {"lines": lines, "before_automation_usd": before["automation_usd"],
                    "before_with_load_balancer_usd": before["with_load_balancer_usd"]}


def cost_section(bench: dict) -> dict:
    """The defaults, each optional part switched off alone, all of them off, and every feature on."""
    def totals(table: dict) -> dict:
        return {k: table[k] for k in ("parameters", "automation_usd", "with_load_balancer_usd", "every_alarm_all_month")}
    return {"defaults": with_before(cost_table(bench), BEFORE["defaults"]),
            "switches": [totals(cost_table(bench, s)) for s in SWITCHES],
            "lean": with_before(cost_table(bench, LEAN), BEFORE["lean"]),
            "every_feature": totals(cost_table(bench, EVERY_FEATURE)),
            "goals": {"every_feature_usd": GOAL_EVERY_FEATURE_USD, "lean_usd": GOAL_LEAN_USD,
                      "100_users_usd": GOAL_100_USERS_USD, "2000_users_usd": GOAL_2000_USERS_USD}}


def render(table: dict) -> str:
    def before(value: float | None) -> str:
        return f"{value:>9.2f}" if value is not None else f"{'':>9}"
    lines = [f"{'item':<44} {'quantity':>12} {'unit':<12} {'before':>9} {'USD/month':>9}"]
    for line in table["lines"]:
        lines.append(f"{line['item']:<44} {line['quantity']:>12,.1f} {line['unit']:<12} "
                     f"{before(line.get('before_usd'))} {line['usd']:>9.2f}")
    lines.append(f"{'automation alone':<70} {before(table.get('before_automation_usd'))} {table['automation_usd']:>9.2f}")
    lines.append(f"{'with the load balancer':<70} {before(table.get('before_with_load_balancer_usd'))} "
                 f"{table['with_load_balancer_usd']:>9.2f}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """Recompute only the costs of a bench JSON file from the counts it already holds: its "cost" key, and
    each sessions-at-scale size's month (its cost and monthly_usd; that section's measuring takes minutes)."""
    path = Path(argv[0]) if argv else REPO_ROOT / "docs" / "bench.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    data["cost"] = cost_section(data)
    for row in data.get("scale_sessions", {}).get("rows", []):
        row["cost"] = json.loads(json.dumps(scale_row_cost(row, data)))
        row["monthly_usd"] = row["cost"]["automation_usd"]
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    cost = data["cost"]
    print(render(cost["defaults"]))
    upper = cost["defaults"]["every_alarm_all_month"]
    print(f"(a healthy month; every alarm's metric sent all month, the upper bound: ${upper['automation_usd']:.2f} alone, "
          f"${upper['with_load_balancer_usd']:.2f} with the load balancer)")
    print(f"\nwith {', '.join(f'{k}={v}' for k, v in LEAN.items())} (goal: at most ${GOAL_LEAN_USD:.2f})")
    print(render(cost["lean"]))
    every = cost["every_feature"]
    print(f"\nevery feature on ({', '.join(f'{k}={v}' for k, v in EVERY_FEATURE.items())}): ${every['automation_usd']:.2f} "
          f"alone, ${every['with_load_balancer_usd']:.2f} with the load balancer (goal: at most ${GOAL_EVERY_FEATURE_USD:.2f})")
    met = True
    for row in data.get("scale_sessions", {}).get("rows", []):
        goal = {100: GOAL_100_USERS_USD, 500: GOAL_2000_USERS_USD}.get(row["logged_in"])
        healthy, paged = row["cost"]["automation_by_year_usd"]["3"], row["cost"]["every_alarm_all_month_by_year_usd"]["3"]
        verdict = "" if goal is None else f" (goal: at most ${goal:.2f}: {'met' if healthy <= goal else 'MISSED'})"
        met = met and (goal is None or healthy <= goal)
        print(f"{row['login_nodes']} login nodes, {row['logged_in']:,} users logged in, from the key's year 3: "
              f"${healthy:.2f} a healthy month{verdict}; every alarm all month ${paged:.2f}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
