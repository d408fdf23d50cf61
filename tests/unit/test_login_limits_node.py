"""The node code that writes pam_limits maxlogins (node/hpops_node_agent/login_limits.py).

Run as a program (python3 -m hpops_node_agent.login_limits) with --root pointing at a directory.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

RELATIVE = Path("etc/security/limits.d/90-hpops-maxlogins.conf")


def run(root: Path, limits) -> tuple[int, dict]:
    raw = limits if isinstance(limits, str) else json.dumps(limits)
    completed = subprocess.run([sys.executable, "-m", "hpops_node_agent.login_limits", "--root", str(root), "--limits-json", raw],
                               capture_output=True, text=True, timeout=30)
    return completed.returncode, json.loads(completed.stdout.strip().splitlines()[-1])


def entries(root: Path) -> list[list[str]]:
    text = (root / RELATIVE).read_text()
    return [line.split() for line in text.splitlines() if line and not line.startswith("#")]


def test_writes_default_overrides_and_exempt_users(tmp_path):
    code, summary = run(tmp_path, {"default": 2, "overrides": {"bob": 0, "alice": 4, "ops": 1}, "exempt": ["ops", "ci-bot"]})
    assert code == 0 and summary["result"] == "changed"
    assert entries(tmp_path) == [
        ["*", "hard", "maxlogins", "2"],
        ["alice", "hard", "maxlogins", "4"],
        ["bob", "hard", "maxlogins", "0"],
        ["ci-bot", "hard", "maxlogins", "65535"],
        ["ops", "hard", "maxlogins", "65535"],  # exempt wins over an override
    ]
    assert (tmp_path / RELATIVE).stat().st_mode & 0o777 == 0o644
    assert [p.name for p in (tmp_path / RELATIVE).parent.iterdir()] == [RELATIVE.name], "no temp file left behind"


def test_second_run_with_the_same_limits_changes_nothing(tmp_path):
    limits = {"default": 3, "overrides": {"alice": 5}, "exempt": []}
    run(tmp_path, limits)
    before = (tmp_path / RELATIVE).stat()
    code, summary = run(tmp_path, limits)
    assert code == 0 and summary["result"] == "unchanged"
    after = (tmp_path / RELATIVE).stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_new_limits_replace_the_file(tmp_path):
    run(tmp_path, {"default": 3})
    code, summary = run(tmp_path, {"default": 1, "overrides": {"alice": 2}})
    assert code == 0 and summary["result"] == "changed"
    assert entries(tmp_path) == [["*", "hard", "maxlogins", "1"], ["alice", "hard", "maxlogins", "2"]]


@pytest.mark.parametrize("bad", [
    "not json",
    "[]",
    {},
    {"default": 0},
    {"default": True},
    {"default": "2"},
    {"default": 2.0},
    {"default": 10_001},
    {"default": 2, "extra": 1},
    {"default": 2, "overrides": {"alice;rm": 1}},
    {"default": 2, "overrides": {"a b": 1}},
    {"default": 2, "overrides": {"-alice": 1}},
    {"default": 2, "overrides": {".alice": 1}},
    {"default": 2, "overrides": {"al:ice": 1}},
    {"default": 2, "overrides": {"a/b": 1}},
    {"default": 2, "overrides": {"alice\nbob": 1}},
    {"default": 2, "overrides": {"$(id)": 1}},
    {"default": 2, "overrides": {"@admins": 1}},
    {"default": 2, "overrides": {"": 1}},
    {"default": 2, "overrides": {"a" * 33: 1}},
    {"default": 2, "overrides": {"alice": -1}},
    {"default": 2, "overrides": {"alice": False}},
    {"default": 2, "overrides": ["alice"]},
    {"default": 2, "exempt": "ops"},
    {"default": 2, "exempt": ["ops", "*"]},
    {"default": 2, "exempt": [1]},
])
def test_bad_input_is_refused_with_exit_3_and_nothing_changes(tmp_path, bad):
    run(tmp_path, {"default": 2})
    before = (tmp_path / RELATIVE).read_text()
    code, summary = run(tmp_path, bad)
    assert code == 3 and summary["result"] == "failed"
    assert (tmp_path / RELATIVE).read_text() == before


def test_user_names_real_systems_have_are_accepted(tmp_path):
    # LDAP/SSSD and useradd --badname users: dots, upper case, a leading digit or underscore.
    code, summary = run(tmp_path, {"default": 2, "overrides": {"j.doe": 4, "Alice": 3, "9lives": 1, "_svc": 0},
                                   "exempt": ["ci-bot.2"]})
    assert code == 0 and summary["result"] == "changed"
    assert entries(tmp_path)[1:] == [["9lives", "hard", "maxlogins", "1"], ["Alice", "hard", "maxlogins", "3"],
                                     ["_svc", "hard", "maxlogins", "0"], ["j.doe", "hard", "maxlogins", "4"],
                                     ["ci-bot.2", "hard", "maxlogins", "65535"]]


def test_the_agent_module_re_exports_the_shared_rule():
    # The node agent calls login_limits.parse_limits / apply; the rule itself lives in hpops_core.
    from hpops_core.node_channel import login_limits as shared
    from hpops_node_agent import login_limits as node

    assert node.parse_limits is shared.parse_limits and node.BadInput is shared.BadInput
    assert node.canonical_json is shared.canonical_json
    with pytest.raises(node.BadInput, match="'a b' is not a valid user name") as refused:
        node.parse_limits('{"default": 2, "exempt": ["a b"]}')
    assert refused.value.field == "exempt"


def test_bad_input_on_a_fresh_node_creates_nothing(tmp_path):
    code, _ = run(tmp_path, {"default": -2})
    assert code == 3
    assert not (tmp_path / "etc").exists()
