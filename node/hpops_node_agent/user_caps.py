#!/usr/bin/env python3
"""Per-user CPU, memory and task caps on a login node, as systemd per-user slice settings (hpops).

Standard library only. Every login (SSH through pam_systemd) runs in ``user-<uid>.slice``; systemd
applies drop-ins from ``/etc/systemd/system/user-.slice.d/`` to every such slice and from
``user-<uid>.slice.d/`` to one (user@.service(5), "CONTROLLING RESOURCES FOR LOGGED-IN USERS").
This writes ``90-hpops-caps.conf`` there:

* everybody: ``[Slice]`` ``CPUQuota=`` (percent of one CPU), ``MemoryMax=``, ``TasksMax=``;
* an override: the same keys for that user's uid;
* an exempt user, and always root (uid 0, whose slice ``user-.slice.d`` would otherwise cap):
  ``CPUQuota=`` (empty: no quota), ``MemoryMax=infinity``, ``TasksMax=infinity``.

What a user sees at each cap (systemd.resource-control(5)): at ``CPUQuota`` their processes together
get no more CPU time (slower, nothing fails); at ``MemoryMax`` the kernel reclaims and then
OOM-kills a process in their slice ("Killed"); at ``TasksMax`` fork/clone fails ("fork: Resource
temporarily unavailable"). Session Manager shells run in the SSM agent's cgroup, outside any user
slice, so these caps do not reach them.

Every change is checked before it counts: after writing, ``systemd-analyze verify`` must print
nothing for the affected slices (it exits 0 even on invalid values, so any output is a failure);
otherwise every file is put back as it was. Then ``systemctl daemon-reload`` makes systemd read them.
``caps`` None (turned off) removes every file this module wrote. UNCONFIRMED: whether already
running slices take new values at daemon-reload (``systemctl set-property`` would apply at once);
new logins always do.
"""

from __future__ import annotations

import os
import pwd
import subprocess
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

from hpops_core.common import validation
from hpops_core.node_channel.user_caps import KEYS, BadCaps, caps_of_document, parse_caps  # noqa: F401

from . import host_keys

DROPIN = "90-hpops-caps.conf"
UNIT_DIR = Path("etc/systemd/system")
UNCAPPED = "[Slice]\nCPUQuota=\nMemoryMax=infinity\nTasksMax=infinity\n"
HEADER = "# Managed by hpops (HyperPod login-node autopilot): per-user caps. Do not edit.\n"


def render(values: Dict[str, str]) -> str:
    lines = [f"{KEYS[key][0]}={values[key]}" for key in ("cpuQuota", "memoryMax", "tasksMax") if key in values]
    return HEADER + "[Slice]\n" + "".join(line + "\n" for line in lines)


def _uid(user: str) -> Optional[int]:
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        return None


def wanted_files(caps: dict, uid_of: Callable[[str], Optional[int]] = _uid) -> Tuple[Dict[str, str], List[str]]:
    """Relative path -> content, and the users skipped (no account on this node)."""
    files = {str(UNIT_DIR / "user-.slice.d" / DROPIN): render(caps["default"]),
             str(UNIT_DIR / "user-0.slice.d" / DROPIN): HEADER + UNCAPPED}
    skipped = []
    for user in sorted(set(caps["overrides"]) | set(caps["exempt"])):
        uid = uid_of(user)
        if uid is None or uid == 0:
            skipped.append(user)
            continue
        content = HEADER + UNCAPPED if user in caps["exempt"] else render({**caps["default"], **caps["overrides"][user]})
        files[str(UNIT_DIR / f"user-{uid}.slice.d" / DROPIN)] = content
    return files, skipped


def _managed(root: Path) -> List[str]:
    return sorted(str(p.relative_to(root)) for p in (root / UNIT_DIR).glob(f"user-*.slice.d/{DROPIN}"))


def _slice_of(relative: str) -> str:
    name = Path(relative).parent.name[: -len(".d")]  # user-.slice or user-<uid>.slice
    return "user-65534.slice" if name == "user-.slice" else name  # any user's slice shows the shared drop-in


def verify(root: Path, slices: List[str], analyze: str = "systemd-analyze") -> str:
    """systemd-analyze's complaints about these slices ("" when none)."""
    result = subprocess.run([analyze, "verify", f"--root={root}", "--man=no", *sorted(set(slices))],
                            capture_output=True, text=True, timeout=60)
    return (result.stdout + result.stderr).strip()


def apply(root: Path, caps: Optional[dict], reload_cmd: Optional[List[str]] = None, analyze: str = "systemd-analyze",
          uid_of: Callable[[str], Optional[int]] = _uid) -> Dict[str, object]:
    """Bring the drop-ins to ``caps`` (None: remove them). {"result": changed|unchanged|failed, "reason", ...}."""
    present = {rel: (root / rel).read_text(encoding="utf-8") for rel in _managed(root)}
    wanted, skipped = wanted_files(caps, uid_of) if caps is not None else ({}, [])
    if wanted == present:
        return {"result": "unchanged", "reason": _describe(caps, skipped), "skipped": skipped}
    for rel, content in wanted.items():
        (root / rel).parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        host_keys.atomic_write(str(root / rel), content.encode("utf-8"), 0o644)
    for rel in set(present) - set(wanted):
        (root / rel).unlink()
    complaints = verify(root, [_slice_of(rel) for rel in wanted], analyze) if wanted else ""
    if complaints:
        _restore(root, present, wanted)
        return {"result": "failed", "reason": "systemd-analyze verify: " + " ".join(complaints.split())[:200]
                + "; previous settings restored", "skipped": skipped}
    if reload_cmd:
        reload = subprocess.run(reload_cmd, capture_output=True, text=True, timeout=60)
        if reload.returncode != 0:
            _restore(root, present, wanted)
            subprocess.run(reload_cmd, capture_output=True, timeout=60)
            return {"result": "failed", "reason": "daemon-reload failed; previous settings restored", "skipped": skipped}
    return {"result": "changed", "reason": _describe(caps, skipped), "skipped": skipped}


def _restore(root: Path, present: Dict[str, str], wanted: Dict[str, str]) -> None:
    for rel in wanted:
        if rel not in present:
            try:
                os.unlink(str(root / rel))
            except FileNotFoundError:
                pass
    for rel, content in present.items():
        (root / rel).parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        host_keys.atomic_write(str(root / rel), content.encode("utf-8"), 0o644)


def _describe(caps: Optional[dict], skipped: List[str]) -> str:
    if caps is None:
        return "per-user caps off"
    default = ", ".join(f"{KEYS[k][0]}={v}" for k, v in caps["default"].items()) or "none"
    text = f"per-user caps {default}; {len(caps['overrides'])} override(s), {len(caps['exempt'])} exempt"
    return text + (f"; {len(skipped)} user(s) without an account here" if skipped else "")


# What says a user hit a cap since the last look (cgroup v2, Documentation/admin-guide/cgroup-v2.rst):
# memory.events "max" (usage hit MemoryMax) and "oom_kill", pids.events "max" (a fork refused at
# TasksMax), cpu.stat "nr_throttled" (held back by CPUQuota). Counters only grow, so a rise is news.
CAP_COUNTERS = (("memory", "memory.events", ("max", "oom_kill")), ("tasks", "pids.events", ("max",)),
                ("cpu", "cpu.stat", ("nr_throttled",)))
MAX_AT_CAP = 50


def _counters(text: str, keys: Tuple[str, ...]) -> int:
    total = 0
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in keys and parts[1].isdigit():
            total += int(parts[1])
    return total


def users_at_cap(cgroup_root: Path, seen: Dict[str, Dict[str, int]],
                 user_of: Optional[Callable[[int], Optional[str]]] = None
                 ) -> Tuple[List[Dict[str, object]], Dict[str, Dict[str, int]]]:
    """Users whose slice hit a cap since ``seen`` (the previous tick's counters): [{"user", "caps"}],
    and the counters to keep. A user seen for the first time is compared with zero only if the
    caller had counters before (the first look after start says nothing)."""
    user_of = user_of or _name
    now: Dict[str, Dict[str, int]] = {}
    at_cap: List[Dict[str, object]] = []
    for slice_dir in sorted((cgroup_root / "user.slice").glob("user-*.slice")):
        uid_text = slice_dir.name[len("user-"):-len(".slice")]
        user = user_of(int(uid_text)) if uid_text.isdigit() and uid_text != "0" else None
        if user is None or not validation.is_limited_user(user):
            continue
        counters = {}
        for cap, filename, keys in CAP_COUNTERS:
            try:
                counters[cap] = _counters((slice_dir / filename).read_text(), keys)
            except OSError:
                continue
        now[user] = counters
        before = seen.get(user, {} if seen else None)
        if before is None:
            continue
        hit = sorted(cap for cap, value in counters.items() if value > before.get(cap, 0))
        if hit and len(at_cap) < MAX_AT_CAP:
            at_cap.append({"user": user, "caps": hit})
    return at_cap, now


def _name(uid: int) -> Optional[str]:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None
