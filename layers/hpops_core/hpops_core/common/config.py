"""Configuration: one frozen dataclass, read from the environment at call time (never at import)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from hpops_core.common.errors import ConfigurationError


def env_str(env: Mapping[str, str], name: str, pattern: re.Pattern[str] | None = None) -> str:
    """A required variable; with `pattern`, it must also match (a malformed value is named, not echoed)."""
    value = env.get(name, "").strip()
    if not value:
        raise ConfigurationError(f"missing environment variable {name}")
    if pattern is not None and not pattern.match(value):
        raise ConfigurationError(f"environment variable {name} is malformed")
    return value


def env_int(env: Mapping[str, str], name: str, low: int, high: int, default: int | None = None) -> int:
    if default is not None and not env.get(name, "").strip():
        return default
    raw = env_str(env, name)
    try:
        value = int(raw)
    except ValueError:
        raise ConfigurationError(f"environment variable {name} must be an integer") from None
    if not low <= value <= high:
        raise ConfigurationError(f"environment variable {name} must be between {low} and {high}")
    return value


def env_choice(env: Mapping[str, str], name: str, choices: tuple[str, ...]) -> str:
    value = env_str(env, name)
    if value not in choices:
        raise ConfigurationError(f"environment variable {name} must be one of {', '.join(choices)}")
    return value
