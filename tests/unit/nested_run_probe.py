"""Run only by test_suite_record.py, in a pytest of its own: its one test runs pytest again inside that
run, as the suite's own probes do (test_suite_layout.py), with the run's environment, and then checks
that the inner run left the outer run's record (HPOPS_NESTED_PROBE_RECORD) as it was: not yet written."""

import os
import subprocess
import sys
from pathlib import Path


def test_runs_pytest_inside_the_run():
    record = Path(os.environ["HPOPS_NESTED_PROBE_RECORD"])
    inner = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
                            f"{__file__}::test_inner_run"], cwd=Path(__file__).resolve().parents[2],
                           capture_output=True, text=True, timeout=300, env=os.environ)
    assert inner.returncode == 0 and "1 passed" in inner.stdout, inner.stdout[-2000:] + inner.stderr[-2000:]
    assert not record.exists(), f"the inner run wrote the outer run's record: {record.read_text(encoding='utf-8')}"


def test_inner_run():
    pass
