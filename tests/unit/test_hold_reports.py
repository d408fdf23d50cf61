"""The controller's holds report as RecordUsageReport parses it: its IMDS section, field by field (pure)."""

import pytest

from hpops_core.budget_guard.hold_reports import parse_holds_event
from hpops_core.budget_guard.usage_reports import MalformedUsageReport
from hpops_core.node_channel import contract, user_holds

IMDS = {"nonRoot": "blocked", "lockdown": "on", "reason": "nobody: connection refused"}


def event(**detail):
    body = {"format": user_holds.HOLDS_REPORT_FORMAT, "cluster": "ml", "instanceId": "i-0123456789abcdef0",
            "agentVersion": "1.0.0", "reportedAt": "2026-11-26T12:00:00Z", "version": "0123456789abcdef",
            "enforced": True, "enforceReason": "", "users": []} | detail
    return {"source": contract.REPORT_SOURCE, "detail-type": user_holds.HOLDS_DETAIL_TYPE, "detail": body}


def test_the_controllers_imds_probe_is_kept_as_sent_and_its_absence_is_no_section():
    assert parse_holds_event(event(imds=IMDS))["imds"] == IMDS
    assert parse_holds_event(event(imds={"nonRoot": "reachable", "lockdown": "off"}))["imds"] == {
        "nonRoot": "reachable", "lockdown": "off", "reason": ""}
    assert "imds" not in parse_holds_event(event())  # an agent without a probe configured (or an older agent)


@pytest.mark.parametrize("imds,named", [
    (IMDS | {"nonRoot": "blocked-ish"}, "imds.nonRoot"),  # not a probe answer: doctor would trust it
    (IMDS | {"lockdown": "sometimes"}, "imds.lockdown"),
    (IMDS | {"reason": "x" * 10_000}, "imds.reason"),
    (IMDS | {"credentials": "AKIA..."}, "imds"),  # a field the agent never sends
    ("reachable", "imds"),
    ({"lockdown": "off"}, "imds.nonRoot"),
])
def test_a_malformed_imds_section_refuses_the_whole_report_by_name(imds, named):
    with pytest.raises(MalformedUsageReport, match=rf"invalid field\(s\): .*{named.replace('.', '[.]')}"):
        parse_holds_event(event(imds=imds))
