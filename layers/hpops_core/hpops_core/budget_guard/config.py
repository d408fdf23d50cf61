"""BudgetGuard configuration: one frozen dataclass per function, read from the environment at call time.

template.yaml sets these variables on the budget guard functions from the stack parameters
(section "budget guard"). A missing or malformed value is a deployment bug and
raises ConfigurationError naming the variable, so the failed execution says what to fix.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation

from hpops_core.common import validation
from hpops_core.budget_guard.budget_spec import DEFAULT_USER_TAG, _check_tag_key, _check_user
from hpops_core.budget_guard.prices import InvalidPriceTable, hourly_prices
from hpops_core.common.config import env_bool, env_str, environment
from hpops_core.common.errors import ConfigurationError

_AMOUNT = re.compile(r"\d{1,12}(\.\d{1,2})?")
_ACCOUNT = re.compile(r"\d{12}")



def _optional_amount(env: Mapping[str, str], name: str) -> Decimal | None:
    """"" means "not configured"; anything else must be a positive dollar amount."""
    raw = env.get(name, "").strip()
    if not raw:
        return None
    if not _AMOUNT.fullmatch(raw) or Decimal(raw) <= 0:
        raise ConfigurationError(f"environment variable {name} must be a positive dollar amount like 1500 or 1500.50")
    return Decimal(raw)


def _users(env: Mapping[str, str], name: str) -> tuple[str, ...]:
    raw = env.get(name, "").strip()
    users: list[str] = []
    for part in (p.strip() for p in raw.split(",")):
        if not part:
            continue
        try:
            user = _check_user(part, f"environment variable {name}")
        except ValueError as exc:  # InvalidPosixUser: names the entry, never echoes a long or odd one
            raise ConfigurationError(str(exc)) from None
        if user not in users:
            users.append(user)
    return tuple(users)


def _thresholds(env: Mapping[str, str], name: str) -> tuple[Decimal, ...]:
    raw = env_str(env, name)
    values: set[Decimal] = set()
    for part in raw.split(","):
        try:
            value = Decimal(part.strip())
        except InvalidOperation:
            raise ConfigurationError(f"environment variable {name} must be comma-separated percentages like 80,100") from None
        if not value.is_finite() or value <= 0 or value > 1000:
            raise ConfigurationError(f"environment variable {name}: {part.strip()} is not a percentage in (0, 1000]")
        values.add(value)
    return tuple(sorted(values))


def _account(env: Mapping[str, str]) -> str:
    account_id = env_str(env, "ACCOUNT_ID")
    if not _ACCOUNT.fullmatch(account_id):
        raise ConfigurationError("environment variable ACCOUNT_ID must be a 12-digit account id")
    return account_id


@dataclass(frozen=True)
class TriggerConfig:
    """ParseBudgetTrigger: which cluster this stack guards."""

    cluster_name: str

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> TriggerConfig:
        return cls(cluster_name=env_str(environment(env), "CLUSTER_NAME", validation.CLUSTER_NAME_RE))


@dataclass(frozen=True)
class EnsureBudgetsConfig:
    """EnsureBudgets: what budgets the cluster and its users get, and where they alert."""

    cluster_name: str
    cluster_arn: str
    account_id: str
    alert_topic_arn: str
    default_limit: Decimal | None
    users: tuple[str, ...]
    user_limit: Decimal | None
    user_tag_key: str
    delete_with_cluster: bool

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> EnsureBudgetsConfig:
        env = environment(env)
        user_tag_key = env.get("BUDGET_USER_TAG_KEY", "").strip() or DEFAULT_USER_TAG
        try:
            _check_tag_key(user_tag_key)
        except ValueError:
            raise ConfigurationError("environment variable BUDGET_USER_TAG_KEY is not a usable tag key") from None
        return cls(
            cluster_name=env_str(env, "CLUSTER_NAME", validation.CLUSTER_NAME_RE),
            cluster_arn=env_str(env, "CLUSTER_ARN", validation.CLUSTER_ARN_RE),
            account_id=_account(env),
            alert_topic_arn=env_str(env, "ALERT_TOPIC_ARN"),
            default_limit=_optional_amount(env, "MONTHLY_BUDGET_USD"),
            users=_users(env, "BUDGET_USERS"),
            user_limit=_optional_amount(env, "USER_MONTHLY_BUDGET_USD"),
            user_tag_key=user_tag_key,
            delete_with_cluster=env_bool(env, "DELETE_BUDGETS_WITH_CLUSTER"),
        )


@dataclass(frozen=True)
class ProjectionConfig:
    """ProjectSpend / RememberClusterState: prices, thresholds, and the state table."""

    cluster_name: str
    state_table: str
    thresholds: tuple[Decimal, ...]
    hourly_prices: Mapping[str, Decimal] = field(repr=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ProjectionConfig:
        env = environment(env)
        try:
            prices = hourly_prices(env.get("HOURLY_PRICES_JSON", ""))
        except InvalidPriceTable as error:
            raise ConfigurationError(f"environment variable HOURLY_PRICES_JSON: {error}") from None
        return cls(
            cluster_name=env_str(env, "CLUSTER_NAME"),
            state_table=env_str(env, "STATE_TABLE_NAME"),
            thresholds=_thresholds(env, "PROJECTION_THRESHOLDS_PERCENT"),
            hourly_prices=prices,
        )


@dataclass(frozen=True)
class AlertConfig:
    """PublishAlert: where a projected-overrun alert goes."""

    cluster_name: str
    cluster_arn: str
    alert_topic_arn: str
    event_bus: str

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> AlertConfig:
        env = environment(env)
        return cls(
            cluster_name=env_str(env, "CLUSTER_NAME"),
            cluster_arn=env_str(env, "CLUSTER_ARN"),
            alert_topic_arn=env_str(env, "ALERT_TOPIC_ARN"),
            event_bus=env.get("ALERT_EVENT_BUS", "").strip() or "default",
        )
