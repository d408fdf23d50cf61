"""How loaded this login node is, as its kernel measures it: pressure stall information (PSI).

/proc/pressure/cpu and /proc/pressure/memory give the share of wall time (percent, averaged over
10, 60 and 300 s) in which at least one runnable task ("some") or every task ("full") waited for the
resource. PSI measures contention, not utilisation: a node busy at 100% CPU with nothing waiting reads
0, a node whose users' processes queue for CPU or stall in memory reclaim reads it at once. The stack
compares these figures across the login tier (load-aware admission); this module only reads them.

A kernel without PSI (built without it, or booted with psi=0) has no /proc/pressure: the section
then carries only the load average and says why, and the stack leaves pressure out of its comparison.
Runs inside the agent's systemd sandbox: ProtectKernelTunables makes /proc read-only, not unreadable.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Dict, Optional

_AVG60 = re.compile(r"\bavg60=([0-9]+(?:\.[0-9]+)?)\b")
# Where a change of the node's pressure is news worth a report before the heartbeat: the stack
# judges a node against the tier's mean, so only a move across these edges (percent) is sent at once.
BAND_EDGES = (10.0, 25.0, 50.0)


def _avg60(text: str, kind: str) -> Optional[float]:
    for line in text.splitlines():
        if line.startswith(kind + " "):
            match = _AVG60.search(line)
            if match:
                return min(100.0, round(float(match.group(1)), 2))
    return None


def _read(path: Path) -> Optional[str]:
    try:
        with open(path, "r", encoding="ascii", errors="replace") as handle:
            return handle.read(4096)
    except OSError:
        return None


def _cpus(proc: Path) -> Optional[int]:
    stat = _read(proc / "stat")
    if stat is not None:
        count = sum(1 for line in stat.splitlines() if re.match(r"cpu[0-9]+ ", line))
        if count:
            return count
    return os.cpu_count() if proc == Path("/proc") else None


def load_section(proc: Path) -> Dict[str, Any]:
    """The report's "load" section: PSI avg60 figures (percent), the 1-minute load average and CPUs."""
    section: Dict[str, Any] = {}
    cpu, memory = _read(proc / "pressure" / "cpu"), _read(proc / "pressure" / "memory")
    if cpu is None or memory is None:
        section["reason"] = "no /proc/pressure: this kernel does not provide pressure stall information"
    else:
        figures = {"cpuSome60": _avg60(cpu, "some"), "memorySome60": _avg60(memory, "some"),
                   "memoryFull60": _avg60(memory, "full")}
        if None in figures.values():
            section["reason"] = "/proc/pressure is not in the format the agent reads"
        else:
            section.update(figures)
    loadavg = _read(proc / "loadavg")
    if loadavg:
        try:
            section["load1"] = min(1e6, round(float(loadavg.split()[0]), 2))
        except (ValueError, IndexError):
            pass
    cpus = _cpus(proc)
    if cpus:
        section["cpus"] = min(cpus, 4096)
    return section


def pressure(section: Optional[Dict[str, Any]]) -> Optional[float]:
    """The node's pressure as the stack compares it: the larger of CPU and memory "some" (avg60)."""
    if not section or "cpuSome60" not in section:
        return None
    return max(float(section["cpuSome60"]), float(section["memorySome60"]))


def band(section: Optional[Dict[str, Any]]) -> Optional[int]:
    """Which of BAND_EDGES' bands the pressure is in (the report digest carries this, not the figures)."""
    value = pressure(section)
    if value is None:
        return None
    return sum(1 for edge in BAND_EDGES if value >= edge)
