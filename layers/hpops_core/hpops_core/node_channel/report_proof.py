"""Is this report the enrolled agent's? PURE (plus node_proof's signature check).

A report enters through EventBridge, which carries no caller identity; any process holding the
node role can put one on the bus. So a report counts only if it is signed by the key enrolled
for the instance it names (enrollment.py), the enrollment is uncontested and of the role the
report needs (login reports from the login group, usage and holds from the controller group),
and nothing in it is dated in the future. A usage or holds report (who is charged, who is held) needs
more: an enrollment proven by a verified document, an approval or its window passed uncontested; a
login report too where the cluster's agents were seen with documents (Enrollment.counts_reports).
"sequence" is bounded by the clock (at most now plus FUTURE_SKEW_SECONDS, in microseconds, as the
agent makes them): a far-future sequence would pin every later report as a replay. It must not be below the last one accepted for
the same stored item (checked by the store's conditional write): an older report, replayed or
reordered, is refused; the same report again (EventBridge delivers at least once, and the agent
never reuses a sequence) is stored again and changes nothing. The instance's group and role are the enrollment's (AWS's record), never the payload's.
"""

from __future__ import annotations

import copy
from datetime import datetime, timedelta
from typing import Any

from hpops_core.node_channel import node_proof
from hpops_core.node_channel.enrollment import Enrollment, NodeChannelError, NotEnrolledError, parse_time
from hpops_core.node_channel.proof_format import PROOF_FIELD, SEQUENCE_FIELD

# How far in the future a report's own times may be (clock skew between a node and Lambda).
FUTURE_SKEW_SECONDS = 120
MAX_SEQUENCE = 2**63 - 1


class ReportRoleError(NodeChannelError):
    """The report's kind is not one this instance's group sends (e.g. usage from a login node)."""


class ReportFromFutureError(NodeChannelError):
    """A time in the report is later than now plus the allowed skew (e.g. windows dated 2099)."""


class UnprovenEnrollmentError(NotEnrolledError):
    """The key is enrolled but not proven (no verified document or approval, window still open): it
    may not charge, hold, or (where documents are served) report for the node yet."""


class ReportReplayError(NodeChannelError):
    """The report's sequence is below the last accepted one: an old report replayed or reordered."""


def unsigned_event(event: Any) -> tuple[Any, int | None]:
    """(the event with "proof" and "sequence" taken out of its detail, the sequence): what the report
    parsers check, which refuse unknown fields."""
    if not isinstance(event, dict) or not isinstance(event.get("detail"), dict):
        return event, None
    stripped = copy.copy(event)
    stripped["detail"] = {k: v for k, v in event["detail"].items() if k not in (PROOF_FIELD, SEQUENCE_FIELD)}
    sequence = event["detail"].get(SEQUENCE_FIELD)
    return stripped, sequence if type(sequence) is int and 0 < sequence <= MAX_SEQUENCE else None


def check_signed_report(detail: dict, enrollment: Enrollment | None, cluster: str, instance_id: str, role: str,
                        now: datetime, times: list[str]) -> int:
    """The report's sequence if ``detail`` is the enrolled agent's report for ``instance_id``; a named
    NodeChannelError / NodeProofError otherwise."""
    if enrollment is None:
        raise NotEnrolledError(f"{instance_id} has no enrolled agent key: its reports are refused")
    if not enrollment.usable:
        raise NotEnrolledError(f"{instance_id}'s enrollment is {enrollment.status}: its reports are refused")
    weighty = role != "login"  # usage and holds: someone is charged or held on its word
    if not (enrollment.proven(now) if weighty else enrollment.counts_reports(now)):
        raise UnprovenEnrollmentError(f"{instance_id}'s key is not proven yet (no verified instance identity "
                                      "document, no approval, its enrollment window still open): its "
                                      f"{role} reports count from {enrollment.window_ends_at}")
    if enrollment.role != role:
        raise ReportRoleError(f"{instance_id} is enrolled as a {enrollment.role} node (group {enrollment.group}); "
                              f"{role} reports come only from the {role} group")
    node_proof.verify_body(detail, enrollment.public_key, "report", cluster)
    _, sequence = unsigned_event({"detail": detail})
    if sequence is None:
        raise ReportReplayError(f"{instance_id}'s report carries no valid sequence")
    latest = now + timedelta(seconds=FUTURE_SKEW_SECONDS)
    if sequence > int(latest.timestamp()) * 1_000_000:
        raise ReportFromFutureError(f"{instance_id}'s report sequence is ahead of the clock (sequences are "
                                    "microseconds since 1970 at most)")
    for text in times:
        if isinstance(text, str) and len(text) >= 19:
            try:
                moment = parse_time(text)
            except ValueError:
                continue  # the report's own parser names malformed times
            if moment > latest:
                raise ReportFromFutureError(f"{instance_id}'s report is dated {text}, after now plus "
                                            f"{FUTURE_SKEW_SECONDS} s")
    return sequence
