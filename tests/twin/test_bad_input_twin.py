"""Bad input to the state machines fails with a named error and changes nothing: the sync's and the
budget guard's. Every input here is refused before anything is written, so they share one world (a
refusal that wrote something fails its own test, and the ones after it see it too)."""

from __future__ import annotations

import pytest

from hpops_twin.world import TwinWorld

BUDGET_TAG = "hpops:monthly-budget-usd"


@pytest.fixture(scope="module")
def world():
    with TwinWorld() as twin:
        twin.budget.tag_cluster(BUDGET_TAG, "750000")  # a limit: only the bad input keeps a budget from being made
        yield twin


@pytest.mark.parametrize(
    "payload, error",
    [
        ({"cluster": "ml;rm -rf /", "mode": "repair"}, "MalformedEventError"),
        ({"cluster": "someone-elses-cluster", "mode": "repair"}, "UnknownClusterError"),
        ({"cluster": "ml-research", "mode": "nuke"}, "MalformedEventError"),
        ({"detail-type": "SageMaker HyperPod Cluster Node Health Event", "source": "aws.sagemaker",
          "detail": {"ClusterName": "ml-research"}}, "MalformedEventError"),
        (["not", "an", "object"], "MalformedEventError"),
    ],
)
def test_bad_sync_input_fails_with_a_named_error_and_changes_nothing(world, payload, error):
    result = world.wait([world.start_raw(payload)])[0]
    assert result.status == "FAILED"
    assert result.error == error
    assert world.target_ips() == []
    lease = world.lease_item() or {}
    assert "holder" not in lease and "ipCache" not in lease, "rejected before taking the lease"


@pytest.mark.parametrize(
    "payload, error",
    [
        ({"detail-type": "SageMaker HyperPod Cluster Node Health Event", "source": "aws.sagemaker",
          "detail": {"ClusterName": "ml-research"}}, "MalformedEventError"),
        ({"version": "0", "id": "1", "detail-type": "SageMaker HyperPod Cluster State Change", "source": "aws.sagemaker",
          "account": "123456789012", "time": "2026-11-10T12:00:00Z", "region": "us-east-1", "resources": [],
          "detail": {"ClusterName": "ml-research", "ClusterStatus": "InService"}}, "MalformedEventError"),
        ({"cluster": "ml-research", "mode": "sweep", "extra": "x"}, "MalformedEventError"),
        ({"cluster": "someone-elses-cluster", "mode": "sweep"}, "UnknownClusterError"),
        (["not", "an", "object"], "MalformedEventError"),
    ],
)
def test_bad_budget_guard_input_fails_with_a_named_error_and_creates_nothing(world, payload, error):
    result = world.wait([world.budget.start_raw(payload)])[0]
    assert (result.status, result.error) == ("FAILED", error)
    assert world.budget.budgets() == {}
    assert world.budget.state_items() == {}
    assert world.budget.sns_messages() == []
    assert world.counter.calls["budgets.CreateBudget"] == 0
