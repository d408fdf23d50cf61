"""An event's job is to say which cluster may have changed: only the cluster is required and checked
strictly; an odd hint (instance id, group, health summary, level...) is shown as a placeholder and
logged by name, and the cluster is reconciled anyway."""

import copy
import logging

import pytest

from hpops_core.common.errors import MalformedEventError
from hpops_core.login_sync.trigger import SyncRequest, parse_sync_input


def test_the_documented_node_health_example_reconciles_its_cluster(saved_event):
    # AWS's own example carries InstanceId i-12345678abcdefghi, which is not hex.
    request = parse_sync_input(saved_event("node-health-documented.json"))
    assert isinstance(request, SyncRequest)
    assert request.cluster == "ml-research" and request.mode == "event" and request.dry_run is False
    assert request.trigger == "node health i-12345678abcdefghi: Unschedulable, Replace"
    assert request.event_id == "5d2f0a7e-5555-4c3b-9d1e-6f7a8b9c0d1e"
    assert request.odd_hints == ()


def _set(path, value):
    def mutate(event):
        target = event
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return mutate


def _drop(path):
    def mutate(event):
        target = event
        for key in path[:-1]:
            target = target[key]
        target.pop(path[-1])
    return mutate


# (sample, mutation, trigger text, odd hints)
LENIENT = {
    "hostile instance id": ("hyperpod-node-health.json", _set(["detail", "InstanceId"], "i-XYZ; curl evil"),
                            "node health instance id (unrecognised): Unhealthy, Replace", ("instance id",)),
    "no instance id": ("hyperpod-node-health.json", _drop(["detail", "InstanceId"]),
                       "node health unknown instance: Unhealthy, Replace", ()),
    "escape in health status": ("hyperpod-node-health.json",
                                _set(["detail", "HealthSummary", "HealthStatus"], "\x1b[31mred"),
                                "node health i-0123456789abcdef0: health status (unrecognised), Replace",
                                ("health status",)),
    "health summary not an object": ("hyperpod-node-health.json", _set(["detail", "HealthSummary"], "broken"),
                                     "node health i-0123456789abcdef0: unknown", ("health summary",)),
    "huge repair action": ("hyperpod-node-health.json", _set(["detail", "HealthSummary", "RepairAction"], "R" * 5000),
                           "node health i-0123456789abcdef0: Unhealthy, repair action (unrecognised)",
                           ("repair action",)),
    "unknown event level": ("hyperpod-cluster-event.json", _set(["detail", "EventDetails", "EventLevel"], "Critical"),
                            "cluster event event level (unrecognised) on i-0fedcba9876543210", ("event level",)),
    "unknown resource type": ("hyperpod-cluster-event.json",
                              lambda e: (e["detail"]["EventDetails"].pop("InstanceId"),
                                         e["detail"]["EventDetails"].pop("InstanceGroupName"),
                                         e["detail"]["EventDetails"].update(ResourceType="Node")),
                              "cluster event Info on resource type (unrecognised)", ("resource type",)),
    "no event id": ("hyperpod-cluster-event.json", _drop(["detail", "EventDetails", "EventId"]),
                    "cluster event Info on i-0fedcba9876543210", ()),
    "odd instance group in a cluster event": ("hyperpod-cluster-event.json",
                                              lambda e: (e["detail"]["EventDetails"].pop("InstanceId"),
                                                         e["detail"]["EventDetails"].update(InstanceGroupName="lo gin")),
                                              "cluster event Info on instance group (unrecognised)", ("instance group",)),
    "cluster status not a word": ("hyperpod-cluster-state-change.json", _set(["detail", "ClusterStatus"], "In$ervice"),
                               "cluster state status (unrecognised) (login 3/4, gpu 8/8)", ("status",)),
    "odd group in a state change": ("hyperpod-cluster-state-change.json",
                                    _set(["detail", "InstanceGroups", 0, "InstanceGroupName"], "login;reboot"),
                                    "cluster state Updating (instance group (unrecognised) 3/4, gpu 8/8)",
                                    ("instance group",)),
    "negative count": ("hyperpod-cluster-state-change.json", _set(["detail", "InstanceGroups", 1, "CurrentCount"], -1),
                       "cluster state Updating (login 3/4, gpu instance count (unrecognised)/8)", ("instance count",)),
    "groups not a list": ("hyperpod-cluster-state-change.json", _set(["detail", "InstanceGroups"], {"login": 3}),
                          "cluster state Updating", ("instance groups",)),
}


@pytest.mark.parametrize("name", sorted(LENIENT))
def test_odd_hints_never_fail_the_parse_and_are_replaced_and_logged(saved_event, caplog, name):
    sample, mutate, trigger, odd = LENIENT[name]
    event = copy.deepcopy(saved_event(sample))
    mutate(event)
    with caplog.at_level(logging.WARNING):
        request = parse_sync_input(event)
    assert request.cluster == "ml-research" and request.mode == "event"
    assert request.trigger == trigger
    assert request.odd_hints == odd
    logged = [r for r in caplog.records if "hints unrecognised" in r.getMessage()]
    if odd:
        assert len(logged) == 1 and getattr(logged[0], "oddHints") == list(odd)
        assert "curl" not in caplog.text and "\x1b" not in caplog.text and "R" * 100 not in caplog.text
    else:
        assert logged == []


def _source(event):
    event["source"] = "aws.ec2"


STRICT = {
    "wrong source": ("hyperpod-node-health.json", _source),
    "wrong detail-type": ("hyperpod-node-health.json", _set(["detail-type"], "SageMaker HyperPod Something Else")),
    "detail-type not a string": ("hyperpod-node-health.json", _set(["detail-type"], ["x"])),
    "no detail": ("hyperpod-node-health.json", _drop(["detail"])),
    "detail not an object": ("hyperpod-node-health.json", _set(["detail"], ["ml-research"])),
    "no cluster name": ("hyperpod-node-health.json", _drop(["detail", "ClusterName"])),
    "hostile cluster name": ("hyperpod-node-health.json", _set(["detail", "ClusterName"], "ml;rm -rf /")),
    "cluster name too long": ("hyperpod-cluster-state-change.json", _set(["detail", "ClusterName"], "a" * 64)),
    "malformed cluster ARN": ("hyperpod-cluster-state-change.json", _set(["detail", "ClusterArn"], "arn:aws:ec2:x")),
    "EventDetails not an object": ("hyperpod-cluster-event.json", _set(["detail", "EventDetails"], "ml-research")),
    "cluster event without cluster": ("hyperpod-cluster-event.json", _drop(["detail", "EventDetails", "ClusterName"])),
}


@pytest.mark.parametrize("name", sorted(STRICT))
def test_the_cluster_and_the_envelope_are_still_checked_strictly(saved_event, name):
    sample, mutate = STRICT[name]
    event = copy.deepcopy(saved_event(sample))
    mutate(event)
    with pytest.raises(MalformedEventError) as refused:
        parse_sync_input(event)
    assert "rm -rf" not in str(refused.value)


def test_a_cluster_status_aws_adds_later_is_shown_as_is(saved_event):
    # The budget guard accepts any word as a status; the trigger text agrees with it.
    event = saved_event("hyperpod-cluster-state-change.json")
    event["detail"]["ClusterStatus"] = "Hibernating"
    request = parse_sync_input(event)
    assert request.trigger.startswith("cluster state Hibernating (") and request.odd_hints == ()
