"""RecordNodeReport's configuration: which cluster and login group a report must come from; read at call time."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from hpops_core.common import validation
from hpops_core.common.config import env_int, env_str


@dataclass(frozen=True)
class NodeReportConfig:
    cluster_name: str
    login_group: str
    state_table: str

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> NodeReportConfig:
        env = os.environ if env is None else env
        return cls(env_str(env, "CLUSTER_NAME", validation.CLUSTER_NAME_RE),
                   env_str(env, "LOGIN_GROUP_NAME", validation.INSTANCE_GROUP_RE),
                   env_str(env, "STATE_TABLE_NAME"))


@dataclass(frozen=True)
class NodeChannelConfig:
    """NodeChannel (enroll, fetch) and the report handlers' enrollment checks."""

    cluster_name: str
    login_group: str
    controller_group: str
    state_table: str
    enrollment_window_minutes: int
    alert_topic_arn: str = ""  # where enrollment conflicts go (NodeChannel); the report handlers send none
    region: str = ""  # the stack's Region (Lambda's AWS_REGION): an instance identity document must name it

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> NodeChannelConfig:
        env = os.environ if env is None else env
        return cls(env_str(env, "CLUSTER_NAME", validation.CLUSTER_NAME_RE),
                   env_str(env, "LOGIN_GROUP_NAME", validation.INSTANCE_GROUP_RE),
                   env_str(env, "CONTROLLER_GROUP_NAME", validation.INSTANCE_GROUP_RE),
                   env_str(env, "STATE_TABLE_NAME"),
                   env_int(env, "ENROLLMENT_WINDOW_MINUTES", 5, 24 * 60, default=60),
                   env.get("ALERT_TOPIC_ARN", "").strip(), env.get("AWS_REGION", "").strip())
