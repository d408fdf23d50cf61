"""A sync that timed out or was stopped cannot release its lease itself: its status-change event does.

Without this, every later event and sweep would coalesce into the dead holder until the lease
expired (LEASE_SECONDS, longer than the sync's timeout), and the login tier would not heal.
"""

import json
import time

from hpops_core.login_sync import sync_lease


def _status_change(world, execution_name: str, status: str, state_machine_arn: str | None = None) -> dict:
    machine = state_machine_arn or world.output("LoginNodeSyncStateMachineArn")
    execution = machine.replace(":stateMachine:", ":execution:") + f":{execution_name}"
    return {
        "Source": "aws.states",
        "DetailType": "Step Functions Execution Status Change",
        "Resources": [execution],
        "Detail": json.dumps({"executionArn": execution, "stateMachineArn": machine, "name": execution_name,
                              "status": status, "input": "{}", "inputDetails": {"included": True}}),
    }, execution


def _hold_lease(world, holder: str) -> None:
    table = world.resolver.physical_ids["SyncStateTable"]
    assert sync_lease.acquire(table, world.cluster_name, holder, int(time.time()), 3060).acquired


def test_a_timed_out_sync_frees_its_lease_and_the_next_sweep_heals(world):
    entry, execution = _status_change(world, "sweep-that-timed-out", "TIMED_OUT")
    _hold_lease(world, execution)
    coalesced = world.wait([world.run_schedule()])[0]
    assert coalesced.output["lease"]["acquired"] is False and world.target_ips() == []

    world.deliver_to_functions("default", entry)

    assert not world.delivery_failures
    assert "holder" not in world.lease_item()
    result = world.wait([world.run_schedule()])[0]
    assert result.status == "SUCCEEDED"
    assert world.target_ips() == world.login_truth() and len(world.target_ips()) == 3


def test_an_aborted_sync_frees_its_lease(world):
    entry, execution = _status_change(world, "stopped-by-operator", "ABORTED")
    _hold_lease(world, execution)
    world.deliver_to_functions("default", entry)
    assert "holder" not in world.lease_item()


def test_another_holder_keeps_its_lease(world):
    # The ended execution no longer holds the lease (a newer sync took it): nothing is released.
    entry, _ = _status_change(world, "old-sync", "TIMED_OUT")
    live = world.output("LoginNodeSyncStateMachineArn").replace(":stateMachine:", ":execution:") + ":live-sync"
    _hold_lease(world, live)
    world.deliver_to_functions("default", entry)
    assert world.lease_item()["holder"]["S"] == live


def test_other_state_machines_and_successes_release_nothing(world):
    entry, execution = _status_change(world, "sync-ok", "SUCCEEDED")
    _hold_lease(world, execution)
    world.deliver_to_functions("default", entry)  # the rule does not match a success
    other, _ = _status_change(world, "sync-ok", "TIMED_OUT",
                              world.output("LoginNodeSyncStateMachineArn").rsplit(":", 1)[0] + ":someone-elses-machine")
    world.deliver_to_functions("default", other)  # nor another state machine
    assert world.lease_item()["holder"]["S"] == execution
    assert not world.delivery_failures
