"""The usage collector against a real Slurm with slurmdbd accounting (conftest.py brings it up).

Two users run short jobs of different sizes; the collector (the real module, through its one-shot
CLI in a subprocess) must report per-user node-, CPU- and GPU-seconds equal to what sacct itself
says and to what sreport says after a forced rollup, the same again on a re-run, and honest
statuses when accounting is disabled or slurmdbd is down.
"""

from __future__ import annotations

import collections
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpops_core.node_channel import contract
from hpops_node_agent import bundle as bundle_module
from hpops_node_agent import usage

pytestmark = pytest.mark.realslurm

ALICE, BOB = "hpusage-alice", "hpusage-bob"
INSTANCE_ID = "i-0123456789abcdef0"
# Whole seconds: each job's elapsed time may be N or N+1 depending on which source rounds when.
JITTER_SECONDS_PER_JOB = 1


def utc(epoch: float) -> str:
    return datetime.datetime.fromtimestamp(int(epoch), datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")


def run_collector(slurm, tmp_path: Path, since: str, conf: Path | None = None) -> tuple[int, list, float]:
    """`python3 -m hpops_node_agent usage --once --print`: (exit code, reports, wall seconds)."""
    config = tmp_path / "agent.json"
    config.write_text(json.dumps({"cluster": "hpopsusage", "region": "us-west-2", "reportBus": "bus",
                                  "role": "controller", "ip": "127.0.0.1", "instanceId": INSTANCE_ID}))
    env = dict(os.environ, SLURM_CONF=str(conf or slurm.conf),
               PYTHONPATH=str(Path(bundle_module.__file__).parent.parent),
               # a half-hour offset: any local-time slip would shift every job across windows
               TZ="XST-5:30")
    began = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "hpops_node_agent", "usage", "--once", "--print",
                             "--since", since, "--config", str(config)],
                            capture_output=True, text=True, timeout=120, env=env)
    seconds = time.monotonic() - began
    assert result.stdout, result.stderr
    return result.returncode, json.loads(result.stdout), seconds


def per_user(reports: list) -> dict:
    totals: dict = collections.defaultdict(lambda: collections.Counter())
    for report in reports:
        for record in report["records"]:
            totals[record["user"]].update({name: record[name] for name in
                                           ("nodeSeconds", "cpuSeconds", "gpuSeconds", "jobs")})
    return {user: dict(values) for user, values in totals.items()}


def stack_node_hours(reports: list) -> dict:
    """Per-user node-hours as CheckUserSpend computes them from the reports the agent sent."""
    from decimal import Decimal

    from hpops_core.budget_guard.rates import Rate, RateChoice, no_billed_month
    from hpops_core.budget_guard.usage_reports import parse_usage_event
    from hpops_core.budget_guard.usage_store import StoredWindow
    from hpops_core.budget_guard.user_spend import UserLimits, spend_report

    windows = []
    for report in reports:
        for part in usage.split_report(report):
            parsed = parse_usage_event({"source": contract.REPORT_SOURCE, "detail-type": contract.USAGE_DETAIL_TYPE,
                                        "detail": part})
            # the test cluster has no provisioning_parameters.json: map its one partition by hand
            windows.append(StoredWindow(parsed.window_start, parsed.collected_at, parsed.final, parsed.status,
                                        parsed.records, {"batch": "compute"}))
    rate = Rate("ml.c5.4xlarge", Decimal("1"), "override", "test rate: $1 per node-hour")
    rates = RateChoice({"ml.c5.4xlarge": rate}, ())
    now = datetime.datetime.now(datetime.timezone.utc)
    report = spend_report("hpopsusage", now, windows,
                          [{"InstanceGroupName": "compute", "InstanceType": "ml.c5.4xlarge", "CurrentCount": 1}],
                          rates, no_billed_month(), UserLimits())
    spend = {u.user: u for u in report.users}
    # at $1 per node-hour, dollars are node-hours (kept to the micro-dollar per record)
    assert all(abs(u.usd - u.node_hours) < Decimal("0.0001") for u in spend.values())
    return {user: u.node_hours for user, u in spend.items()}


def tres(text: str, name: str) -> int:
    return sum(int(item.split("=", 1)[1]) for item in text.split(",") if item.split("=", 1)[0] == name)


def test_per_user_usage_equals_sacct_and_sreport_and_a_rerun_changes_nothing(slurm, tmp_path, monkeypatch):
    began = time.time()
    since = utc(began - 1)
    two = "-n{}".format(min(2, slurm.cpus))
    jobs = [slurm.submit(ALICE, "-n1", "--gres=gpu:1", "--wrap=sleep 3"),
            slurm.submit(ALICE, two, "--wrap=sleep 2"),
            slurm.submit(BOB, "-n1", "--wrap=sleep 2"),
            slurm.submit(BOB, "-n1", "--gres=gpu:2", "--wrap=sleep 4")]

    fields = "--format=User,JobID,AllocNodes,AllocCPUS,AllocTRES,ElapsedRaw,End,State,Start"

    def all_ended():
        rows = {row[1]: row for row in slurm.sacct_lines(since, fields)}
        return rows if all(job in rows and rows[job][6] not in ("Unknown", "") for job in jobs) else None

    rows = slurm.wait_for("every job's End in accounting", all_ended, timeout=60, interval=0.5)
    jobs_done = time.time()
    assert {rows[job][7] for job in jobs} == {"COMPLETED"}, rows

    # What sacct itself says, per user; and how far another source may be off (a second per job, times its size).
    expected: dict = collections.defaultdict(collections.Counter)
    tolerance: dict = collections.defaultdict(collections.Counter)
    for job in jobs:
        user, _, nodes, cpus, alloc_tres, elapsed, _, _, _ = rows[job]
        assert int(elapsed) >= 2  # the job really ran (an unwritable work directory ends FAILED in 0 s)
        gpus = tres(alloc_tres, "gres/gpu")
        expected[user].update({"nodeSeconds": int(nodes) * int(elapsed), "cpuSeconds": int(cpus) * int(elapsed),
                               "gpuSeconds": gpus * int(elapsed), "jobs": 1})
        tolerance[user].update({"nodeSeconds": int(nodes) * JITTER_SECONDS_PER_JOB,
                                "cpuSeconds": int(cpus) * JITTER_SECONDS_PER_JOB,
                                "gpuSeconds": gpus * JITTER_SECONDS_PER_JOB})

    code, reports, collector_seconds = run_collector(slurm, tmp_path, since)
    assert code == 0 and {report["status"] for report in reports} == {contract.USAGE_OK}, reports
    assert all(report["skipped"] == 0 and report["instanceId"] == INSTANCE_ID for report in reports)
    found = per_user(reports)
    assert set(found) == {ALICE, BOB}
    for user in (ALICE, BOB):
        assert found[user]["jobs"] == expected[user]["jobs"] == 2
        for name in ("nodeSeconds", "cpuSeconds", "gpuSeconds"):
            assert found[user][name] > 0
            assert abs(found[user][name] - expected[user][name]) <= tolerance[user][name], (
                user, name, found, dict(expected))

    # What the stack makes of those reports: each part through the Lambda's validation, then the
    # per-user figures the budget guard prices, against sacct's own totals.
    stack_hours = stack_node_hours(reports)
    for user in (ALICE, BOB):
        assert abs(stack_hours[user] * 3600 - expected[user]["nodeSeconds"]) <= tolerance[user]["nodeSeconds"], (
            user, stack_hours, dict(expected))

    # A window that cuts through the longest job: the module's own sacct call still finds every job
    # overlapping it (those that started before it too) and clips each to it.
    def epoch(text: str) -> int:
        return int(datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S").replace(
            tzinfo=datetime.timezone.utc).timestamp())

    longest = max(jobs, key=lambda job: int(rows[job][5]))
    cut_start, cut_end = epoch(rows[longest][8]) + 1, epoch(rows[longest][8]) + 3
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    result = usage.run_sacct(usage.sacct_command(slurm.sacct, cut_start, cut_end))
    assert result.returncode == 0, result.stderr
    clipped, skipped = usage.aggregate(result.stdout.splitlines(), cut_start, cut_end, time.time())
    assert not skipped
    oracle: dict = collections.defaultdict(collections.Counter)
    for job in jobs:
        user, _, nodes, cpus, alloc_tres, _, end, _, start = rows[job]
        inside = min(epoch(end), cut_end) - max(epoch(start), cut_start)
        if inside > 0:
            # a job is counted in the window it started in, not in every window it overlaps
            oracle[(user, "batch")].update({"nodeSeconds": int(nodes) * inside, "cpuSeconds": int(cpus) * inside,
                                            "gpuSeconds": tres(alloc_tres, "gres/gpu") * inside,
                                            "jobs": int(cut_start <= epoch(start) < cut_end)})
    assert clipped == {key: dict(values) for key, values in oracle.items()}
    assert clipped[(rows[longest][0], "batch")]["nodeSeconds"] >= 2

    # sreport, after a rollup forced past the current hour, agrees per user.
    today = utc(began // 86400 * 86400)
    next_hour = utc((time.time() // 3600 + 1) * 3600)
    slurm.rollup(today, next_hour)
    window_start = utc(began // 3600 * 3600)
    by_sreport = {}
    for tres_name, name in (("cpu", "cpuSeconds"), ("gres/gpu", "gpuSeconds"), ("node", "nodeSeconds")):
        used = by_sreport[tres_name] = slurm.sreport_used_by_user(window_start, tres_name)
        for user in (ALICE, BOB):
            assert abs(used.get(user, 0) - found[user][name]) <= tolerance[user][name], (tres_name, user, used, found)

    # A re-run reads the same windows: the same keys, the same totals.
    code, again, _ = run_collector(slurm, tmp_path, since)
    assert code == 0
    assert [[(r["key"], r["nodeSeconds"], r["cpuSeconds"], r["gpuSeconds"], r["jobs"]) for r in report["records"]]
            for report in again] == \
        [[(r["key"], r["nodeSeconds"], r["cpuSeconds"], r["gpuSeconds"], r["jobs"]) for r in report["records"]]
         for report in reports]
    assert per_user(again) == found

    sacct_seconds = [report["sacctSeconds"] for report in reports]
    print("\nreal Slurm: up {:.1f} s, jobs done {:.1f} s after submit, sacct {} s per window, "
          "collector CLI {:.2f} s wall\ncollector {}\nsreport {}".format(
              slurm.timings["up"], jobs_done - began, sacct_seconds, collector_seconds, found, by_sreport))


def test_accounting_disabled_is_reported_as_such(slurm, tmp_path):
    code, reports, _ = run_collector(slurm, tmp_path, utc(time.time()), conf=slurm.conf_without_accounting)
    assert code == 1
    [report] = reports
    assert report["status"] == contract.USAGE_NOT_ENABLED and report["records"] == []
    assert "disabled" in report["reason"]


def test_slurmdbd_down_is_sacct_failed_not_zeros(slurm, tmp_path):
    slurm.stop("slurmdbd")  # the last test of the module: the fixture tears the rest down
    code, reports, _ = run_collector(slurm, tmp_path, utc(time.time()))
    assert code == 1
    [report] = reports
    assert report["status"] == contract.USAGE_SACCT_FAILED and report["records"] == []
    assert "database" in report["reason"].lower() or "connection" in report["reason"].lower(), report["reason"]
