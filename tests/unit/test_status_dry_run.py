"""`hpops status` on a stack whose session limits are in dry run (a new stack's default): who enforcement
would cut is visible, with the one step that turns it on; an enforcing stack shows no such lines."""

from hpops.main import _login_sessions
from hpops.output import ENFORCE_STEP, login_sessions_text

REPORTS = {"i-0a": {"sessions": {"list": [{"user": "alice", "path": "ssh"}, {"user": "alice", "path": "ssh"},
                                          {"user": "alice", "path": "ssm"}, {"user": "bob", "path": "ssh"}]}}}


def test_dry_run_marks_who_would_be_cut_and_says_how_to_enforce():
    view = _login_sessions({"MaxSessionsPerUser": "2", "SessionLimitsDryRun": "true"}, REPORTS)
    lines = login_sessions_text(view)
    assert lines[0].startswith("session limits: DRY RUN (SessionLimitsDryRun=true): nothing is ended")
    assert lines[1].strip() == ENFORCE_STEP and "SessionLimitsDryRun=false" in ENFORCE_STEP
    alice = next(line for line in lines if line.strip().startswith("alice"))
    assert "3 of limit 2  OVER, WOULD END 1" in alice
    assert "WOULD END" not in next(line for line in lines if line.strip().startswith("bob"))


def test_an_enforcing_stack_shows_over_without_dry_run_lines():
    for parameters in ({"SessionLimitsDryRun": "false"}, {}):  # {}: a stack from before the parameter
        lines = login_sessions_text(_login_sessions({"MaxSessionsPerUser": "2"} | parameters, REPORTS))
        assert not any("DRY RUN" in line or "WOULD END" in line for line in lines)
        assert any(line.strip().startswith("alice") and line.rstrip().endswith("ssm: i-0a 1") and "  OVER" in line
                   for line in lines)
