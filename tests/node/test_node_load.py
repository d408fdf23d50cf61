"""The agent's load section (node_load.py): the kernel's pressure stall information, read as the kernel
writes it, and the stack's validation of what arrives.

Runs against this machine's own /proc (a real kernel) and against files in the documented format
(the kernel's Documentation/accounting/psi.rst: "some avg10=… avg60=… avg300=… total=…", and a
"full" line too, for memory and, since 5.13, for CPU)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hpops_core.node_channel import contract
from hpops_core.node_channel.reports import MalformedNodeReport, parse_report_event
from hpops_node_agent import node_load


def fake_proc(root: Path, cpu: float, memory: float, full: float = 0.0, loadavg: str = "3.52 2.10 1.00 4/512 999") -> Path:
    proc = root / "proc"
    (proc / "pressure").mkdir(parents=True)
    (proc / "pressure" / "cpu").write_text(f"some avg10=1.00 avg60={cpu:.2f} avg300=0.50 total=123\n"
                                           "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    (proc / "pressure" / "memory").write_text(f"some avg10=0.00 avg60={memory:.2f} avg300=0.00 total=9\n"
                                              f"full avg10=0.00 avg60={full:.2f} avg300=0.00 total=0\n")
    (proc / "loadavg").write_text(loadavg + "\n")
    (proc / "stat").write_text("cpu  1 2 3\ncpu0 1 2 3\ncpu1 1 2 3\ncpu2 1 2 3\nintr 5\n")
    return proc


def event(load) -> dict:
    detail = {"format": contract.REPORT_FORMAT, "cluster": "ml-research", "instanceId": "i-0123456789abcdef0",
              "ip": "10.1.0.5", "role": "login", "agentVersion": "0.1.0", "reportedAt": "2026-11-26T08:00:01Z",
              "trigger": "change", "load": load}
    return {"version": "0", "id": "x", "source": contract.REPORT_SOURCE, "detail-type": contract.REPORT_DETAIL_TYPE,
            "account": "123456789012", "time": "2026-11-26T08:00:01Z", "region": "us-east-1", "resources": [],
            "detail": detail}


def test_the_documented_format_is_read_and_pressure_is_the_larger_of_cpu_and_memory(tmp_path):
    section = node_load.load_section(fake_proc(tmp_path, cpu=42.5, memory=61.25, full=12.0))
    assert section == {"cpuSome60": 42.5, "memorySome60": 61.25, "memoryFull60": 12.0, "load1": 3.52, "cpus": 3}
    assert node_load.pressure(section) == 61.25 and node_load.band(section) == 3
    assert [node_load.band({"cpuSome60": p, "memorySome60": 0.0}) for p in (0, 9.99, 10, 30, 50)] == [0, 0, 1, 2, 3]


@pytest.mark.skipif(not Path("/proc/pressure/cpu").exists(), reason="this kernel has no PSI")
def test_this_machines_kernel_is_read_and_the_stack_accepts_what_the_agent_sends():
    section = node_load.load_section(Path("/proc"))
    assert {"cpuSome60", "memorySome60", "memoryFull60", "load1"} <= set(section) and section["cpus"] == os.cpu_count()
    report = parse_report_event(event(section))
    assert report.load.cpuSome60 == section["cpuSome60"] and report.load.cpus == section["cpus"]


def test_a_kernel_without_psi_says_so_and_sends_no_pressure(tmp_path):
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "loadavg").write_text("0.50 0.40 0.30 1/100 42\n")
    section = node_load.load_section(proc)
    assert "cpuSome60" not in section and "does not provide pressure stall information" in section["reason"]
    assert section["load1"] == 0.5 and node_load.band(section) is None
    assert parse_report_event(event(section)).load.cpuSome60 is None


def test_a_garbled_pressure_file_is_not_guessed_at(tmp_path):
    proc = fake_proc(tmp_path, 1, 1)
    (proc / "pressure" / "cpu").write_text("some avg10=oops\n")
    section = node_load.load_section(proc)
    assert "cpuSome60" not in section and "not in the format" in section["reason"]


@pytest.mark.parametrize("load", [
    {"cpuSome60": 101.0, "memorySome60": 0.0, "memoryFull60": 0.0},  # a share of time is at most 100%
    {"cpuSome60": -1, "memorySome60": 0.0, "memoryFull60": 0.0},
    {"cpuSome60": "5", "memorySome60": 0.0, "memoryFull60": 0.0},  # a string is not a figure
    {"cpuSome60": True, "memorySome60": 0.0, "memoryFull60": 0.0},
    {"cpuSome60": 5.0},  # half a section cannot be compared
    {"cpus": 0}, {"load1": -3}, {"idle": 5},  # unknown fields are refused
    ["not", "an", "object"],
])
def test_a_malformed_load_section_is_refused_by_name(load):
    with pytest.raises(MalformedNodeReport, match="load"):
        parse_report_event(event(load))


def test_only_a_move_into_another_band_is_news_before_the_heartbeat():
    from hpops_node_agent.agent import report_digest

    def digest(cpu: float) -> str:
        return report_digest({"instanceId": "i-1", "ip": "10.1.0.5",
                              "load": {"cpuSome60": cpu, "memorySome60": 0.0, "memoryFull60": 0.0, "load1": cpu}})
    assert digest(12.0) == digest(24.9)  # pressure moves all the time: the heartbeat carries it
    assert digest(24.9) != digest(25.0)  # a new band is sent at once
