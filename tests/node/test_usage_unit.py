"""Slurm usage from accounting: parsing, clipping to windows, idempotency, statuses, shipping.

sacct is stood in by a small script (the collector runs it as a real subprocess); the numbers
against a real Slurm are in tests/slurm/test_usage_real_slurm.py.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import boto3
import pytest
from moto import mock_aws
from real_tools import MotoServer

from hpops_core.node_channel import contract
from hpops_node_agent import bundle as bundle_module
from hpops_node_agent import usage
from hpops_node_agent.agent import NodeAgent
from hpops_node_agent.config import AgentConfig, ConfigError

CLUSTER = "usage-cluster"
REGION = "us-west-2"
BUS = "hpops-node-reports"
INSTANCE_ID = "i-0123456789abcdef0"
HOUR = 3600


def at(text: str) -> int:
    return int(datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=datetime.timezone.utc).timestamp())


W0 = at("2026-11-23T06:00:00")  # the window most tests look at
NOW = at("2026-11-23T06:55:00")  # inside W0: W0 is the open window

LINES = [
    # 2 nodes x 30 min, 16 GPUs
    "alice|101|gpu|2|billing=192,cpu=192,gres/gpu=16,mem=2000G,node=2|1800|2026-11-23T06:10:00|2026-11-23T06:40:00|COMPLETED",
    # spans the previous window and this one: 30 min before, 60 min in W0
    "bob|102|cpu|1|billing=4,cpu=4,mem=8G,node=1|5400|2026-11-23T05:30:00|2026-11-23T07:00:00|COMPLETED",
    # still running: counts up to now; GPUs only as typed entries
    "alice|103|gpu|1|cpu=96,gres/gpu:h100=8,node=1|300|2026-11-23T06:50:00|Unknown|RUNNING",
    # a requeued job's earlier run (--duplicates): it held its node too
    "j.doe|104|cpu|1|cpu=2,node=1|120|2026-11-23T06:00:00|2026-11-23T06:02:00|REQUEUED",
    "j.doe|104|cpu|1|cpu=2,node=1|60|2026-11-23T06:05:00|2026-11-23T06:06:00|COMPLETED",
    # never started: nothing to count, nothing skipped
    "carol|105|gpu|0||0|Unknown|Unknown|PENDING",
    "carol|106|gpu|0||0|None|2026-11-23T06:20:00|CANCELLED by 1001",
    # hostile or odd: skipped with a reason, never in the report
    "bad;user|107|gpu|1|cpu=1,node=1|60|2026-11-23T06:00:00|2026-11-23T06:01:00|COMPLETED",
    "-rf|108|gpu|1|cpu=1,node=1|60|2026-11-23T06:00:00|2026-11-23T06:01:00|COMPLETED",
    "dave|109|gpu|two|cpu=1,node=1|60|2026-11-23T06:00:00|2026-11-23T06:01:00|COMPLETED",
    "dave|110|gpu|1|cpu=1e9,node=1|60|2026-11-23T06:00:00|2026-11-23T06:01:00|COMPLETED",
    "dave|111|gpu|1|cpu=1,node=1|60|yesterday|2026-11-23T06:01:00|COMPLETED",
    "dave|113|gpu|1|cpu=1,node=1|99999999999999999999|2026-11-23T06:00:00|2026-11-23T06:01:00|COMPLETED",
    "dave|112|gpu;x|1|cpu=1,node=1|60|2026-11-23T06:00:00|2026-11-23T06:01:00|COMPLETED",
    "sacct: error: this is not a job line",
    "",
]


def totals_at(window_start: int, now: int, lines=LINES):
    return usage.aggregate(lines, window_start, window_start + HOUR, now)


# --------------------------------------------------------------------------- parsing and clipping


def test_per_user_per_partition_totals_clip_jobs_to_the_window():
    totals, skipped = totals_at(W0, NOW)
    assert totals == {
        ("alice", "gpu"): {"nodeSeconds": 2 * 1800 + 300, "cpuSeconds": 192 * 1800 + 96 * 300,
                           "gpuSeconds": 16 * 1800 + 8 * 300, "jobs": 2},
        # the open window ends at now (06:55): 55 of the job's 60 minutes in W0 so far; the job is
        # counted in the window it started in (05:00), so a month's jobs are jobs, not job-hours
        ("bob", "cpu"): {"nodeSeconds": 3300, "cpuSeconds": 4 * 3300, "gpuSeconds": 0, "jobs": 0},
        ("j.doe", "cpu"): {"nodeSeconds": 180, "cpuSeconds": 360, "gpuSeconds": 0, "jobs": 2},
    }
    assert skipped == {usage.SKIP_USER: 2, usage.SKIP_NUMBER: 3, usage.SKIP_TIME: 1, usage.SKIP_PARTITION: 1,
                       usage.SKIP_MALFORMED: 1}


def test_a_job_spanning_two_windows_is_split_between_them():
    later = at("2026-11-23T07:20:00")
    # what sacct says at 07:20: the running job's ElapsedRaw has grown with it
    lines = [line.replace("|300|", "|1800|") for line in LINES]
    before, _ = totals_at(W0 - HOUR, later, lines)
    during, _ = totals_at(W0, later, lines)
    assert before[("bob", "cpu")]["nodeSeconds"] == 1800 and during[("bob", "cpu")]["nodeSeconds"] == 3600
    assert before[("bob", "cpu")]["nodeSeconds"] + during[("bob", "cpu")]["nodeSeconds"] == 5400
    assert (before[("bob", "cpu")]["jobs"], during[("bob", "cpu")]["jobs"]) == (1, 0)  # one job, counted once
    # the running job keeps counting, up to the end of a window that has ended
    assert during[("alice", "gpu")]["nodeSeconds"] == 2 * 1800 + 600
    after, _ = totals_at(W0 + HOUR, later, lines)
    assert after[("alice", "gpu")] == {"nodeSeconds": 1200, "cpuSeconds": 96 * 1200, "gpuSeconds": 8 * 1200,
                                       "jobs": 0}  # it started (and was counted) in W0


def test_unknown_end_counts_to_now_and_elapsed_caps_suspended_time():
    running = usage.parse_line("alice|1|gpu|1|cpu=8,node=1|100|2026-11-23T06:00:00|Unknown|RUNNING")
    assert running.end is None
    assert usage.seconds_in_window(running._replace(elapsed=None), W0, W0 + HOUR, W0 + 600) == 600
    # Start..End says 600 s, but the job was suspended for all but 100 of them
    assert usage.seconds_in_window(running, W0, W0 + HOUR, W0 + 600) == 100
    assert usage.seconds_in_window(running, W0 + HOUR, W0 + 2 * HOUR, W0 + 600) == 0


def test_gpu_tres_untyped_total_wins_over_typed_entries():
    assert usage.parse_tres("cpu=8,gres/gpu=4,gres/gpu:a100=4,node=1") == {"cpu": 8, "node": 1, "gpu": 4}
    assert usage.parse_tres("cpu=8,gres/gpu:a100=2,gres/gpu:h100=3") == {"cpu": 8, "node": 0, "gpu": 5}
    assert usage.parse_tres("") == {"cpu": 0, "node": 0, "gpu": 0}
    with pytest.raises(usage.SkippedLine, match=usage.SKIP_NUMBER):
        usage.parse_tres("cpu")
    with pytest.raises(usage.SkippedLine, match=usage.SKIP_NUMBER):
        usage.parse_tres("cpu=٣")  # a digit, but not an ASCII one


# --------------------------------------------------------------------------- reports and keys


def report_at(now: int, lines=LINES, window_start: int = W0) -> dict:
    totals, skipped = totals_at(window_start, now, lines)
    return usage.build_report(CLUSTER, INSTANCE_ID, window_start, now, contract.USAGE_OK, totals=totals,
                              skipped=skipped, sacct_seconds=0.25, agent_version="t")


def test_report_shape_and_idempotency_keys():
    report = report_at(NOW)
    assert report["format"] == contract.USAGE_FORMAT
    assert (report["windowStart"], report["windowEnd"]) == ("2026-11-23T06:00:00Z", "2026-11-23T07:00:00Z")
    assert report["final"] is False and report["collectedAt"] == "2026-11-23T06:55:00Z"
    assert report["skipped"] == 8 and report["sacctSeconds"] == 0.25 and (report["part"], report["parts"]) == (1, 1)
    assert [record["key"] for record in report["records"]] == [
        "usage-cluster/2026-11-23T06:00:00Z/alice/gpu", "usage-cluster/2026-11-23T06:00:00Z/bob/cpu",
        "usage-cluster/2026-11-23T06:00:00Z/j.doe/cpu"]
    text = json.dumps(report)
    for odd in ("bad;user", "-rf", "two", "1e9", "yesterday", "gpu;x", "not a job line", "99999"):
        assert odd not in text

    # Re-reading the same window: the same keys, the same totals (replaces, never adds).
    assert report_at(NOW) == report
    # Later the totals grow under the same keys; once the settle delay has passed, the window is final.
    later = report_at(W0 + HOUR + contract.USAGE_SETTLE_SECONDS)
    assert [r["key"] for r in later["records"]] == [r["key"] for r in report["records"]]
    assert later["records"][1]["nodeSeconds"] == 3600 and later["final"] is True
    assert report_at(W0 + HOUR + contract.USAGE_SETTLE_SECONDS - 1)["final"] is False


def test_record_keys_refuse_what_could_break_them():
    with pytest.raises(ValueError):
        contract.usage_record_key(CLUSTER, "2026-11-23T06:00:00Z", "a/b", "gpu")
    with pytest.raises(ValueError):
        contract.usage_record_key(CLUSTER, "2026-11-23T06:00:00Z", "alice", "gpu/x")
    with pytest.raises(ValueError):
        contract.usage_record_key(CLUSTER, "2026-11-23 06:00", "alice", "gpu")


def test_big_windows_are_split_into_parts_under_the_limit():
    lines = ["user{0}|{0}|part{1}|1|cpu=1,node=1|60|2026-11-23T06:00:00|2026-11-23T06:01:00|COMPLETED".format(
        index, index % 7) for index in range(3000)]
    report = report_at(NOW, lines)
    assert len(report["records"]) == 3000
    parts = usage.split_report(report, max_bytes=64 * 1024)
    assert len(parts) > 1
    assert all(len(usage.encoded(part).encode()) <= 64 * 1024 for part in parts)
    assert [(part["part"], part["parts"]) for part in parts] == [(i, len(parts)) for i in range(1, len(parts) + 1)]
    assert [record for part in parts for record in part["records"]] == report["records"]
    assert usage.split_report(report_at(NOW)) == [report_at(NOW)]


# --------------------------------------------------------------------------- partitions -> instance groups

# The lifecycle scripts' provisioning_parameters.json (awslabs/awsome-distributed-training,
# 1.architectures/5.sagemaker-hyperpod: README's example, and automate-cluster-creation.sh, which
# names each worker group's partition after its instance type).
PROVISIONING = {
    "version": "1.0.0",
    "workload_manager": "slurm",
    "controller_group": "controller-machine",
    "login_group": "my-login-group",
    "worker_groups": [
        {"instance_group_name": "compute-nodes", "partition_name": "dev"},
        {"instance_group_name": "worker-group-1", "partition_name": "ml.p5.48xlarge"},
    ],
    "fsx_dns_name": "fs-12345678a90b01cde.fsx.us-west-2.amazonaws.com",
    "fsx_mountname": "1abcdefg",
}


def provisioning_file(tmp_path: Path, document) -> Path:
    path = tmp_path / "provisioning_parameters.json"
    if isinstance(document, bytes):
        path.write_bytes(document)
    else:
        path.write_text(document if isinstance(document, str) else json.dumps(document))
    return path


def test_every_report_part_names_each_partitions_instance_group(tmp_path):
    sacct = fake_sacct(tmp_path / "bin", stdout="\n".join(LINES) + "\n")
    logged = []
    collect = usage.UsageCollector(CLUSTER, INSTANCE_ID, sacct_cmd=str(sacct), clock=lambda: NOW,
                                   provisioning_path=str(provisioning_file(tmp_path, PROVISIONING)),
                                   log=lambda event, **fields: logged.append((event, fields)))
    [report] = collect.collect_range(NOW, NOW)
    assert report["partitionGroups"] == {"dev": "compute-nodes", "ml.p5.48xlarge": "worker-group-1"}
    assert (report["partitionGroupsSkipped"], report["partitionGroupsReason"]) == (0, "")
    assert report["records"]  # the usage itself is unchanged by the map
    parts = usage.split_report(report, max_bytes=len(usage.encoded(dict(report, records=[]))) + 300)
    assert len(parts) > 1 and all(part["partitionGroups"] == report["partitionGroups"] for part in parts)
    # read on every run, logged only when it says something new
    collect.collect_range(NOW, NOW)
    assert [event for event, _ in logged] == ["usage-partition-groups"]


@pytest.mark.parametrize("content, reason", [
    (None, "provisioning_parameters.json not found at"),
    ("{not json", "is not valid JSON"),
    ("[]", "must be a JSON object"),
    (b"\xff\xfe{}", "is not valid JSON"),  # not UTF-8
    ("[" * 100000 + "]" * 100000, "nested too deeply"),
    ({"controller_group": "controller-machine"}, "has no worker_groups list"),
    ({"worker_groups": {"instance_group_name": "a", "partition_name": "b"}}, "has no worker_groups list"),
    ({"worker_groups": []}, "lists no worker_groups"),
], ids=["missing", "not-json", "array", "not-utf8", "nested-100000-deep", "no-worker-groups", "worker-groups-object",
        "no-worker-group-listed"])  # ids: pytest puts the id in the sacct child's environment (PYTEST_CURRENT_TEST)
def test_a_missing_or_unreadable_provisioning_file_gives_an_empty_map_and_says_why(tmp_path, content, reason):
    path = tmp_path / "provisioning_parameters.json"
    if content is not None:
        provisioning_file(tmp_path, content)
    sacct = fake_sacct(tmp_path / "bin", stdout="\n".join(LINES) + "\n")
    collect = usage.UsageCollector(CLUSTER, INSTANCE_ID, sacct_cmd=str(sacct), clock=lambda: NOW,
                                   provisioning_path=str(path))
    [report] = collect.collect_range(NOW, NOW)
    assert report["status"] == contract.USAGE_OK and report["partitionGroups"] == {}
    assert reason in report["partitionGroupsReason"] and report["partitionGroupsSkipped"] == 0
    # a status-only report (no sacct) carries the same statement about the file
    status = collect.collect(W0, NOW, None)
    assert status["status"] == contract.USAGE_SLURM_NOT_FOUND and reason in status["partitionGroupsReason"]


def test_unconfigured_provisioning_path_says_so():
    assert usage.read_partition_groups(None) == usage.read_partition_groups("") == usage.NO_PROVISIONING
    assert usage.NO_PROVISIONING.groups == {} and usage.NO_PROVISIONING.reason


def test_hostile_worker_groups_entries_are_left_out_and_counted_never_echoed():
    hostile = [
        {"instance_group_name": "gpu-workers", "partition_name": "gpu;rm -rf /"},
        {"instance_group_name": "gpu-workers", "partition_name": "a/b"},
        {"instance_group_name": "gpu-workers", "partition_name": "p" * 65},
        {"instance_group_name": "gpu-workers", "partition_name": "\u202egpu"},
        {"instance_group_name": "-leading-dash", "partition_name": "cpu"},
        {"instance_group_name": "under_score", "partition_name": "cpu"},
        {"instance_group_name": "g" * 64, "partition_name": "cpu"},
        {"instance_group_name": ["gpu-workers"], "partition_name": "cpu"},
        {"instance_group_name": "controller-machine", "partition_name": None},  # terraform's null
        {"partition_name": "cpu"},
        "gpu-workers",
        42,
        None,
    ]
    fine = [{"instance_group_name": "gpu-workers", "partition_name": "gpu"},
            {"instance_group_name": "gpu-workers", "partition_name": "gpu"},  # a repeat changes nothing
            # two groups in one partition: no one instance type prices its node-seconds
            {"instance_group_name": "g5-workers", "partition_name": "dev"},
            {"instance_group_name": "c5-workers", "partition_name": "dev"}]
    result = usage.partition_groups({"worker_groups": hostile + fine})
    assert result.groups == {"gpu": "gpu-workers"}
    assert result.skipped == len(hostile) + 2
    assert result.reason == ("left out: {} worker_groups entries without a valid partition_name and "
                             "instance_group_name; partitions served by more than one instance group: dev"
                             .format(len(hostile)))
    report = usage.build_report(CLUSTER, INSTANCE_ID, W0, NOW, contract.USAGE_OK, partitions=result)
    text = usage.encoded(report)
    for odd in ("rm -rf", "a/b", "p" * 65, "\u202e", "\\u202e", "leading-dash", "under_score", "g" * 64,
                "controller-machine", "g5-workers", "c5-workers"):
        assert odd not in text


def test_partition_groups_are_bounded_so_every_part_keeps_room_for_records():
    workers = [{"instance_group_name": "group-{:03d}".format(n), "partition_name": "p{:03d}".format(n)}
               for n in range(contract.USAGE_MAX_PARTITION_GROUPS + 50)]
    result = usage.partition_groups({"worker_groups": workers})
    assert len(result.groups) == contract.USAGE_MAX_PARTITION_GROUPS and result.skipped == 50
    assert result.groups["p000"] == "group-000" and "p149" not in result.groups
    assert result.reason == "left out: 50 partitions over the limit of {}".format(contract.USAGE_MAX_PARTITION_GROUPS)
    # the longest names the rules allow, at the limit: the header stays a small share of a part
    longest = [{"instance_group_name": "g{:02d}".format(n) + "g" * 60, "partition_name": "p{:02d}".format(n) + "p" * 61}
               for n in range(contract.USAGE_MAX_PARTITION_GROUPS)]
    header = usage.build_report(CLUSTER, INSTANCE_ID, W0, NOW, contract.USAGE_OK,
                                partitions=usage.partition_groups({"worker_groups": longest}))
    assert len(header["partitionGroups"]) == contract.USAGE_MAX_PARTITION_GROUPS
    assert len(usage.encoded(header)) < contract.MAX_USAGE_REPORT_BYTES // 10


# --------------------------------------------------------------------------- windows


def test_due_windows_fresh_steady_and_backlog():
    # fresh node: the previous window and the current one
    assert usage.due_windows(NOW, None) == ([W0 - HOUR, W0], 0)
    # steady state: everything up to W0 final; only the open window
    assert usage.due_windows(NOW, W0) == ([W0], 0)
    # W0 ended 5 min ago: not final yet, read again with the new current window
    assert usage.due_windows(W0 + HOUR + 300, W0) == ([W0, W0 + HOUR], 0)
    # a long outage: at most MAX_ENDED per run, never older than the backlog limit
    starts, dropped = usage.due_windows(NOW, W0 - 500 * HOUR)
    assert dropped == 500 - usage.MAX_BACKLOG_WINDOWS
    assert starts[0] == W0 - usage.MAX_BACKLOG_WINDOWS * HOUR
    assert len(starts) == usage.MAX_ENDED_WINDOWS_PER_RUN + 1 and starts[-1] == W0


def test_sacct_command_is_utc_window_all_users_allocations_only():
    command = usage.sacct_command("/opt/slurm/bin/sacct", W0, NOW)
    assert command[:4] == ["/opt/slurm/bin/sacct", "--allusers", "-X", "--duplicates"]
    assert command[-4:] == ["-S", "2026-11-23T06:00:00", "-E", "2026-11-23T06:55:00"]
    assert "--format=User,JobID,Partition,AllocNodes,AllocTRES,ElapsedRaw,Start,End,State" in command


# --------------------------------------------------------------------------- statuses, with a stand-in sacct


def fake_sacct(directory: Path, stdout: str = "", stderr: str = "", code: int = 0, scontrol: str | None = None) -> Path:
    """An sacct that prints canned output and records its arguments and TZ (and an scontrol next to it)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "out.txt").write_text(stdout)
    (directory / "err.txt").write_text(stderr)
    script = directory / "sacct"
    script.write_text("#!/bin/sh\n"
                      'printf "%s\\n" "$TZ $*" >> "$(dirname "$0")/calls.txt"\n'
                      'cat "$(dirname "$0")/out.txt"; cat "$(dirname "$0")/err.txt" >&2\n'
                      "exit {}\n".format(code))
    script.chmod(0o755)
    if scontrol is not None:
        (directory / "scontrol").write_text("#!/bin/sh\ncat <<'EOF'\n{}\nEOF\n".format(scontrol))
        (directory / "scontrol").chmod(0o755)
    return script


def collector(tmp_path: Path, sacct: Path | str, now: float = NOW) -> usage.UsageCollector:
    return usage.UsageCollector(CLUSTER, INSTANCE_ID, state_path=str(tmp_path / "state" / usage.STATE_FILE),
                                sacct_cmd=str(sacct), clock=lambda: now)


def test_collect_runs_sacct_in_utc_and_reports_the_window(tmp_path):
    sacct = fake_sacct(tmp_path / "bin", stdout="\n".join(LINES) + "\n")
    report = collector(tmp_path, sacct).collect(W0, NOW, str(sacct))
    assert report["status"] == contract.USAGE_OK and report["reason"] == ""
    assert report == dict(report_at(NOW), sacctSeconds=report["sacctSeconds"], agentVersion="")
    call = (tmp_path / "bin" / "calls.txt").read_text().split()
    assert call[0] == "UTC" and call[-4:] == ["-S", "2026-11-23T06:00:00", "-E", "2026-11-23T06:55:00"]


@pytest.mark.parametrize("stderr, scontrol, status", [
    ("Slurm accounting storage is disabled\n", None, contract.USAGE_NOT_ENABLED),
    ("sacct: error: something else\n", "AccountingStorageType   = accounting_storage/none\n",
     contract.USAGE_NOT_ENABLED),
    ("sacct: error: Sending PersistInit msg: Connection refused\n"
     "sacct: error: Problem talking to the database: Connection refused\n",
     "AccountingStorageType   = accounting_storage/slurmdbd\n", contract.USAGE_SACCT_FAILED),
])
def test_accounting_not_enabled_is_a_status_not_zeros(tmp_path, stderr, scontrol, status):
    sacct = fake_sacct(tmp_path / "bin", stderr=stderr, code=1, scontrol=scontrol)
    report = collector(tmp_path, sacct).collect(W0, NOW, str(sacct))
    assert report["status"] == status and report["records"] == [] and report["skipped"] == 0
    if status == contract.USAGE_SACCT_FAILED:
        assert report["reason"] == "sacct: error: Problem talking to the database: Connection refused"
        assert usage.failure("sacct: error: \x1b[31mred\n")[1] == "sacct: error: ?[31mred"
    else:
        assert "disabled" in report["reason"]


def test_no_sacct_is_slurm_not_found(tmp_path, monkeypatch):
    report = collector(tmp_path, tmp_path / "nowhere" / "sacct").collect(W0, NOW, None)
    assert report["status"] == contract.USAGE_SLURM_NOT_FOUND and "configured sacctCmd" in report["reason"]
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(usage, "SACCT_FALLBACKS", (str(tmp_path / "nowhere"),))
    assert usage.find_sacct("") is None
    assert usage.find_sacct(str(tmp_path / "nowhere")) is None


# --------------------------------------------------------------------------- state: incremental and idempotent


def test_run_once_ships_due_windows_and_remembers_only_final_shipped_ones(tmp_path):
    sacct = fake_sacct(tmp_path / "bin", stdout="\n".join(LINES) + "\n")
    shipped = []

    def ship(parts):
        shipped.append(parts)
        return True

    first = collector(tmp_path, sacct, NOW).run_once(ship)
    assert [r["windowStart"] for r in first] == ["2026-11-23T05:00:00Z", "2026-11-23T06:00:00Z"]
    assert [r["final"] for r in first] == [True, False]
    state = json.loads((tmp_path / "state" / usage.STATE_FILE).read_text())
    assert state["finalThrough"] == W0  # the previous window is final; W0 is still open
    assert oct((tmp_path / "state" / usage.STATE_FILE).stat().st_mode & 0o777) == "0o600"

    # The next run (5 min after W0 ended) re-reads W0 and reads the new window; same keys for W0.
    second = collector(tmp_path, sacct, W0 + HOUR + 300).run_once(ship)
    assert [r["windowStart"] for r in second] == ["2026-11-23T06:00:00Z", "2026-11-23T07:00:00Z"]
    assert [r["key"] for r in second[0]["records"]] == [r["key"] for r in first[1]["records"]]
    assert json.loads((tmp_path / "state" / usage.STATE_FILE).read_text())["finalThrough"] == W0

    # After the settle delay W0 is final; a failed send keeps it due.
    settled = W0 + HOUR + contract.USAGE_SETTLE_SECONDS
    assert [r["final"] for r in collector(tmp_path, sacct, settled).run_once(lambda parts: False)] == [True]
    assert json.loads((tmp_path / "state" / usage.STATE_FILE).read_text())["finalThrough"] == W0
    collector(tmp_path, sacct, settled).run_once(ship)
    assert json.loads((tmp_path / "state" / usage.STATE_FILE).read_text())["finalThrough"] == W0 + HOUR


def quick_collector(tmp_path: Path, now: float, calls: list | None = None) -> usage.UsageCollector:
    """A collector whose sacct is canned output in-process (thousands of windows; the subprocess and its
    arguments are tested above): records each window it was asked for in ``calls``."""
    sacct = tmp_path / "bin" / "sacct"
    if not sacct.exists():
        fake_sacct(tmp_path / "bin", stdout="\n".join(LINES) + "\n")

    def run(command, **_):
        if calls is not None and "-S" in command:
            calls.append(command[command.index("-S") + 1])
        return subprocess.CompletedProcess(command, 0, ("\n".join(LINES) + "\n").encode(), b"")

    return usage.UsageCollector(CLUSTER, INSTANCE_ID, state_path=str(tmp_path / "state" / usage.STATE_FILE),
                                sacct_cmd=str(sacct), clock=lambda: now, run=run)


def recollected(tmp_path: Path, now: float, marker: str, runs: int = 40) -> list:
    """Each run's re-read final windows (ISO starts, after the run's due windows), until a run re-reads none."""
    per_run: list = []
    for _ in range(runs):
        due = {usage.iso(start) for start in usage.due_windows(now, quick_collector(tmp_path, now)._final_through())[0]}
        reports = quick_collector(tmp_path, now).run_once(lambda parts: True, marker)
        again = [r["windowStart"] for r in reports if r["windowStart"] not in due]
        if not again:
            break
        per_run.append(again)
    return per_run


def test_the_stacks_recollect_marker_reads_every_voided_hour_again_once_the_current_month_first(tmp_path):
    """The stack voided a replaced key's windows from Nov 11 (older than an outage's 7-day backlog): the
    agent reads every one of those hours again, the current month (November) first, 96 a run beside its
    due windows, drops none, and obeys the same marker only once."""
    now = at("2026-12-03T06:55:00")
    quick_collector(tmp_path, now).run_once(lambda parts: True)
    since = at("2026-11-11T00:00:00")
    per_run = recollected(tmp_path, now, usage.iso(since))
    starts = [start for run in per_run for start in run]
    december, november = at("2026-12-01T00:00:00"), at("2026-11-11T00:00:00")
    current = [usage.iso(december + hour * HOUR) for hour in range((now // HOUR * HOUR - december) // HOUR)]
    older = [usage.iso(november + hour * HOUR) for hour in range((december - november) // HOUR)]
    assert starts == current + older, "December's hours first, then November's, each once, none dropped"
    assert [len(run) for run in per_run][:-1] == [usage.MAX_RECOLLECT_WINDOWS_PER_RUN] * (len(per_run) - 1)
    state = json.loads((tmp_path / "state" / usage.STATE_FILE).read_text())
    assert set(state) == {"finalThrough", "finalThroughTime", "recollectMarker"}, "re-collection is over"
    # The same marker again (the enroll answer repeats it every recheck): nothing is read twice.
    again = quick_collector(tmp_path, now).run_once(lambda parts: True, usage.iso(since))
    assert [r["windowStart"] for r in again] == [usage.iso(now // HOUR * HOUR)]
    # Garbage from the stack moves nothing.
    assert [r["windowStart"] for r in quick_collector(tmp_path, now).run_once(lambda parts: True, "yesterday")] == [
        usage.iso(now // HOUR * HOUR)]


def test_a_voided_hour_not_sent_is_read_again_at_the_next_run(tmp_path):
    now = at("2026-11-20T12:05:00")
    quick_collector(tmp_path, now).run_once(lambda parts: True)
    marker = usage.iso(at("2026-11-19T00:00:00"))
    sent: list = []

    def ship_four(parts):
        if len(sent) >= 4:
            return False
        sent.append(parts[0]["windowStart"])
        return True

    quick_collector(tmp_path, now).run_once(ship_four, marker)
    # The due windows first (11:00, not final yet, and the open 12:00), then the voided hours until a send fails.
    assert sent == ["2026-11-20T11:00:00Z", "2026-11-20T12:00:00Z", "2026-11-19T00:00:00Z", "2026-11-19T01:00:00Z"]
    per_run = recollected(tmp_path, now, marker)
    assert per_run[0][0] == "2026-11-19T02:00:00Z" and len(per_run) == 1


def test_once_the_voided_hours_are_read_again_the_backlog_is_seven_days_again(tmp_path):
    """Re-collection ends: after it, an agent down for ten days sends the last seven days' windows and
    drops the older ones, as any outage (re-collection's wider reach is for voided hours only)."""
    now = at("2026-11-20T12:15:00")
    quick_collector(tmp_path, now).run_once(lambda parts: True)
    assert recollected(tmp_path, now, usage.iso(at("2026-10-01T00:00:00")))
    logged: list = []
    later = now + 10 * 24 * HOUR
    collector_later = quick_collector(tmp_path, later)
    collector_later.log = lambda event, **fields: logged.append((event, fields))
    reports = collector_later.run_once(lambda parts: True, usage.iso(at("2026-10-01T00:00:00")))
    assert reports[0]["windowStart"] == usage.iso(later // HOUR * HOUR - usage.MAX_BACKLOG_WINDOWS * HOUR)
    assert len(reports) == usage.MAX_ENDED_WINDOWS_PER_RUN + 1
    assert [fields["windows"] for event, fields in logged if event == "usage-windows-dropped"] == [3 * 24]


def test_at_day_20_the_current_month_is_whole_again_within_five_runs(tmp_path):
    """The measure docs/node-agent.md quotes: a controller key replaced on the 20th at noon after 62 days
    of windows. Runs (one per usageSeconds, 15 minutes by default) until every voided hour of the
    current month was read again, and until all of them were."""
    now = at("2026-11-20T12:05:00")
    quick_collector(tmp_path, now).run_once(lambda parts: True)
    marker = usage.iso(now // HOUR * HOUR - contract.USAGE_RECOLLECT_MAX_WINDOWS * HOUR)
    per_run = recollected(tmp_path, now, marker)
    month = usage.iso(at("2026-11-01T00:00:00"))
    whole = next(index for index, run in enumerate(per_run, 1) if any(start < month for start in run)
                 or index == len(per_run))
    assert whole == 5 and len(per_run) == 16  # Nov 1-20 noon (467 h) in 5 runs; all 62 days in 16


def test_run_once_without_accounting_sends_one_status_and_keeps_its_place(tmp_path):
    sacct = fake_sacct(tmp_path / "bin", stderr="Slurm accounting storage is disabled\n", code=1)
    shipped = []
    reports = collector(tmp_path, sacct).run_once(lambda parts: shipped.append(parts) or True)
    assert len(reports) == 1 and len(shipped) == 1
    assert reports[0]["status"] == contract.USAGE_NOT_ENABLED and reports[0]["windowStart"] == "2026-11-23T06:00:00Z"
    assert not (tmp_path / "state" / usage.STATE_FILE).exists()
    assert len((tmp_path / "bin" / "calls.txt").read_text().splitlines()) == 1  # one sacct call, not one per window


# --------------------------------------------------------------------------- the agent and the CLI


def test_config_usage_keys():
    base = {"cluster": CLUSTER, "region": REGION, "reportBus": BUS}
    config = AgentConfig.from_dict(base)
    assert config.usage_seconds == contract.DEFAULT_USAGE_SECONDS and config.sacct_cmd == ""
    assert AgentConfig.from_dict(dict(base, usageSeconds=0)).usage_seconds == 0
    for bad in ({"usageSeconds": 5}, {"usageSeconds": "900"}, {"sacctCmd": "sacct"}):
        with pytest.raises(ConfigError):
            AgentConfig.from_dict(dict(base, **bad))


@pytest.fixture
def events_queue(monkeypatch):
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": REGION}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        session = boto3.session.Session(region_name=REGION)
        events, sqs = session.client("events"), session.client("sqs")
        events.create_event_bus(Name=BUS)
        queue_url = sqs.create_queue(QueueName="usage")["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        events.put_rule(Name="usage", EventBusName=BUS, EventPattern=json.dumps(
            {"source": [contract.REPORT_SOURCE], "detail-type": [contract.USAGE_DETAIL_TYPE]}))
        events.put_targets(Rule="usage", EventBusName=BUS, Targets=[{"Id": "q", "Arn": arn}])

        def received():
            found = []
            while True:
                messages = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10).get("Messages", [])
                if not messages:
                    return found
                for message in messages:
                    found.append(json.loads(message["Body"]))
                    sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])

        yield session, received


def controller_config(tmp_path):
    """The controller's agent with sacct answering LINES, under tmp_path/root."""
    sacct = fake_sacct(tmp_path / "bin", stdout="\n".join(LINES) + "\n")
    return AgentConfig.from_dict({"cluster": CLUSTER, "region": REGION, "reportBus": BUS, "role": "controller",
                                  "ip": "10.1.0.2", "instanceId": INSTANCE_ID, "root": str(tmp_path / "root"),
                                  "sacctCmd": str(sacct),
                                  "provisioningParameters": str(provisioning_file(tmp_path, PROVISIONING))})


def test_controller_agent_sends_usage_with_the_report_path(tmp_path, events_queue):
    session, received = events_queue
    config = controller_config(tmp_path)
    agent = NodeAgent(config, session, clock=lambda: NOW)
    assert agent.tick().api_calls == {}  # the login-node tick stays a no-op on the controller
    outcome = agent.usage_tick()
    # The stack's switch is read first (no parameter: a stack from before the switch, so on).
    assert outcome.windows_sent == 2 and outcome.api_calls == {"ssm:GetParameters": 1, "events:PutEvents": 2}
    events = received()
    assert {event["detail-type"] for event in events} == {contract.USAGE_DETAIL_TYPE}
    details = sorted((event["detail"] for event in events), key=lambda detail: detail["windowStart"])
    assert details[1] == dict(report_at(NOW), instanceId=INSTANCE_ID, agentVersion=details[1]["agentVersion"],
                              sacctSeconds=details[1]["sacctSeconds"], partitionGroupsReason="",
                              partitionGroups={"dev": "compute-nodes", "ml.p5.48xlarge": "worker-group-1"})
    state = tmp_path / "root" / "var" / "lib" / "hpops-node-agent" / usage.STATE_FILE
    assert json.loads(state.read_text())["finalThrough"] == W0

    # A window too big for one entry goes as parts, in several PutEvents calls (a request's limit is 256 KB).
    lines = ["user{0}|{0}|part{1}|1|cpu=1,node=1|60|2026-11-23T06:00:00|2026-11-23T06:01:00|COMPLETED".format(
        index, index % 7) for index in range(3000)]
    parts = usage.split_report(report_at(NOW, lines))
    assert len(parts) > 1
    agent._calls.clear()
    assert agent._send_usage(parts) is True and 1 < agent._calls["events:PutEvents"] <= len(parts)
    sent = sorted((event["detail"] for event in received()), key=lambda detail: detail["part"])
    assert [(detail["part"], detail["parts"]) for detail in sent] == [(i, len(parts)) for i in range(1, len(parts) + 1)]
    assert sum(len(detail["records"]) for detail in sent) == 3000


def test_a_stack_without_per_user_spend_switches_the_controllers_collection_off(tmp_path, events_queue, capsys):
    session, received = events_queue
    config = controller_config(tmp_path)
    switch = f"/hpops/{CLUSTER}/node/user-spend"
    session.client("ssm").put_parameter(Name=switch, Value="off", Type="String")  # UserSpendEnabled=false
    agent = NodeAgent(config, session, clock=lambda: NOW)
    for _ in range(2):
        outcome = agent.usage_tick()
        assert outcome.switched_off and outcome.windows_sent == 0 and outcome.reports == []
        assert outcome.api_calls == {"ssm:GetParameters": 1}
    assert received() == [] and not (tmp_path / "root" / "var" / "lib" / "hpops-node-agent" / usage.STATE_FILE).exists()
    assert capsys.readouterr().out.count('"usage-switch"') == 1, "logged when it changes, not every run"
    # Switched back on by a stack update: the next run collects (from where it would have started).
    session.client("ssm").put_parameter(Name=switch, Value="on", Type="String", Overwrite=True)
    outcome = agent.usage_tick()
    assert not outcome.switched_off and outcome.windows_sent == 2 and len(received()) == 2


def test_controller_loop_collects_every_usage_interval_and_polls_holds_in_between(tmp_path, monkeypatch):
    config = AgentConfig.from_dict({"cluster": CLUSTER, "region": REGION, "reportBus": BUS, "role": "controller",
                                    "ip": "10.1.0.2", "instanceId": INSTANCE_ID, "root": str(tmp_path),
                                    "usageSeconds": 60, "pollSeconds": 20})
    now = [1000.0]
    agent = NodeAgent(config, session=None, clock=lambda: now[0])
    stop = threading.Event()
    ticks, polls, waits = [], [], []

    def usage_tick():
        ticks.append(now[0])
        if len(ticks) == 2:
            raise RuntimeError("a bug")  # logged; the loop goes on
        if len(ticks) == 3:
            stop.set()

    def wait(seconds):
        waits.append(seconds)
        now[0] += seconds

    monkeypatch.setattr(agent, "usage_tick", usage_tick)
    monkeypatch.setattr(agent, "holds_tick", lambda: polls.append(now[0]))
    monkeypatch.setattr(agent, "next_interval", lambda: 20)
    monkeypatch.setattr(stop, "wait", wait)
    agent.run(stop)
    assert ticks == [1000, 1060, 1120]
    assert polls == [1000, 1020, 1040, 1060, 1080, 1100, 1120] and set(waits) == {20}
    assert agent.tick().api_calls == {}  # nothing of the login node's loop


def test_controller_instance_id_comes_from_resource_config(tmp_path):
    resource = tmp_path / "resource_config.json"
    resource.write_text(json.dumps({"InstanceGroups": [{"Name": "controller-machine", "Instances": [
        {"CustomerIpAddress": "10.1.0.2", "InstanceId": "i-0000000000000000c"}]}]}))
    config = AgentConfig.from_dict({"cluster": CLUSTER, "region": REGION, "reportBus": BUS, "role": "controller",
                                    "ip": "10.1.0.2", "resourceConfig": str(resource)})
    assert usage.reporting_instance_id(config, imds=lambda: pytest.fail("IMDS asked")) == "i-0000000000000000c"
    logged = []
    missing = AgentConfig.from_dict({"cluster": CLUSTER, "region": REGION, "reportBus": BUS, "role": "controller",
                                     "ip": "10.1.0.2", "resourceConfig": str(tmp_path / "absent.json")})
    assert usage.reporting_instance_id(missing, log=lambda event, **fields: logged.append(event)) is None
    assert logged == ["usage-instance-id-unknown"]


def run_cli(tmp_path: Path, *arguments: str, env_extra: dict | None = None,
            **config_extra) -> subprocess.CompletedProcess:
    config = {"cluster": CLUSTER, "region": REGION, "reportBus": BUS, "role": "controller", "ip": "10.1.0.2",
              "instanceId": INSTANCE_ID}
    config.update(config_extra)
    (tmp_path / "agent.json").write_text(json.dumps(config))
    env = {key: value for key, value in os.environ.items() if not key.startswith("AWS_")}
    env.update(env_extra or {}, PYTHONPATH=str(Path(bundle_module.__file__).parent.parent))
    command = [sys.executable, "-m", "hpops_node_agent", *arguments, "--config", str(tmp_path / "agent.json")]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)


def test_cli_prints_reports_without_aws(tmp_path):
    sacct = fake_sacct(tmp_path / "bin", stdout="\n".join(LINES) + "\n")
    result = run_cli(tmp_path, "usage", "--once", "--print", "--since", "2026-11-23T05:10:00", sacctCmd=str(sacct))
    assert result.returncode == 0, result.stderr
    reports = json.loads(result.stdout)
    assert reports[0]["windowStart"] == "2026-11-23T05:00:00Z" and len(reports) >= 2
    assert all(report["status"] == contract.USAGE_OK and report["instanceId"] == INSTANCE_ID for report in reports)
    assert not (tmp_path / "var").exists()  # --print keeps no state

    missing = run_cli(tmp_path, "usage", "--once", "--print", sacctCmd=str(tmp_path / "nowhere"))
    assert missing.returncode == 1
    [report] = json.loads(missing.stdout)
    assert report["status"] == contract.USAGE_SLURM_NOT_FOUND

    assert run_cli(tmp_path, "usage").returncode == 2  # the loop collects; one-shot needs --once
    assert run_cli(tmp_path, "--print").returncode == 2
    bad_since = run_cli(tmp_path, "usage", "--once", "--print", "--since", "yesterday")
    assert bad_since.returncode == 2 and "--since must look like" in bad_since.stderr


def test_cli_once_sends_the_due_windows_through_eventbridge(tmp_path):
    with MotoServer() as moto:
        endpoint = moto.endpoint
        session = boto3.session.Session(region_name=REGION, aws_access_key_id="testing",
                                        aws_secret_access_key="testing")
        events, sqs = session.client("events", endpoint_url=endpoint), session.client("sqs", endpoint_url=endpoint)
        events.create_event_bus(Name=BUS)
        queue_url = sqs.create_queue(QueueName="usage")["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        events.put_rule(Name="usage", EventBusName=BUS,
                        EventPattern=json.dumps({"detail-type": [contract.USAGE_DETAIL_TYPE]}))
        events.put_targets(Rule="usage", EventBusName=BUS, Targets=[{"Id": "q", "Arn": arn}])
        sacct = fake_sacct(tmp_path / "bin", stdout="\n".join(LINES) + "\n")
        result = run_cli(tmp_path, "usage", "--once", sacctCmd=str(sacct), root=str(tmp_path / "root"),
                         env_extra={"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                                    "AWS_DEFAULT_REGION": REGION, "AWS_ENDPOINT_URL": endpoint})
        messages = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10).get("Messages", [])
    assert result.returncode == 0, result.stdout + result.stderr
    windows = sorted(json.loads(message["Body"])["detail"]["windowStart"] for message in messages)
    assert len(windows) == 2  # the previous window (fresh node) and the current one
    logged = [json.loads(line) for line in result.stdout.splitlines()]
    assert [line["event"] for line in logged] == ["usage-partition-groups", "usage-collected", "usage-collected"]
    assert "provisioning_parameters.json not found" in logged[0]["reason"]  # the agent passes the configured path
    # the previous window is final (state saved) unless it ended less than the settle delay ago
    assert (tmp_path / "root" / "var" / "lib" / "hpops-node-agent" / usage.STATE_FILE).exists() is logged[1]["final"]


# --------------------------------------------------------------------------- install.sh on the controller


def controller_bundle(tmp_path: Path, **agent_overrides) -> Path:
    lifecycle = tmp_path / "lifecycle"
    lifecycle.mkdir()
    (lifecycle / "provisioning_parameters.json").write_text(json.dumps({
        "controller_group": "controller-machine", "login_group": "login", "worker_groups": []}))
    resource = tmp_path / "resource_config.json"
    resource.write_text(json.dumps({"InstanceGroups": [
        {"Name": "controller-machine", "Instances": [{"CustomerIpAddress": "10.1.0.2", "InstanceId": INSTANCE_ID}]}]}))
    bundle = bundle_module.build_bundle(lifecycle, CLUSTER, REGION, BUS, vendor=False)
    config = json.loads((bundle / "agent.json").read_text())
    config.update({"resourceConfig": str(resource), "ip": "10.1.0.2"}, **agent_overrides)
    (bundle / "agent.json").write_text(json.dumps(config))
    return bundle


@pytest.mark.parametrize("usage_seconds, unit", [(None, True), (0, False)])
def test_install_gives_the_controller_the_service_unless_usage_is_off(tmp_path, usage_seconds, unit):
    bundle = controller_bundle(tmp_path, **({} if usage_seconds is None else {"usageSeconds": usage_seconds}))
    root = tmp_path / "root"
    root.mkdir()
    env = {key: value for key, value in os.environ.items() if not key.startswith("AWS_")}
    env["HPOPS_PYTHON"] = sys.executable
    result = subprocess.run(["bash", str(bundle / "install.sh"), "--root", str(root), "--no-systemd"],
                            capture_output=True, text=True, timeout=120, env=env, cwd=bundle.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "node role: controller" in result.stdout and "first cycle" not in result.stdout
    assert (root / "etc" / "systemd" / "system" / "hpops-node-agent.service").exists() is unit
    assert (root / "var" / "lib" / "hpops-node-agent").is_dir() is unit
    assert (root / "opt" / "hpops-node-agent" / "hpops_node_agent" / "usage.py").exists()


# --------------------------------------------------------------------------- the bench (make bench), at a small size


def test_usage_bench_counts_add_up_against_the_generated_jobs():
    from hpops_twin import usage_bench

    # Two days of 300 jobs: dense enough that the windows hold running, pending and multi-node GPU jobs.
    month = usage_bench.generate_month(300, seed=2, days=2)
    now = month.now
    assert any(job.start is not None and job.end is None for job in month.jobs)  # running
    assert any(job.start is None and job.end is None for job in month.jobs)  # pending
    assert any(job.nodes > 1 and job.gpus for job in month.jobs)
    # the rows are what the real parser reads back as the generated job
    for job in month.jobs:
        parsed = usage.parse_line(job.row(now))
        if job.start is None:
            assert parsed is None
        else:
            assert (parsed.user, parsed.partition, parsed.nodes, parsed.cpus, parsed.gpus, parsed.start, parsed.end) \
                == (job.user, job.partition, job.nodes, job.cpus, job.gpus, job.start, job.end)

    result = usage_bench.measure(300, seed=2, days=2, real_sacct=False)
    assert result.jobs == 300 and result.real_sacct.measured is False
    current = now // HOUR * HOUR
    assert [sweep.window_starts for sweep in result.sweeps] == [
        [current], [current - HOUR, current],
        [current - 30 * HOUR + n * HOUR for n in range(usage.MAX_ENDED_WINDOWS_PER_RUN)] + [current]]
    for sweep in result.sweeps:
        rows = node_seconds = gpu_seconds = 0
        for start in sweep.window_starts:
            until = min(start + HOUR, now)
            for job in month.jobs:
                if job.eligible >= until or (job.end is not None and job.end < start):
                    continue  # sacct does not list it for this window
                rows += 1
                if job.start is not None:
                    inside = max(0, min(now if job.end is None else job.end, start + HOUR, now) - max(job.start, start))
                    node_seconds += job.nodes * inside
                    gpu_seconds += job.gpus * inside
        assert sweep.sacct_calls == len(sweep.window_starts)
        assert (sweep.rows_parsed, sweep.node_seconds, sweep.gpu_seconds) == (rows, node_seconds, gpu_seconds)
        assert sweep.events == len(sweep.window_starts)  # small windows: one part each
        assert sweep.bytes_shipped > sweep.events * len(contract.USAGE_DETAIL_TYPE)
    assert result.sweeps[-1].node_seconds > 0 and result.sweeps[-1].gpu_seconds > 0
    assert all(result.verdicts().values())
    assert "not measured" in result.render() and "FAKE" in result.render()


def test_the_bench_fake_sacct_refuses_a_command_it_was_not_built_for(tmp_path):
    from hpops_twin import usage_bench

    fake = usage_bench.install_fake_sacct(str(tmp_path), usage_bench.generate_month(5, seed=1))
    right = usage.sacct_command(fake, W0, W0 + HOUR)
    assert subprocess.run(right, capture_output=True).returncode == 0
    wrong = [fake, "--allusers", "--parsable2", "-S", "2026-11-23T06:00:00", "-E", "2026-11-23T07:00:00"]
    answer = subprocess.run(wrong, capture_output=True, text=True)
    assert answer.returncode == 2 and "not the command" in answer.stderr


def test_the_bench_times_a_real_sacct_only_when_one_answers(tmp_path, monkeypatch):
    from hpops_twin import usage_bench

    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert usage_bench.real_sacct_window().note == "no sacct on PATH"
    monkeypatch.setenv("PATH", str(tmp_path / "bin") + os.pathsep + os.defpath)  # the stand-in comes first
    fake_sacct(tmp_path / "bin", stderr="sacct: fatal: Could not establish a configuration source\n", code=1)
    assert usage_bench.real_sacct_window().measured is False
    fake_sacct(tmp_path / "bin", stdout="\n".join(LINES[:3]) + "\n")
    real = usage_bench.real_sacct_window(now=NOW)
    assert (real.measured, real.jobs) == (True, 3) and real.seconds >= 0
    calls = (tmp_path / "bin" / "calls.txt").read_text().splitlines()
    assert calls[-1].split()[-4:] == ["-S", "2026-11-23T06:00:00", "-E", "2026-11-23T06:55:00"]  # the collector's command


def test_gpu_seconds_that_slurmdbd_does_not_record_are_named_not_reported_as_zero():
    untracked = "AccountingStorageType   = accounting_storage/slurmdbd\nAccountingStorageTRES   = cpu,mem,energy,node\n"
    tracked = "AccountingStorageTRES   = cpu,mem,energy,node,billing,gres/gpu\n"
    assert usage.gpu_tracking_note(untracked) == usage.GPU_NOT_TRACKED
    assert usage.gpu_tracking_note(tracked) == ""
    assert usage.gpu_tracking_note(None) == ""  # scontrol unreachable: say nothing rather than guess
