"""Which ended execution's lease is released: a pure decision over Step Functions' status-change event."""

import json
from pathlib import Path

import pytest

from hpops_core.common.errors import MalformedEventError
from hpops_core.login_sync.execution_events import lease_to_release

SAMPLE = json.loads((Path(__file__).parents[2] / "events" / "sync-execution-timed-out.json").read_text())
MACHINE = SAMPLE["detail"]["stateMachineArn"]


def with_detail(**changes):
    return SAMPLE | {"detail": SAMPLE["detail"] | changes}


def test_the_documented_timed_out_event_releases_that_executions_lease():
    cleanup = lease_to_release(SAMPLE, MACHINE)
    assert cleanup.holder == SAMPLE["detail"]["executionArn"]
    assert "TIMED_OUT" in cleanup.reason


@pytest.mark.parametrize("status", ["ABORTED", "FAILED"])
def test_aborted_and_failed_release(status):
    assert lease_to_release(with_detail(status=status), MACHINE).holder == SAMPLE["detail"]["executionArn"]


@pytest.mark.parametrize("status", ["SUCCEEDED", "RUNNING", "PENDING_REDRIVE"])
def test_a_running_or_successful_execution_keeps_its_lease(status):
    assert lease_to_release(with_detail(status=status), MACHINE).holder is None


def test_another_state_machine_is_not_ours():
    other = MACHINE.rsplit(":", 1)[0] + ":someone-else"
    assert lease_to_release(with_detail(stateMachineArn=other), MACHINE).holder is None


@pytest.mark.parametrize("event", [
    with_detail(executionArn="arn:aws:states:us-east-1:123456789012:execution:x:$(reboot)"),
    with_detail(status="EXPLODED"),
    SAMPLE | {"source": "aws.sagemaker"},
    SAMPLE | {"detail": "not an object"},
])
def test_malformed_events_are_named_errors(event):
    with pytest.raises(MalformedEventError):
        lease_to_release(event, MACHINE)
