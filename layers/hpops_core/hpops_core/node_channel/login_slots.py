"""Login-node slots as the agents read them (standard library, shipped to the nodes).

/hpops/<cluster>/node/login-slots = {"format": LOGIN_SLOTS_FORMAT, "host": NLB DNS name,
"portBase": 2200, "slots": {ip: N}}, written by the sync (hpops_core/login_sync/slots.py) when a
slot changes hands. A node finds its own IP and tells users at login how to come back to it.
"""

from __future__ import annotations

import json
import re

from hpops_core.common.errors import HpopsError

LOGIN_SLOTS_FORMAT = "hpops.node.login-slots.v1"
SLOT_PORT_BASE = 2200  # slot N listens on 2200+N (template.yaml's LoginSlotNListener)
MAX_SLOTS = 8
_HOST = re.compile(r"\A[A-Za-z0-9.-]{0,253}\Z")


class BadSlots(HpopsError, ValueError):
    """The slot map is not one the agent may act on; nothing is written."""


def slot_of(text: str, ip: str) -> tuple[int, str] | None:
    """(slot, host) for the node with this IP, None when it has no slot; BadSlots for a bad document."""
    try:
        document = json.loads(text)
    except (ValueError, TypeError) as error:
        raise BadSlots("not JSON") from error
    if not isinstance(document, dict) or document.get("format") != LOGIN_SLOTS_FORMAT:
        raise BadSlots(f"format is not {LOGIN_SLOTS_FORMAT}")
    host, slots = document.get("host"), document.get("slots")
    if not isinstance(host, str) or not _HOST.match(host) or not isinstance(slots, dict):
        raise BadSlots("host or slots malformed")
    slot = slots.get(ip)
    if slot is None:
        return None
    if isinstance(slot, bool) or not isinstance(slot, int) or not 1 <= slot <= MAX_SLOTS:
        raise BadSlots(f"slot {slot!r} is not 1-{MAX_SLOTS}")
    return slot, host


def login_line(slot: int, host: str) -> str:
    where = f"ssh -p {SLOT_PORT_BASE + slot} {host}" if host else f"port {SLOT_PORT_BASE + slot} of the login address"
    return f"you are on login-{slot:02d}; come back to this node with: {where}"


def host_patterns(host: str, slots: int) -> str:
    """The known_hosts host field for the login address and its slot ports: OpenSSH looks a
    non-22 port up as "[host]:port", so each slot port is named."""
    return ",".join([host] + [f"[{host}]:{SLOT_PORT_BASE + n}" for n in range(1, slots + 1)])
