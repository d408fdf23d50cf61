"""Which login nodes' users are told their node leaves rotation, and the document their agents read.

`leaving_nodes` is pure: the login group as listed, the nodes load-aware admission keeps out, the
document published last time and "now" in, the entries to publish out (with a reason per change).
A node is leaving when it still has an IP but is not Running (HyperPod shuts down a node it scales
in or replaces: ShuttingDown) or when admission keeps it out of rotation. An entry keeps its
`since` while the node stays leaving for the same reason, so the agents tell each session once.
`publish_leave_notices` reads the document and writes it only when the entries change.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone

from hpops_core.cluster.login_group import LoginNode
from hpops_core.common.clients import client, transient_errors_named
from hpops_core.node_channel.leave_notices import LEAVE_NOTICES_FORMAT


@dataclass(frozen=True)
class LeaveNotices:
    nodes: dict[str, dict[str, str]]  # instance id -> {"ip", "why", "detail", "since"}
    changed: bool
    reasons: tuple[str, ...]


def leaving_nodes(nodes: Iterable[LoginNode], held_out: Mapping[str, str], previous: Mapping[str, dict],
                  now: datetime) -> LeaveNotices:
    """``held_out``: ip -> why, the Running nodes load-aware admission keeps out of rotation."""
    since = now.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    wanted: dict[str, dict[str, str]] = {}
    for node in sorted(nodes, key=lambda n: n.instance_id):
        if not node.ip:
            continue  # never had an IP: nobody can be logged in there
        if node.status == "Running":
            if node.ip not in held_out:
                continue
            why, detail = "admission", held_out[node.ip]
        elif node.status == "ShuttingDown":
            why, detail = "stopping", "status ShuttingDown"
        else:
            why, detail = "status", f"status {node.status}"
        entry = {"ip": node.ip, "why": why, "detail": _printable(detail), "since": since}
        old = previous.get(node.instance_id)
        if isinstance(old, dict) and old.get("why") == why and old.get("ip") == node.ip and isinstance(old.get("since"), str):
            entry["since"] = old["since"]  # the same leave, told once
        wanted[node.instance_id] = entry
    reasons = tuple([f"tell the users of {i} ({e['ip']}): {e['why']}, {e['detail']}" for i, e in wanted.items()
                     if i not in previous or previous[i].get("since") != e["since"]]
                    + [f"no more notice for {i}: back in rotation or gone" for i in previous if i not in wanted])
    return LeaveNotices(wanted, wanted != dict(previous), reasons)


def _printable(text: str) -> str:
    """What the agents accept in a notice (node_channel/leave_notices.py): a reason never breaks the document."""
    kept = "".join(c if c.isascii() and (c.isalnum() or c in " ._,:;()%/=-") else " " for c in text)
    return " ".join(kept.split())[:120]


def notice_document(nodes: Mapping[str, Mapping[str, str]], grace_minutes: int, host: str) -> str:
    return json.dumps({"format": LEAVE_NOTICES_FORMAT, "graceMinutes": grace_minutes, "host": host,
                       "nodes": {i: dict(e) for i, e in sorted(nodes.items())}}, sort_keys=True)


def read_notices(parameter: str) -> dict[str, dict]:
    """The entries published last time; {} when none were (or the document is not ours)."""
    ssm = client("ssm")
    try:
        with transient_errors_named("ssm:GetParameter"):
            value = ssm.get_parameter(Name=parameter)["Parameter"]["Value"]
    except ssm.exceptions.ParameterNotFound:
        return {}
    try:
        document = json.loads(value)
    except ValueError:
        return {}
    nodes = document.get("nodes") if isinstance(document, dict) else None
    return {i: e for i, e in nodes.items() if isinstance(e, dict)} if isinstance(nodes, dict) else {}


def publish_leave_notices(parameter: str, nodes: Iterable[LoginNode], held_out: Mapping[str, str], now: datetime,
                          grace_minutes: int, host: str) -> LeaveNotices:
    notices = leaving_nodes(nodes, held_out, read_notices(parameter), now)
    if notices.changed:
        with transient_errors_named("ssm:PutParameter"):
            client("ssm").put_parameter(Name=parameter, Value=notice_document(notices.nodes, grace_minutes, host),
                                        Type="String", Overwrite=True)
    return notices
