"""`make bench`, Slurm usage: what one collection sweep costs on the controller at 10,000 jobs a month.

A synthetic month of jobs (users of very different activity, three partitions, durations from
seconds to days, running and pending jobs, multi-node GPU allocations) is written the way
`sacct --parsable2` prints it, with the fields usage.py asks for. A fake `sacct` (a small Python
script in a temporary directory) answers each -S/-E window from those rows, selecting the jobs
sacct selects without -s: eligible before the window ends and not ended before it starts. So the
real UsageCollector.run_once runs unchanged over its normal path: subprocess, parsing, clipping,
aggregation, reports, split_report, the state file. Its ship function only counts PutEvents
entries and bytes (the agent's size rule); nothing is sent to AWS.

Not measured here: sacct's own query time against a real slurmdbd holding 10,000 jobs; the fake's
time is a Python start-up and a scan of a text file. When a real Slurm answers on this machine,
one window is also read from it with the collector's own command and timed.

Counts are exact; seconds are this machine's.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

from hpops_core.node_channel import contract
from hpops_node_agent import identity, usage  # noqa: F401 identity: loaded in the agent before any sweep

JOBS = 10_000
USERS = 40
HOUR = contract.USAGE_WINDOW_SECONDS
# A sweep at 23:40 on the month's last day: the current window is 23:00, the previous one is final.
NOW = int(dt.datetime(2026, 11, 30, 23, 40, tzinfo=dt.timezone.utc).timestamp())
DAYS = 30
EVENTBRIDGE_ENTRY_LIMIT = 256 * 1024
EVENTBRIDGE_BILLING_CHUNK = 64 * 1024  # PutEvents bills each 64 KB of an entry as one event


@dataclass(frozen=True)
class Partition:
    group: str  # the instance group in provisioning_parameters.json
    share: float
    cpus_per_node: int
    gpus_per_node: int
    gpu_tres: str  # how AllocTRES spells the GPUs: both untyped and typed, or typed only
    nodes: tuple[int, ...]  # drawn uniformly: repeats weight the common sizes
    median_seconds: int
    sigma: float
    time_limit: int
    mean_wait: int


PARTITIONS = {
    "cpu": Partition("c5-workers", 0.50, 72, 0, "", (1, 1, 1, 1, 2, 4), 15 * 60, 1.4, 24 * HOUR, 300),
    "gpu": Partition("p5-workers", 0.35, 192, 8, "gres/gpu={g},gres/gpu:h100={g}", (1, 1, 1, 2, 2, 4, 8, 16),
                     2 * HOUR, 1.2, 72 * HOUR, 1800),
    "dev": Partition("g5-workers", 0.15, 48, 4, "gres/gpu:a10g={g}", (1,), 30 * 60, 1.0, 8 * HOUR, 120),
}
SWEEPS = (  # (scenario, hours the state file is behind the current window)
    ("steady 15-min run, caught up", 0),
    ("first run after an hour ends", 1),
    ("catch-up after 30 h down (24-window cap)", 30),
)


@dataclass(frozen=True)
class SyntheticJob:
    job_id: int
    user: str
    partition: str
    nodes: int
    cpus: int
    gpus: int
    eligible: int
    start: int | None  # None: never started (pending, or cancelled while pending)
    end: int | None  # None: not ended (running or pending)
    state: str

    def row(self, now: int) -> str:
        """The line `sacct --parsable2 --format=<usage.SACCT_FIELDS>` prints for this job at ``now``."""
        started = self.start is not None
        shape = PARTITIONS[self.partition]
        tres = ""
        if started:
            gpus = shape.gpu_tres.format(g=self.gpus) + "," if self.gpus else ""
            tres = f"billing={self.cpus},cpu={self.cpus},{gpus}mem={self.nodes * 64}G,node={self.nodes}"
        values = {
            "User": self.user, "JobID": str(self.job_id), "Partition": self.partition,
            "AllocNodes": str(self.nodes if started else 0), "AllocTRES": tres,
            "ElapsedRaw": str(((self.end or now) - self.start) if started else 0),
            "Start": _time(self.start) if started else ("None" if self.end is not None else "Unknown"),
            "End": _time(self.end) if self.end is not None else "Unknown",
            "State": self.state,
        }
        # A KeyError here means usage.py asks sacct for a field this bench does not generate.
        return "|".join(values[name] for name in usage.SACCT_FIELDS)


@dataclass
class Month:
    jobs: list[SyntheticJob]
    now: int

    def provisioning(self) -> dict:
        """provisioning_parameters.json as the lifecycle scripts write it."""
        return {"version": "1.0.0", "workload_manager": "slurm", "controller_group": "controller-machine",
                "login_group": "login-nodes",
                "worker_groups": [{"instance_group_name": shape.group, "partition_name": name}
                                  for name, shape in PARTITIONS.items()]}


def _time(epoch: int) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")


def generate_month(jobs: int = JOBS, seed: int = 1, now: int = NOW, days: int = DAYS) -> Month:
    """``jobs`` jobs submitted over the ``days`` before ``now``, deterministic for a seed."""
    rng = random.Random(seed)
    users = [f"u{number:03d}" for number in range(USERS)]
    activity = [1 / (rank + 1) for rank in range(USERS)]  # a few heavy users, a long tail
    names = list(PARTITIONS)
    shares = [PARTITIONS[name].share for name in names]
    made = []
    for job_id in range(1, jobs + 1):
        name = rng.choices(names, shares)[0]
        shape = PARTITIONS[name]
        user = rng.choices(users, activity)[0]
        eligible = rng.randrange(now - days * 86400, now)
        nodes = rng.choice(shape.nodes)
        if shape.gpus_per_node:
            cpus = nodes * shape.cpus_per_node if name == "gpu" else rng.choice((8, 16, 48))
            gpus = nodes * shape.gpus_per_node if name == "gpu" else rng.choice((1, 2, 4))
        else:
            cpus = nodes * shape.cpus_per_node if nodes > 1 else rng.choice((1, 2, 4, 8, 16, 36, 72))
            gpus = 0
        draw = rng.random()
        if draw < 0.01:  # cancelled while pending
            end = eligible + rng.randint(60, 4 * HOUR)
            made.append(SyntheticJob(job_id, user, name, nodes, cpus, gpus, eligible, None,
                                     end if end < now else None, "CANCELLED by 1001" if end < now else "PENDING"))
            continue
        start = eligible + int(rng.expovariate(1 / shape.mean_wait))
        if draw < 0.08:
            duration, state = rng.randint(5, 120), "FAILED"
        else:
            duration = int(rng.lognormvariate(0, shape.sigma) * shape.median_seconds) + 1
            state = "COMPLETED"
            if duration >= shape.time_limit:
                duration, state = shape.time_limit, "TIMEOUT"
            elif draw < 0.13:
                state = "CANCELLED by 1001"
            elif draw < 0.14:
                state = "OUT_OF_MEMORY"
        if start >= now:
            made.append(SyntheticJob(job_id, user, name, nodes, cpus, gpus, eligible, None, None, "PENDING"))
        elif start + duration > now:
            made.append(SyntheticJob(job_id, user, name, nodes, cpus, gpus, eligible, start, None, "RUNNING"))
        else:
            made.append(SyntheticJob(job_id, user, name, nodes, cpus, gpus, eligible, start, start + duration, state))
    return Month(made, now)


# --------------------------------------------------------------------------- the fake sacct

FAKE_SACCT = r'''
import datetime, os, sys, time

began = time.perf_counter()
EXPECTED = {expected!r}
arguments = sys.argv[1:]
if arguments[:-4] != EXPECTED or arguments[-4] != "-S" or arguments[-2] != "-E":
    sys.stderr.write("sacct (bench fake): not the command the rows were generated for: %r\n" % (arguments,))
    sys.exit(2)


def epoch(text):
    moment = datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S")
    return int(moment.replace(tzinfo=datetime.timezone.utc).timestamp())


start, until = epoch(arguments[-3]), epoch(arguments[-1])
here = os.path.dirname(os.path.abspath(__file__))
rows = []
with open(os.path.join(here, "jobs.tsv"), encoding="utf-8") as handle:
    for line in handle:
        eligible, end, row = line.rstrip("\n").split("\t", 2)
        # sacct without -s: eligible before the window ends, and not ended before it starts
        if int(eligible) < until and (not end or int(end) >= start):
            rows.append(row)
sys.stdout.write("".join(row + "\n" for row in rows))
with open(os.path.join(here, "calls.tsv"), "a", encoding="utf-8") as log:
    log.write("%d\t%d\t%d\t%.6f\n" % (start, until, len(rows), time.perf_counter() - began))
'''


def install_fake_sacct(directory: str, month: Month) -> str:
    """The fake sacct and its rows in ``directory``; returns the executable's path."""
    expected = usage.sacct_command("sacct", 0, 1)[1:-4]
    with open(os.path.join(directory, "jobs.tsv"), "w", encoding="utf-8") as handle:
        for job in month.jobs:
            handle.write(f"{job.eligible}\t{'' if job.end is None else job.end}\t{job.row(month.now)}\n")
    with open(os.path.join(directory, "fake_sacct.py"), "w", encoding="utf-8") as handle:
        handle.write(FAKE_SACCT.format(expected=expected))
    executable = os.path.join(directory, "sacct")
    with open(executable, "w", encoding="utf-8") as handle:
        # -S: the fake needs no site-packages; its start-up is still counted in the sacct time.
        handle.write(f'#!/bin/sh\nexec "{sys.executable}" -S "{directory}/fake_sacct.py" "$@"\n')
    os.chmod(executable, 0o755)
    return executable


# --------------------------------------------------------------------------- the oracle


def selected(job: SyntheticJob, start: int, until: int) -> bool:
    return job.eligible < until and (job.end is None or job.end >= start)


def window_seconds(job: SyntheticJob, start: int, now: int) -> int:
    if job.start is None:
        return 0
    end = now if job.end is None else job.end
    return max(0, min(end, start + HOUR, now) - max(job.start, start))


def expected_totals(month: Month, starts: list[int]) -> tuple[int, int, int]:
    """(rows sacct prints, node-seconds, GPU-seconds) over the windows, straight from the jobs."""
    rows = node_seconds = gpu_seconds = 0
    for start in starts:
        until = max(min(start + HOUR, month.now), start + 1)
        for job in month.jobs:
            if selected(job, start, until):
                rows += 1
                seconds = window_seconds(job, start, month.now)
                node_seconds += job.nodes * seconds
                gpu_seconds += job.gpus * seconds
    return rows, node_seconds, gpu_seconds


# --------------------------------------------------------------------------- one sweep


@dataclass
class SweepRow:
    scenario: str
    window_starts: list[int]
    sacct_calls: int
    rows_parsed: int
    records: int
    events: int  # PutEvents entries: report parts after split_report
    bytes_shipped: int
    billed_events: int  # 64 KB chunks
    max_entry_bytes: int
    wall_seconds: float
    sacct_seconds: float  # inside the sacct subprocess calls (the fake's)
    fake_own_seconds: float  # of which the fake's own scan, after its Python start-up
    ship_seconds: float
    rest_seconds: float  # wall - sacct - ship: parse, clip, aggregate, build and split reports, state file
    node_seconds: int
    gpu_seconds: int
    expected_rows: int
    expected_node_seconds: int
    expected_gpu_seconds: int


def sweep(month: Month, directory: str, sacct: str, scenario: str, hours_behind: int) -> SweepRow:
    current = usage.window_start_of(month.now)
    state = os.path.join(directory, "state", usage.STATE_FILE)
    os.makedirs(os.path.dirname(state), exist_ok=True)
    with open(state, "w", encoding="utf-8") as handle:
        json.dump({"finalThrough": current - hours_behind * HOUR}, handle)
    calls_log = os.path.join(os.path.dirname(sacct), "calls.tsv")
    if os.path.exists(calls_log):
        os.remove(calls_log)
    provisioning = os.path.join(directory, "provisioning_parameters.json")
    with open(provisioning, "w", encoding="utf-8") as handle:
        json.dump(month.provisioning(), handle)

    subprocess_seconds: list[float] = []

    def timed_run(command, **kwargs):
        if os.path.basename(command[0]) != "sacct":
            # The collector also asks `scontrol show config` once per run (GPU tracking); the
            # fake has none, so it fails as on a host without scontrol, and is not a sacct call.
            return subprocess.CompletedProcess(command, 127, b"", b"no scontrol in the bench")
        began = time.perf_counter()
        try:
            return subprocess.run(command, **kwargs)
        finally:
            subprocess_seconds.append(time.perf_counter() - began)

    shipped = {"events": 0, "bytes": 0, "billed": 0, "max": 0, "seconds": 0.0}

    def ship(parts: list) -> bool:
        """Counts what the agent's _send_usage would put in PutEvents entries; sends nothing."""
        began = time.perf_counter()
        for part in parts:
            size = sum(len(text.encode("utf-8")) for text in
                       (contract.REPORT_SOURCE, contract.USAGE_DETAIL_TYPE, usage.encoded(part)))
            shipped["events"] += 1
            shipped["bytes"] += size
            shipped["billed"] += -(-size // EVENTBRIDGE_BILLING_CHUNK)
            shipped["max"] = max(shipped["max"], size)
        shipped["seconds"] += time.perf_counter() - began
        return True

    collector = usage.UsageCollector("bench-cluster", "i-0123456789abcdef0", state_path=state, sacct_cmd=sacct,
                                     clock=lambda: month.now, run=timed_run, provisioning_path=provisioning)
    began = time.perf_counter()
    reports = collector.run_once(ship)
    wall = time.perf_counter() - began

    failed = [report["reason"] for report in reports if report["status"] != contract.USAGE_OK]
    if failed or any(report["skipped"] or report["partitionGroupsReason"] for report in reports):
        raise RuntimeError(f"usage bench '{scenario}': {failed or [r['skippedReasons'] for r in reports]}")
    with open(calls_log, encoding="utf-8") as handle:
        fake_calls = [line.split("\t") for line in handle.read().splitlines()]
    starts = [usage.parse_time(report["windowStart"].rstrip("Z")) for report in reports]
    records = [record for report in reports for record in report["records"]]
    rows, node_seconds, gpu_seconds = expected_totals(month, starts)
    sacct_seconds = sum(subprocess_seconds)
    return SweepRow(
        scenario, starts, len(subprocess_seconds), sum(int(call[2]) for call in fake_calls), len(records),
        shipped["events"], shipped["bytes"], shipped["billed"], shipped["max"], wall, sacct_seconds,
        sum(float(call[3]) for call in fake_calls), shipped["seconds"], wall - sacct_seconds - shipped["seconds"],
        sum(record["nodeSeconds"] for record in records), sum(record["gpuSeconds"] for record in records),
        rows, node_seconds, gpu_seconds)


# --------------------------------------------------------------------------- a real sacct, when there is one


@dataclass
class RealSacct:
    measured: bool
    note: str
    seconds: float | None = None
    jobs: int | None = None


def real_sacct_window(now: float | None = None) -> RealSacct:
    """The collector's own command for the current window against this machine's Slurm, if it answers."""
    sacct = shutil.which("sacct")
    if sacct is None:
        return RealSacct(False, "no sacct on PATH")
    probe = [sacct, "-n", "-X", "-S", "now-1hour"]
    try:
        answer = subprocess.run(probe, capture_output=True, timeout=30, env=usage.slurm_env())
    except (OSError, subprocess.TimeoutExpired) as error:
        return RealSacct(False, f"`{' '.join(probe[1:])}`: {type(error).__name__}")
    if answer.returncode != 0:
        return RealSacct(False, f"`sacct {' '.join(probe[1:])}` exited {answer.returncode}")
    now = time.time() if now is None else now
    start = usage.window_start_of(now)
    result = usage.run_sacct(usage.sacct_command(sacct, start, max(int(now), start + 1)))
    if result.returncode != 0:
        return RealSacct(False, f"the collector's sacct command exited {result.returncode}")
    jobs = sum(1 for line in result.stdout.splitlines() if line.strip())
    return RealSacct(True, f"window {usage.iso(start)} to now", result.seconds, jobs)


# --------------------------------------------------------------------------- the section


@dataclass
class UsageBenchResult:
    jobs: int
    users: int
    partitions: list[str]
    running: int
    pending: int
    multi_node: int
    gpu_jobs: int
    sweep_at: str
    sweeps: list[SweepRow]
    real_sacct: RealSacct

    def verdicts(self) -> dict[str, bool]:
        calls = ", ".join(str(s.sacct_calls) for s in self.sweeps)
        return {
            f"usage: one sacct call per due window ({calls})": all(
                s.sacct_calls == len(s.window_starts) for s in self.sweeps),
            "usage: rows, node- and GPU-seconds equal an independent sum over the generated jobs": all(
                (s.rows_parsed, s.node_seconds, s.gpu_seconds)
                == (s.expected_rows, s.expected_node_seconds, s.expected_gpu_seconds) for s in self.sweeps),
            "usage: every PutEvents entry under EventBridge's 256 KB": all(
                s.max_entry_bytes <= EVENTBRIDGE_ENTRY_LIMIT for s in self.sweeps),
        }

    def render(self) -> str:
        lines = [
            f"Slurm usage collection, one sweep of the real UsageCollector.run_once at {self.sweep_at}",
            f"  data: synthetic month of {self.jobs:,} jobs, {self.users} users, partitions "
            f"{', '.join(self.partitions)}; {self.running} running and {self.pending} pending at the sweep, "
            f"{self.multi_node:,} multi-node, {self.gpu_jobs:,} with GPUs",
            "  sacct: a FAKE (Python script answering -S/-E from the generated rows with sacct's window selection)",
            "  ship: counts PutEvents entries and bytes as the agent builds them; nothing is sent to AWS",
        ]
        header = (f"{'sweep':<42} {'windows':>7} {'sacct':>5} {'rows':>5} {'records':>7} {'events':>6} "
                  f"{'bytes':>8} {'wall s':>7} {'sacct s':>7} {'rest s':>7} {'ship s':>7}")
        lines += [header, "-" * len(header)]
        for s in self.sweeps:
            lines.append(f"{s.scenario:<42} {len(s.window_starts):>7} {s.sacct_calls:>5} {s.rows_parsed:>5} "
                         f"{s.records:>7} {s.events:>6} {s.bytes_shipped:>8,} {s.wall_seconds:7.3f} "
                         f"{s.sacct_seconds:7.3f} {s.rest_seconds:7.3f} {s.ship_seconds:7.3f}")
        lines += [
            "  wall = sacct + rest + ship; rest = parse, clip, aggregate, build and split reports, state file;",
            "  ship = encoding each entry and counting it. events = PutEvents entries (report parts);",
            f"  billed 64 KB events per sweep: {', '.join(str(s.billed_events) for s in self.sweeps)}.",
            "  'sacct s' is the FAKE's process (sh + Python start-up + a scan of the rows; its own scan: "
            f"{', '.join(f'{s.fake_own_seconds:.3f}' for s in self.sweeps)} s), NOT sacct's query time",
            f"  against a real slurmdbd holding {self.jobs:,} jobs, which this bench does not measure.",
        ]
        real = self.real_sacct
        if real.measured:
            lines.append(f"real sacct on this machine ({real.note}, the collector's command): {real.seconds:.3f} s, "
                         f"{real.jobs} jobs returned (this machine's Slurm, not the synthetic month)")
        else:
            lines.append(f"real sacct: not measured ({real.note})")
        return "\n".join(lines)


def measure(jobs: int = JOBS, seed: int = 1, real_sacct: bool = True, days: int = DAYS) -> UsageBenchResult:
    month = generate_month(jobs, seed, days=days)
    with tempfile.TemporaryDirectory(prefix="hpops-usage-bench-") as directory:
        sacct = install_fake_sacct(directory, month)
        rows = [sweep(month, directory, sacct, scenario, behind) for scenario, behind in SWEEPS]
    started = [job for job in month.jobs if job.start is not None]
    return UsageBenchResult(
        jobs=len(month.jobs), users=len({job.user for job in month.jobs}), partitions=list(PARTITIONS),
        running=sum(1 for job in started if job.end is None),
        pending=sum(1 for job in month.jobs if job.start is None and job.end is None),
        multi_node=sum(1 for job in month.jobs if job.nodes > 1),
        gpu_jobs=sum(1 for job in month.jobs if job.gpus), sweep_at=usage.iso(month.now), sweeps=rows,
        real_sacct=real_sacct_window() if real_sacct else RealSacct(False, "not asked for"))


def usage_section(jobs: int = JOBS) -> tuple[UsageBenchResult, dict[str, bool]]:
    """For bench.py: measure, print, and return the result and the verdicts."""
    result = measure(jobs)
    print()
    print(result.render(), flush=True)
    return result, result.verdicts()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="What one Slurm usage collection sweep costs.")
    parser.add_argument("--jobs", type=int, default=JOBS)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    result, verdicts = usage_section(args.jobs)
    print()
    for text, ok in verdicts.items():
        print(f"{'ok  ' if ok else 'MISS'} {text}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"usage": asdict(result), "targets": verdicts}, handle, indent=2)
    return 0 if all(verdicts.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
