"""The one configuration loader: each function has a frozen dataclass whose from_env() reads the
environment at call time (never at import) with these helpers; a missing or malformed variable is
named in a ConfigurationError, its value never echoed."""

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


def env_bool(env: Mapping[str, str], name: str, default: bool = False) -> bool:
    """The one boolean parser: the template passes "true"/"false" (any case); unset means `default`."""
    raw = env.get(name, "").strip().lower()
    if not raw:
        return default
    if raw not in ("true", "false"):
        raise ConfigurationError(f"environment variable {name} must be true or false")
    return raw == "true"


def environment(env: Mapping[str, str] | None) -> Mapping[str, str]:
    """`env` if given (tests), else the process environment, read now: never cached at import."""
    return os.environ if env is None else env
