"""Configuration: one frozen dataclass, read from the environment at call time (never at import)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from hpops_core.errors import ConfigurationError


def _require(env: Mapping[str, str], name: str) -> str:
    value = env.get(name, "").strip()
    if not value:
        raise ConfigurationError(f"missing environment variable {name}")
    return value


def _require_int(env: Mapping[str, str], name: str, low: int, high: int) -> int:
    raw = _require(env, name)
    try:
        value = int(raw)
    except ValueError:
        raise ConfigurationError(f"environment variable {name} must be an integer") from None
    if not low <= value <= high:
        raise ConfigurationError(f"environment variable {name} must be between {low} and {high}")
    return value


def _require_choice(env: Mapping[str, str], name: str, choices: tuple[str, ...]) -> str:
    value = _require(env, name)
    if value not in choices:
        raise ConfigurationError(f"environment variable {name} must be one of {', '.join(choices)}")
    return value


@dataclass(frozen=True)
class SyncConfig:
    """Everything the LoginNodeSync functions need; template.yaml sets it in Globals."""

    cluster_name: str
    cluster_arn: str
    login_group: str
    target_group_arn: str
    ssh_port: int
    state_table: str
    lease_seconds: int
    host_identity_mode: str  # "keys": new login nodes take traffic only once their host keys verify

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> SyncConfig:
        env = os.environ if env is None else env
        return cls(
            cluster_name=_require(env, "CLUSTER_NAME"),
            cluster_arn=_require(env, "CLUSTER_ARN"),
            login_group=_require(env, "LOGIN_GROUP_NAME"),
            target_group_arn=_require(env, "TARGET_GROUP_ARN"),
            ssh_port=_require_int(env, "SSH_PORT", 1, 65535),
            state_table=_require(env, "STATE_TABLE_NAME"),
            lease_seconds=_require_int(env, "LEASE_SECONDS", 60, 86400),
            host_identity_mode=_require_choice(env, "HOST_IDENTITY_MODE", ("keys", "off")),
        )
