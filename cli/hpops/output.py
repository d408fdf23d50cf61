"""What the CLI prints about targets and executions (shared by the real stack and the twin)."""

from __future__ import annotations

import csv
import datetime as dt
import json
import sys
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any


# Registered means taking (or about to take) connections: a draining target is on its way out.
NOT_REGISTERED_STATES = frozenset({"draining"})


def print_targets(targets: list[dict], truth: list[str] | None) -> None:
    print(f"{'target':<18} {'port':>5}  state")
    for t in sorted(targets, key=lambda t: t["ip"]):
        print(f"{t['ip']:<18} {t['port']:>5}  {t['state']}")
    if truth is not None:
        registered = sorted(t["ip"] for t in targets if t["state"] not in NOT_REGISTERED_STATES)
        print(f"Running login nodes: {', '.join(truth) or '(none)'}")
        print("in sync" if registered == truth else "OUT OF SYNC: start `hpops repair`")


def describe_result(result: dict) -> None:
    print(f"execution {result['name']}: {result['status']}")
    if result.get("error"):
        print(f"  error: {result['error']}: {result.get('cause', '')}")
    plan = (result.get("output") or {}).get("plan")
    if plan:
        print(f"  plan: {plan['summary']}")
        for reason in plan["reasons"]:
            print(f"    {reason}")


# ---------------------------------------------------------------------------- hpops cost

COST_CSV_FIELDS = ("line", "user", "node_hours", "gpu_hours", "jobs", "usd", "limit_usd", "limit_source",
                   "percent_of_limit", "projected_usd", "projected_percent_of_limit", "rate_sources", "note")


def _money(text: str | None) -> str:
    from decimal import Decimal

    return "-" if text is None else f"{Decimal(text):,.2f}"


def _number(text: str | None) -> str:
    from decimal import Decimal

    return "-" if text is None else f"{Decimal(text):,}"


def _rate(text: str) -> str:
    """USD per hour to at most 4 places (a billed rate is cost / hours, with every digit)."""
    from decimal import ROUND_HALF_UP, Decimal

    shown = f"{Decimal(text).quantize(Decimal('0.0001'), ROUND_HALF_UP):f}".rstrip("0")
    whole, _, fraction = shown.partition(".")
    return f"{whole}.{fraction.ljust(2, '0')}"


def cost_exit_status(document: dict) -> int:
    """1 when a user is at or over a threshold, or a warning says the figures are incomplete."""
    return 1 if document.get("findings") or document.get("warnings") else 0


def cost_rows(document: dict) -> list[dict]:
    """The report as flat rows (CSV): users first, highest spend first, then idle, other, cluster."""
    rows = [{"line": "user", "user": u["user"], "node_hours": u["nodeHours"], "gpu_hours": u["gpuHours"],
             "jobs": u["jobs"], "usd": u["usd"], "limit_usd": u["limitUsd"] or "", "limit_source": u["limitSource"] or "",
             "percent_of_limit": u["percentOfLimit"] or "", "projected_usd": u["projectedUsd"],
             "projected_percent_of_limit": u["projectedPercentOfLimit"] or "", "rate_sources": " ".join(u["rateSources"]),
             "note": f"{u['unpricedNodeHours']} node-hours unpriced" if u["unpricedNodeHours"] != "0.00" else ""}
            for u in document["users"]]
    for line, key in (("idle", "idle"), ("other", "other"), ("cluster", "clusterCost")):
        rows.append({"line": line, "usd": document[key]["usd"], "note": document[key]["reason"]})
    return rows


def print_cost(document: dict, form: str = "table") -> None:
    """`hpops cost`: the per-user table (or JSON, or CSV) whose lines add up to the cluster's cost."""
    if form == "json":
        print(json.dumps(document, indent=2, sort_keys=True))
        return
    if form == "csv":
        writer = csv.DictWriter(sys.stdout, fieldnames=COST_CSV_FIELDS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(cost_rows(document))
        return
    thresholds = ", ".join(f"{t}%" for t in document.get("thresholdsPercent", []))
    print(f"per-user spend on {document['cluster']}, {document['month']}, as of {document['asOf']}"
          + (f" (alerts at {thresholds} of a limit)" if thresholds else ""))
    header = (f"{'user':<16} {'node-h':>10} {'GPU-h':>10} {'jobs':>6} {'USD':>14} {'% limit':>8} "
              f"{'projected USD':>14} {'proj %':>7}  limit")
    print(header)
    print("-" * len(header))
    for u in document["users"]:
        limit = "-" if u["limitUsd"] is None else f"{_money(u['limitUsd'])} ({u['limitSource']})"
        print(f"{u['user'][:16]:<16} {_number(u['nodeHours']):>10} {_number(u['gpuHours']):>10} {u['jobs']:>6} "
              f"{_money(u['usd']):>14} {u['percentOfLimit'] or '-':>8} {_money(u['projectedUsd']):>14} "
              f"{u['projectedPercentOfLimit'] or '-':>7}  {limit}")
    if not document["users"]:
        print("(no Slurm usage this month)")
    print("-" * len(header))
    for label, key in (("users", None), ("idle", "idle"), ("other", "other"), ("cluster cost", "clusterCost")):
        amount = document["usersUsd"] if key is None else document[key]["usd"]
        note = "allocated node time, priced per partition's instance type" if key is None else document[key]["reason"]
        print(f"{label:<45} {_money(amount):>14}  {note}")
    print("(users + idle + other = cluster cost)")
    if document["rates"]:
        print("rates:")
        for r in document["rates"]:
            print(f"  {r['instanceType']:<22} ${_rate(r['usdPerHour'])}/h  {r['source']:<8} {r['detail']}")
    cost_explorer = document.get("costExplorer")
    if cost_explorer:
        print(f"billed month from {cost_explorer['source']}: {cost_explorer['reason']}"
              + (" (--fresh asks again)" if cost_explorer["source"] == "cache" else ""))
    collector = document.get("collector")
    if collector:
        print(f"usage collector: {collector['status']}" + (f" ({collector['reason']})" if collector["reason"] else "")
              + f", collected {collector['collectedAt']}, window {collector['windowStart']}")
    for warning in document["warnings"]:
        print(f"warning {warning['name']}: {warning['reason']}")
    for finding in document.get("findings", []):
        print(f"over a threshold: {finding}")
    for line in hold_lines(document.get("holds")):
        print(line)


def hold_lines(holds: Mapping | None) -> list[str]:
    """Who is held in Slurm for spend, who was released and why (`hpops cost`, `hpops status`)."""
    if not holds or (holds["action"] != "hold" and not holds["held"] and not holds["releases"]):
        return []  # alerts only, and nobody held from before: nothing to say
    mode = f"UserBudgetAction {holds['action']}" + (" (dry run)" if holds["dryRun"] else "")
    lines = [f"holds ({mode}): {len(holds['held'])} user(s) held"
             + (f", decided {holds['decidedAt']}" if holds.get("decidedAt") else "")]
    for h in holds["held"]:
        applied = f"; controller: {h['agent']} ({h['agentReason']})" if h.get("agent") else "; controller: not reported yet"
        lines.append(f"  held {h['user']} since {h['since']}: {h['reason']}{applied}")
    if holds["held"]:
        lines.append(f"  {holds['ends']}")
    waiting = [u for u in holds["wouldHold"] if u not in {h["user"] for h in holds["held"]}]
    if waiting:
        verb = "would hold" if holds["dryRun"] or holds["action"] != "hold" else "next sweep holds"
        lines.append(f"  {verb}: {', '.join(waiting)}")
    for r in holds["releases"]:
        lines.append(f"  released {r['user']} at {r['at']} by {r['by']}: {r['reason']}")
    agent = holds.get("agent")
    if agent and agent.get("enforced") is False:
        lines.append(f"  HOLDS CANNOT APPLY: {agent['enforceReason']}")
    elif agent is None and holds["action"] == "hold":
        lines.append("  no holds report from the controller's agent yet")
    return lines


# ---------------------------------------------------------------------------- hpops status

STATUS_FORMAT = "hpops.status.v1"


def _ip_key(ip: str) -> tuple:
    parts = ip.split(".")
    return tuple(int(p) for p in parts) if len(parts) == 4 and all(p.isdigit() for p in parts) else (999, ip)


def _utc(value: Any) -> str | None:
    """An AWS timestamp (datetime) or stored ISO text as `2026-05-01T10:00:00Z`."""
    if value is None:
        return None
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    return value.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def execution_console_url(region: str, execution_arn: str) -> str:
    return f"https://{region}.console.aws.amazon.com/states/home?region={region}#/v2/executions/details/{execution_arn}"


def dashboard_console_url(region: str, name: str) -> str:
    return f"https://{region}.console.aws.amazon.com/cloudwatch/home?region={region}#dashboards/dashboard/{name}"


def status_document(*, stack: str, region: str, cluster: str, login_group: str, now: dt.datetime,
                    targets: Sequence[Mapping], login_nodes: Sequence[Mapping], reports: Mapping[str, Mapping],
                    published: Mapping | None, executions: Mapping[str, Any], alarms: Sequence[Mapping],
                    dashboard: str | None, sessions: Mapping, spend: Mapping) -> dict:
    """Pure: what `hpops status` shows, as one JSON-safe document (text and --json print the same).

    ``targets``: {ip, port, state, reason}; ``login_nodes``: the login group's Running nodes
    {instanceId, ip}; ``reports``: instance id -> latest node report (report_store.report_from_item);
    ``executions``: state machine -> its last execution (ListExecutions item), None when it has none,
    or the string "absent" when the stack has no such output; ``alarms``: DescribeAlarms items."""
    registered = {t["ip"] for t in targets if t["state"] not in NOT_REGISTERED_STATES}
    running = {n["ip"] for n in login_nodes}
    extra, missing = sorted(registered - running, key=_ip_key), sorted(running - registered, key=_ip_key)
    by_ip = {t["ip"]: t for t in targets}
    published_version = (published or {}).get("version")
    nodes = []
    for node in sorted(login_nodes, key=lambda n: _ip_key(n["ip"])):
        report = reports.get(node["instanceId"]) or {}
        identity = report.get("hostIdentity")
        target = by_ip.get(node["ip"])
        nodes.append({
            "instanceId": node["instanceId"], "ip": node["ip"],
            "target": None if target is None else {"state": target["state"], "reason": target.get("reason")},
            "hostIdentity": None if identity is None else {
                "mode": identity.get("mode"), "result": identity.get("result"), "version": identity.get("version"),
                "reason": identity.get("reason") or "",
                "current": None if published_version is None else identity.get("version") == published_version},
            "agentVersion": report.get("agentVersion"), "receivedAt": report.get("receivedAt"),
        })
    others = [{"ip": t["ip"], "port": t.get("port"), "state": t["state"], "reason": t.get("reason"),
               "extra": t["ip"] in extra}
              for t in sorted(targets, key=lambda t: _ip_key(t["ip"])) if t["ip"] not in running]
    machines = {}
    for name, last in executions.items():
        if last == "absent" or last is None:
            machines[name] = {"present": last != "absent", "last": None}
            continue
        machines[name] = {"present": True, "last": {
            "name": last.get("name") or last["executionArn"].rsplit(":", 1)[-1], "status": last["status"],
            "startDate": _utc(last.get("startDate")), "stopDate": _utc(last.get("stopDate")),
            "executionArn": last["executionArn"], "consoleUrl": execution_console_url(region, last["executionArn"])}}
    in_alarm = [{"name": a["AlarmName"], "reason": a.get("StateReason", ""), "since": _utc(a.get("StateUpdatedTimestamp"))}
                for a in sorted(alarms, key=lambda a: a["AlarmName"]) if a.get("StateValue") == "ALARM"]
    problems = []
    if extra or missing:
        problems.append("OUT OF SYNC")
    if in_alarm:
        problems.append(f"{len(in_alarm)} alarm{'s' if len(in_alarm) > 1 else ''} in ALARM")
    return {
        "format": STATUS_FORMAT, "stack": stack, "region": region, "cluster": cluster, "loginGroup": login_group,
        "asOf": _utc(now), "problems": problems, "exitStatus": 1 if problems else 0,
        "sync": {"inSync": not (extra or missing), "extra": extra, "missing": missing,
                 "runningLoginNodes": len(running), "registeredTargets": len(registered)},
        "loginNodes": nodes, "otherTargets": others,
        "hostIdentity": None if not published else {"mode": published.get("mode"), "version": published_version},
        "executions": machines,
        "alarms": {"total": len(alarms), "inAlarm": in_alarm},
        "dashboard": None if not dashboard else {"name": dashboard, "url": dashboard_console_url(region, dashboard)},
        "sessions": dict(sessions), "spend": dict(spend),
    }


def _short(version: str | None) -> str:
    """Secret version ids are UUIDs: 8 characters tell them apart on screen (--json has them whole)."""
    if not version:
        return "-"
    return version if len(version) <= 12 else version[:8] + "…"


def _age(received_at: str | None, now: dt.datetime) -> str:
    if not received_at:
        return "never"
    seconds = int((now - dt.datetime.fromisoformat(received_at.replace("Z", "+00:00"))).total_seconds())
    if seconds < 120:
        return f"{max(seconds, 0)} s ago"
    if seconds < 7200:
        return f"{seconds // 60} min ago"
    return f"{seconds // 3600} h ago" if seconds < 172800 else f"{seconds // 86400} days ago"


def _date(iso: str | None) -> str:
    return "-" if not iso else iso.replace("T", " ")


def status_text(document: Mapping) -> list[str]:
    """`hpops status` for a person: the verdict first, then why, one screen."""
    d = document
    now = dt.datetime.fromisoformat(d["asOf"].replace("Z", "+00:00"))
    lines = [f"stack {d['stack']} ({d['region']}): cluster {d['cluster']}, login group {d['loginGroup']}, "
             f"as of {_date(d['asOf'])}"]
    lines.append(("PROBLEM: " + ", ".join(d["problems"]) if d["problems"] else "OK: targets in sync, no alarm in ALARM")
                 + f" (exit {d['exitStatus']})")
    sync = d["sync"]
    lines.append("")
    head = f"login nodes: {sync['runningLoginNodes']} Running, {sync['registeredTargets']} registered targets: "
    if sync["inSync"]:
        lines.append(head + "in sync")
    else:
        why = [f"extra {', '.join(sync['extra'])}"] if sync["extra"] else []
        why += [f"missing {', '.join(sync['missing'])}"] if sync["missing"] else []
        lines.append(head + f"OUT OF SYNC ({'; '.join(why)}): run hpops repair --stack-name {d['stack']}")
    lines.append(f"  {'instance':<21} {'ip':<15} {'target':<14} {'host identity':<13} {'version':<21} report")
    for node in d["loginNodes"]:
        target = node["target"]
        state = "not registered" if target is None else target["state"]
        identity = node["hostIdentity"]
        if identity is None:
            result, version = "no report", "-"
        else:
            result = identity["result"] or "-"
            mark = {True: " (current)", False: " (behind)", None: ""}[identity["current"]]
            version = _short(identity["version"]) + mark
        lines.append(f"  {node['instanceId']:<21} {node['ip']:<15} {state:<14} {result:<13} {version:<21} "
                     f"{_age(node['receivedAt'], now)}")
        if target is not None and target.get("reason") and target["state"] != "healthy":
            lines.append(f"      target {target['state']}: {target['reason']}")
        if identity is not None and identity["result"] == "failed" and identity["reason"]:
            lines.append(f"      host identity failed: {identity['reason']}")
    for other in d["otherTargets"]:
        note = "extra: no Running login node has this IP" if other["extra"] else "not a Running login node's IP"
        lines.append(f"  {'-':<21} {other['ip']:<15} {other['state']:<14} {note}")
    if d["hostIdentity"]:
        lines.append(f"  host identity published: {d['hostIdentity']['mode']}, version {d['hostIdentity']['version']}")
    else:
        lines.append("  host identity published: none yet (hpops host-keys generate|adopt, or ca-generate)")

    lines += ["", "last executions:"]
    for name, machine in d["executions"].items():
        last = machine["last"]
        if last is None:
            lines.append(f"  {name:<14} " + ("none yet" if machine["present"] else "not in this stack's outputs"))
        else:
            lines.append(f"  {name:<14} {last['status']:<10} {_date(last['startDate'])}  {last['consoleUrl']}")

    alarms = d["alarms"]
    lines += ["", f"alarms: {len(alarms['inAlarm'])} of {alarms['total']} in ALARM"]
    for alarm in alarms["inAlarm"]:
        lines.append(f"  ALARM {alarm['name']} since {_date(alarm['since'])}: {alarm['reason']}")
    if d["dashboard"]:
        lines.append(f"dashboard: {d['dashboard']['name']}  {d['dashboard']['url']}")
    else:
        lines.append("dashboard: not in this stack's outputs")

    sessions = d["sessions"]
    if not sessions.get("available"):
        lines += ["", f"sessions: unavailable ({sessions.get('reason', 'unknown')})"]
    else:
        top = ", ".join(f"{u['user']} {u['sessions']}" for u in sessions["topUsers"]) or "none"
        lines += ["", f"sessions: {sessions['active']} active on login nodes; by {sessions['groupedBy']}: {top}"]
        if sessions.get("runAs"):
            lines.append(f"  Session Manager: {sessions['runAs']}")
    lines += spread_text(d.get("spread"))
    lines += admission_text(d.get("admission"))
    lines += enrollment_text(d.get("enrollment"), d["stack"])
    lines += login_sessions_text(d.get("loginSessions"))
    spend = d["spend"]
    if not spend.get("available"):
        lines.append(f"spend: unavailable ({spend.get('reason', 'unknown')})")
    else:
        lines.append(f"spend {spend['month']}, top {len(spend['topUsers'])} of {spend['users']} users "
                     f"(all: hpops cost --stack-name {d['stack']}):")
        for u in spend["topUsers"]:
            share = f"  {u['percentOfLimit']} % of {_money(u['limitUsd'])}" if u.get("percentOfLimit") else ""
            lines.append(f"  {u['user'][:16]:<16} {_money(u['usd']):>12} USD{share}")
        if not spend["topUsers"]:
            lines.append("  (no Slurm usage this month)")
        lines += hold_lines(spend.get("holds"))
    return lines


def spread_text(spread: Mapping | None) -> list[str]:
    """`hpops status` lines: sessions and distinct users per Running login node, and the busiest over the mean."""
    if not spread or not spread["nodes"]:
        return []
    ratio = "no sessions" if spread["maxOverMean"] is None else f"busiest {spread['maxOverMean']:.2f}x the mean"
    lines = [f"spread: {spread['sessions']} sessions on {spread['reporting']} reporting login node(s), "
             f"{spread['meanPerNode']:g} per node, {ratio}"]
    for node in spread["nodes"]:
        lines.append(f"  {node['instanceId']:<21} " + ("no report" if node["sessions"] is None else
                                                       f"{node['sessions']} sessions, {node['users']} users"))
    return lines


def enrollment_text(enrollment: Mapping | None, stack: str) -> list[str]:
    """`hpops status` lines: how the agents' keys were enrolled, whether AWS's identity documents back
    them here, and the contested nodes with the command that settles them."""
    if not enrollment:
        return []
    how = enrollment["byHow"]
    counts = f"{enrollment['nodes']} agent key(s) enrolled: {how['document']} with a verified instance identity " \
             f"document, {how['approval']} approved, {how['window']} inside their window without one"
    if enrollment["documentsSeen"]:
        lines = [f"enrollment: {counts}; this cluster's IMDS serves identity documents"]
    else:
        lines = [f"enrollment: {counts}; no agent has sent a verified identity document (IMDS does not serve one "
                 "here, or the agents predate them): a new node's key is trusted as the first presented inside its "
                 "window, as before documents (docs/node-agent.md)"]
    lines += [f"  {c['instanceId']:<21} contested by {c['keys']} keys: hpops adopt --stack-name {stack} "
              "(reads its key as root, approves it)" for c in enrollment["contested"]]
    return lines


def admission_text(admission: Mapping | None) -> list[str]:
    """`hpops status` lines: load-aware admission's mode and the nodes it keeps out of rotation, with why."""
    if not admission or admission["mode"] == "off":
        return []
    head = "admission (dry-run: nothing is moved)" if admission["mode"] == "dry-run" else "admission (on)"
    if admission["stale"]:
        last = ("never ran" if admission["lastRunSecondsAgo"] is None
                else f"last ran {admission['lastRunSecondsAgo'] // 60} min ago")
        return [f"{head}: {last}: the sync keeps every login node in rotation "
                "(look for LoginAdmission's errors and EventDeliveryDLQAlarm)"]
    if not admission["out"]:
        return [f"{head}: every login node takes new connections"]
    verb = "would be out of rotation" if admission["mode"] == "dry-run" else "out of rotation for new connections"
    return [f"{head}:"] + [f"  {o['instanceId']:<21} {verb} since {_date(o['since'])}: {o['reason']}"
                           for o in admission["out"]]


# The one step that turns session limits on (docs/session-limits.md#dry-run-first).
ENFORCE_STEP = ("to enforce: add SessionLimitsDryRun=false to samconfig.toml's parameter_overrides, then "
                "sam build && sam deploy")


def login_sessions_text(view: Mapping | None) -> list[str]:
    """`hpops status` lines: each user's sessions as the login nodes report them, by path and node."""
    if not view:
        return []
    lines = []
    dry_run = bool(view.get("dryRun"))
    if dry_run:
        lines += [f"session limits: DRY RUN (SessionLimitsDryRun=true): nothing is ended; WOULD END marks whose "
                  "sessions enforcement would end now", f"  {ENFORCE_STEP}"]
    lines.append(f"sessions the login nodes report (SSH and Session Manager together, per user): {view['userCount']} user(s)")
    for u in view["users"]:
        def nodes(counts: Mapping) -> str:
            return ", ".join(f"{n} {c}" for n, c in sorted(counts.items())) or "none"
        limit = "exempt" if u["limit"] is None else f"limit {u['limit']}"
        over = ""
        if u["over"]:
            over = f"  OVER, WOULD END {u['total'] - u['limit']}" if dry_run else "  OVER"
        lines.append(f"  {u['user'][:16]:<16} {u['total']} of {limit}{over}"
                     f"  ssh: {nodes(u['ssh'])}; ssm: {nodes(u['ssm'])}")
    for node, caps in sorted(view["caps"].items()):
        lines.append(f"  caps on {node}: {caps}")
    for user, nodes in view.get("atCap", {}).items():
        where = "; ".join(f"{node}: {', '.join(caps)}" for node, caps in sorted(nodes.items()))
        lines.append(f"  at a cap: {user} ({where})")
    return lines


def print_status(document: Mapping, as_json: bool = False) -> None:
    if as_json:
        print(json.dumps(document, indent=2, sort_keys=True))
        return
    for line in status_text(document):
        print(line)


def top_spenders(document: Mapping, count: int = 5) -> dict:
    """The spend section of `hpops status` from a `hpops cost` document: the ``count`` highest."""
    users = sorted(document["users"], key=lambda u: (-Decimal(u["usd"]), u["user"]))
    return {"available": True, "month": document["month"], "asOf": document["asOf"], "users": len(users),
            "topUsers": [{"user": u["user"], "usd": u["usd"], "limitUsd": u["limitUsd"],
                          "percentOfLimit": u["percentOfLimit"], "projectedUsd": u["projectedUsd"]}
                         for u in users[:count]],
            "warnings": [w["name"] for w in document.get("warnings", [])], "holds": document.get("holds")}
