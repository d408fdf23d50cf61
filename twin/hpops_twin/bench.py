"""`make bench`: what a reconcile costs, measured in the twin.

Counts are exact (every AWS call our Lambda code makes goes through boto3's default session, and
the twin counts them there); times are wall-clock on this machine and only indicative.
Targets: <= 6 SageMaker+ELB calls for a single-node replacement whatever the cluster size, <= 3
for an idle sweep (ListClusterNodes, DescribeTargetHealth, and the DescribeCluster that checks the
login group is the cluster's), <= 3 DynamoDB calls per reconcile (the lease taken and released, the
enrollments GateTargetChanges checks), nothing growing with workers. Certificate
mode: a replacement costs one signature; the daily check costs only handshakes when nothing is due.
Node channel: how many agent polls (30 s each on a cluster) and API calls a node join and a host
key rotation take, from the agents' own call counts and the state machines'.
Footprint (hpops_twin/footprint.py): each Lambda function's cold-start imports against `import boto3`
in fresh interpreters (target <= 1.5x), and each layer's unzipped size (target <= 40 MB).
Slurm usage (hpops_twin/usage_bench.py): one collection sweep over a synthetic month of 10,000 jobs.
Budget holds (hpops_twin/holds_bench.py): usage reports and agent polls from the crossing usage report to the hold.
Balance (hpops_twin/balance_bench.py): 200 users' sessions over the login nodes through NAT, Client
VPN and routed paths, the NLB's target choice modelled on the target group the twin's sync produced.
Session-limit bound (hpops_twin/session_bound_bench.py): agent polls from an SSH login over the
cluster-wide limit to the session ended, on a simulated clock.
Admission (hpops_twin/admission_bench.py): load-aware admission's scheduled run, a move out and back, the floor.
Flood (hpops_twin/flood_bench.py): NodeChannel refusals sent as a cluster user with the node role, each
kind's time, log bytes and AWS calls, priced an hour at NodeFacingConcurrency.

Progress goes to stderr, flushed: one line when a section starts, one with its seconds when it ends.
The tables (stdout) are unchanged. `--json FILE` also records each section's seconds and the machine,
which is what docs/bench.json (the figures the README quotes) is made with.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass

from hpops_twin.world import StuckExecutionError, TwinWorld

SIZES = (10, 100, 1000, 5000)
LOGIN_NODES = 4


@dataclass
class Row:
    scenario: str
    cluster_nodes: int
    sagemaker_elb_calls: int
    dynamodb_calls: int
    calls: dict
    state_transitions: int
    seconds: float
    executions: int = 0  # LoginNodeSync executions the scenario started
    coalesced: int = 0  # of which found the lease taken, set pending and ended


def _sync_functions(world: TwinWorld) -> set[str]:
    """The functions LoginNodeSync invokes, read from its DefinitionSubstitutions in template.yaml."""
    spec = world.template.state_machines()["LoginNodeSyncStateMachine"]
    return {value["Fn::GetAtt"][0] for value in spec.substitutions.values()}


def _measure(world: TwinWorld, scenario: str, size: int, start) -> Row:
    """LoginNodeSync's own cost: the same events also start other state machines (budget guard),
    whose calls and transitions are left out here (make bench reports them separately)."""
    world.counter.reset()
    began = time.perf_counter()
    arns = start()
    results = world.wait(arns, timeout=300)
    while not world.converged() and time.perf_counter() - began < 60:
        time.sleep(0.01)
    seconds = time.perf_counter() - began
    if any(r.status != "SUCCEEDED" for r in results) or not world.converged():
        raise RuntimeError(f"{scenario} at {size} nodes did not converge")
    calls = world.counter.calls_of(_sync_functions(world))
    by_service = {k.split(".", 1)[0]: 0 for k in calls}
    for key, count in calls.items():
        by_service[key.split(".", 1)[0]] += count
    sync_arns = [arn for arn in arns if ":LoginNodeSync" in arn or "LoginNodeSyncStateMachine" in arn]
    transitions = sum(world.state_transitions(arn) for arn in sync_arns)
    coalesced = sum(1 for r in results if r.arn in sync_arns and ((r.output or {}).get("lease") or {}).get("acquired") is False)
    return Row(scenario, size, by_service.get("sagemaker", 0) + by_service.get("elastic-load-balancing-v2", 0),
               by_service.get("dynamodb", 0), dict(sorted(calls.items())), transitions, seconds,
               len(sync_arns), coalesced)


def bench_size(size: int) -> list[Row]:
    rows = []
    with TwinWorld(login_count=LOGIN_NODES, worker_count=size - LOGIN_NODES) as world:
        world.wait([world.run_schedule()])  # initial sync fills the target group and the IP cache
        cluster, sim = world.cluster_name, world.sim

        rows.append(_measure(world, "idle sweep", size, lambda: [world.run_schedule()]))

        victim = sorted(sim.nodes(cluster, world.login_group), key=lambda n: n.ip)[0]
        sim.replace_node(cluster, victim.instance_id)
        provisioned = sim.finish_provisioning(cluster)  # the "successfully provisioned" cluster event
        rows.append(_measure(world, "replacement: one event -> converged", size,
                             lambda: world.publish([provisioned[0]])))

        victim = sorted(sim.nodes(cluster, world.login_group), key=lambda n: n.ip)[0]
        burst = sim.replace_node(cluster, victim.instance_id) + sim.finish_provisioning(cluster)
        burst += [sim.state_change_event(cluster) for _ in range(20 - len(burst))]
        rows.append(_measure(world, "replacement: 20-event burst", size, lambda: world.publish(burst)))
    return rows


def certificate_mode_rows(size: int = 100) -> list[Row]:
    """HostIdentityMode=certificate: a replacement costs two Run Commands and one signature."""
    parameters = {"HostIdentityMode": "certificate", "HostCertificatePrincipals": "login.hpc.example.edu"}
    with TwinWorld(login_count=LOGIN_NODES, worker_count=size - LOGIN_NODES, parameters=parameters) as world:
        world.wait([world.run_schedule()])
        cluster, sim = world.cluster_name, world.sim
        victim = sorted(sim.nodes(cluster, world.login_group), key=lambda n: n.ip)[0]
        sim.replace_node(cluster, victim.instance_id)
        provisioned = sim.finish_provisioning(cluster)
        rows = [_measure(world, "cert mode: replacement -> converged", size, lambda: world.publish([provisioned[0]]))]
        rows.append(_measure(world, "cert mode: daily check, nothing due", size,
                             lambda: [world.run_schedule("CertificateRenewal")]))
    return rows


@dataclass
class ChannelRow:
    scenario: str
    nodes: int
    max_polls_per_node: int  # agent ticks before the node was acknowledged (30 s apart on a cluster)
    waits: int  # CheckNodeReport reads the state machine made
    agent_calls: dict
    lambda_calls: dict
    state_transitions: int
    seconds: float


def _measure_channel(world: TwinWorld, scenario: str, nodes: list[str], start) -> ChannelRow:
    world.counter.reset()
    world.hosts.agent_calls.clear()
    world.hosts.polls.clear()
    reads_before = sum(1 for i in world.dispatcher.invocations if i.function.endswith("CheckNodeReportFunction"))
    began = time.perf_counter()
    arns = start()
    results = world.wait(arns, timeout=300)
    seconds = time.perf_counter() - began
    if any(r.status != "SUCCEEDED" for r in results) or not world.converged():
        raise RuntimeError(f"{scenario} did not converge")
    reads = sum(1 for i in world.dispatcher.invocations if i.function.endswith("CheckNodeReportFunction")) - reads_before
    sync_arns = [arn for arn in arns if "LoginNodeSync" in arn]
    return ChannelRow(scenario, len(nodes), max((world.hosts.polls[n] for n in nodes), default=0), reads,
                      dict(sorted(world.hosts.agent_calls.items())), dict(sorted(world.counter.calls_of(_sync_functions(world)).items())),
                      sum(world.state_transitions(arn) for arn in sync_arns), seconds)


def node_channel_rows() -> list[ChannelRow]:
    """Keys mode, 4 login nodes: a replacement joining, then a host key rotation."""
    from hpops_twin.node_hosts import rotation_bundle

    with TwinWorld(login_count=LOGIN_NODES, worker_count=8) as world:
        world.wait([world.run_schedule()])
        cluster, sim = world.cluster_name, world.sim
        victim = sorted(sim.nodes(cluster, world.login_group), key=lambda n: n.ip)[0]
        world.wait(world.publish(sim.replace_node(cluster, victim.instance_id)))
        new = next(n for n in sim.nodes(cluster, world.login_group) if n.status == "Pending")
        provisioned = sim.finish_provisioning(cluster)
        rows = [_measure_channel(world, "node join: Running -> verified -> registered", [new.instance_id],
                                 lambda: world.publish([provisioned[0]]))]
        running = [n.instance_id for n in sim.nodes(cluster, world.login_group) if n.status == "Running"]
        world.install_canonical_host_keys(rotation_bundle())
        rows.append(_measure_channel(world, "rotation: publish -> all acknowledged", running,
                                     lambda: [world.start_repair()]))
    return rows


def render_channel(rows: list[ChannelRow]) -> str:
    header = f"{'node channel (keys mode)':<46} {'nodes':>5} {'polls/node':>10} {'reads':>5} {'transitions':>11} {'seconds':>8}  agent calls | Lambda calls"
    lines = [header, "-" * len(header)]
    for r in rows:
        agent = ", ".join(f"{k.split('.', 1)[1]}={v}" for k, v in r.agent_calls.items())
        lambdas = ", ".join(f"{k.split('.', 1)[1]}={v}" for k, v in r.lambda_calls.items())
        lines.append(f"{r.scenario:<46} {r.nodes:>5} {r.max_polls_per_node:>10} {r.waits:>5} {r.state_transitions:>11} "
                     f"{r.seconds:8.2f}  {agent} | {lambdas}")
    return "\n".join(lines)


def render(rows: list[Row]) -> str:
    header = f"{'scenario':<38} {'nodes':>6} {'SM+ELB':>7} {'DDB':>4} {'transitions':>11} {'seconds':>8}  calls"
    lines = [header, "-" * len(header)]
    for r in rows:
        calls = ", ".join(f"{k.split('.', 1)[1]}={v}" for k, v in r.calls.items())
        lines.append(f"{r.scenario:<38} {r.cluster_nodes:>6} {r.sagemaker_elb_calls:>7} {r.dynamodb_calls:>4} "
                     f"{r.state_transitions:>11} {r.seconds:8.2f}  {calls}")
    return "\n".join(lines)


class Progress:
    """Section lines on stderr, flushed as they happen: without them the first table appears after
    minutes of silence (it prints once every cluster size is measured). stderr keeps stdout, the
    tables, exactly what it was for anyone who redirects or compares it."""

    def __init__(self, total: int, stream=None):
        self.total, self.number = total, 0
        self.stream = stream
        self.began = time.perf_counter()
        self.sections: list[dict] = []

    def say(self, text: str) -> None:
        print(f"bench [{self.elapsed():>4}] {text}", file=self.stream or sys.stderr, flush=True)

    def elapsed(self) -> str:
        minutes, seconds = divmod(int(time.perf_counter() - self.began), 60)
        return f"{minutes}:{seconds:02d}"

    @contextmanager
    def section(self, title: str) -> Iterator[None]:
        self.number += 1
        label = f"{self.number}/{self.total} {title}"
        self.say(f"{label} ...")
        began = time.perf_counter()
        try:
            yield
        except BaseException:
            self.say(f"{label}: stopped after {time.perf_counter() - began:.1f} s")
            raise
        seconds = time.perf_counter() - began
        self.sections.append({"section": title, "seconds": round(seconds, 2)})
        self.say(f"{label}: {seconds:.1f} s")


def run_bench(json_path: str | None = None, sizes: tuple[int, ...] = SIZES) -> int:
    """Print the tables and the targets; 0 when every target is met, 1 when one is missed, 2 when
    a scenario could not be measured (one line says which and why, instead of a hang)."""
    try:
        return _run_bench(json_path, sizes)
    except (StuckExecutionError, RuntimeError) as error:
        print(f"bench stopped: {error}", flush=True)
        return 2


def _run_bench(json_path: str | None, sizes: tuple[int, ...]) -> int:
    progress = Progress(total=len(sizes) + 10)
    rows = []
    for size in sizes:
        with progress.section(f"LoginNodeSync at {size:,} cluster nodes: idle sweep, replacement, 20-event burst"):
            rows += bench_size(size)
    with progress.section("LoginNodeSync in certificate mode: replacement, daily check"):
        certificate_rows = certificate_mode_rows()
    rows += certificate_rows
    print(render(rows), flush=True)
    single = [r for r in rows if r.scenario.startswith("replacement: one")]
    idle = [r for r in rows if r.scenario == "idle sweep"]
    verdicts = {
        "replacement <= 6 SageMaker+ELB calls at every size": all(r.sagemaker_elb_calls <= 6 for r in single),
        "idle sweep <= 3 SageMaker+ELB calls": all(r.sagemaker_elb_calls <= 3 for r in idle),
        # The lease (taken, released) and the agents' enrollments (a contested node leaves the target group).
        "<= 3 DynamoDB calls per single reconcile": all(r.dynamodb_calls <= 3 for r in single + idle),
        "calls do not grow with cluster size": len({r.sagemaker_elb_calls for r in single}) == 1,
        "cert mode replacement: one signature, <= 7 SageMaker+ELB":
            certificate_rows[0].calls.get("ssm.PutParameter") == 1 and certificate_rows[0].sagemaker_elb_calls <= 7,
        "cert mode daily check with nothing due: no signature":
            "ssm.PutParameter" not in certificate_rows[1].calls,
    }
    with progress.section("node channel: node join, host key rotation"):
        channel_rows = node_channel_rows()
    print()
    print(render_channel(channel_rows), flush=True)
    join, rotation = channel_rows[0], channel_rows[1]
    verdicts |= {
        "node join: keys applied at on_create, registered with no wait for a report": join.waits == 0,
        "rotation: every login node acknowledged within 2 agent polls": rotation.max_polls_per_node <= 2,
    }
    from hpops_twin import session_bench
    from hpops_twin.session_bench import session_limits_section

    with progress.section(f"session limits: {session_bench.SESSIONS:,} sessions of {session_bench.USERS} users"):
        session_rows, session_verdicts = session_limits_section()
    verdicts |= session_verdicts
    from hpops_twin.session_bound_bench import KEY as BOUND_KEY, bound_record, session_bound_section

    with progress.section("session-limit bound: agent polls from an SSH login over the limit to the session ended"):
        bound_rows, bound_verdicts = session_bound_section()
    verdicts |= bound_verdicts
    from hpops_twin.budget_bench import budget_guard_section

    with progress.section("budget guard: budget created, state change, scale-out alert, hourly sweep, a day of sweeps"):
        budget_rows, budget_verdicts = budget_guard_section()
    verdicts |= budget_verdicts
    from hpops_twin.footprint import RUNS, footprint_section

    with progress.section(f"footprint: layer sizes, each function's cold-start import ({RUNS} rounds)"):
        footprint, footprint_verdicts = footprint_section(progress=progress.say)
    verdicts |= footprint_verdicts
    from hpops_twin.usage_bench import JOBS, usage_section

    with progress.section(f"Slurm usage: collection sweeps over a synthetic month of {JOBS:,} jobs"):
        usage_result, usage_verdicts = usage_section()
    verdicts |= usage_verdicts
    from hpops_twin.holds_bench import BOUND_KEY as HOLD_BOUND_KEY, bound_record as hold_bound_record, holds_section

    with progress.section("budget holds: usage reports, sweeps and agent polls from the crossing to the hold, and a release"):
        hold_rows, hold_verdicts = holds_section()
    verdicts |= hold_verdicts
    from hpops_twin.scale_budget_bench import KEY as SCALE_BUDGET_KEY, SIZES as BUDGET_SIZES, scale_budget_section

    with progress.section(f"budget paths at {', '.join(f'{n:,}' for n in BUDGET_SIZES)} users: all cross, held, released"):
        scale_budget_rows, scale_budget_verdicts = scale_budget_section()
    verdicts |= scale_budget_verdicts
    from hpops_twin.balance_bench import KEY as BALANCE_KEY, USERS as BALANCE_USERS, balance_section

    with progress.section(f"balance: {BALANCE_USERS} users through NAT, Client VPN and routed paths, with and without stickiness"):
        balance_rows, balance_verdicts = balance_section()
    verdicts |= balance_verdicts
    from hpops_twin.admission_bench import KEY as ADMISSION_KEY, admission_section

    with progress.section("admission: a scheduled run, a hot node leaving rotation and returning, the floor"):
        admission_record, admission_verdicts = admission_section()
    verdicts |= admission_verdicts
    from hpops_twin import scale_sessions_bench

    with progress.section("sessions at scale: 4 / 12 / 50 login nodes, 200 / 2,000 / 10,000 users, functions fed stored data"):
        scale_rows, scale_verdicts = scale_sessions_bench.scale_sessions_section()
    verdicts |= scale_verdicts
    from hpops_twin import flood_bench

    with progress.section("flood: NodeChannel refusals as a cluster user, priced an hour at NodeFacingConcurrency"):
        flood_rows, flood_verdicts = flood_bench.flood_section()
    verdicts |= flood_verdicts
    from hpops_twin.demo_bench import KEY as DEMO_KEY, demo_section

    with progress.section("demo: `make demo` warm, its CPU seconds and longest silence"):
        demo_run, demo_verdicts = demo_section()
    verdicts |= demo_verdicts
    from hpops_twin.suite_bench import KEY as SUITE_KEY, suite_section

    with progress.section("suite time: the last `make test`'s record (bench-results/suite-times.json), not a new run"):
        suite_summary, suite_verdicts = suite_section()
    verdicts |= suite_verdicts
    print()
    for text, ok in verdicts.items():
        print(f"{'ok  ' if ok else 'MISS'} {text}", flush=True)
    progress.say(f"done: {sum(ok for ok in verdicts.values())} of {len(verdicts)} targets met")
    if json_path:
        with open(json_path, "w", encoding="utf-8") as handle:
            json.dump({"rows": [asdict(r) for r in rows], "targets": verdicts,
                       "node_channel": [asdict(r) for r in channel_rows],
                       "session_limits": [asdict(r) for r in session_rows],
                       BOUND_KEY: bound_record(bound_rows),
                       "budget_guard": [asdict(r) for r in budget_rows],
                       "footprint": asdict(footprint), "usage": asdict(usage_result),
                       "budget_holds": [asdict(r) for r in hold_rows], HOLD_BOUND_KEY: hold_bound_record(hold_rows),
                       BALANCE_KEY: [asdict(r) for r in balance_rows], ADMISSION_KEY: admission_record,
                       SCALE_BUDGET_KEY: [asdict(r) for r in scale_budget_rows],
                       scale_sessions_bench.KEY: scale_sessions_bench.record(scale_rows),
                       DEMO_KEY: asdict(demo_run), flood_bench.KEY: flood_bench.record(flood_rows),
                       **({SUITE_KEY: suite_summary} if suite_summary else {}),
                       "config": {"login_nodes": LOGIN_NODES, "cluster_sizes": list(sizes),
                                  "session_users": session_bench.USERS, "active_sessions": session_bench.SESSIONS},
                       "run": _run_record(progress)}, handle, indent=2)
            handle.write("\n")
        from hpops_twin import cost_model

        print()
        cost_model.main([json_path])  # the month's cost from the counts just written, under "cost"
    return 0 if all(verdicts.values()) else 1


def _run_record(progress: Progress) -> dict:
    """Where and when the figures were measured: the README quotes times from one such run."""
    return {"finished": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version(),
            "seconds": round(time.perf_counter() - progress.began, 1), "sections": progress.sections}
