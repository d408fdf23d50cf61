"""Every accepted input shape, and the named errors for everything else."""

import copy

import pytest

from hpops_core.common.errors import MalformedEventError, UnknownClusterError
from hpops_core.login_sync.trigger import parse_sync_input, require_managed_cluster


@pytest.mark.parametrize(
    "name, trigger",
    [
        ("hyperpod-cluster-state-change.json", "cluster state Updating (login 3/4, gpu 8/8)"),
        ("hyperpod-node-health.json", "node health i-0123456789abcdef0: Unhealthy, Replace"),
        ("hyperpod-cluster-event.json", "cluster event Info on i-0fedcba9876543210"),
    ],
)
def test_every_hyperpod_event_becomes_a_reconcile_of_its_cluster(saved_event, name, trigger):
    request = parse_sync_input(saved_event(name))
    assert request.cluster == "ml-research"
    assert request.mode == "event" and request.dry_run is False
    assert request.trigger == trigger


def test_sweep_and_repair_inputs(saved_event):
    assert parse_sync_input(saved_event("sweep.json")).mode == "sweep"
    repair = parse_sync_input(saved_event("repair-dry-run.json"))
    assert (repair.mode, repair.dry_run) == ("repair", True)


def test_unknown_cluster_is_named():
    request = parse_sync_input({"cluster": "someone-else", "mode": "repair"})
    with pytest.raises(UnknownClusterError):
        require_managed_cluster(request, "ml-research")


HOSTILE = ["ml;rm -rf /", "$(reboot)", "a" * 300, "ml\nresearch", "\x1b[31mred", "../../etc", ""]


@pytest.mark.parametrize("hostile", HOSTILE)
def test_hostile_cluster_names_are_rejected_without_echo(saved_event, hostile):
    event = saved_event("hyperpod-node-health.json")
    event["detail"]["ClusterName"] = hostile
    with pytest.raises(MalformedEventError) as raised:
        parse_sync_input(event)
    assert hostile not in str(raised.value) or hostile == ""
    with pytest.raises(MalformedEventError):
        parse_sync_input({"cluster": hostile, "mode": "sweep"})


@pytest.mark.parametrize(
    "mutate",
    [
        lambda e: e.pop("detail"),
        lambda e: e.__setitem__("detail-type", "SageMaker HyperPod Something Else"),
        lambda e: e.__setitem__("source", "aws.ec2"),
        lambda e: e.__setitem__("detail", "not an object"),  # an odd *hint* is lenient: test_events_lenient.py
        lambda e: e["detail"].pop("ClusterName"),
        lambda e: e.__setitem__("detail-type", ["not", "a", "string"]),
    ],
)
def test_malformed_events_get_a_named_error(saved_event, mutate):
    event = copy.deepcopy(saved_event("hyperpod-node-health.json"))
    mutate(event)
    with pytest.raises(MalformedEventError):
        parse_sync_input(event)


@pytest.mark.parametrize("payload", [None, [], "repair", 42, {}, {"cluster": "ml-research"},
                                     {"cluster": "ml-research", "mode": "delete-everything"},
                                     {"cluster": "ml-research", "mode": "repair", "extra": 1},
                                     # "false" is not false: a quoted flag must not start a real repair
                                     {"cluster": "ml-research", "mode": "repair", "dryRun": "false"},
                                     {"cluster": "ml-research", "mode": "repair", "dryRun": 0}])
def test_malformed_manual_inputs(payload):
    with pytest.raises(MalformedEventError):
        parse_sync_input(payload)
