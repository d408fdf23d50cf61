"""`make demo`'s summary table: every step's whole name, however long, on its own row."""

from hpops_twin.demo import Demo, StepOutcome


def outcome(number: int, title: str, ok: bool = True) -> StepOutcome:
    return StepOutcome(number=number, title=title, executions_started=1, executions=1, synced=1, coalesced=0,
                       failed=0 if ok else 1, extra_passes=0, dry_runs=0, targets=["10.0.0.1"], truth=["10.0.0.1"],
                       converged=True, expectation="x", expectation_met=ok, seconds=0.5)


def test_long_step_names_are_shown_whole():
    long_title = ("host key rotation: repair publishes, every agent applies and reports, each node is re-verified"
                  " and the target group keeps every login node")
    demo = Demo(world=None)
    demo.steps = [outcome(1, "first deploy: the sweep registers every Running login node"), outcome(2, long_title, ok=False)]
    lines = demo.table().splitlines()
    assert len(long_title) > 100
    assert lines[2].endswith("first deploy: the sweep registers every Running login node")
    assert lines[3].endswith(long_title) and "FAILED" in lines[3]
    assert lines[0].split()[-1] == "step"


def test_demo_lines_fit_a_terminal_with_fingerprints_and_versions_shortened():
    from hpops_twin.demo import SCREEN_WIDTH, fitted

    line = ("[ 33.58s]           verify 10.1.0.12: ecdsa-sha2-nistp256: presented "
            "SHA256:c1oadu3Znch/XUTrEngjbXlRCkQkoXAUhILHLnuZnpA, expected SHA256:VTuDVSmrkdcmcgVVuRsqjRssSHKO0uCQaTc3snaCcPE;"
            " ssh-ed25519: presented SHA256:pF4nVe//JFoPGCh7obZfij8hwU902nU4oNM4e//dfzs, installed version "
            "a488185e-8c65-4d6b-ba5c-b6f2ab587d35 (6 files)")
    shown: list[str] = []
    fitted(shown.append)(line)
    assert len(shown) > 1 and all(len(part) <= SCREEN_WIDTH for part in shown)
    text = " ".join(part.strip() for part in shown)
    assert "SHA256:c1oadu3Z…" in text and "SHA256:VTuDVSmr…" in text and "version a488185e… (6 files)" in text
    assert all(part.startswith(" " * 22) for part in shown[1:]), "continuations sit under the line's own indent"


def test_the_demo_says_what_it_enforces_that_a_new_stack_only_dry_runs():
    from hpops_twin.demo_story import beyond_defaults
    from hpops_twin.world import ENFORCING

    note = beyond_defaults(ENFORCING | {"LoadAwareAdmission": "on"})
    assert "SessionLimitsDryRun=false (a new stack: true)" in note
    assert "LoadAwareAdmission=on (a new stack: dry-run)" in note
