"""Per-user CPU, memory and task caps as systemd user-slice drop-ins, checked by the real
`systemd-analyze verify` (offline, against a node root in a directory; skips without it, except
under CI=true)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from hpops_node_agent import user_caps

ANALYZE = shutil.which("systemd-analyze") or "/usr/bin/systemd-analyze"
UIDS = {"alice": 2001, "bob": 2002, "ops": 2003}
CAPS = {"default": {"cpuQuota": "200%", "memoryMax": "8G", "tasksMax": 512},
        "overrides": {"alice": {"memoryMax": "16G"}}, "exempt": ["ops"]}


@pytest.fixture(autouse=True)
def analyze():
    if not os.access(ANALYZE, os.X_OK):
        reason = "systemd-analyze needed (apt-get install -y systemd)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)


def apply(root: Path, caps, reload_cmd=None):
    return user_caps.apply(root, caps and user_caps.parse_caps(caps), reload_cmd=reload_cmd, analyze=ANALYZE,
                           uid_of=UIDS.get)


def dropin(root: Path, slice_name: str) -> str:
    return (root / "etc/systemd/system" / f"{slice_name}.d" / user_caps.DROPIN).read_text()


def settings(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def test_caps_for_everyone_an_override_an_exempt_user_and_root_pass_verify(tmp_path):
    result = apply(tmp_path, CAPS)

    assert result["result"] == "changed", result
    assert settings(dropin(tmp_path, "user-.slice")) == ["[Slice]", "CPUQuota=200%", "MemoryMax=8G", "TasksMax=512"]
    assert settings(dropin(tmp_path, "user-2001.slice")) == ["[Slice]", "CPUQuota=200%", "MemoryMax=16G", "TasksMax=512"]
    uncapped = ["[Slice]", "CPUQuota=", "MemoryMax=infinity", "TasksMax=infinity"]
    assert settings(dropin(tmp_path, "user-2003.slice")) == uncapped
    assert settings(dropin(tmp_path, "user-0.slice")) == uncapped, "root is never capped"
    for unit in ("user-2001.slice", "user-2002.slice", "user-2003.slice", "user-0.slice"):
        check = subprocess.run([ANALYZE, "verify", f"--root={tmp_path}", "--man=no", unit], capture_output=True, text=True)
        assert (check.returncode, check.stdout + check.stderr) == (0, ""), unit
    assert apply(tmp_path, CAPS)["result"] == "unchanged"


def test_a_value_systemd_refuses_is_rolled_back_to_the_previous_settings(tmp_path):
    apply(tmp_path, CAPS)
    before = {p: p.read_text() for p in tmp_path.rglob("*.conf")}

    # Passes the agent's own check, but overflows: systemd says "Numerical result out of range".
    result = apply(tmp_path, {"default": {"memoryMax": "999999999T"}, "overrides": {}, "exempt": []})

    assert result["result"] == "failed" and "Invalid memory limit" in result["reason"]
    assert "previous settings restored" in result["reason"]
    assert {p: p.read_text() for p in tmp_path.rglob("*.conf")} == before


def test_a_failed_daemon_reload_is_rolled_back_too(tmp_path):
    result = apply(tmp_path, CAPS, reload_cmd=["false"])
    assert result["result"] == "failed" and not list(tmp_path.rglob("*.conf"))


def test_turning_the_caps_off_removes_every_file_written(tmp_path):
    apply(tmp_path, CAPS)
    other = tmp_path / "etc/systemd/system/user-.slice.d/50-site.conf"
    other.write_text("[Slice]\nTasksMax=900\n")  # the site's own drop-in stays

    result = apply(tmp_path, None, reload_cmd=["true"])

    assert result["result"] == "changed"
    assert [p.name for p in tmp_path.rglob("*.conf")] == ["50-site.conf"]
    assert apply(tmp_path, None)["result"] == "unchanged"


def test_dropping_an_override_removes_that_users_file(tmp_path):
    apply(tmp_path, CAPS)
    apply(tmp_path, {**CAPS, "overrides": {}})
    assert not (tmp_path / "etc/systemd/system/user-2001.slice.d" / user_caps.DROPIN).exists()


@pytest.mark.parametrize("caps", [
    {"default": {"cpuQuota": "lots"}},
    {"default": {"memoryMax": "8 GB"}},
    {"default": {"tasksMax": -5}},
    {"default": {"MemoryMaxx": "8G"}},
    {"default": {}, "exempt": ["root"]},
    {"default": {}, "overrides": {"bad name;rm": {}}},
])
def test_bad_caps_are_refused_before_anything_is_written(tmp_path, caps):
    with pytest.raises(user_caps.BadCaps):
        user_caps.parse_caps(caps)


def write_slice(root: Path, uid: int, memory_max: int = 0, oom: int = 0, pids_max: int = 0, throttled: int = 0) -> None:
    """A user slice's counters as cgroup v2 writes them (cgroup-v2.rst: memory.events, pids.events, cpu.stat)."""
    slice_dir = root / "user.slice" / f"user-{uid}.slice"
    slice_dir.mkdir(parents=True, exist_ok=True)
    (slice_dir / "memory.events").write_text(f"low 0\nhigh 0\nmax {memory_max}\noom 0\noom_kill {oom}\n")
    (slice_dir / "pids.events").write_text(f"max {pids_max}\n")
    (slice_dir / "cpu.stat").write_text(f"usage_usec 100\nuser_usec 50\nsystem_usec 50\nnr_periods 10\n"
                                        f"nr_throttled {throttled}\nthrottled_usec 0\n")


def test_who_reached_a_cap_since_the_last_poll_from_the_slices_counters(tmp_path):
    names = {2001: "alice", 2002: "bob", 0: "root"}.get
    write_slice(tmp_path, 2001, memory_max=3)
    write_slice(tmp_path, 2002, throttled=7)
    write_slice(tmp_path, 0, oom=9)

    first, seen = user_caps.users_at_cap(tmp_path, {}, names)
    assert first == [], "the first look after start has nothing to compare with"

    write_slice(tmp_path, 2001, memory_max=3, oom=1, pids_max=2)  # alice: OOM-killed and a fork refused
    write_slice(tmp_path, 2002, throttled=7)  # bob: no change
    write_slice(tmp_path, 0, oom=10)  # root is never reported
    at_cap, seen = user_caps.users_at_cap(tmp_path, seen, names)

    assert at_cap == [{"user": "alice", "caps": ["memory", "tasks"]}]
    assert user_caps.users_at_cap(tmp_path, seen, names)[0] == [], "no new hits, nobody at a cap"
