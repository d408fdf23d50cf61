"""The usage report that puts a user over their limit holds them within one report and one agent poll.

The bench's own measurement (hpops_twin.holds_bench), run in the twin with IAM enforced: the
controller's real agent reports usage, RecordUsageReport starts the BudgetGuard check itself, the
agent applies the hold at its next poll; no scheduled sweep runs in between.
"""

from __future__ import annotations

from hpops_twin.holds_bench import holds_section


def test_the_usage_report_that_crosses_the_limit_holds_within_one_report_and_one_poll():
    """RecordUsageReport starts the check itself (under the twin's IAM): no sweep is waited for."""
    rows, verdicts = holds_section()
    crossing, release = rows
    assert (crossing.usage_reports, crossing.sweeps, crossing.polls) == (1, 0, 1), crossing
    assert (release.sweeps, release.polls) == (1, 1) and all(verdicts.values()), rows
