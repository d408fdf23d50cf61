"""PublishLoginLimits: the limits are published once per version, and each login node's agent
report says whether that node applied them (pure decision), with moto for the publication."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import boto3
import pytest
from moto import mock_aws

from hpops_core.aws import clients
from hpops_core.errors import ConfigurationError
from hpops_core.node_channel import contract
from hpops_core.node_channel.login_limits import desired_document, parse_limits
from hpops_core.session_limits import login_limits
from hpops_core.session_limits.config import LoginLimitsConfig

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)
LIMITS = parse_limits('{"default": 2, "overrides": {"alice": 4}}')
VERSION = desired_document(LIMITS)["version"]
ENV = {"CLUSTER_NAME": "ml", "CLUSTER_ID": "abc123def456", "LOGIN_GROUP_NAME": "login", "SESSION_LIMITS_DRY_RUN": "false",
       "MAX_SESSIONS_PER_USER": "2", "SESSION_LIMIT_OVERRIDES": '{"alice": 4}', "SESSION_EXEMPT_USERS": "ops, ci",
       "STATE_TABLE_NAME": "t"}


def node(instance_id, launched=NOW - timedelta(days=1)):
    return {"InstanceId": instance_id, "LaunchTime": launched, "InstanceStatus": {"Status": "Running"}}


def report(version, result="changed", reason=""):
    return {"loginLimits": {"version": version, "result": result, "reason": reason}}


def test_each_running_node_is_applied_pending_or_failed_with_a_reason():
    running = [node("i-done"), node("i-new", launched=NOW - timedelta(seconds=40)), node("i-behind"),
               node("i-broken"), node("i-silent")]
    reports = {"i-done": report(VERSION, "unchanged"), "i-new": {}, "i-behind": report("old"),
               "i-broken": report(None, "failed", "limits.d is read-only"), "i-gone": report(VERSION)}
    verdicts = {v.instance_id: v for v in login_limits.judge_login_limits(
        VERSION, running, reports, published_at=NOW - timedelta(hours=1), now=NOW)}
    assert {i: v.state for i, v in verdicts.items()} == {
        "i-done": "applied", "i-new": "pending", "i-behind": "failed", "i-broken": "failed", "i-silent": "failed"}
    assert "read-only" in verdicts["i-broken"].reason
    assert "hpops-node-agent" in verdicts["i-silent"].reason
    assert "i-gone" not in verdicts, "a node that left the group is not judged"


def test_a_new_version_gives_every_node_the_grace_period_again():
    verdicts = login_limits.judge_login_limits(VERSION, [node("i-old")], {"i-old": report("previous")},
                                               published_at=NOW - timedelta(seconds=30), now=NOW)
    assert [v.state for v in verdicts] == ["pending"]


@pytest.fixture
def aws(monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with mock_aws():
        clients.reset_clients()
        yield boto3.client("ssm", region_name="us-east-1")
        clients.reset_clients()


def test_publication_writes_once_per_version(aws, monkeypatch):
    monkeypatch.setattr(login_limits, "list_login_group", lambda cluster, group: [])
    first = login_limits.publish_and_check("ml", "login", "t", LIMITS, NOW)
    again = login_limits.publish_and_check("ml", "login", "t", LIMITS, NOW)
    assert first.published and not again.published
    stored = aws.get_parameter(Name=contract.login_limits_parameter("ml"))["Parameter"]
    assert stored["Version"] == 1
    assert json.loads(stored["Value"]) == {"format": contract.LOGIN_LIMITS_FORMAT, "version": VERSION, "limits": LIMITS}
    changed = login_limits.publish_and_check("ml", "login", "t", parse_limits('{"default": 3}'), NOW)
    assert changed.published and aws.get_parameter(Name=contract.login_limits_parameter("ml"))["Parameter"]["Version"] == 2


def test_configuration_is_validated_by_the_nodes_own_rule_and_names_the_entry():
    config = LoginLimitsConfig.from_env(ENV)
    assert config.limits == {"default": 2, "exempt": ["ci", "ops"], "overrides": {"alice": 4}}
    for hostile in ('{"Alice Smith": 4}', '{"bob;rm -rf /": 1}', '{"a b": 1}'):
        with pytest.raises(ConfigurationError, match="login node limits: not a valid user name"):
            LoginLimitsConfig.from_env(ENV | {"SESSION_LIMIT_OVERRIDES": hostile})
