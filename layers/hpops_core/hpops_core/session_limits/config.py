"""Session-limit configuration: frozen dataclasses read from the environment at call time.

template.yaml sets these variables from the stack parameters (section "session limits").
Anything missing or malformed raises :class:`~hpops_core.common.errors.ConfigurationError` naming the
variable, so a bad deployment fails loudly (named Step Functions error, alarm) instead of
enforcing a limit nobody meant.

    CLUSTER_NAME, CLUSTER_ID, LOGIN_GROUP_NAME    which login nodes (CLUSTER_ID: last segment of the ARN)
    MAX_SESSIONS_PER_USER                         default limit, >= 1
    SESSION_LIMIT_OVERRIDES                       JSON object {"posix-user": limit >= 0} (never root)
    SESSION_EXEMPT_USERS                          comma-separated POSIX users with no limit
                                                  (user names: hpops_core/common/validation.py, refused naming the entry)
    SESSION_EXEMPT_PRINCIPALS                     comma-separated globs over the owner ARN
    SESSION_OWNER_MAPPINGS                        JSON array of {"pattern": "<ARN glob>", "user": "<posix>"}
                                                  (or ["<ARN glob>", "<posix>"]), first match wins; they stand
                                                  in for SSMSessionRunAs session tags (see identity.py)
    UNMAPPED_SESSION_POLICY                       count-as-principal | ignore
    SESSION_EXCESS_POLICY                         newest | oldest
    SESSION_LIMITS_DRY_RUN                        true | false (any case; unset: false)
    ALERT_TOPIC_ARN, STATE_TABLE_NAME             where notifications and ended-session records go
    SESSION_TAG_CACHE_SECONDS                     optional, default 300: how long run-as tags are trusted
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hpops_core.common import validation
from hpops_core.common.config import env_bool, env_choice, env_int, env_str, environment
from hpops_core.common.errors import ConfigurationError

from .identity import IdentityConfig, InvalidIdentityConfig
from .policy import InvalidPolicy, LimitPolicy

_TOPIC_ARN_RE = re.compile(r"^arn:aws[a-z-]*:sns:[a-z0-9-]+:[0-9]{12}:[A-Za-z0-9_-]{1,256}(\.fifo)?$")


def _csv(env: Mapping[str, str], name: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in env.get(name, "").split(",") if part.strip())


def _users(env: Mapping[str, str], name: str) -> tuple[str, ...]:
    users = _csv(env, name)
    for user in users:
        try:
            validation.check_posix_user(user, f"environment variable {name}")
        except validation.InvalidValue as exc:
            raise ConfigurationError(str(exc)) from None
    return users


def _json(env: Mapping[str, str], name: str, default: str) -> Any:
    raw = env.get(name, "").strip() or default
    try:
        return json.loads(raw)
    except ValueError:
        raise ConfigurationError(f"environment variable {name} is not valid JSON") from None


def _overrides(env: Mapping[str, str]) -> dict[str, int]:
    name = "SESSION_LIMIT_OVERRIDES"
    value = _json(env, name, "{}")
    if not isinstance(value, dict):
        raise ConfigurationError(f"environment variable {name} must be a JSON object of user -> limit")
    for user, limit in value.items():
        # Refused here, at parse time, naming the entry: a limit for a name no session can run as
        # (or for root, which is never counted) would silently never apply.
        try:
            validation.check_limited_user(user, f"environment variable {name}")
        except validation.InvalidValue as exc:
            raise ConfigurationError(str(exc)) from None
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise ConfigurationError(f"environment variable {name}: limit for {user!r} must be an integer")
    return value


def _mappings(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    name = "SESSION_OWNER_MAPPINGS"
    value = _json(env, name, "[]")
    if not isinstance(value, list):
        raise ConfigurationError(f"environment variable {name} must be a JSON array of mapping rules")
    rules = []
    for index, rule in enumerate(value):
        if isinstance(rule, dict) and set(rule) == {"pattern", "user"}:
            rules.append((rule["pattern"], rule["user"]))
        elif isinstance(rule, list) and len(rule) == 2:
            rules.append((rule[0], rule[1]))
        else:
            raise ConfigurationError(
                f"environment variable {name}: rule {index} must be {{\"pattern\": ..., \"user\": ...}}"
            )
    return tuple(rules)


def _policy(env: Mapping[str, str]) -> LimitPolicy:
    try:
        return LimitPolicy(
            default_max=env_int(env, "MAX_SESSIONS_PER_USER", 1, 10_000),
            overrides=_overrides(env),
            exempt_users=frozenset(_users(env, "SESSION_EXEMPT_USERS")),
            exempt_principal_patterns=_csv(env, "SESSION_EXEMPT_PRINCIPALS"),
            excess=env_choice(env, "SESSION_EXCESS_POLICY", ("newest", "oldest")),  # type: ignore[arg-type]
        )
    except InvalidPolicy as exc:
        raise ConfigurationError(f"session limit policy: {exc}") from None


@dataclass(frozen=True)
class SessionTriggerConfig:
    """What ParseSessionTrigger needs: which cluster and login group this stack guards."""

    cluster_name: str
    cluster_id: str
    login_group: str
    dry_run: bool

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> SessionTriggerConfig:
        env = environment(env)
        return cls(
            cluster_name=env_str(env, "CLUSTER_NAME", validation.CLUSTER_NAME_RE),
            cluster_id=env_str(env, "CLUSTER_ID", validation.CLUSTER_ID_RE),
            login_group=env_str(env, "LOGIN_GROUP_NAME", validation.INSTANCE_GROUP_RE),
            dry_run=env_bool(env, "SESSION_LIMITS_DRY_RUN"),
        )


@dataclass(frozen=True)
class SessionLimitsConfig:
    """Everything EnforceSessionLimits needs. ``policy`` and ``identity`` are validated on read."""

    cluster_name: str
    cluster_id: str
    login_group: str
    policy: LimitPolicy
    identity: IdentityConfig
    dry_run: bool
    topic_arn: str
    state_table: str
    tag_cache_seconds: int

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> SessionLimitsConfig:
        env = environment(env)
        trigger = SessionTriggerConfig.from_env(env)
        policy = _policy(env)
        try:
            identity = IdentityConfig(
                mapping_rules=_mappings(env),
                unmapped_policy=env_choice(env, "UNMAPPED_SESSION_POLICY", ("count-as-principal", "ignore")),  # type: ignore[arg-type]
            )
        except InvalidIdentityConfig as exc:
            raise ConfigurationError(f"SESSION_OWNER_MAPPINGS / UNMAPPED_SESSION_POLICY: {exc}") from None
        return cls(
            cluster_name=trigger.cluster_name,
            cluster_id=trigger.cluster_id,
            login_group=trigger.login_group,
            policy=policy,
            identity=identity,
            dry_run=trigger.dry_run,
            topic_arn=env_str(env, "ALERT_TOPIC_ARN", _TOPIC_ARN_RE),
            state_table=env_str(env, "STATE_TABLE_NAME"),
            tag_cache_seconds=env_int(env, "SESSION_TAG_CACHE_SECONDS", 0, 3600, default=300),
        )


@dataclass(frozen=True)
class ReportCheckConfig:
    """What CheckReportedSessions needs: the same limits as enforcement, and which machine to start.

        SESSION_LIMITS_STATE_MACHINE_ARN    the SessionLimits state machine
    """

    cluster_name: str
    policy: LimitPolicy
    state_table: str
    state_machine_arn: str

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ReportCheckConfig:
        env = environment(env)
        return cls(cluster_name=env_str(env, "CLUSTER_NAME", validation.CLUSTER_NAME_RE), policy=_policy(env),
                   state_table=env_str(env, "STATE_TABLE_NAME"),
                   state_machine_arn=env_str(env, "SESSION_LIMITS_STATE_MACHINE_ARN", validation.STATE_MACHINE_ARN_RE))


@dataclass(frozen=True)
class LoginLimitsConfig:
    """What PublishLoginLimits needs: the same limits as enforcement, in the nodes' own format.

    The limits are validated here with the rule the node agent applies
    (hpops_core.node_channel.login_limits), so a user name or limit a node would refuse fails
    with ConfigurationError naming the variable and the entry, before anything is published.
    """

    cluster_name: str
    login_group: str
    limits: dict
    state_table: str
    dry_run: bool
    user_caps: dict | None = None  # per-user CPU/memory/task caps (node_channel/user_caps.py); None: off

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> LoginLimitsConfig:
        from hpops_core.node_channel.login_limits import BadInput, parse_limits

        env = environment(env)
        trigger = SessionTriggerConfig.from_env(env)
        wanted = {
            "default": env_int(env, "MAX_SESSIONS_PER_USER", 1, 10_000),
            "overrides": _overrides(env),
            "exempt": list(_users(env, "SESSION_EXEMPT_USERS")),
        }
        try:
            limits = parse_limits(json.dumps(wanted))
        except BadInput as exc:
            source = _LIMITS_SOURCES.get(exc.field, "the session limit variables")
            raise ConfigurationError(f"login node limits: {source}: {exc}") from None
        document_text(limits)  # ConfigurationError when it would not fit a standard (4 KB) parameter
        return cls(
            cluster_name=trigger.cluster_name,
            login_group=trigger.login_group,
            limits=limits,
            state_table=env_str(env, "STATE_TABLE_NAME"),
            dry_run=trigger.dry_run,
            user_caps=_user_caps(env),
        )


def _user_caps(env: Mapping[str, str]) -> dict | None:
    from hpops_core.node_channel.user_caps import BadCaps, parse_caps

    raw = (env.get("USER_CAPS") or "").strip()
    if not raw:
        return None
    try:
        return parse_caps(json.loads(raw))
    except ValueError as exc:  # JSONDecodeError and BadCaps
        raise ConfigurationError(f"USER_CAPS: {exc if isinstance(exc, BadCaps) else 'not JSON'}") from None


_LIMITS_SOURCES = {"default": "MAX_SESSIONS_PER_USER", "overrides": "SESSION_LIMIT_OVERRIDES",
                   "exempt": "SESSION_EXEMPT_USERS"}


def document_text(limits: dict) -> str:
    """The parameter value for these limits; ConfigurationError when it would not fit the standard tier."""
    from hpops_core.node_channel.desired_state import MAX_STANDARD_PARAMETER_BYTES
    from hpops_core.node_channel.login_limits import canonical_json, desired_document

    text = canonical_json(desired_document(limits))
    if len(text.encode()) > MAX_STANDARD_PARAMETER_BYTES:
        raise ConfigurationError(
            f"login node limits: the published document would be {len(text.encode())} bytes, over the "
            f"{MAX_STANDARD_PARAMETER_BYTES} a standard SSM parameter holds; use fewer entries in "
            "SESSION_LIMIT_OVERRIDES / SESSION_EXEMPT_USERS")
    return text
