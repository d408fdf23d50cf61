"""What the CLI prints about targets and executions (shared by the real stack and the twin)."""

from __future__ import annotations


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
