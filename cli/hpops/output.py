"""What the CLI prints about targets and executions (shared by the real stack and the twin)."""

from __future__ import annotations

import csv
import json
import sys


def print_targets(targets: list[dict], truth: list[str] | None) -> None:
    print(f"{'target':<18} {'port':>5}  state")
    for t in sorted(targets, key=lambda t: t["ip"]):
        print(f"{t['ip']:<18} {t['port']:>5}  {t['state']}")
    if truth is not None:
        registered = sorted(t["ip"] for t in targets if t["state"] != "draining")
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
    collector = document.get("collector")
    if collector:
        print(f"usage collector: {collector['status']}" + (f" ({collector['reason']})" if collector["reason"] else "")
              + f", collected {collector['collectedAt']}, window {collector['windowStart']}")
    for warning in document["warnings"]:
        print(f"warning {warning['name']}: {warning['reason']}")
    for finding in document.get("findings", []):
        print(f"over a threshold: {finding}")
