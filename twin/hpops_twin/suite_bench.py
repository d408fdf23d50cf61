"""`make bench`'s suite section: what the last `make test` cost, read from the record it wrote
(bench-results/suite-times.json, tests/conftest.py), against the suite's budget (tests/README.md).

    python -m hpops_twin.suite_bench [bench-results/suite-times.json] [--merge docs/bench.json]

It never runs the suite itself (that is `make test`, and minutes): without a record it says so and
sets no target. The budget is for `bash .ci/run` on a fresh clone, installs included; the record
holds the tests' wall time, so the wall-time target here is the tests' share of it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from hpops_twin.bench_section import run_alone
from hpops_twin.template_model import REPO_ROOT

KEY = "suite"
RECORD = REPO_ROOT / "bench-results" / "suite-times.json"
WALL_TARGET_SECONDS = 20 * 60  # bash .ci/run on a fresh clone, 2 CPUs
PEAK_TARGET_MB = 2048  # each worker (the twin tests' process) under 2 GB
SLOWEST_SHOWN = 10


def suite_record(path: Path = RECORD) -> dict[str, Any] | None:
    """The last `make test`'s record, or None if there is none (a fresh clone before its first run)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None


def suite_summary(record: dict[str, Any]) -> dict[str, Any]:
    """What the section reports and docs/bench.json keeps: wall, shares, peaks, the slowest tests."""
    processes = record.get("processes", [])
    return {
        "wall_seconds": record["wall_seconds"], "test_seconds": record["test_seconds"],
        "tests": sum(d["tests"] for d in record["directories"].values()),
        "directories": {name: {"tests": d["tests"], "seconds": d["seconds"], "share": d["share"]}
                        for name, d in record["directories"].items()},
        "workers": [{"worker": p["worker"], "cpu_seconds": p["cpu_seconds"], "peak_rss_mb": p["peak_rss_mb"]}
                    for p in processes],
        "peak_rss_mb": max((p["peak_rss_mb"] for p in processes), default=None),
        "slowest": record.get("slowest", [])[:SLOWEST_SHOWN],
    }


def suite_section(path: Path = RECORD) -> tuple[dict[str, Any] | None, dict[str, bool]]:
    record = suite_record(path)
    if record is None:
        print(f"\nsuite time: no record at {path} (`make test` writes it); nothing to report", flush=True)
        return None, {}
    summary = suite_summary(record)
    print(f"\nsuite time (the last `make test`, {path.name}): {summary['tests']:,} tests, "
          f"{summary['wall_seconds']:.0f} s wall, {summary['test_seconds']:.0f} s in tests", flush=True)
    print(f"{'directory':<14} {'tests':>6} {'seconds':>9} {'share':>7}")
    for name, d in summary["directories"].items():
        print(f"{name:<14} {d['tests']:>6} {d['seconds']:>9.1f} {100 * d['share']:>6.1f}%")
    for worker in summary["workers"]:
        print(f"worker {worker['worker']:<6} cpu {worker['cpu_seconds']:>7.1f} s, peak memory {worker['peak_rss_mb']} MB")
    if summary["slowest"]:
        print(f"slowest {len(summary['slowest'])}:")
        for phase in summary["slowest"]:
            print(f"  {phase['seconds']:>7.1f} s {phase['phase']:<8} {phase['test']}")
    else:
        print("slowest: not in this record (written before it kept them)")
    peak = summary["peak_rss_mb"]
    verdicts = {
        f"suite: the tests' wall time at most {WALL_TARGET_SECONDS // 60} min (bash .ci/run's budget, installs aside)":
            summary["wall_seconds"] <= WALL_TARGET_SECONDS,
        f"suite: every worker's peak memory under {PEAK_TARGET_MB} MB": peak is not None and peak < PEAK_TARGET_MB,
    }
    return summary, verdicts


def main(argv: list[str]) -> int:
    """Report the record (default bench-results/suite-times.json); `--merge FILE` also replaces only this
    section's key and targets in that bench JSON file."""
    path = Path(argv[0]) if argv[:1] and not argv[0].startswith("--") else RECORD
    argv = argv[1:] if argv[:1] and not argv[0].startswith("--") else argv
    summary, verdicts = suite_section(path)
    if summary is None:
        return 1
    return run_alone(argv, verdicts, {KEY: summary}, stale_target=lambda text: text.startswith("suite: "))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
