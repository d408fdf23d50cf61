"""Pure: which planned registrations may go ahead once their host identity was checked."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from hpops_core.node_channel.contract import READ_AGENT_FINGERPRINT


@dataclass(frozen=True)
class GatedPlan:
    register: tuple[str, ...]
    deregister: tuple[str, ...]
    rejected: tuple[dict, ...]  # {"ip", "instanceId", "reason"}
    reasons: tuple[str, ...]
    # Nodes still serving on a valid certificate whose renewal failed: {"ip", "instanceId", "reason"}.
    renewal_failed: tuple[dict, ...] = ()

    def to_state(self) -> dict[str, Any]:
        return {
            "register": list(self.register),
            "deregister": list(self.deregister),
            "rejected": list(self.rejected),
            "reasons": list(self.reasons),
            "renewalFailed": list(self.renewal_failed),
            "hasChanges": bool(self.register or self.deregister),
        }


def enrollment_problem(instance_id: str, enrollments: Mapping[str, str] | None,
                       approvals: Mapping[str, str] | None = None) -> str | None:
    """Why a node may not be admitted for its enrollment (None: it may), with what to do. ``enrollments``:
    instance id -> status (node_channel/enrollment.py), None when the caller does not check enrollment;
    ``approvals``: instance id -> the fingerprint an operator's pending approval names."""
    if enrollments is None:
        return None
    status = enrollments.get(instance_id)
    if status == "enrolled":
        return None
    approve = (f"read its agent's key fingerprint as root on the node ({READ_AGENT_FINGERPRINT}), then "
               f"`hpops node approve-enrollment --stack-name <stack> --node {instance_id} --fingerprint SHA256:...`")
    if status is None and (approvals or {}).get(instance_id):
        return (f"{instance_id}'s agent has not enrolled its key yet; an approval for {approvals[instance_id]} waits "
                "for its next attempt (within 5 minutes)")
    if status is None:
        return (f"{instance_id}'s agent has not enrolled its key: a node launched more than EnrollmentWindowMinutes "
                f"before its agent asked (a cluster that ran before the install) needs an operator's approval: "
                f"`hpops adopt --stack-name <stack>`, or {approve}; a newer node lacks the agent or its path to "
                "Lambda (`hpops doctor`)")
    return f"{instance_id}'s enrollment is {status}: two keys claimed it; an operator must re-enroll it: {approve}"


def gate_registrations(plan: Mapping[str, Any], verdicts: Iterable[Mapping[str, Any]], repair: bool,
                       enrollments: Mapping[str, str] | None = None,
                       approvals: Mapping[str, str] | None = None) -> GatedPlan:
    """Register only nodes whose presented host keys matched and whose agent is enrolled, uncontested;
    in a repair, also drop registered ones that failed. A registered node that became contested stays.

    A registered node that fails a repair's re-verification is deregistered,
    unless that would leave the target group empty (a broken canonical identity must not take the
    whole tier down). A registered node that is merely not enrolled yet (a cluster upgraded to
    enrollment) stays: its users are not disturbed, and its unsigned reports count for nothing.
    """
    by_ip = {v["ip"]: v for v in verdicts}
    register, rejected, reasons = [], [], []
    for ip in plan.get("register", []):
        verdict = by_ip.get(ip)
        unenrolled = enrollment_problem(verdict["instanceId"], enrollments, approvals) \
            if verdict and verdict.get("instanceId") else None
        if unenrolled:
            # An agent that cannot enroll cannot fetch the keys or report: enrollment is the first reason.
            failed = "" if verdict.get("ok") else f" (and so: {verdict.get('reason')})"
            rejected.append({"ip": ip, "instanceId": verdict["instanceId"], "reason": unenrolled + failed})
            reasons.append(f"keep {ip} out: {unenrolled}{failed}")
        elif verdict and verdict.get("ok"):
            register.append(ip)
            reasons.append(f"register {ip}: {verdict['instanceId']} presents the canonical host identity")
        else:
            why = verdict["reason"] if verdict else "not verified"
            rejected.append({"ip": ip, "instanceId": verdict["instanceId"] if verdict else "", "reason": why})
            reasons.append(f"keep {ip} out: {why}")
    deregister = list(plan.get("deregister", []))
    # A contested node that already serves stays: a contest says two keys claimed it, not that the node
    # stopped presenting the canonical identity (which its verification says); any user could otherwise
    # take working nodes out by presenting keys. Its reports and secrets stop until it is settled.
    failing = [ip for ip in plan.get("keep", []) if repair and ip in by_ip and not by_ip[ip].get("ok")]
    if failing:
        survivors = len(plan.get("keep", [])) - len(failing) + len(register)
        for ip in failing:
            verdict = by_ip[ip]
            rejected.append({"ip": ip, "instanceId": verdict["instanceId"], "reason": verdict["reason"]})
            if survivors > 0:
                deregister.append(ip)
                reasons.append(f"deregister {ip}: {verdict['reason']}")
            else:
                reasons.append(f"keep {ip} registered despite failing ({verdict['reason']}): it would empty the target group")
    renewal_failed = tuple(
        {"ip": v["ip"], "instanceId": v["instanceId"], "reason": f"{v['reason']} (still serving: {v.get('before', '')})"}
        for v in verdicts if v.get("ok") and v.get("renewalFailed")
    )
    return GatedPlan(tuple(register), tuple(sorted(deregister)), tuple(rejected), tuple(reasons), renewal_failed)
