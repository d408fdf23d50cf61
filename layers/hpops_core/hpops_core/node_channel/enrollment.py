"""Enrollment: which key speaks for an instance, decided from AWS's record of it. PURE.

Every process on a node holds the node's IAM role, so a request proves nothing by the role alone.
The agent (root) enrolls its own key once per instance id; afterwards the stack trusts only that
key for that instance (node_proof.py). The decision rests on what AWS says about the instance
(DescribeClusterNode: the group, hence the role; the IP; the launch time), never on the request:

- the instance exists in this cluster, in the login or the controller group, Running or Pending,
  at the IP the statement claims;
- it was launched within the enrollment window (the agent enrolls at on_create, minutes after
  launch), OR the operator approved exactly this instance and key fingerprint (single use);
- first presenter wins: the same key again is "enrolled" (idempotent); a different key is refused.
  Inside the window a different key means two presenters raced for a new node and the stack cannot
  tell the agent from the impostor: the instance becomes CONTESTED (kept out, team alerted) until
  an operator re-enrolls it. After the window the enrolled key stands; the attempt is refused and
  alarmed, so no user can take a serving node out by presenting a key.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from typing import Any

from hpops_core.common import validation
from hpops_core.common.errors import HpopsError

ENROLLED = "enrolled"
CONTESTED = "contested"
STATUSES = (ENROLLED, CONTESTED)
ROLE_BY_GROUP_KIND = ("login", "controller")
LIVE_STATUSES = ("Running", "Pending")
# How far a statement's issuedAt may be from the stack's clock (either way).
STATEMENT_SKEW_SECONDS = 300

_IP = re.compile(r"\A[0-9]{1,3}(\.[0-9]{1,3}){3}\Z")
_PUBLIC_KEY = re.compile(r"\Assh-ed25519 [A-Za-z0-9+/]{68}\Z")
_ISO = re.compile(r"\A[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?Z\Z")
_NONCE = re.compile(r"\A[A-Za-z0-9_-]{16,64}\Z")
FINGERPRINT_RE = re.compile(r"\ASHA256:[A-Za-z0-9+/]{43}\Z")
STATEMENT_FIELDS = ("cluster", "instanceId", "ip", "agentPublicKey", "issuedAt", "nonce", "identityDocument")


class NodeChannelError(HpopsError):
    """A NodeChannel request was refused; nothing was changed."""


class MalformedNodeChannelRequest(NodeChannelError, ValueError):
    """The request is not what the agent sends (the message names fields, never values)."""


class EnrollmentRefusedError(NodeChannelError):
    """AWS's record does not back this enrollment (not this cluster's login/controller node, other IP,
    launched outside the window without an operator approval, stale statement)."""


class EnrollmentConflictError(NodeChannelError):
    """Another key is already enrolled for (or contests) this instance: first presenter wins."""


class NotEnrolledError(NodeChannelError):
    """The instance has no enrollment, or it is contested: nothing it signs is accepted."""


@dataclass(frozen=True)
class Statement:
    cluster: str
    instance_id: str
    ip: str
    public_key: str
    issued_at: datetime
    nonce: str
    identity_document: dict | None


@dataclass(frozen=True)
class Enrollment:
    """The stored record: which key speaks for the instance, with AWS's group and role."""

    cluster: str
    instance_id: str
    public_key: str
    fingerprint: str
    group: str
    role: str  # "login" | "controller", from the group AWS reports
    ip: str
    status: str  # ENROLLED | CONTESTED
    enrolled_at: str
    via: str  # "window" | "approval"
    contested_by: tuple[str, ...] = ()  # fingerprints that presented themselves afterwards

    @property
    def usable(self) -> bool:
        return self.status == ENROLLED


@dataclass(frozen=True)
class Approval:
    instance_id: str
    fingerprint: str
    approved_at: str


@dataclass(frozen=True)
class EnrollmentDecision:
    """outcome: "enroll" (store, first presenter wins), "re-enroll" (store over any record: approved),
    "already" (same key: nothing to do), "contest" (mark contested), "conflict" (refuse, keep record),
    "await-approval" (refuse: outside the window, nothing enrolled), "refuse"."""

    outcome: str
    reason: str
    record: Enrollment | None = None

    @property
    def accepted(self) -> bool:
        return self.outcome in ("enroll", "re-enroll", "already")


def iso(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str) -> datetime:
    return datetime.strptime(text[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc)


def parse_statement(statement: Any) -> Statement:
    """The enroll statement, validated; MalformedNodeChannelRequest naming bad fields otherwise."""
    bad: list[str] = []
    f = validation.JsonFields(statement, "statement", STATEMENT_FIELDS, bad)
    cluster = f.get("cluster", validation.is_cluster_name)
    instance_id = f.get("instanceId", validation.is_instance_id)
    ip = f.text("ip", _IP)
    public_key = f.text("agentPublicKey", _PUBLIC_KEY)
    issued_at = f.text("issuedAt", _ISO)
    nonce = f.text("nonce", _NONCE)
    document = f.get("identityDocument", lambda v: v is None or _identity_document_ok(v), required=False)
    if bad:
        raise MalformedNodeChannelRequest("enroll request rejected; invalid field(s): {}".format(
            ", ".join(sorted(set(bad))[:5])))
    return Statement(cluster, instance_id, ip, public_key, parse_time(issued_at), nonce, document)


def _identity_document_ok(value: Any) -> bool:
    return (isinstance(value, dict) and set(value) <= {"document", "signature"} and isinstance(value.get("document"), dict)
            and len(str(value)) <= 4096)


def group_role(group: str | None, login_group: str, controller_group: str) -> str | None:
    if group == login_group:
        return "login"
    if group == controller_group:
        return "controller"
    return None


def decide_enrollment(statement: Statement, fingerprint: str, aws_node: dict | None, existing: Enrollment | None,
                      approval: Approval | None, now: datetime, cluster: str, login_group: str,
                      controller_group: str, window: timedelta) -> EnrollmentDecision:
    """Whether ``statement`` (already proven signed by its key, whose fingerprint is given) enrolls."""
    if statement.cluster != cluster:
        return EnrollmentDecision("refuse", f"statement names cluster {statement.cluster}, this stack manages {cluster}")
    if abs((now - statement.issued_at).total_seconds()) > STATEMENT_SKEW_SECONDS:
        return EnrollmentDecision("refuse", f"statement issued {iso(statement.issued_at)}, more than "
                                            f"{STATEMENT_SKEW_SECONDS} s from now")
    if aws_node is None:
        return EnrollmentDecision("refuse", f"{statement.instance_id} is not a node of cluster {cluster}")
    group = aws_node.get("InstanceGroupName")
    role = group_role(group, login_group, controller_group)
    if role is None:
        return EnrollmentDecision("refuse", f"{statement.instance_id} is in group {group}: only the login and "
                                            "controller groups' agents enroll")
    status = (aws_node.get("InstanceStatus") or {}).get("Status")
    if status not in LIVE_STATUSES:
        return EnrollmentDecision("refuse", f"{statement.instance_id} is {status}, not Running or Pending")
    if aws_node.get("PrivatePrimaryIp") != statement.ip:
        return EnrollmentDecision("refuse", f"{statement.instance_id} claimed IP {statement.ip}, AWS says "
                                            f"{aws_node.get('PrivatePrimaryIp')}")
    document_problem = _identity_document_problem(statement)
    if document_problem:
        return EnrollmentDecision("refuse", document_problem)
    record = Enrollment(cluster, statement.instance_id, statement.public_key, fingerprint, group, role, statement.ip,
                        ENROLLED, iso(now), "window")
    approved = approval is not None and approval.instance_id == statement.instance_id and approval.fingerprint == fingerprint
    if approved:
        return EnrollmentDecision("re-enroll", f"operator approved {fingerprint} for {statement.instance_id}",
                                  replace(record, via="approval"))
    if existing is not None:
        if existing.fingerprint == fingerprint and existing.usable:
            return EnrollmentDecision("already", f"{statement.instance_id} is enrolled with this key", existing)
        if existing.fingerprint == fingerprint:
            return EnrollmentDecision("conflict", f"{statement.instance_id} is contested: an operator must re-enroll it",
                                      existing)
        if _in_window(aws_node, now, window) and existing.via == "window":
            return EnrollmentDecision("contest", f"two keys presented themselves for new instance "
                                                 f"{statement.instance_id} ({existing.fingerprint}, {fingerprint}): "
                                                 "kept out until an operator re-enrolls it", existing)
        return EnrollmentDecision("conflict", f"{statement.instance_id} is enrolled with another key "
                                              f"({existing.fingerprint}); {fingerprint} refused", existing)
    if not _in_window(aws_node, now, window):
        return EnrollmentDecision("await-approval", f"{statement.instance_id} was launched outside the "
                                                    f"{int(window.total_seconds() // 60)}-minute enrollment window: "
                                                    f"an operator must approve {fingerprint}")
    return EnrollmentDecision("enroll", f"{statement.instance_id} launched within the enrollment window", record)


def _in_window(aws_node: dict, now: datetime, window: timedelta) -> bool:
    launched = aws_node.get("LaunchTime")
    if isinstance(launched, str):
        launched = parse_time(launched)
    if not isinstance(launched, datetime):
        return False
    if launched.tzinfo is None:
        launched = launched.replace(tzinfo=timezone.utc)
    return timedelta(0) - timedelta(seconds=STATEMENT_SKEW_SECONDS) <= now - launched <= window


def _identity_document_problem(statement: Statement) -> str | None:
    """The instance identity document, where the node's IMDS serves one, must name the same instance
    and IP. Its signature is not checked here (see docs/node-agent.md): it is a consistency check."""
    if not statement.identity_document:
        return None
    document = statement.identity_document.get("document") or {}
    if document.get("instanceId") != statement.instance_id or document.get("privateIp") != statement.ip:
        return "the instance identity document names another instance or IP"
    return None
