"""The controller agent's holds reports as they arrive from EventBridge: validated. PURE.

Accepted only from the controller group's node (usage_reports.check_usage_origin, the same rule
as usage reports). A report never decides who is held: it says what the agent applied, for
`hpops status`/`hpops cost` and the "could not apply" alert. So a forged or replayed report can at
most misreport, and a replayed older one is not even kept (hold_state.store_agent_report).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from typing import Any

from hpops_core.budget_guard.usage_reports import MAX_REASON, MalformedUsageReport, UsageReport
from hpops_core.common import validation
from hpops_core.node_channel import contract, user_holds
from hpops_core.node_channel import reports as node_reports

_ISO = re.compile(r"\A[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z\Z")
_VERSION = re.compile(r"\A[0-9a-f]{16}\Z")
_AGENT_VERSION = re.compile(r"\A[A-Za-z0-9:._-]{0,128}\Z")
_FIELDS = ("format", "cluster", "instanceId", "agentVersion", "reportedAt", "version", "enforced", "enforceReason",
           "users", "imds")
MAX_BYTES = 64 * 1024


def parse_holds_event(event: Any) -> dict[str, Any]:
    """The EventBridge event -> its report as plain JSON; MalformedUsageReport naming bad fields otherwise."""
    if not isinstance(event, dict) or len(json.dumps(event, default=str)) > MAX_BYTES:
        raise MalformedUsageReport("expected an EventBridge event of the size a holds report has")
    bad: list[str] = []
    if event.get("source") != contract.REPORT_SOURCE:
        bad.append("source")
    if event.get("detail-type") != user_holds.HOLDS_DETAIL_TYPE:
        bad.append("detail-type")
    f = validation.JsonFields(event.get("detail"), "", _FIELDS, bad)
    report = {
        "format": f.one_of("format", (user_holds.HOLDS_REPORT_FORMAT,)),
        "cluster": f.get("cluster", validation.is_cluster_name),
        "instanceId": f.get("instanceId", validation.is_instance_id),
        "agentVersion": f.text("agentVersion", _AGENT_VERSION, required=False),
        "reportedAt": f.text("reportedAt", _ISO),
        "version": f.text("version", _VERSION, nullable=True),
        "enforced": f.get("enforced", lambda v: v is None or isinstance(v, bool)),
        "enforceReason": f.short("enforceReason", MAX_REASON, default="", required=False),
        "users": [],
    }
    rows = f.get("users", lambda v: isinstance(v, list) and len(v) <= user_holds.MAX_REPORTED_USERS, default=[])
    if not bad:
        for index, raw in enumerate(rows):
            row = validation.JsonFields(raw, f"users[{index}]", ("user", "state", "reason"), bad)
            report["users"].append({"user": row.get("user", validation.is_posix_user),
                                    "state": row.one_of("state", user_holds.HOLD_STATES),
                                    "reason": row.short("reason", MAX_REASON, default="", required=False)})
    # The controller's own IMDS probe: the same section, and the same rule, as a login node's report.
    imds = node_reports.imds_section(f.data.get("imds"), bad)
    if bad:
        shown = sorted(set(bad))
        raise MalformedUsageReport(f"holds report rejected; invalid field(s): {', '.join(shown[:5])}")
    return report if imds is None else dict(report, imds=asdict(imds))


def origin_view(report: dict[str, Any]) -> UsageReport:
    """The fields check_usage_origin reads (cluster, instance id), as the usage report type it takes."""
    return UsageReport(report["cluster"], report["instanceId"], "", "", True, contract.USAGE_OK, "",
                       report["reportedAt"], (), {}, 1, 1)
