"""`hpops cost --twin`, as the README shows it: the demo's month played in a twin of its own, then the
`hpops cost` table. A module of its own: two twins cannot be open at once in a process, and the
month's tests (test_user_spend_twin.py) keep theirs open for the whole module."""

from __future__ import annotations

import shlex

from test_user_spend_twin import expected_cluster_cost

from hpops.main import main
from hpops_twin import user_spend_demo as chapter
from hpops_twin.user_spend_demo import SWEEPS

README_COMMAND = "hpops cost --twin"


def test_hpops_cost_twin_plays_the_month_and_prints_the_report(capsys):
    status = main(shlex.split(README_COMMAND)[1:])

    printed = capsys.readouterr().out.splitlines()
    assert status == 1, "alice is over 80 % projected: a finding"
    header = next(number for number, line in enumerate(printed) if line.startswith("user "))
    assert [line.split()[0] for line in printed[header + 2:header + 5]] == ["alice", "bob", "carol"]
    figures = chapter.table_figures(printed)
    assert figures["cluster cost"] == expected_cluster_cost(SWEEPS[-1])
    assert figures["users"] + figures["idle"] + figures["other"] == figures["cluster cost"]
    assert "(users + idle + other = cluster cost)" in printed
