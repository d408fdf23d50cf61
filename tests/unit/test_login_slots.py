"""Login-node slots: the pure plan (stable for a node's life, a replacement takes a free slot) and the
map the agents read."""

from __future__ import annotations

import json

import pytest

from hpops_core.login_sync.slots import plan_slots, slot_document
from hpops_core.node_channel.login_slots import BadSlots, login_line, slot_of


def test_nodes_keep_their_slots_and_a_replacement_takes_the_lowest_free_one():
    plan = plan_slots({1: ["10.1.0.5"], 2: ["10.1.0.6"], 3: ["10.1.0.7"], 4: []}, ["10.1.0.5", "10.1.0.7", "10.1.0.9"])
    assert plan.deregister == {2: ("10.1.0.6",)}
    assert plan.register == {2: "10.1.0.9"}
    assert plan.assignment == {"10.1.0.5": 1, "10.1.0.7": 3, "10.1.0.9": 2}


def test_nothing_changes_when_every_node_has_its_slot():
    plan = plan_slots({1: ["10.1.0.5"], 2: []}, ["10.1.0.5"])
    assert not plan.has_changes and plan.assignment == {"10.1.0.5": 1}


def test_more_nodes_than_slots_leaves_the_rest_without_one_and_says_so():
    plan = plan_slots({1: [], 2: []}, ["10.1.0.7", "10.1.0.5", "10.1.0.6"])
    assert plan.register == {1: "10.1.0.5", 2: "10.1.0.6"}
    assert "10.1.0.7: no free slot (all 2 taken)" in plan.reasons


def test_a_slot_edited_to_hold_two_nodes_keeps_one_and_a_node_never_holds_two_slots():
    plan = plan_slots({1: ["10.1.0.5", "10.1.0.6"], 2: ["10.1.0.5"]}, ["10.1.0.5", "10.1.0.6"])
    assert plan.assignment == {"10.1.0.5": 1, "10.1.0.6": 2}
    assert plan.deregister == {1: ("10.1.0.6",), 2: ("10.1.0.5",)} and plan.register == {2: "10.1.0.6"}


def test_the_agent_finds_its_slot_in_the_published_map():
    text = slot_document({"10.1.0.5": 3}, "login-nlb.elb.us-east-1.amazonaws.com")
    assert slot_of(text, "10.1.0.5") == (3, "login-nlb.elb.us-east-1.amazonaws.com")
    assert slot_of(text, "10.1.0.6") is None
    assert login_line(3, "login.hpc.example.edu") == (
        "you are on login-03; come back to this node with: ssh -p 2203 login.hpc.example.edu")


@pytest.mark.parametrize("text", [
    "nope", "{}",
    json.dumps({"format": "hpops.node.login-slots.v1", "host": "x; rm -rf /", "slots": {}}),
    json.dumps({"format": "hpops.node.login-slots.v1", "host": "h", "slots": {"10.1.0.5": 99}}),
    json.dumps({"format": "hpops.node.login-slots.v1", "host": "h", "slots": {"10.1.0.5": True}}),
])
def test_a_bad_map_is_refused(text):
    with pytest.raises(BadSlots):
        slot_of(text, "10.1.0.5")
