"""`hpops doctor --twin`, as the README shows it: a fresh twin with the account around it set up as a
working installation, every check OK. (`--json`'s one document: tests/aws/test_doctor.py.)"""

from __future__ import annotations

import shlex

from hpops.doctor_checks import CHECKS, NOTE, OK
from hpops.main import main

README_COMMAND = "hpops doctor --twin"


def test_doctor_twin_command_exits_0_with_every_check_ok(capsys):
    assert main(shlex.split(README_COMMAND)[1:]) == 0
    lines = capsys.readouterr().out.splitlines()
    # One line a finding: "STATUS check[subject]: message".
    statuses = {}
    for line in lines:
        status, name = line.split(":", 1)[0].split(" ", 1)
        statuses.setdefault(name.split("[", 1)[0], set()).add(status)
    assert set(statuses) == set(CHECKS), lines
    # imds-exposure is a NOTE without the optional IMDS lockdown: a fact to accept, exit status still 0
    assert {name: s for name, s in statuses.items() if s != {OK}} == {"imds-exposure": {NOTE}}, lines
    assert "OK slurm-usage[controller-machine]" in " ".join(lines)
