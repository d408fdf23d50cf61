"""Directory user names (``alice@example.edu``, SSSD/realmd fully-qualified) on the node: limited,
capped (by uid), counted in Slurm usage and held like any other, through the one name rule; hostile
names refused at every entry point with a named error and nothing written.

The real-sshd side (such a user counted and limited) is tests/ssh/test_sessions_as_opened_real_sshd.py.
"""

from __future__ import annotations

import json

import pytest

from hpops_core.common import validation
from hpops_core.node_channel import contract, user_holds
from hpops_core.node_channel.login_limits import BadInput, parse_limits
from hpops_core.node_channel.reports import _session_entry
from hpops_core.node_channel.user_caps import BadCaps, parse_caps
from hpops_node_agent import login_limits, ssh_sessions, usage, user_caps

DIRECTORY = "alice@example.edu"
HOSTILE = ["alice@example.edu;id", "alice@../../etc", "-alice@example.edu", "alice@example.edu\nroot", "@wheel",
           "alice@" + "x" * 64, "a" * 33 + "@example.edu", "alice@exa mple.edu", "EXAMPLE\\alice"]


def test_a_directory_user_gets_their_own_maxlogins_line_and_pam_limits_reads_it_as_that_user(tmp_path):
    limits = parse_limits(json.dumps({"default": 2, "overrides": {DIRECTORY: 4}, "exempt": ["ops@example.edu"]}))
    assert login_limits.apply(tmp_path, limits) == "changed"
    lines = (tmp_path / login_limits.RELATIVE_PATH).read_text().splitlines()
    # pam_limits reads a line as a group only when it starts with '@' (or '%'): here it is the user.
    assert f"{DIRECTORY}  hard  maxlogins  4" in lines and not any(line.startswith("@") for line in lines)


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_names_are_refused_by_the_limits_caps_holds_and_end_sessions_documents(name, tmp_path):
    with pytest.raises(BadInput, match="not a valid user name"):
        parse_limits(json.dumps({"default": 2, "overrides": {name: 4}}))
    with pytest.raises(BadCaps):
        parse_caps({"default": {"memoryMax": "8G"}, "overrides": {name: {"memoryMax": "16G"}}})
    with pytest.raises(validation.InvalidValue, match="held user: .* is not a valid user name"):
        user_holds.desired_document("2027-01", "2027-02-01T00:00:00Z", False, [name])  # the stack's side
    planted = dict(user_holds.desired_document("2027-01", "2027-02-01T00:00:00Z", False, ["bob"]), users=[name])
    with pytest.raises(user_holds.BadHolds, match="POSIX user names"):
        user_holds.parse_document(json.dumps(planted))  # the node's side, had one been planted
    with pytest.raises(ValueError, match="end-sessions"):
        ssh_sessions.parse_end_sessions({"format": contract.END_SESSIONS_FORMAT,
                                         "sessions": [{"handle": "0123abcd:42:7", "user": name}]})
    assert not list(tmp_path.iterdir())


def test_a_directory_user_is_capped_through_their_uid(tmp_path):
    caps = parse_caps({"default": {"memoryMax": "8G"}, "overrides": {DIRECTORY: {"memoryMax": "16G"}},
                       "exempt": []})
    files, skipped = user_caps.wanted_files(caps, {DIRECTORY: 1_200_001}.get)
    assert skipped == [] and "MemoryMax=16G" in files["etc/systemd/system/user-1200001.slice.d/90-hpops-caps.conf"]
    # And who hit a cap is named by the account behind the slice's uid.
    slice_dir = tmp_path / "user.slice" / "user-1200001.slice"
    slice_dir.mkdir(parents=True)
    (slice_dir / "memory.events").write_text("max 0\noom_kill 0\n")
    _, seen = user_caps.users_at_cap(tmp_path, {}, {1_200_001: DIRECTORY}.get)
    (slice_dir / "memory.events").write_text("max 3\noom_kill 1\n")
    at_cap, _ = user_caps.users_at_cap(tmp_path, seen, {1_200_001: DIRECTORY}.get)
    assert at_cap == [{"user": DIRECTORY, "caps": ["memory"]}]


def test_slurm_usage_and_holds_take_a_directory_user():
    job = usage.parse_line(f"{DIRECTORY}|1|gpu|2|cpu=8,node=2|100|2026-11-23T06:00:00|2026-11-23T06:10:00|COMPLETED")
    assert job.user == DIRECTORY
    with pytest.raises(usage.SkippedLine):
        usage.parse_line("alice@x;id|1|gpu|2|cpu=8,node=2|100|2026-11-23T06:00:00|2026-11-23T06:10:00|COMPLETED")
    document = user_holds.desired_document("2027-01", "2027-02-01T00:00:00Z", False, [DIRECTORY])
    assert user_holds.parse_document(user_holds.canonical_json(document))["users"] == [DIRECTORY]


def test_a_directory_users_session_passes_the_stacks_report_check():
    entry = ssh_sessions.NodeSession("0123abcd:42:7", DIRECTORY, "ssh", True, 1_800_000_000.0).to_report()
    bad: list[str] = []
    assert _session_entry(entry, "sessions.list[0]", bad)["user"] == DIRECTORY and bad == []
    _session_entry(dict(entry, user="alice@example.edu;id"), "sessions.list[0]", bad)
    assert bad == ["sessions.list[0].user"]
