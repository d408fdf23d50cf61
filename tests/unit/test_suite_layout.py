"""The suite runs over several xdist workers: a test module that uses something of the whole machine
carries the marker that puts it in that resource's group (real_tools.py, tests/README.md), or two
of them could run at once and see each other's daemons, users and sessions."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from real_tools import SHARED_RESOURCE_GROUPS

TESTS = Path(__file__).resolve().parents[1]

# What in a module's text says it uses the resource: the programs it starts or runs.
USES = {
    "realssh": re.compile(r"/usr/sbin/sshd\b|which\(\"sshd\"\)|/usr/sbin/haproxy\b|which\(\"haproxy\"\)"
                          r"|\brunning_sshd\(|\bkey_users\("),  # real_tools' sshd and its users
    "realslurm": re.compile(r"/usr/sbin/(slurmctld|slurmd|slurmdbd|munged|mariadbd)\b"),
    "netns": re.compile(r"[\"']netns[\"']"),
}
ADDS_USERS = re.compile(r"[\"'](/usr/sbin/)?useradd[\"']")


def marked(text: str, marker: str) -> bool:
    return re.search(rf"pytest\.mark\.{marker}\b", text) is not None


def suite_modules() -> list[Path]:
    return sorted(p for p in TESTS.rglob("test_*.py") if p.parent != TESTS and p != Path(__file__).resolve())


def needed(module: Path) -> tuple[set[str], bool]:
    """The markers the module needs (from its own text and its directory's conftest.py), and whether it adds users."""
    texts = [module.read_text(encoding="utf-8")]
    conftest = module.parent / "conftest.py"
    if conftest.exists():
        texts.append(conftest.read_text(encoding="utf-8"))
    markers = {marker for marker, pattern in USES.items() for text in texts if pattern.search(text)}
    return markers, any(ADDS_USERS.search(text) for text in texts)


def test_every_resource_has_a_group_and_a_declared_marker():
    declared = (TESTS.parent / "pyproject.toml").read_text(encoding="utf-8")
    assert set(USES) == set(SHARED_RESOURCE_GROUPS)
    for marker in SHARED_RESOURCE_GROUPS:
        assert re.search(rf'^\s*"{marker}: .*xdist group {SHARED_RESOURCE_GROUPS[marker]}"', declared, re.M), marker


@pytest.mark.parametrize("module", suite_modules(), ids=lambda p: str(p.relative_to(TESTS)))
def test_a_module_that_uses_a_shared_resource_carries_its_marker(module):
    markers, adds_users = needed(module)
    text = module.read_text(encoding="utf-8")
    # A module in another group already runs one test at a time there; its namespaces are its own (unique names).
    missing = sorted(m for m in markers if not marked(text, m)
                     and not (m == "netns" and any(marked(text, other) for other in SHARED_RESOURCE_GROUPS)))
    assert not missing, f"{module.name} uses what {missing} stand for: mark it so it runs in that xdist group"
    if adds_users:
        assert any(marked(text, m) for m in ("realssh", "realslurm")), \
            f"{module.name} adds users: mark it realssh or realslurm, whichever daemon they are for"


@pytest.mark.parametrize("module", suite_modules(), ids=lambda p: str(p.relative_to(TESTS)))
def test_no_module_is_kept_in_its_file_order(module):
    """A shuffled run must shuffle every module: a test that needs what the one before left fails alone."""
    assert not re.search(r"random_order\(\s*disabled\s*=\s*True", module.read_text(encoding="utf-8")), \
        f"{module.name} keeps its file order: give each test its starting point from a fixture"


def test_the_layout_rules_see_the_modules_they_are_for():
    """The patterns still find today's real-daemon tests (a renamed constant would blind them)."""
    found = {marker: {m.name for m in suite_modules() if marker in needed(m)[0]} for marker in USES}
    assert "test_real_sshd.py" in found["realssh"] and "test_keepalive_real_sshd.py" in found["realssh"]
    assert "test_leave_notice_real_sshd.py" in found["realssh"]  # through real_tools.running_sshd
    assert "test_holds_real_slurm.py" in found["realslurm"]
    assert "test_imds_guard.py" in found["netns"]


def test_a_shared_resource_test_reaches_xdist_in_its_group(tmp_path):
    """The groups are given before xdist turns them into the node ids it schedules by: if they came after,
    every real-daemon test would be spread over the workers, two sshd or Slurm tests side by side."""
    import os
    import subprocess
    import sys

    out = tmp_path / "probe.txt"
    probe = TESTS / "unit" / "xdist_group_probe.py"
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider",
                          str(probe)], cwd=TESTS.parent, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "HPOPS_GROUP_PROBE_OUT": str(out)})
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    ran = [line.split(" ", 1) for line in out.read_text(encoding="utf-8").splitlines()]
    shared = [(worker, nodeid) for worker, nodeid in ran if "probe_ssh" in nodeid or "probe_slurm" in nodeid]
    assert len(shared) == 8 and len(ran) == 12
    assert all(nodeid.endswith(f"@{SHARED_RESOURCE_GROUPS['realssh']}") for _, nodeid in shared), shared
    assert len({worker for worker, _ in shared}) == 1, shared
