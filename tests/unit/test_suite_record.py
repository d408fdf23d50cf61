"""`make test` keeps what the run cost in bench-results/suite-times.json (tests/README.md). A test that
runs pytest again inside the suite must leave that record as the outer run writes it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
PROBE = TESTS / "unit" / "nested_run_probe.py"


def test_a_pytest_run_inside_the_suite_leaves_the_suite_record_as_the_outer_run_writes_it(tmp_path):
    record = tmp_path / "suite-times.json"
    # The outer run as `make test` starts it; the environment variable that used to name the record is
    # set too, as a shell left from an older checkout would have it: the inner run inherits it.
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
                          f"--suite-times={record}", f"{PROBE}::test_runs_pytest_inside_the_run"],
                         cwd=TESTS.parent, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "HPOPS_SUITE_TIMES": str(record), "HPOPS_NESTED_PROBE_RECORD": str(record)})
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]  # the probe: untouched while it ran

    written = json.loads(record.read_text(encoding="utf-8"))
    slowest = {entry["test"] for entry in written["slowest"]}
    assert "tests/unit/nested_run_probe.py::test_runs_pytest_inside_the_run" in slowest, written
    assert not any("test_inner_run" in test for test in slowest), "the inner run's record replaced the outer one"
    assert written["directories"]["tests/unit"]["tests"] == 1
    # The outer run still prints its summary: the slowest tests and the suite's time (what .ci/run shows).
    assert "suite time:" in run.stdout


def test_make_test_names_the_record_by_option():
    recipe = (TESTS.parent / "Makefile").read_text(encoding="utf-8").split("\ntest:", 1)[1].split("\n\n", 1)[0]
    assert re.search(r"\$\(PYTEST\) --durations=20 --suite-times=bench-results/suite-times\.json", recipe), recipe
    assert "HPOPS_SUITE_TIMES" not in recipe
