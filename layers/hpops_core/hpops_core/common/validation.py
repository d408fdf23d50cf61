"""The rules for the names and ids hpops handles, each written once (standard library, Python 3.8+).

Lambda code, the node agent (the lifecycle bundle ships this file) and the template's
AllowedPatterns (tests/unit/test_validation_rules.py checks they agree) all use these rules:

  POSIX user       letters, digits, '_', '.', '-'; at most 32; not starting with '-' or '.';
                   optionally `@domain` (DNS labels), as SSSD/realmd name directory users
                   (accepts `j.doe`, `Alice`, `alice@example.edu`; a name that is counted or
                   limited is never `root`)
  cluster name     HyperPod's ClusterName: ^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$
  instance group   SageMaker's ClusterInstanceGroupName: the same shape
  cluster id       the last segment of a cluster ARN (what SSM targets name)
  instance id      strict: botocore's ClusterNodeId, for API calls and SSM targets;
                   event: what AWS documents in events (its own example `i-12345678abcdefghi` is not hex)
  SSM session id   an IAM user, role-session or federated name plus a hex suffix: [A-Za-z0-9+=,.@_-]{1,96}
                   (botocore allows any 1-96 characters; a real id never has more than these)
  Step Functions   state machine and execution ARNs (the lease holder is an execution ARN)

Each rule comes as a pattern (for pydantic and for composing, e.g. SSM targets), an `is_*`
predicate, and a `check_*` that returns the value or raises InvalidValue with a message naming
the entry without echoing long or unprintable values.
"""

from __future__ import annotations

import re
from typing import Any

from hpops_core.common.errors import HpopsError

_LOCAL_USER_PATTERN = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}"
_DOMAIN_LABEL_PATTERN = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
# `user@domain`: SSSD's default full_name_format for fully-qualified names (realmd turns them on
# when it joins Active Directory). The domain is DNS labels only, so no '..', no '/', no leading '-'.
POSIX_USER_PATTERN = r"{0}(?:@{1}(?:\.{1}){{0,5}})?".format(_LOCAL_USER_PATTERN, _DOMAIN_LABEL_PATTERN)
# Wider than Debian's default NAME_REGEX because real systems have more (useradd --badname,
# LDAP/SSSD users such as `j.doe` or `alice@example.edu`, upper case), but names are written into
# a limits.d file, sacctmgr arguments and budget names: no whitespace, ':', '/', '*', '\\' or shell
# syntax; no leading '-' or '.' (options, hidden files); one '@' at most, never first (pam_limits
# reads a leading '@' as a group). 32 for the part before '@': the utmp limit; a domain has at
# most 6 labels of at most 63.
POSIX_USER_RULE = ("letters, digits, '_', '.', '-', at most 32, not starting with '-' or '.', "
                   "optionally @ and a DNS domain")
# SSM never runs a session as root, and pam_limits' maxlogins does not apply to uid 0: a limit
# or count under root would only ever hit unrelated people.
NEVER_LIMITED_USERS = frozenset({"root"})

HYPERPOD_NAME_PATTERN = r"[a-zA-Z0-9](?:-*[a-zA-Z0-9]){0,62}"
CLUSTER_NAME_PATTERN = HYPERPOD_NAME_PATTERN
INSTANCE_GROUP_PATTERN = HYPERPOD_NAME_PATTERN
# HyperPod cluster ids are 12 lowercase alphanumerics; a little more is accepted so twins with
# other lengths work, never a separator ('_' splits SSM targets).
CLUSTER_ID_PATTERN = r"[a-z0-9]{1,64}"
CLUSTER_ARN_PATTERN = r"arn:aws[a-z-]*:sagemaker:[a-z0-9-]+:[0-9]{12}:cluster/[a-zA-Z0-9-]{1,63}"
INSTANCE_ID_PATTERN = r"i-[a-f0-9]{8}(?:[a-f0-9]{9})?"
EVENT_INSTANCE_ID_PATTERN = r"i-[A-Za-z0-9]{8,32}"
# botocore allows any 1-96 characters, but a real session id is the caller's IAM user, role-session
# or federated name ([\w+=,.@-], IAM's own rule for those names) followed by '-' and hex. Anything
# else (shell characters, bidi overrides that spoof an alert's text) is not a session SSM started.
SESSION_ID_PATTERN = r"[A-Za-z0-9+=,.@_-]{1,96}"
# Step Functions names: 1-80 of letters, digits, '-' and '_' (what our machines and executions use).
STATE_MACHINE_ARN_PATTERN = r"arn:aws[a-z-]*:states:[a-z0-9-]+:[0-9]{12}:stateMachine:[A-Za-z0-9_-]{1,80}"
EXECUTION_ARN_PATTERN = r"arn:aws[a-z-]*:states:[a-z0-9-]+:[0-9]{12}:execution:[A-Za-z0-9_-]{1,80}:[A-Za-z0-9_-]{1,80}"


def anchored(pattern: str) -> str:
    """For pydantic (Rust regex): `$` there is the end of the text, unlike Python's `$`."""
    return "^(?:{})$".format(pattern)


def _compiled(pattern: str) -> "re.Pattern[str]":
    # \A...\Z: safe with .match as well as .fullmatch (Python's `$` also matches before a final "\n").
    return re.compile(r"\A(?:{})\Z".format(pattern))


POSIX_USER_RE = _compiled(POSIX_USER_PATTERN)
CLUSTER_NAME_RE = _compiled(CLUSTER_NAME_PATTERN)
INSTANCE_GROUP_RE = _compiled(INSTANCE_GROUP_PATTERN)
CLUSTER_ID_RE = _compiled(CLUSTER_ID_PATTERN)
CLUSTER_ARN_RE = _compiled(CLUSTER_ARN_PATTERN)
INSTANCE_ID_RE = _compiled(INSTANCE_ID_PATTERN)
EVENT_INSTANCE_ID_RE = _compiled(EVENT_INSTANCE_ID_PATTERN)
SESSION_ID_RE = _compiled(SESSION_ID_PATTERN)
STATE_MACHINE_ARN_RE = _compiled(STATE_MACHINE_ARN_PATTERN)
EXECUTION_ARN_RE = _compiled(EXECUTION_ARN_PATTERN)

MAX_SHOWN = 40


class InvalidValue(HpopsError, ValueError):
    """A value broke one of these rules; the message names the entry, never a long or unprintable value."""


def shown(value: Any) -> str:
    """A value as it may appear in a message: short text as its repr (newlines and escape sequences
    come out as harmless backslash escapes), anything longer or not text only described."""
    if isinstance(value, str):
        if len(value) <= MAX_SHOWN:
            return repr(value)
        return "a {}-character value".format(len(value))
    return "a value of type {}".format(type(value).__name__)


def _matches(regex: "re.Pattern[str]", value: Any) -> bool:
    return isinstance(value, str) and regex.match(value) is not None


def is_posix_user(value: Any) -> bool:
    return _matches(POSIX_USER_RE, value)


def is_limited_user(value: Any) -> bool:
    """A POSIX user a session count or a limit can apply to (never root)."""
    return is_posix_user(value) and value not in NEVER_LIMITED_USERS


def is_cluster_name(value: Any) -> bool:
    return _matches(CLUSTER_NAME_RE, value)


def is_instance_group(value: Any) -> bool:
    return _matches(INSTANCE_GROUP_RE, value)


def is_cluster_id(value: Any) -> bool:
    return _matches(CLUSTER_ID_RE, value)


def is_cluster_arn(value: Any) -> bool:
    return _matches(CLUSTER_ARN_RE, value)


def is_instance_id(value: Any) -> bool:
    """Strict (botocore's ClusterNodeId): for ids passed to AWS APIs and read from SSM targets."""
    return _matches(INSTANCE_ID_RE, value)


def is_event_instance_id(value: Any) -> bool:
    """Lenient: the shape AWS documents in events and parameter names; safe in logs and paths."""
    return _matches(EVENT_INSTANCE_ID_RE, value)


def is_state_machine_arn(value: Any) -> bool:
    return _matches(STATE_MACHINE_ARN_RE, value)


def is_execution_arn(value: Any) -> bool:
    return _matches(EXECUTION_ARN_RE, value)


def is_session_id(value: Any) -> bool:
    return _matches(SESSION_ID_RE, value)


def _check(ok: bool, value: Any, what: str, rule: str) -> Any:
    if not ok:
        raise InvalidValue("{}: {} is not {}".format(what, shown(value), rule))
    return value


def check_posix_user(value: Any, what: str = "user") -> str:
    return _check(is_posix_user(value), value, what, "a valid user name ({})".format(POSIX_USER_RULE))


def check_limited_user(value: Any, what: str = "user") -> str:
    check_posix_user(value, what)
    if value in NEVER_LIMITED_USERS:
        raise InvalidValue("{}: {} is never counted or limited".format(what, shown(value)))
    return value


def check_cluster_name(value: Any, what: str = "cluster name") -> str:
    return _check(is_cluster_name(value), value, what, "a HyperPod cluster name")


def check_instance_group(value: Any, what: str = "instance group") -> str:
    return _check(is_instance_group(value), value, what, "an instance group name")


def check_cluster_id(value: Any, what: str = "cluster id") -> str:
    return _check(is_cluster_id(value), value, what, "a HyperPod cluster id")


def check_cluster_arn(value: Any, what: str = "cluster ARN") -> str:
    return _check(is_cluster_arn(value), value, what, "a HyperPod cluster ARN")


def check_instance_id(value: Any, what: str = "instance id") -> str:
    return _check(is_instance_id(value), value, what, "an EC2 instance id")


def check_event_instance_id(value: Any, what: str = "instance id") -> str:
    return _check(is_event_instance_id(value), value, what, "an instance id")


def check_session_id(value: Any, what: str = "session id") -> str:
    return _check(is_session_id(value), value, what, "an SSM session id (1-96 characters, no spaces or control characters)")


class JsonFields:
    """Reads one JSON object's fields against these rules, collecting the names of those that break them.

    For small inputs where a pydantic model would cost more cold start than it saves code (node
    reports, usage reports, Step Functions' status events). Unknown fields are bad fields; names,
    never values, end up in `bad`, so a message built from them echoes nothing hostile.
    """

    def __init__(self, data: Any, where: str, allowed: "tuple[str, ...]", bad: "list[str]"):
        self.data = data if isinstance(data, dict) else {}
        self.where, self.bad = where, bad
        if not isinstance(data, dict):
            bad.append(where or "detail")
        unknown = sum(1 for k in self.data if k not in allowed)
        if unknown:
            # Counted, not named: a field name is as much the sender's text as a value.
            bad.append(self._name("<{} unknown field(s)>".format(unknown)))

    def _name(self, key: str) -> str:
        return "{}.{}".format(self.where, key) if self.where else key

    def get(self, key: str, ok: Any, default: Any = None, required: bool = True) -> Any:
        if key not in self.data and not required:
            return default
        value = self.data.get(key)
        if not ok(value):
            self.bad.append(self._name(key))
            return default
        return value

    def text(self, key: str, rule: "re.Pattern[str]", nullable: bool = False, **options: Any) -> Any:
        return self.get(key, lambda v: (nullable and v is None) or (isinstance(v, str) and rule.match(v) is not None),
                        **options)

    def one_of(self, key: str, choices: "tuple[Any, ...]", **options: Any) -> Any:
        return self.get(key, lambda v: isinstance(v, str) and v in choices, **options)

    def short(self, key: str, limit: int, **options: Any) -> Any:
        return self.get(key, lambda v: isinstance(v, str) and len(v) <= limit, **options)

    def count(self, key: str, maximum: int, **options: Any) -> Any:
        """A whole number in [0, maximum]; JSON's true/false are not numbers here."""
        return self.get(key, lambda v: type(v) is int and 0 <= v <= maximum, **options)

    def boolean(self, key: str, **options: Any) -> Any:
        return self.get(key, lambda v: isinstance(v, bool), **options)

    def mapping(self, key: str, key_ok: Any, value_ok: Any, max_items: int, **options: Any) -> "dict[str, Any]":
        def ok(v: Any) -> bool:
            return isinstance(v, dict) and len(v) <= max_items and all(key_ok(k) and value_ok(x) for k, x in v.items())
        options.setdefault("required", False)
        return dict(self.get(key, ok, default={}, **options) or {})
