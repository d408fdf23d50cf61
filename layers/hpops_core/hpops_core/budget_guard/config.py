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
from hpops_core.budget_guard.holds import ACTIONS, HoldPolicy
from hpops_core.budget_guard.rate_overrides import InvalidRateOverrides, rate_overrides
from hpops_core.budget_guard.user_spend import UserLimits
from hpops_core.common.config import env_bool, env_str, environment
from hpops_core.common.errors import ConfigurationError

_AMOUNT = re.compile(r"\d{1,12}(\.\d{1,2})?")
_ACCOUNT = re.compile(r"\d{12}")
# The Price List is asked for this region's prices (Lambda sets AWS_REGION to the stack's region).
_REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d{1,2}$")



def _optional_amount(env: Mapping[str, str], name: str) -> Decimal | None:
    """"" means "not configured"; anything else must be a positive dollar amount."""
    raw = env.get(name, "").strip()
    if not raw:
        return None
    if not _AMOUNT.fullmatch(raw) or Decimal(raw) <= 0:
        raise ConfigurationError(f"environment variable {name} must be a positive dollar amount like 1500 or 1500.50")
    return Decimal(raw)


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
    """EnsureBudgets: the cluster's budget and where it alerts."""

    cluster_name: str
    cluster_arn: str
    account_id: str
    alert_topic_arn: str
    default_limit: Decimal | None
    delete_with_cluster: bool

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> EnsureBudgetsConfig:
        env = environment(env)
        return cls(
            cluster_name=env_str(env, "CLUSTER_NAME", validation.CLUSTER_NAME_RE),
            cluster_arn=env_str(env, "CLUSTER_ARN", validation.CLUSTER_ARN_RE),
            account_id=_account(env),
            alert_topic_arn=env_str(env, "ALERT_TOPIC_ARN"),
            default_limit=_optional_amount(env, "MONTHLY_BUDGET_USD"),
            delete_with_cluster=env_bool(env, "DELETE_BUDGETS_WITH_CLUSTER"),
        )


@dataclass(frozen=True)
class ProjectionConfig:
    """ProjectSpend / RememberClusterState: thresholds, the state table, the region whose list
    prices apply, and the operator's last-resort rates (RATE_OVERRIDES_JSON)."""

    cluster_name: str
    state_table: str
    thresholds: tuple[Decimal, ...]
    region: str
    rate_overrides: Mapping[str, Decimal] = field(repr=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ProjectionConfig:
        env = environment(env)
        try:
            overrides = rate_overrides(env.get("RATE_OVERRIDES_JSON", ""))
        except InvalidRateOverrides as error:
            raise ConfigurationError(f"environment variable RATE_OVERRIDES_JSON: {error}") from None
        return cls(
            cluster_name=env_str(env, "CLUSTER_NAME"),
            state_table=env_str(env, "STATE_TABLE_NAME"),
            thresholds=_thresholds(env, "PROJECTION_THRESHOLDS_PERCENT"),
            region=env_str(env, "AWS_REGION", _REGION),
            rate_overrides=overrides,
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


# ------------------------------------------------------------------ per-user spend (Slurm accounting)


def _user_overrides(env: Mapping[str, str], name: str) -> dict[str, Decimal]:
    """"alice=500,bob=2000.50": a monthly limit per POSIX user, over the default."""
    overrides: dict[str, Decimal] = {}
    for part in (p.strip() for p in env.get(name, "").split(",")):
        if not part:
            continue
        user, separator, amount = part.partition("=")
        if not separator or not validation.is_posix_user(user.strip()) or not _AMOUNT.fullmatch(amount.strip()):
            raise ConfigurationError(f"environment variable {name}: entry {validation.shown(part)} is not user=USD "
                                     "(e.g. alice=500)")
        overrides[user.strip()] = Decimal(amount.strip())
    return overrides


@dataclass(frozen=True)
class UsageReportConfig:
    """RecordUsageReport: whose reports count (the controller group's node), where they are kept, and
    (holds on) which machine a kept report starts (BUDGET_GUARD_STATE_MACHINE_ARN)."""

    cluster_name: str
    controller_group: str
    state_table: str
    hold_action: str = "alert"
    budget_state_machine_arn: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> UsageReportConfig:
        env = environment(env)
        action = _hold_policy(env).action
        return cls(
            cluster_name=env_str(env, "CLUSTER_NAME", validation.CLUSTER_NAME_RE),
            controller_group=env_str(env, "CONTROLLER_GROUP_NAME", validation.INSTANCE_GROUP_RE),
            state_table=env_str(env, "STATE_TABLE_NAME"),
            hold_action=action,
            budget_state_machine_arn=env_str(env, "BUDGET_GUARD_STATE_MACHINE_ARN", validation.STATE_MACHINE_ARN_RE)
            if action == "hold" else None,
        )


@dataclass(frozen=True)
class UserSpendConfig:
    """CheckUserSpend (and `hpops cost`): limits, thresholds, and what rates need."""

    cluster_name: str
    state_table: str
    thresholds: tuple[Decimal, ...]
    region: str
    limits: UserLimits
    rate_overrides: Mapping[str, Decimal] = field(repr=False)
    hold_policy: HoldPolicy = HoldPolicy()
    stack_name: str = "S"
    ce_max_age_hours: int = 24  # how old a kept Cost Explorer answer may be (ce_cache)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> UserSpendConfig:
        env = environment(env)
        projection = ProjectionConfig.from_env(env)
        return cls(
            cluster_name=projection.cluster_name,
            state_table=projection.state_table,
            thresholds=_thresholds(env, "USER_THRESHOLDS_PERCENT"),
            region=projection.region,
            limits=UserLimits(_optional_amount(env, "USER_MONTHLY_BUDGET_USD"),
                              _user_overrides(env, "USER_BUDGET_OVERRIDES")),
            rate_overrides=projection.rate_overrides,
            hold_policy=_hold_policy(env),
            stack_name=env.get("STACK_NAME", "").strip() or "S",
            ce_max_age_hours=_max_age_hours(env),
        )


def _max_age_hours(env: Mapping[str, str]) -> int:
    """COST_EXPLORER_MAX_AGE_HOURS, 1-24; unset (a function deployed before the cache): 24."""
    raw = env.get("COST_EXPLORER_MAX_AGE_HOURS", "").strip() or "24"
    if not raw.isdigit() or not 1 <= int(raw) <= 24:
        raise ConfigurationError("environment variable COST_EXPLORER_MAX_AGE_HOURS must be a whole number of hours "
                                 "from 1 to 24")
    return int(raw)


def _hold_policy(env: Mapping[str, str]) -> HoldPolicy:
    """UserBudgetAction, UserBudgetHoldDryRun, UserBudgetExemptUsers; unset: alerts only, as before holds."""
    action = env.get("USER_BUDGET_ACTION", "").strip() or "alert"
    if action not in ACTIONS:
        raise ConfigurationError(f"environment variable USER_BUDGET_ACTION must be one of {', '.join(ACTIONS)}")
    exempt = set()
    for user in (u.strip() for u in env.get("USER_BUDGET_EXEMPT_USERS", "").split(",")):
        if user and not validation.is_posix_user(user):
            raise ConfigurationError(f"environment variable USER_BUDGET_EXEMPT_USERS: {validation.shown(user)} "
                                     "is not a POSIX user name")
        if user:
            exempt.add(user)
    return HoldPolicy(action, env_bool(env, "USER_BUDGET_HOLD_DRY_RUN"), frozenset(exempt))


@dataclass(frozen=True)
class UserAlertConfig:
    """SendUserAlerts: the platform team's topic, the topic users subscribe to (filtered by user), and
    where the queued alerts wait (the state table, under the cluster's budget items)."""

    alert_topic_arn: str
    user_topic_arn: str
    cluster_name: str
    state_table: str

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> UserAlertConfig:
        env = environment(env)
        return cls(alert_topic_arn=env_str(env, "ALERT_TOPIC_ARN"), user_topic_arn=env_str(env, "USER_ALERT_TOPIC_ARN"),
                   cluster_name=env_str(env, "CLUSTER_NAME", validation.CLUSTER_NAME_RE),
                   state_table=env_str(env, "STATE_TABLE_NAME"))
