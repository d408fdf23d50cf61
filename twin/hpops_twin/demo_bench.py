"""`make bench`'s demo section: `hpops demo` as a user runs it (warm venv), its CPU seconds, wall seconds and
the longest time it printed nothing.

    python -m hpops_twin.demo_bench [--merge docs/bench.json]

The demo runs in a child process, so its CPU is the child's (resource.RUSAGE_CHILDREN: the demo and the
ssh-keygen it runs), whatever else the machine is doing; wall time and silences are what a user waits.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from hpops_twin.bench_section import run_alone

KEY = "demo"
CPU_TARGET_SECONDS = 60
SILENCE_TARGET_SECONDS = 10


@dataclass
class DemoRun:
    exit_status: int
    cpu_seconds: float
    wall_seconds: float
    longest_silence_seconds: float
    silent_before: str  # the line printed after the longest silence
    lines: int


def run_demo_measured(command: list[str] | None = None, echo: Callable[[str], None] | None = None) -> DemoRun:
    command = command or [str(Path(sys.executable).with_name("hpops")), "demo"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = last = time.monotonic()
    longest, after, lines = 0.0, "", 0
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=os.environ | {"PYTHONUNBUFFERED": "1"})
    for line in process.stdout:
        now = time.monotonic()
        lines += 1
        if now - last > longest:
            longest, after = now - last, line.strip()[:100]
        last = now
        if echo:
            echo(line.rstrip("\n"))
    status = process.wait()
    wall = time.monotonic() - began
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (used.ru_utime - before.ru_utime) + (used.ru_stime - before.ru_stime)
    return DemoRun(status, round(cpu, 1), round(wall, 1), round(longest, 1), after, lines)


def demo_section(echo: Callable[[str], None] | None = None) -> tuple[DemoRun, dict[str, bool]]:
    run = run_demo_measured(echo=echo)
    print(f"\nmake demo (warm): exit {run.exit_status}, {run.cpu_seconds:.1f} s CPU, {run.wall_seconds:.1f} s wall, "
          f"{run.lines} lines; longest silence {run.longest_silence_seconds:.1f} s, before: {run.silent_before}",
          flush=True)
    verdicts = {
        f"demo: exits 0 in at most {CPU_TARGET_SECONDS} s of CPU": run.exit_status == 0 and run.cpu_seconds <= CPU_TARGET_SECONDS,
        f"demo: never silent for more than {SILENCE_TARGET_SECONDS} s": run.longest_silence_seconds <= SILENCE_TARGET_SECONDS,
    }
    return run, verdicts


def main(argv: list[str]) -> int:
    """Run this section alone (`--show`: with the demo's lines); `--merge FILE` also replaces only its key in
    that bench JSON file."""
    show = "--show" in argv
    argv = [a for a in argv if a != "--show"]
    run, verdicts = demo_section(echo=(lambda line: print(line, flush=True)) if show else None)
    return run_alone(argv, verdicts, {KEY: asdict(run)})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
