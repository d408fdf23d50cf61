"""The per-user login limits as the stack publishes them and the node agent applies them.

One rule for both sides (standard library, Python 3.8+; the agent bundle ships this file):
{"default": N, "overrides": {user: N}, "exempt": [user]}, validated and written one way only, so
the version the stack publishes is the version a node reports back.
"""

from __future__ import annotations

import hashlib
import json
import re

from hpops_core.node_channel import contract

# One rule for a POSIX user name, wherever hpops names one. Wider than Debian's default
# NAME_REGEX because real systems have more (useradd --badname, LDAP/SSSD users such as `j.doe`,
# upper case), but the name is written into a limits.d file, so no whitespace, ':', '/', '@', '*',
# newline or shell syntax, and no leading '-' or '.' (options, hidden files). 32: the utmp limit.
USER_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}$")
USER_RULE = "letters, digits, '_', '.', '-', at most 32, not starting with '-' or '.'"
MAX_LIMIT = 10000
EXEMPT_LIMIT = 65535  # "no limit" for an exempt user: far beyond anything a person opens


class BadInput(ValueError):
    """The limits are not exactly what a node accepts. `field`: "default", "overrides" or "exempt"."""

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(message)
        self.field = field


def is_user_name(value: object) -> bool:
    return isinstance(value, str) and USER_RE.match(value) is not None


def _limit(field: str, name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= MAX_LIMIT:
        raise BadInput("{} must be an integer from {} to {}".format(name, minimum, MAX_LIMIT), field)
    return value


def _user(field: str, value: object) -> str:
    if not is_user_name(value):
        raise BadInput("{}: {!r} is not a valid user name ({})".format(field, str(value)[:40], USER_RULE), field)
    return value  # type: ignore[return-value]


def parse_limits(raw: str) -> dict:
    """{"default": N, "overrides": {user: N}, "exempt": [user]} -> the same, validated and normalized."""
    try:
        value = json.loads(raw)
    except ValueError:
        raise BadInput("limits are not valid JSON") from None
    if not isinstance(value, dict) or not set(value) <= {"default", "overrides", "exempt"} or "default" not in value:
        raise BadInput('limits must be an object with "default" and optional "overrides", "exempt"')
    overrides = value.get("overrides", {})
    exempt = value.get("exempt", [])
    if not isinstance(overrides, dict):
        raise BadInput('"overrides" must be an object of user -> limit', "overrides")
    if not isinstance(exempt, list):
        raise BadInput('"exempt" must be a list of user names', "exempt")
    return {
        "default": _limit("default", "default", value["default"], 1),
        "overrides": {_user("overrides", user): _limit("overrides", "overrides[{}]".format(user), limit, 0)
                      for user, limit in sorted(overrides.items())},
        "exempt": sorted({_user("exempt", user) for user in exempt}),
    }


def canonical_json(limits: dict) -> str:
    """The one spelling of a set of limits (what the stack publishes and versions)."""
    return json.dumps(limits, sort_keys=True, separators=(",", ":"))


def limits_version(limits: dict) -> str:
    return hashlib.sha256(canonical_json(limits).encode()).hexdigest()[:16]


def desired_document(limits: dict) -> dict:
    """What /hpops/<cluster>/node/login-limits holds."""
    return {"format": contract.LOGIN_LIMITS_FORMAT, "version": limits_version(limits), "limits": limits}
