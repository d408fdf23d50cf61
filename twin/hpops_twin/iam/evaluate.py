"""IAM policy evaluation, as the IAM policy evaluation logic describes it, for the policies this stack has.

An explicit Deny in any applicable statement wins; otherwise an Allow (identity-based, or a
resource-based policy naming the principal) allows; otherwise the request is implicitly denied.
Action and NotAction match case-insensitively with * and ? wildcards, Resource and NotResource
case-sensitively. Conditions: the operators and keys below. A condition operator or key this
module does not know is an error of the twin (TwinIamError), never an allow, so a template that
starts using one fails every test until the evaluator understands it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache


class TwinIamError(Exception):
    """The twin cannot decide a request as IAM would (unknown operation, operator or key)."""


# Condition keys the twin puts in a request's context (enforce.py) and so can evaluate.
KNOWN_CONDITION_KEYS = frozenset({
    "kms:viaservice", "aws:sourcearn", "aws:sourceaccount", "dynamodb:leadingkeys", "events:source",
    "ssm:sessiondocumentaccesscheck", "iam:passedtoservice", "iam:policyarn", "iam:permissionsboundary",
    "cloudformation:rolearn",
})
# Policy variables in a Resource, filled from the caller's identity (context keys of the same name).
POLICY_VARIABLES = frozenset({"aws:username", "aws:userid"})

_STRING_OPERATORS = {"StringEquals", "StringNotEquals", "StringLike", "StringNotLike",
                     "StringEqualsIgnoreCase", "ArnEquals", "ArnLike", "ArnNotEquals", "ArnNotLike", "Bool"}


@lru_cache(maxsize=4096)
def _pattern(glob: str, ignore_case: bool) -> re.Pattern:
    # IAM wildcards: * any run of characters (also across ':' and '/'), ? one character.
    body = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in glob)
    return re.compile(body, re.IGNORECASE | re.DOTALL if ignore_case else re.DOTALL)


def glob_match(glob: str, value: str, ignore_case: bool = False) -> bool:
    return _pattern(glob, ignore_case).fullmatch(value) is not None


def _as_list(value: object) -> list:
    if value is None:
        return []
    return list(value) if isinstance(value, list | tuple) else [value]


def _single(operator: str, wanted: list[str], value: str) -> bool:
    if operator in ("StringEquals", "ArnEquals"):
        return value in wanted
    if operator == "StringEqualsIgnoreCase":
        return value.lower() in [w.lower() for w in wanted]
    if operator in ("StringLike", "ArnLike"):
        return any(glob_match(w, value) for w in wanted)
    if operator == "Bool":
        return value.lower() in [str(w).lower() for w in wanted]
    if operator in ("StringNotEquals", "ArnNotEquals"):
        return value not in wanted
    if operator in ("StringNotLike", "ArnNotLike"):
        return not any(glob_match(w, value) for w in wanted)
    raise TwinIamError(f"condition operator {operator} is not understood by the twin")


def condition_holds(condition: Mapping, context: Mapping[str, tuple[str, ...]]) -> bool:
    """All operators, all keys in a Condition block must hold (values of one key: any)."""
    for full_operator, keys in condition.items():
        qualifier, _, operator = full_operator.rpartition(":")
        if_exists = operator.endswith("IfExists")
        operator = operator.removesuffix("IfExists")
        if operator not in _STRING_OPERATORS or qualifier not in ("", "ForAllValues", "ForAnyValue"):
            raise TwinIamError(f"condition operator {full_operator} is not understood by the twin")
        for key, wanted in keys.items():
            if key.lower() not in KNOWN_CONDITION_KEYS:
                raise TwinIamError(f"condition key {key} is not understood by the twin")
            wanted = [str(w) for w in _as_list(wanted)]
            values = context.get(key.lower())
            if qualifier == "ForAllValues":
                # Every value in the request must match; no values at all is true (as in IAM).
                if not all(_single(operator, wanted, v) for v in values or ()):
                    return False
                continue
            if values is None:
                if if_exists:
                    continue
                return False
            if not any(_single(operator, wanted, v) for v in values):
                return False
    return True


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str  # "allowed by <policy>/<sid>", "explicit deny in ...", "no policy allows"


def _statements(document: Mapping) -> Iterable[Mapping]:
    return _as_list(document.get("Statement"))


def _matches_action(statement: Mapping, action: str) -> bool:
    if "Action" in statement:
        return any(glob_match(a, action, ignore_case=True) for a in _as_list(statement["Action"]))
    return not any(glob_match(a, action, ignore_case=True) for a in _as_list(statement.get("NotAction")))


def _filled(pattern: str, context: Mapping[str, tuple[str, ...]]) -> str | None:
    """`pattern` with its policy variables replaced by the caller's values; None when the caller has no
    value for one (IAM: the element then matches nothing)."""
    if "${" not in pattern:
        return pattern
    missing = False

    def value(match: re.Match) -> str:
        nonlocal missing
        name = match.group(1).lower()
        if name not in POLICY_VARIABLES:
            raise TwinIamError(f"policy variable ${{{match.group(1)}}} is not understood by the twin")
        values = context.get(name)
        if not values:
            missing = True
            return ""
        return values[0]  # IAM names hold neither * nor ?

    filled = re.sub(r"\$\{([^}]+)\}", value, pattern)
    return None if missing else filled


def _matches_resource(statement: Mapping, resource: str, context: Mapping[str, tuple[str, ...]]) -> bool:
    if "Resource" in statement:
        return any(p is not None and glob_match(p, resource)
                   for p in (_filled(r, context) for r in _as_list(statement["Resource"])))
    if "NotResource" in statement:
        return not any(p is not None and glob_match(p, resource)
                       for p in (_filled(r, context) for r in _as_list(statement["NotResource"])))
    return True  # resource-based policies may omit Resource: the resource is the one the policy is on


def _matches_principal(statement: Mapping, principal: str | None) -> bool:
    """Identity policies (principal None) have no Principal element; resource policies must name it."""
    if principal is None:
        return "Principal" not in statement
    named = statement.get("Principal")
    if named == "*":
        return True
    if not isinstance(named, Mapping):
        return False
    return any(principal in _as_list(v) for v in named.values())


def decide(policies: Mapping[str, Mapping], action: str, resource: str, context: Mapping[str, tuple[str, ...]],
           principal: str | None = None) -> Decision:
    """policies: name -> policy document (identity policies, or a resource's policy with
    `principal` the service or ARN asking)."""
    allowed_by = None
    for name, document in policies.items():
        for number, statement in enumerate(_statements(document)):
            if not (_matches_principal(statement, principal) and _matches_action(statement, action)
                    and _matches_resource(statement, resource, context)):
                continue
            if not condition_holds(statement.get("Condition") or {}, context):
                continue
            where = f"{name}/{statement.get('Sid') or number}"
            if statement.get("Effect") == "Deny":
                return Decision(False, f"explicit deny in {where}")
            allowed_by = allowed_by or where
    if allowed_by:
        return Decision(True, f"allowed by {allowed_by}")
    return Decision(False, "no policy allows it")
