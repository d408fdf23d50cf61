"""Login nodes leaving rotation, as the agents read them (standard library, shipped to the nodes).

/hpops/<cluster>/node/leave-notices = {"format": LEAVE_NOTICES_FORMAT, "graceMinutes": N, "host": NLB DNS
name, "nodes": {instanceId: {"ip", "why", "since"}}}, written by the sync
(hpops_core/login_sync/leave_notices.py) when the set of leaving login nodes changes. An agent finds
its own instance id and writes the notice once to each of its users' terminals (ParallelCluster's login
pools warn with wall for GracetimePeriod minutes before a login node stops). Entries are keyed by
instance id, which HyperPod never reuses, so a later node that gets the same IP is never told.
"""

from __future__ import annotations

import datetime
import json
import re

from hpops_core.common.errors import HpopsError

LEAVE_NOTICES_FORMAT = "hpops.node.leave-notices.v1"
# Why a node leaves. "stopping": HyperPod is shutting it down (a scale-in or a replacement); "status":
# it is not Running (the status is in the reason); "admission": load-aware admission took it out of
# rotation for new connections, and it stays up.
WHYS = ("stopping", "status", "admission")
MAX_GRACE_MINUTES = 120
_HOST = re.compile(r"\A[A-Za-z0-9.-]{0,253}\Z")
_IP = re.compile(r"\A[0-9a-fA-F.:]{2,45}\Z")
_DETAIL = re.compile(r"\A[A-Za-z0-9 ._,:;()%/=-]{0,120}\Z")  # printable, nothing a terminal acts on
_SINCE = re.compile(r"\A[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z\Z")


class BadLeaveNotices(HpopsError, ValueError):
    """The leave-notice document is not one the agent may act on; nothing is written to any terminal."""


def notice_for(text: str, instance_id: str) -> dict | None:
    """{"ip", "why", "detail", "since", "graceMinutes", "host"} for this node, None when it is not
    leaving; BadLeaveNotices for a document the agent must not act on."""
    try:
        document = json.loads(text)
    except (ValueError, TypeError) as error:
        raise BadLeaveNotices("not JSON") from error
    if not isinstance(document, dict) or document.get("format") != LEAVE_NOTICES_FORMAT:
        raise BadLeaveNotices("format is not {}".format(LEAVE_NOTICES_FORMAT))
    grace, host, nodes = document.get("graceMinutes"), document.get("host"), document.get("nodes")
    if isinstance(grace, bool) or not isinstance(grace, int) or not 0 <= grace <= MAX_GRACE_MINUTES:
        raise BadLeaveNotices("graceMinutes is not 0-{}".format(MAX_GRACE_MINUTES))
    if not isinstance(host, str) or not _HOST.match(host) or not isinstance(nodes, dict):
        raise BadLeaveNotices("host or nodes malformed")
    entry = nodes.get(instance_id)
    if entry is None:
        return None
    if not isinstance(entry, dict):
        raise BadLeaveNotices("entry is not an object")
    ip, why, since, detail = entry.get("ip"), entry.get("why"), entry.get("since"), entry.get("detail", "")
    if (not isinstance(ip, str) or not _IP.match(ip) or why not in WHYS or not isinstance(since, str)
            or not _SINCE.match(since) or not isinstance(detail, str) or not _DETAIL.match(detail)):
        raise BadLeaveNotices("entry malformed")
    return {"ip": ip, "why": why, "detail": detail, "since": since, "graceMinutes": grace, "host": host}


def notice_key(notice: dict) -> str:
    """One notice: told once per session for each (why, since); a node that leaves again is told again."""
    return "{}@{}".format(notice["why"], notice["since"])


def message(notice: dict) -> str:
    """The text users see, ASCII only, lines ended with CRLF (a terminal in raw mode does not add the CR)."""
    since = datetime.datetime.strptime(notice["since"], "%Y-%m-%dT%H:%M:%SZ")
    elsewhere = ("ssh {}".format(notice["host"]) if notice["host"]
                 else "the login address you used (it no longer leads here)")
    detail = " ({})".format(notice["detail"]) if notice["detail"] else ""
    lines = ["", "*** hpops: message to the users of login node {} ***".format(notice["ip"])]
    if notice["why"] == "admission":
        lines += ["This node is out of rotation for new logins since {} UTC: it is busier than the others{}.".format(
                      since.strftime("%H:%M"), detail),
                  "It stays up and your session continues. For a less busy node log in again with: " + elsewhere]
    else:
        leaving = ("HyperPod is shutting it down" if notice["why"] == "stopping" else "it is no longer Running") + detail
        lines.append("This node left rotation at {} UTC: {}.".format(since.strftime("%H:%M"), leaving))
        if notice["graceMinutes"]:
            by = since + datetime.timedelta(minutes=notice["graceMinutes"])
            lines.append("Save your work and log out within {} minutes (by {} UTC); HyperPod may stop the node "
                         "sooner.".format(notice["graceMinutes"], by.strftime("%H:%M")))
        else:
            lines.append("Save your work and log out now: the node may stop at any time.")
        lines.append("Continue on another login node with: " + elsewhere)
    return "\r\n".join(lines + ["", ""])
