"""Per-user caps on the login nodes: the one rule the stack (publishing) and the node agent
(applying) validate them with. Standard library only (it ships in the node bundle).

Document (parameter /hpops/<cluster>/node/user-caps, written by SessionLimits' sweep; absent: off):

    {"format": contract.USER_CAPS_FORMAT,
     "caps": {"default": {"cpuQuota": "200%", "memoryMax": "8G", "tasksMax": "512"},
              "overrides": {user: {...}}, "exempt": [user]}}

Values are systemd's spellings (systemd.resource-control(5)): ``CPUQuota`` percent of one CPU,
``MemoryMax`` bytes with K/M/G/T or a percent of RAM, ``TasksMax`` a count or a percent.
systemd-analyze has the last word on the node; this rule keeps out what is plainly not a value.
"""

from __future__ import annotations

import re
from typing import Dict, Optional

from hpops_core.common import validation
from hpops_core.common.errors import HpopsError

_CPU = re.compile(r"\A[1-9][0-9]{0,5}%\Z")
_MEMORY = re.compile(r"\A([1-9][0-9]{0,8}[KMGT]?|[1-9][0-9]?%|100%)\Z")
_TASKS = re.compile(r"\A([1-9][0-9]{0,6}|[1-9][0-9]?%|100%)\Z")
KEYS = {"cpuQuota": ("CPUQuota", _CPU), "memoryMax": ("MemoryMax", _MEMORY), "tasksMax": ("TasksMax", _TASKS)}


class BadCaps(HpopsError, ValueError):
    """Caps the agent will not write (named field; nothing changed)."""


def parse_caps(document: object) -> Optional[dict]:
    """{"default": {cpuQuota, memoryMax, tasksMax}, "overrides": {user: {...}}, "exempt": [user]} or None (off)."""
    if document is None:
        return None
    if not isinstance(document, dict) or set(document) - {"default", "overrides", "exempt"}:
        raise BadCaps("caps must be an object with default, overrides, exempt")

    def one(value: object, where: str) -> Dict[str, str]:
        if not isinstance(value, dict) or set(value) - set(KEYS):
            raise BadCaps(f"{where} must be an object of cpuQuota, memoryMax, tasksMax")
        checked = {}
        for key, raw in value.items():
            if raw is None:
                continue
            text = str(raw) if isinstance(raw, int) and not isinstance(raw, bool) else raw
            if not isinstance(text, str) or not KEYS[key][1].match(text):
                raise BadCaps(f"{where}.{key} is not a systemd {KEYS[key][0]} value")
            checked[key] = text
        return checked

    overrides = document.get("overrides") or {}
    exempt = document.get("exempt") or []
    if not isinstance(overrides, dict) or not isinstance(exempt, list):
        raise BadCaps("overrides must be an object and exempt a list")
    for user in [*overrides, *exempt]:
        if not validation.is_limited_user(user):
            raise BadCaps("overrides and exempt must name users (never root, which is always exempt)")
    return {"default": one(document.get("default") or {}, "default"),
            "overrides": {user: one(value, "overrides[]") for user, value in overrides.items()},
            "exempt": sorted(set(exempt))}


def caps_document(caps: dict) -> dict:
    """The parameter's value for these (parsed) caps."""
    from hpops_core.node_channel import contract

    return {"format": contract.USER_CAPS_FORMAT, "caps": caps}


def caps_of_document(document: object) -> Optional[dict]:
    """The caps a published document asks for; BadCaps when it is not one."""
    from hpops_core.node_channel import contract

    if not isinstance(document, dict) or document.get("format") != contract.USER_CAPS_FORMAT or "caps" not in document:
        raise BadCaps("not a %s document" % contract.USER_CAPS_FORMAT)
    caps = parse_caps(document["caps"])
    if caps is None:
        raise BadCaps("caps must be an object")
    return caps
