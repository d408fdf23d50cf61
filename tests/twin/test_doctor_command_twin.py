"""`hpops doctor --twin`: a fresh twin with the account around it set up as a working installation."""

from __future__ import annotations

import json

from hpops.doctor_checks import CHECKS, NOTE, OK
from hpops.main import main


def test_doctor_twin_command_exits_0_and_json_is_one_document(capsys):
    assert main(["doctor", "--twin", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["format"] == "hpops.doctor.v1" and document["exitStatus"] == 0
    assert {c["check"] for c in document["checks"]} == set(CHECKS)
    # imds-exposure is a NOTE without the optional IMDS lockdown: a fact to accept, exit status still 0
    assert {c["status"] for c in document["checks"] if c["check"] != "imds-exposure"} == {OK}
    assert {c["status"] for c in document["checks"] if c["check"] == "imds-exposure"} == {NOTE}
