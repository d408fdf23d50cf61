"""UserCaps: validated at configuration time with the nodes' own rule, published to the user-caps
parameter only when it changes, and deleted when turned off (the agents then remove their drop-ins)."""

from __future__ import annotations

import json

import boto3
import pytest
from moto import mock_aws

from hpops_core.common import clients
from hpops_core.common.errors import ConfigurationError
from hpops_core.node_channel import contract
from hpops_core.session_limits.config import LoginLimitsConfig
from hpops_core.session_limits.login_limits import publish_user_caps

ENV = {"CLUSTER_NAME": "ml", "CLUSTER_ID": "abc123def456", "LOGIN_GROUP_NAME": "login", "SESSION_LIMITS_DRY_RUN": "false",
       "MAX_SESSIONS_PER_USER": "2", "SESSION_LIMIT_OVERRIDES": "{}", "SESSION_EXEMPT_USERS": "", "STATE_TABLE_NAME": "t"}
CAPS = {"default": {"cpuQuota": "200%", "memoryMax": "8G", "tasksMax": 512}, "overrides": {"alice": {"memoryMax": "16G"}},
        "exempt": ["ops"]}


@pytest.fixture
def ssm(monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with mock_aws():
        clients.reset_clients()
        yield boto3.client("ssm", region_name="us-east-1")
    clients.reset_clients()


def test_caps_are_off_by_default_and_parsed_with_the_nodes_rule():
    assert LoginLimitsConfig.from_env(ENV).user_caps is None
    caps = LoginLimitsConfig.from_env(ENV | {"USER_CAPS": json.dumps(CAPS)}).user_caps
    assert caps == {"default": {"cpuQuota": "200%", "memoryMax": "8G", "tasksMax": "512"},
                    "overrides": {"alice": {"memoryMax": "16G"}}, "exempt": ["ops"]}


@pytest.mark.parametrize("raw, named", [
    ("{", "not JSON"),
    ('{"default": {"memoryMax": "8 GB"}}', "default.memoryMax"),
    ('{"default": {}, "exempt": ["root"]}', "never root"),
])
def test_bad_caps_fail_the_configuration_naming_what(raw, named):
    with pytest.raises(ConfigurationError, match="USER_CAPS") as error:
        LoginLimitsConfig.from_env(ENV | {"USER_CAPS": raw})
    assert named in str(error.value)


def test_published_once_unchanged_after_and_deleted_when_off(ssm):
    caps = LoginLimitsConfig.from_env(ENV | {"USER_CAPS": json.dumps(CAPS)}).user_caps
    name = contract.user_caps_parameter("ml")

    assert publish_user_caps("ml", None, dry_run=False) == "off"
    assert publish_user_caps("ml", caps, dry_run=True) == "would publish"
    assert publish_user_caps("ml", caps, dry_run=False) == "published"
    document = json.loads(ssm.get_parameter(Name=name)["Parameter"]["Value"])
    assert document == {"format": contract.USER_CAPS_FORMAT, "caps": caps}
    assert publish_user_caps("ml", caps, dry_run=False) == "unchanged"
    assert publish_user_caps("ml", None, dry_run=True) == "would remove"
    assert publish_user_caps("ml", None, dry_run=False) == "removed"
    assert not ssm.get_parameters(Names=[name])["Parameters"]
