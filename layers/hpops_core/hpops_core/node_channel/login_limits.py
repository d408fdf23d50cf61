"""The per-user login limits as the stack publishes them and the node agent applies them.

One rule for both sides (standard library, Python 3.8+; the agent bundle ships this file):
{"default": N, "overrides": {user: N}, "exempt": [user]}, validated and written one way only, so
the version the stack publishes is the version a node reports back.
"""

from __future__ import annotations

import hashlib
import json

from hpops_core.node_channel import contract

# Relative, so it resolves to hpops_core.common.validation in the layer and in the lifecycle bundle alike.
from hpops_core.common import validation
from hpops_core.common.errors import HpopsError

# The one POSIX user rule (hpops_core/common/validation.py), the same for every user hpops names.
USER_RE = validation.POSIX_USER_RE
USER_RULE = validation.POSIX_USER_RULE
MAX_LIMIT = 10000
EXEMPT_LIMIT = 65535  # "no limit" for an exempt user: far beyond anything a person opens


class BadInput(HpopsError, ValueError):
    """The limits are not exactly what a node accepts. `field`: "default", "overrides" or "exempt"."""

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(message)
        self.field = field


def is_user_name(value: object) -> bool:
    return validation.is_posix_user(value)


def _limit(field: str, name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= MAX_LIMIT:
        raise BadInput("{} must be an integer from {} to {}".format(name, minimum, MAX_LIMIT), field)
    return value


def _user(field: str, value: object, limited: bool) -> str:
    # An override is a limit, and no limit applies to root; exempting root is harmless.
    check = validation.check_limited_user if limited else validation.check_posix_user
    try:
        return check(value, field)
    except validation.InvalidValue as error:
        raise BadInput(str(error), field) from None


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
        "overrides": {_user("overrides", user, True): _limit("overrides", "overrides[{}]".format(user), limit, 0)
                      for user, limit in sorted(overrides.items())},
        "exempt": sorted({_user("exempt", user, False) for user in exempt}),
    }


def canonical_json(limits: dict) -> str:
    """The one spelling of a set of limits (what the stack publishes and versions)."""
    return json.dumps(limits, sort_keys=True, separators=(",", ":"))


def limits_version(limits: dict) -> str:
    return hashlib.sha256(canonical_json(limits).encode()).hexdigest()[:16]


def desired_document(limits: dict) -> dict:
    """What /hpops/<cluster>/node/login-limits holds."""
    return {"format": contract.LOGIN_LIMITS_FORMAT, "version": limits_version(limits), "limits": limits}
