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

# Written into a limits.d file: no whitespace, no ':' or '/', no shell or PAM syntax.
USER_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
MAX_LIMIT = 10000
EXEMPT_LIMIT = 65535  # "no limit" for an exempt user: far beyond anything a person opens


class BadInput(ValueError):
    """The limits are not exactly what a node accepts."""


def _limit(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= MAX_LIMIT:
        raise BadInput("{} must be an integer from {} to {}".format(name, minimum, MAX_LIMIT))
    return value


def _user(value: object) -> str:
    if not isinstance(value, str) or not USER_RE.match(value):
        raise BadInput("not a valid user name: {!r}".format(str(value)[:40]))
    return value


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
        raise BadInput('"overrides" must be an object of user -> limit')
    if not isinstance(exempt, list):
        raise BadInput('"exempt" must be a list of user names')
    return {
        "default": _limit("default", value["default"], 1),
        "overrides": {_user(user): _limit("overrides[{}]".format(user), limit, 0)
                      for user, limit in sorted(overrides.items())},
        "exempt": sorted({_user(user) for user in exempt}),
    }


def canonical_json(limits: dict) -> str:
    """The one spelling of a set of limits (what the stack publishes and versions)."""
    return json.dumps(limits, sort_keys=True, separators=(",", ":"))


def limits_version(limits: dict) -> str:
    return hashlib.sha256(canonical_json(limits).encode()).hexdigest()[:16]


def desired_document(limits: dict) -> dict:
    """What /hpops/<cluster>/node/login-limits holds."""
    return {"format": contract.LOGIN_LIMITS_FORMAT, "version": limits_version(limits), "limits": limits}
