"""Pure identity resolution: AWS principal (session ``Owner``) -> POSIX user the session runs as.

Session Manager's "Run As" picks the OS user from the ``SSMSessionRunAs`` tag of the calling
IAM user or role (or a session tag for federated users), else the account's default run-as
user. We mirror that order, with operator mapping rules standing in for what we cannot see:

1. ``SSMSessionRunAs`` tag on the principal (IAM role/user tags; looked up by the caller).
2. First matching mapping rule (fnmatch-style glob over the *owner ARN*).
3. The unmapped policy: count under the principal's own name, or ignore (never terminated).

Limitations, stated so nobody relies on more:

* Session tags (typical for SSO/federation) are not visible on the role, so a federated
  user's run-as tag can only be reproduced through mapping rules.
* ``root`` is never a result: SSM refuses run-as root, and counting sessions under ``root``
  would let one misconfiguration throttle unrelated people.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Literal

from hpops_core.node_channel.login_limits import USER_RE

from .models import SessionLimitError

RUN_AS_TAG = "SSMSessionRunAs"

UnmappedPolicy = Literal["count-as-principal", "ignore"]
IdentitySource = Literal["tag", "mapping", "principal-name", "unmapped"]

# The one POSIX user rule, the same the login nodes apply to maxlogins entries: a run-as user
# counted here can always be limited there too.
POSIX_USER_RE = USER_RE
# Principal-name fallback keys only group sessions; they are not real accounts, so SSO-style
# names ("alice@example.com") are allowed.
PRINCIPAL_KEY_RE = re.compile(r"^[A-Za-z0-9+=,.@_-]{1,64}$")

FORBIDDEN_USERS = frozenset({"root"})

_ARN_RE = re.compile(
    r"^arn:(?P<partition>aws[a-z-]*):(?P<service>iam|sts)::(?P<account>[0-9]{12}):(?P<resource>.+)$"
)


class InvalidIdentityConfig(SessionLimitError, ValueError):
    """Mapping rules or unmapped policy are unusable (e.g. a rule maps to ``root``)."""


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
            raise InvalidIdentityConfig(f"unknown unmapped_policy {self.unmapped_policy!r}")


def validate_mapping_rules(rules: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    checked = []
    for rule in rules:
        try:
            pattern, user = rule
        except (TypeError, ValueError):
            raise InvalidIdentityConfig(f"mapping rule must be (arn_glob, posix_user): {rule!r}") from None
        if not isinstance(pattern, str) or not pattern:
            raise InvalidIdentityConfig(f"mapping rule pattern must be a non-empty string: {rule!r}")
        if not _valid_posix_user(user):
            raise InvalidIdentityConfig(f"mapping rule maps to an unusable POSIX user: {user!r}")
        checked.append((pattern, user))
    return tuple(checked)


def _valid_posix_user(user: object) -> bool:
    return isinstance(user, str) and bool(POSIX_USER_RE.match(user)) and user not in FORBIDDEN_USERS


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


def resolve_posix_user(
    owner_arn: str,
    principal_tags: Mapping[str, str] | None,
    mapping_rules: Iterable[tuple[str, str]],
    unmapped_policy: UnmappedPolicy = "count-as-principal",
) -> IdentityResolution:
    """Decide which POSIX user a session of ``owner_arn`` counts against. Pure; never ``root``.

    ``principal_tags`` are the tags of :func:`normalize_owner`'s ARN, or None when they were not
    (or could not be) looked up.
    """
    if unmapped_policy not in ("count-as-principal", "ignore"):
        raise InvalidIdentityConfig(f"unknown unmapped_policy {unmapped_policy!r}")
    notes: list[str] = []

    tag_value = (principal_tags or {}).get(RUN_AS_TAG)
    if tag_value is not None:
        if _valid_posix_user(tag_value):
            return IdentityResolution(tag_value, "tag", f"{RUN_AS_TAG} tag on the principal is {tag_value!r}")
        # SSM itself rejects such a value (root, empty, odd characters), so the tag cannot be what
        # the session runs as; fall through rather than count under a bogus name.
        notes.append(f"ignored unusable {RUN_AS_TAG} tag value")

    prefix = "".join(f"{note}; " for note in notes)
    for pattern, user in validate_mapping_rules(mapping_rules):
        if fnmatchcase(owner_arn, pattern):
            return IdentityResolution(user, "mapping", f"{prefix}owner matches mapping rule {pattern!r}")

    if unmapped_policy == "ignore":
        return IdentityResolution(None, "unmapped", f"{prefix}no run-as tag or mapping rule; policy is 'ignore'")

    name = principal_name(owner_arn)
    if name is None or name in FORBIDDEN_USERS or not PRINCIPAL_KEY_RE.match(name):
        return IdentityResolution(
            None, "unmapped", f"{prefix}no run-as tag or mapping rule and no usable principal name to count under"
        )
    return IdentityResolution(
        name, "principal-name", f"{prefix}no run-as tag or mapping rule; counted under principal name {name!r}"
    )
