"""Which login nodes' users are told they leave rotation (pure), and what an agent accepts of it."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from hpops_core.cluster.login_group import LoginNode
from hpops_core.common.errors import ConfigurationError
from hpops_core.login_sync.config import SyncConfig
from hpops_core.login_sync.leave_notices import leaving_nodes, notice_document
from hpops_core.node_channel import leave_notices

NOW = datetime(2026, 11, 28, 15, 30, tzinfo=timezone.utc)
RUNNING = [LoginNode("i-0000000000000000a", "Running", "10.1.0.10"), LoginNode("i-0000000000000000b", "Running", "10.1.0.11")]


def test_a_node_shutting_down_or_held_out_is_leaving_and_keeps_its_since_until_it_is_back():
    stopping = LoginNode("i-0000000000000000c", "ShuttingDown", "10.1.0.12")
    pending = LoginNode("i-0000000000000000d", "Pending", None)  # never had an IP: nobody is on it
    first = leaving_nodes(RUNNING + [stopping, pending], {"10.1.0.11": "pressure 80%"}, {}, NOW)
    assert first.changed and sorted(first.nodes) == ["i-0000000000000000b", "i-0000000000000000c"]
    assert first.nodes["i-0000000000000000c"] == {"ip": "10.1.0.12", "why": "stopping", "detail": "status ShuttingDown",
                                                   "since": "2026-11-28T15:30:00Z"}
    assert first.nodes["i-0000000000000000b"]["why"] == "admission"

    later = leaving_nodes(RUNNING + [stopping], {"10.1.0.11": "pressure 80%"}, first.nodes, NOW + timedelta(minutes=5))
    assert not later.changed and later.reasons == ()  # the same leave: nobody is told twice

    back = leaving_nodes(RUNNING, {}, first.nodes, NOW + timedelta(minutes=9))
    assert back.changed and back.nodes == {}
    assert sorted(back.reasons) == ["no more notice for i-0000000000000000b: back in rotation or gone",
                                    "no more notice for i-0000000000000000c: back in rotation or gone"]
    again = leaving_nodes(RUNNING, {"10.1.0.11": "pressure"}, back.nodes, NOW + timedelta(minutes=20))
    assert again.nodes["i-0000000000000000b"]["since"] == "2026-11-28T15:50:00Z"  # a new leave, told again


def test_what_the_stack_publishes_is_what_the_agent_reads_and_a_bad_document_is_refused_by_name():
    stopping = LoginNode("i-0000000000000000c", "ShuttingDown", "10.1.0.12")
    # A reason with terminal control characters is made printable before it is published.
    notices = leaving_nodes(RUNNING + [stopping], {"10.1.0.10": "hot\x1b[2J\u00e9"}, {}, NOW)
    document = notice_document(notices.nodes, 0, "nlb.example")
    mine = leave_notices.notice_for(document, "i-0000000000000000c")
    assert mine["graceMinutes"] == 0 and "log out now" in leave_notices.message(mine)
    held = leave_notices.notice_for(document, "i-0000000000000000a")
    assert held["detail"] == "hot 2J" and leave_notices.message(held).isascii()
    assert leave_notices.notice_for(document, "i-000000000000000ff") is None

    for bad in ("{", json.dumps({"format": "other"}),
                document.replace('"graceMinutes": 0', '"graceMinutes": 999'),
                document.replace('"why": "stopping"', '"why": "reboot"'),
                document.replace("nlb.example", "nlb.example; rm -rf /")):
        with pytest.raises(leave_notices.BadLeaveNotices):
            leave_notices.notice_for(bad, "i-0000000000000000c")


def test_the_grace_is_configured_off_or_in_minutes():
    base = {"CLUSTER_NAME": "ml-research", "CLUSTER_ARN": "arn:aws:sagemaker:us-east-1:123456789012:cluster/abc123def456",
            "LOGIN_GROUP_NAME": "login", "TARGET_GROUP_ARN": "tg", "SSH_PORT": "22", "STATE_TABLE_NAME": "t",
            "LEASE_SECONDS": "3060", "HOST_IDENTITY_MODE": "off", "NODE_REPORT_POLL_SECONDS": "10",
            "NODE_REPORT_MAX_POLLS": "18"}
    assert SyncConfig.from_env(base | {"LEAVE_NOTICE_MINUTES": "off"}).leave_notice_minutes is None
    assert SyncConfig.from_env(base).leave_notice_minutes is None
    assert SyncConfig.from_env(base | {"LEAVE_NOTICE_MINUTES": "15"}).leave_notice_minutes == 15
    with pytest.raises(ConfigurationError):
        SyncConfig.from_env(base | {"LEAVE_NOTICE_MINUTES": "121"})
