"""PushLoginLimits' core with a fake transport: bounded polling, only Success recorded."""

from __future__ import annotations

from datetime import datetime, timezone
from unittest import mock

import pytest

from hpops_core.errors import ConfigurationError
from hpops_core.host_identity.node_commands import CommandOutcome
from hpops_core.session_limits import login_limits
from hpops_core.session_limits.config import LoginLimitsConfig

NOW = datetime(2026, 11, 22, tzinfo=timezone.utc)


class FakeTransport:
    def __init__(self, statuses: dict[str, str]):
        self.statuses = statuses
        self.sent: list[str] = []

    def send(self, instance_id, document, parameters, comment=""):
        self.sent.append(instance_id)
        return f"cmd-{instance_id}"

    def outcome(self, command_id, instance_id):
        status = self.statuses[instance_id]
        return CommandOutcome(status, "changed" if status == "Success" else "unknown", status)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def summary(instance_id, status="Running"):
    return {"InstanceId": instance_id, "InstanceStatus": {"Status": status}}


@pytest.fixture
def store():
    applied = {"i-same": login_limits.limits_hash('{"default":2}'), "i-gone": "old"}
    recorded, forgotten = {}, []
    with mock.patch.object(login_limits, "applied_hashes", lambda table, cluster: dict(applied)), \
         mock.patch.object(login_limits, "record_applied", lambda t, c, i, d, n: recorded.__setitem__(i, d)), \
         mock.patch.object(login_limits, "forget", lambda t, c, i: forgotten.append(i)), \
         mock.patch.object(login_limits, "list_login_group", lambda cluster, group: [
             summary("i-same"), summary("i-new"), summary("i-slow"), summary("i-broken"), summary("i-pending", "Pending")]):
        yield recorded, forgotten


def test_pushes_changed_running_nodes_polls_within_the_bound_and_records_only_success(store):
    recorded, forgotten = store
    transport = FakeTransport({"i-new": "Success", "i-slow": "InProgress", "i-broken": "Failed"})
    clock = Clock()
    report = login_limits.push_login_limits(
        transport, cluster="c", group="login", table="t", document="doc", limits_json='{"default":2}',
        poll_seconds=20, now=NOW, clock=clock, sleep=clock.sleep,
    )
    assert sorted(transport.sent) == ["i-broken", "i-new", "i-slow"], "unchanged and non-Running nodes are not sent"
    assert report.pushed == ["i-new"] and report.unchanged == ["i-same"]
    assert {f["instanceId"]: f["status"] for f in report.failed} == {"i-broken": "Failed", "i-slow": "Pending"}
    assert list(recorded) == ["i-new"]
    assert forgotten == ["i-gone"]
    assert 20 <= clock.now <= 22, "polling stops at the bound"


def test_configuration_is_validated_by_the_node_scripts_own_rules():
    env = {"CLUSTER_NAME": "ml", "CLUSTER_ID": "abc123def456", "LOGIN_GROUP_NAME": "login", "SESSION_LIMITS_DRY_RUN": "false",
           "MAX_SESSIONS_PER_USER": "2", "SESSION_LIMIT_OVERRIDES": '{"alice": 4}', "SESSION_EXEMPT_USERS": "ops, ci",
           "LOGIN_LIMITS_DOCUMENT": "doc", "STATE_TABLE_NAME": "t"}
    config = LoginLimitsConfig.from_env(env)
    assert config.limits_json == '{"default":2,"exempt":["ci","ops"],"overrides":{"alice":4}}'
    assert config.poll_seconds == 20
    with pytest.raises(ConfigurationError, match="login node limits"):
        LoginLimitsConfig.from_env(env | {"SESSION_LIMIT_OVERRIDES": '{"Alice Smith": 4}'})
