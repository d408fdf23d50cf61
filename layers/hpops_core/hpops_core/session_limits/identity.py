"""Pure identity resolution: the OS user Session Manager runs a session as, which is the POSIX
user the session counts against.

How Session Manager decides (AWS Systems Manager User Guide, "Turn on Run As support for Linux
and macOS managed nodes"):

1. Run As off in the account's Session Manager preferences (the ``SSM-SessionManagerRunShell``
   document's ``inputs.runAsEnabled`` false, or no such document: never configured): on an EC2
   managed node every shell runs as ``ssm-user``, but a session to a HyperPod cluster node
   "initially connects you as the root user" (HyperPod guide, "Accessing your SageMaker HyperPod
   cluster nodes"). Root is never limited, so with Run As off nobody can be: every session is
   left uncounted with :data:`RUN_AS_OFF_REASON`, and nothing is ended.
2. Run As on: the ``SSMSessionRunAs`` *session* tag (federated principals; it wins over the
   role's tag), else the ``SSMSessionRunAs`` tag on the IAM role or user, else
   ``runAsDefaultUser``. With none of them, or a tag naming a user SSM cannot use, SSM starts
   no session at all.

What we can see: the preferences (GetDocument) and role/user tags (ListRoleTags/ListUserTags).
Session tags are visible nowhere we look: ``DescribeSessions`` reports only the owner ARN, and
the CloudTrail record's ``userIdentity`` carries the ARN and a session context (issuing role,
creationDate, mfaAuthenticated, sourceIdentity), never the principal tags. So:

* Operator mapping rules stand in for the session tag, in its place: before the role's tag, and
  only for principals that can carry session tags (assumed-role sessions, federated users). An
  IAM user has no session tags, so its own tag or the default decides, as in SSM.
* A listed session that resolves to nobody (SSM would have refused it) can only exist through a
  session tag we cannot see. The unmapped policy decides: count it under the principal's
  session/user name (the best stand-in for that tag), or leave it uncounted.

``root`` is never a result: counting under root (what Run As off gives on HyperPod) would let one
misconfiguration throttle, and end the sessions of, unrelated people.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any, Literal

from hpops_core.common import validation

from .errors import SessionLimitError

RUN_AS_TAG = "SSMSessionRunAs"
PREFERENCES_DOCUMENT = "SSM-SessionManagerRunShell"
# What a HyperPod node runs a session as when Run As is off (on EC2 managed nodes it would be ssm-user).
RUN_AS_OFF_USER = "root"
RUN_AS_OFF_REASON = "Run As is off: sessions run as root, per-user limits cannot apply"

UnmappedPolicy = Literal["count-as-principal", "ignore"]
IdentitySource = Literal["run-as-off", "mapping", "tag", "default-user", "principal-name", "unmapped"]

# The one POSIX user rule (hpops_core/common/validation.py): a run-as user counted here can always be
# limited on the login nodes too.
POSIX_USER_RE = validation.POSIX_USER_RE
# Principal-name fallback keys only group sessions; they are not real accounts, so SSO-style
# names ("alice@example.com") are allowed.
PRINCIPAL_KEY_RE = re.compile(r"\A[A-Za-z0-9+=,.@_-]{1,64}\Z")

FORBIDDEN_USERS = validation.NEVER_LIMITED_USERS

_ARN_RE = re.compile(
    r"^arn:(?P<partition>aws[a-z-]*):(?P<service>iam|sts)::(?P<account>[0-9]{12}):(?P<resource>.+)$"
)


class InvalidIdentityConfig(SessionLimitError, ValueError):
    """Mapping rules or unmapped policy are unusable (e.g. a rule maps to ``root``)."""


class InvalidRunAsPreferences(SessionLimitError, ValueError):
    """The Session Manager preferences document cannot be read as Run As settings."""


@dataclass(frozen=True)
class RunAsPreferences:
    """What the account's Session Manager preferences say about Run As."""

    enabled: bool
    default_user: str | None = None
    note: str = ""  # where this came from, or what was ignored and why

    def describe(self) -> str:
        if not self.enabled:
            text = RUN_AS_OFF_REASON
        elif self.default_user:
            text = f"Run As is on, runAsDefaultUser {self.default_user}"
        else:
            text = "Run As is on, no runAsDefaultUser"
        return f"{text} ({self.note})" if self.note else text


def _flag(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise InvalidRunAsPreferences(f"{PREFERENCES_DOCUMENT}: inputs.runAsEnabled must be true or false")


def parse_run_as_preferences(content: str | None) -> RunAsPreferences:
    """Run As settings from the preferences document's content (JSON); None: the document does not exist."""
    if content is None:
        return RunAsPreferences(False, None, f"no {PREFERENCES_DOCUMENT} document: Session Manager's defaults")
    try:
        document = json.loads(content)
    except (TypeError, ValueError):
        raise InvalidRunAsPreferences(f"{PREFERENCES_DOCUMENT} is not a JSON document") from None
    inputs = document.get("inputs") if isinstance(document, dict) else None
    if inputs is None:
        inputs = {}
    if not isinstance(inputs, dict):
        raise InvalidRunAsPreferences(f"{PREFERENCES_DOCUMENT}: inputs must be an object")
    enabled = _flag(inputs.get("runAsEnabled", False))
    raw = inputs.get("runAsDefaultUser") or ""
    if not isinstance(raw, str):
        raise InvalidRunAsPreferences(f"{PREFERENCES_DOCUMENT}: inputs.runAsDefaultUser must be a string")
    default = raw.strip()
    if not enabled or not default:
        return RunAsPreferences(enabled, None)
    if not validation.is_limited_user(default):
        # SSM cannot start a session as such a user, so no session runs as it.
        return RunAsPreferences(True, None, f"runAsDefaultUser {validation.shown(default)} is not usable; ignored")
    return RunAsPreferences(True, default)


@dataclass(frozen=True)
class IdentityResolution:
    posix_user: str | None
    source: IdentitySource
    reason: str


@dataclass(frozen=True)
class IdentityConfig:
    """Operator configuration for :func:`resolve_posix_user` (validated on construction)."""

    mapping_rules: tuple[tuple[str, str], ...] = ()
    unmapped_policy: UnmappedPolicy = "count-as-principal"
    # False skips IAM tag lookups entirely (e.g. accounts where run-as comes only from
    # session tags, or when iam:ListRoleTags is not granted).
    lookup_tags: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "mapping_rules", validate_mapping_rules(self.mapping_rules))
        if self.unmapped_policy not in ("count-as-principal", "ignore"):
            raise InvalidIdentityConfig(f"unknown unmapped_policy {validation.shown(self.unmapped_policy)}")


def validate_mapping_rules(rules: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    checked = []
    for index, rule in enumerate(rules):
        try:
            pattern, user = rule
        except (TypeError, ValueError):
            raise InvalidIdentityConfig(f"mapping rule {index} must be (arn_glob, posix_user)") from None
        if not isinstance(pattern, str) or not pattern:
            raise InvalidIdentityConfig(f"mapping rule {index}: pattern must be a non-empty string")
        try:
            validation.check_limited_user(user, f"mapping rule {index} user")
        except validation.InvalidValue as exc:
            raise InvalidIdentityConfig(str(exc)) from None
        checked.append((pattern, user))
    return tuple(checked)


def _valid_posix_user(user: object) -> bool:
    return validation.is_limited_user(user)


@dataclass(frozen=True)
class _Principal:
    partition: str
    account: str
    kind: Literal["assumed-role", "user", "federated-user", "root", "role", "other"]
    name: str  # role name for roles, user name for users
    session_name: str | None = None


def _parse_principal(owner_arn: str) -> _Principal | None:
    match = _ARN_RE.match(owner_arn or "")
    if not match:
        return None
    partition, service, account, resource = match.group("partition", "service", "account", "resource")
    if resource == "root":
        return _Principal(partition, account, "root", "root")
    head, _, rest = resource.partition("/")
    if service == "sts" and head == "assumed-role":
        role, sep, session = rest.partition("/")
        if not role or not sep or not session:
            return None
        return _Principal(partition, account, "assumed-role", role, session_name=session)
    if service == "sts" and head == "federated-user" and rest:
        return _Principal(partition, account, "federated-user", rest)
    if service == "iam" and head == "user" and rest:
        # IAM user ARNs keep the path: user/division/bob -> name is the last segment.
        return _Principal(partition, account, "user", rest.rsplit("/", 1)[-1])
    if service == "iam" and head == "role" and rest:
        return _Principal(partition, account, "role", rest.rsplit("/", 1)[-1])
    return _Principal(partition, account, "other", resource)


def normalize_owner(owner_arn: str) -> str | None:
    """The IAM role/user ARN whose tags decide Run As, or None when there is none to look up.

    ``arn:aws:sts::111122223333:assumed-role/Researchers/alice`` ->
    ``arn:aws:iam::111122223333:role/Researchers``.

    STS ARNs drop the role *path*, so the returned role ARN is path-less and may differ from the
    role's real ARN. That is harmless for tags: ``ListRoleTags`` takes the role *name*, which is
    unique in an account regardless of path. IAM user ARNs are returned unchanged (they keep
    their path). Federated users and the account root have no taggable principal -> None.
    """
    principal = _parse_principal(owner_arn)
    if principal is None:
        return None
    if principal.kind == "assumed-role":
        return f"arn:{principal.partition}:iam::{principal.account}:role/{principal.name}"
    if principal.kind in ("user", "role"):
        return owner_arn
    return None


def principal_name(owner_arn: str) -> str | None:
    """The human-ish name in a principal ARN: role-session name, IAM user name, federated name."""
    principal = _parse_principal(owner_arn)
    if principal is None:
        return None
    if principal.kind == "assumed-role":
        return principal.session_name
    if principal.kind in ("user", "federated-user"):
        return principal.name
    return None


def may_carry_session_tags(owner_arn: str) -> bool:
    """Assumed-role sessions and federated users can carry session tags; IAM users and root cannot."""
    principal = _parse_principal(owner_arn)
    return principal is not None and principal.kind in ("assumed-role", "federated-user")


def _mapping_rule(owner_arn: str, rules: Iterable[tuple[str, str]]) -> tuple[str, str] | None:
    if not may_carry_session_tags(owner_arn):
        return None
    return next(((p, u) for p, u in rules if fnmatchcase(owner_arn, p)), None)


def needs_principal_tags(owner_arn: str, preferences: RunAsPreferences, config: IdentityConfig) -> bool:
    """Whether :func:`resolve_posix_user` would read the principal's tags (look them up only then)."""
    if not preferences.enabled or not config.lookup_tags:
        return False
    if _mapping_rule(owner_arn, config.mapping_rules) is not None:
        return False
    return normalize_owner(owner_arn) is not None


def resolve_posix_user(
    owner_arn: str,
    preferences: RunAsPreferences,
    principal_tags: Mapping[str, str] | None,
    mapping_rules: Iterable[tuple[str, str]] = (),
    unmapped_policy: UnmappedPolicy = "count-as-principal",
) -> IdentityResolution:
    """Decide which POSIX user a session of ``owner_arn`` runs as, in Session Manager's order.

    Pure; never ``root``: with Run As off a HyperPod session runs as root, so it resolves to
    nobody (source ``run-as-off``) and is never counted or ended.

    ``principal_tags`` are the tags of :func:`normalize_owner`'s ARN, or None when they were not
    (or could not be) looked up.
    """
    if unmapped_policy not in ("count-as-principal", "ignore"):
        raise InvalidIdentityConfig(f"unknown unmapped_policy {validation.shown(unmapped_policy)}")
    rules = validate_mapping_rules(mapping_rules)

    # 1. Run As off: SSM ignores every tag, and on a HyperPod node the shell is root's.
    if not preferences.enabled:
        return IdentityResolution(None, "run-as-off", preferences.describe())

    # 2. The session tag, which we cannot see: the operator's mapping rule stands in for it.
    rule = _mapping_rule(owner_arn, rules)
    if rule is not None:
        return IdentityResolution(
            rule[1], "mapping",
            f"owner matches mapping rule {rule[0]!r} (in place of an {RUN_AS_TAG} session tag, "
            "which Session Manager prefers to the role's tag)",
        )

    # 3. The IAM role's or user's tag. A tag SSM cannot use stops SSM there: no default applies.
    notes: list[str] = []
    tag_value = (principal_tags or {}).get(RUN_AS_TAG)
    if tag_value is not None:
        if _valid_posix_user(tag_value):
            return IdentityResolution(tag_value, "tag", f"{RUN_AS_TAG} tag on the principal is {tag_value!r}")
        notes.append(f"the principal's {RUN_AS_TAG} tag is not a usable user, so SSM starts no session with it")
    else:
        if principal_tags is None and normalize_owner(owner_arn) is not None:
            notes.append("the principal's tags were not looked up")
        # 4. The account's default run-as user.
        if preferences.default_user:
            prefix = "".join(f"{note}; " for note in notes)
            return IdentityResolution(
                preferences.default_user, "default-user",
                f"{prefix}no {RUN_AS_TAG} tag on the principal; runAsDefaultUser is {preferences.default_user!r}",
            )
        notes.append(f"no {RUN_AS_TAG} tag and no runAsDefaultUser, so SSM starts no session without a session tag")

    # 5. Nothing SSM could have used: the session exists through a session tag we cannot see.
    prefix = "; ".join(notes)
    if unmapped_policy == "ignore":
        return IdentityResolution(None, "unmapped", f"{prefix}; policy is 'ignore'")
    name = principal_name(owner_arn)
    if name is None or name in FORBIDDEN_USERS or not PRINCIPAL_KEY_RE.match(name):
        return IdentityResolution(None, "unmapped", f"{prefix}; no usable principal name to count under")
    return IdentityResolution(name, "principal-name", f"{prefix}; counted under principal name {name!r}")
