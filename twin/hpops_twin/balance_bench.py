"""`make bench`, balance: how evenly 200 users' SSH sessions spread over 4 login nodes, by access path.

The twin deploys the stack (template.yaml, with `TargetGroupStickiness` as given), its real
LoginNodeSync fills the target group, and the target group it produced (its registered targets and
its stickiness attribute, read back from the emulated ELB) drives a model of the NLB's documented
target choice (hpops_twin/nlb_model.py). Each of 200 users opens one session through 1 source IP
(campus NAT), 2 (AWS Client VPN with two associated subnets) or 200 (routed: Site-to-Site VPN,
Direct Connect). The figure is the busiest node's sessions over the mean per node, median over 20
seeds (20 hash keys and client port draws). The "before" rows are the former settings (source_ip).
`python -m hpops_twin.balance_bench [--merge docs/bench.json]` runs this section alone and can
update only its key of a bench JSON file.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import asdict, dataclass

from hpops_twin import nlb_model
from hpops_twin.bench_section import run_alone
from hpops_twin.world import TwinWorld

KEY = "balance"
USERS = 200
LOGIN_NODES = 4
SEEDS = 20
TARGET = 1.25


@dataclass
class BalanceRow:
    setting: str  # the target group's stickiness as the twin's stack created it
    path: str
    source_ips: int
    users: int
    login_nodes: int
    median_max_over_mean: float
    worst_max_over_mean: float  # over the seeds
    example_sessions: list[int]  # seed 0, busiest first


def target_group_of(world: TwinWorld) -> tuple[list[str], bool]:
    """The registered targets and whether source-IP stickiness is on, as the ELB API returns them."""
    elbv2 = world.aws.client("elbv2")
    attributes = {a["Key"]: a["Value"] for a in elbv2.describe_target_group_attributes(
        TargetGroupArn=world.target_group_arn())["Attributes"]}
    sticky = attributes.get("stickiness.enabled") == "true" and attributes.get("stickiness.type") == "source_ip"
    return world.target_ips(), sticky


def balance_rows(stickiness: str) -> list[BalanceRow]:
    with TwinWorld(login_count=LOGIN_NODES, worker_count=4, parameters={"TargetGroupStickiness": stickiness}) as world:
        world.wait([world.run_schedule()])
        targets, sticky = target_group_of(world)
    if len(targets) != LOGIN_NODES:
        raise RuntimeError(f"the sync registered {len(targets)} of {LOGIN_NODES} login nodes")
    rows = []
    for path in nlb_model.ACCESS_PATHS:
        ratios = [nlb_model.max_over_mean(nlb_model.place_users(path, USERS, targets, sticky, seed)) for seed in range(SEEDS)]
        example = nlb_model.place_users(path, USERS, targets, sticky, 0)
        rows.append(BalanceRow(stickiness, path, len(set(nlb_model.source_ips(path, USERS))), USERS, len(targets),
                               round(statistics.median(ratios), 3),
                               round(max(ratios), 3), sorted(example.values(), reverse=True)))
    return rows


def render(rows: list[BalanceRow]) -> str:
    header = f"{'balance: stickiness':<22} {'path':<11} {'source IPs':>10} {'users':>5} {'median max/mean':>15} {'worst':>6}  seed 0"
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(f"{r.setting:<22} {r.path:<11} {r.source_ips:>10} {r.users:>5} {r.median_max_over_mean:>15.2f} "
                     f"{r.worst_max_over_mean:>6.2f}  {r.example_sessions}")
    return "\n".join(lines)


def balance_section() -> tuple[list[BalanceRow], dict[str, bool]]:
    rows = balance_rows("none") + balance_rows("source_ip")
    print()
    print(render(rows), flush=True)
    defaults = [r for r in rows if r.setting == "none"]
    verdicts = {f"balance: 200 users over 4 login nodes, every access path, median max/mean <= {TARGET} at the defaults":
                all(r.median_max_over_mean <= TARGET for r in defaults)}
    return rows, verdicts


def main(argv: list[str]) -> int:
    """Run this section alone; `--merge FILE` also replaces only its key in that bench JSON file."""
    rows, verdicts = balance_section()
    return run_alone(argv, verdicts, {KEY: [asdict(r) for r in rows]})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
