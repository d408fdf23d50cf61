"""`make bench`, the flood: what a cluster user holding the node role costs the account by calling
NodeChannel as fast as AWS lets them, measured in the twin and priced by the cost model's list prices.

The user sends, through the real NodeChannel handler under the node role (the twin's "agent"
principal, IAM enforced), CALLS requests of each kind a flood would use: another key for a proven
login node (EnrollmentConflictError: the conflict path, its hourly notice included), a fetch signed by a
key enrolled for nothing (NotEnrolledError) and a malformed request. Per refusal the twin measures the
handler's time, the log bytes it wrote, and the AWS calls it made (DynamoDB reads and writes, SNS).

An hour of each kind is then priced at the bound: `NodeFacingConcurrency` (template.yaml's default)
refusals running at once, back to back, each as long as it took here; the dearest kind is the figure.
The twin runs in one process with moto answering in microseconds; on AWS every call is a network round
trip, so fewer refusals fit in an hour: the figure is an upper bound (lower still if Lambda's
per-function request rate limit, UNCONFIRMED here, applies). Billed duration is rounded up to the millisecond. Two X-Ray
cases: the agent's own calls carry no trace header, so NodeChannel (Tracing: PassThrough) records
none; a caller may mark every request sampled, and then Lambda records a trace for each whatever
the mode, which the worst case prices.

`python -m hpops_twin.flood_bench [--merge docs/bench.json]` runs this section alone and can update
only its key of a bench JSON file.
"""

from __future__ import annotations

import json
import math
import secrets
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

from hpops_twin.attacker import Attacker
from hpops_twin.bench_section import run_alone
from hpops_twin.cost_model import PRICES_PATH
from hpops_twin.template_model import TemplateModel
from hpops_twin.world import TwinWorld

KEY = "flood"
FUNCTION = "NodeChannelFunction"
CALLS = 100
READ_CALLS = ("dynamodb.GetItem", "dynamodb.Query")
WRITE_CALLS = ("dynamodb.PutItem", "dynamodb.UpdateItem", "dynamodb.DeleteItem")


@dataclass
class FloodRow:
    kind: str
    error: str  # the named refusal every call got
    calls: int
    mean_ms: float  # the handler's time in the twin, per call
    log_bytes: float  # per call
    read_units: float  # per call (each read here is a strongly consistent read of an item under 4 KB)
    write_units: float  # per call (items under 1 KB)
    notices: int  # SNS publishes over all the calls (the conflict notice: once an hour per node)


def _flood(world: TwinWorld, kind: str, send: Callable[[], dict]) -> FloodRow:
    world.counter.reset()
    before = len(world.dispatcher.invocations)
    errors = {send().get("error") for _ in range(CALLS)}
    mine = [i for i in world.dispatcher.invocations[before:] if i.function.endswith(FUNCTION)]
    if len(mine) != CALLS or len(errors) != 1 or None in errors:
        raise RuntimeError(f"{kind}: expected {CALLS} refusals of one kind, got {len(mine)} calls, errors {errors}")
    calls = world.counter.calls_of({FUNCTION})
    return FloodRow(kind, errors.pop(), CALLS, round(1000 * sum(i.seconds for i in mine) / CALLS, 2),
                    round(sum(len(i.logs.encode("utf-8")) for i in mine) / CALLS, 1),
                    sum(calls[c] for c in READ_CALLS) / CALLS, sum(calls[c] for c in WRITE_CALLS) / CALLS,
                    calls["sns.Publish"])


def flood_rows() -> list[FloodRow]:
    with TwinWorld() as world:
        world.wait([world.run_schedule()])
        node = sorted(world.sim.nodes(world.cluster_name, world.login_group), key=lambda n: n.ip)[0]
        attacker = Attacker(world)
        return [
            _flood(world, "enroll another key for a proven login node", lambda: attacker.enroll(node.instance_id, node.ip)),
            _flood(world, "fetch host keys with a key enrolled for nothing",
                   lambda: attacker.fetch(node.instance_id, ["hostKeys"])),
            _flood(world, "a malformed request", lambda: attacker.invoke({"action": "flood", "n": secrets.token_hex(4)})),
        ]


def hourly_cost(rows: list[FloodRow], prices: dict | None = None, template: TemplateModel | None = None) -> dict[str, Any]:
    """An hour of each kind at the concurrency bound (each as long as it took here, billed by the
    millisecond), priced line by line; the headline is the dearest kind, the one a flood would pick."""
    recorded = prices or json.loads(PRICES_PATH.read_text(encoding="utf-8"))
    p = {k: v["usd"] for k, v in recorded["prices"].items()}
    template = template or TemplateModel()
    concurrency = int(template.parameter_defaults()["NodeFacingConcurrency"])
    memory_gb = template.raw["Globals"]["Function"]["MemorySize"] / 1024
    tracing = template.raw["Resources"][FUNCTION]["Properties"].get(
        "Tracing", template.raw["Globals"]["Function"].get("Tracing"))
    kinds = []
    for row in rows:
        billed_ms = max(math.ceil(row.mean_ms), 1)
        calls = concurrency * 3600 * 1000 // billed_ms
        lines = {
            "Lambda requests": calls * p["lambda_per_1m_requests"] / 1e6,
            "Lambda compute (arm64)": calls * billed_ms / 1000 * memory_gb * p["lambda_arm64_per_gb_second"],
            "DynamoDB on-demand reads": calls * row.read_units * p["dynamodb_on_demand_per_1m_read_units"] / 1e6,
            "DynamoDB on-demand writes": calls * row.write_units * p["dynamodb_on_demand_per_1m_write_units"] / 1e6,
            "CloudWatch Logs ingestion": calls * row.log_bytes / 1e9 * p["cloudwatch_logs_ingest_per_gb"],
        }
        xray = calls * p["xray_per_1m_traces"] / 1e6
        untraced = sum(lines.values())
        kinds.append({"kind": row.kind, "billed_ms": billed_ms, "calls_per_hour": calls,
                      "lines_usd": {k: round(v, 2) for k, v in lines.items()},
                      "xray_if_every_call_marked_sampled_usd": round(xray, 2),
                      "usd_per_hour": round(untraced if tracing == "PassThrough" else untraced + xray, 2),
                      "worst_usd_per_hour": round(untraced + xray, 2)})
    dearest = max(kinds, key=lambda k: k["worst_usd_per_hour"])
    return {"concurrency": concurrency, "tracing": tracing, "kinds": kinds, "dearest": dearest["kind"],
            "calls_per_hour": dearest["calls_per_hour"], "usd_per_hour": max(k["usd_per_hour"] for k in kinds),
            "worst_usd_per_hour": dearest["worst_usd_per_hour"],
            "xray_if_every_call_marked_sampled_usd": dearest["xray_if_every_call_marked_sampled_usd"]}


def render(rows: list[FloodRow], cost: dict[str, Any]) -> str:
    lines = [f"{'flood of NodeChannel (as a cluster user)':<50} {'error':<28} {'ms':>6} {'log B':>6} {'reads':>5} "
             f"{'writes':>6} {'notices':>7} {'calls/h':>10} {'$/h':>6} {'$/h*':>6}"]
    for row, kind in zip(rows, cost["kinds"]):
        lines.append(f"{row.kind:<50} {row.error:<28} {row.mean_ms:>6.2f} {row.log_bytes:>6.0f} {row.read_units:>5.1f} "
                     f"{row.write_units:>6.1f} {row.notices:>7} {kind['calls_per_hour']:>10,} "
                     f"{kind['usd_per_hour']:>6.2f} {kind['worst_usd_per_hour']:>6.2f}")
    lines.append(f"at {cost['concurrency']} concurrent: at most ${cost['usd_per_hour']:.2f} an hour (NodeChannel "
                 f"{cost['tracing']}: no trace per agent call); * ${cost['worst_usd_per_hour']:.2f} if every request "
                 f"is marked sampled (X-Ray ${cost['xray_if_every_call_marked_sampled_usd']:.2f} of it)")
    return "\n".join(lines)


def record(rows: list[FloodRow]) -> dict[str, Any]:
    return {"rows": [asdict(r) for r in rows], "hour": hourly_cost(rows),
            "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def flood_section() -> tuple[list[FloodRow], dict[str, bool]]:
    rows = flood_rows()
    cost = hourly_cost(rows)
    print()
    print(render(rows, cost))
    return rows, {
        "a flood of NodeChannel refusals writes at most one notice an hour per node":
            all(r.notices <= 1 for r in rows),
        "a flood's refusals write nothing but the conflict notice's hour (at most one write each)":
            all(r.write_units <= 1 for r in rows),
    }


def main(argv: list[str]) -> int:
    rows, verdicts = flood_section()
    return run_alone(argv, verdicts, {KEY: record(rows)})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
