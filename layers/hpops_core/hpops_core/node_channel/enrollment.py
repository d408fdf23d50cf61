"""Enrollment: which key speaks for an instance, decided from AWS's record of it. PURE.

Every process on a node holds the node's IAM role, so a request proves nothing by the role alone.
The agent (root) enrolls its own key once per instance id, first thing on a new node (the lifecycle
line runs it before users can log in); afterwards the stack trusts only that key for that instance
(node_proof.py). The decision rests on what AWS says, never on the request alone:

- the instance exists in this cluster, in the login or the controller group, Running or Pending,
  at the IP the statement claims (DescribeClusterNode);
- where IMDS serves it, the instance identity document, verified with AWS's certificate for the
  Region (instance_identity.py), names this instance, this IP, this Region and a pending time that
  matches AWS's launch time: AWS's own word that a process ON the instance asked ("document");
- it was launched within the enrollment window, OR the operator approved exactly this instance and
  key fingerprint (single use; `hpops adopt` records one after reading the key as root on the node).

Who wins, in order:
- an approval wins over anything stored;
- a proven enrollment (document-verified, approved, or uncontested past its window) is never
  contested or displaced: another key is refused and alarmed;
- inside the window, a verified document displaces an unverified key (an impostor on another node
  cannot get this instance's document), and resets what that key left (its stored report);
- inside the window, two unverified keys make the instance CONTESTED (its reports and secrets stop;
  a node that already serves stays in the load balancer, host_identity/gate.py) until an operator
  re-enrolls it or the real agent presents a verified document; contest records are bounded;
- outside the window nothing enrolls without an approval.

Refusals name the rule that refused, never AWS's record (a refusal must teach nobody a node's IP or group).
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
WINDOW, DOCUMENT, APPROVAL = "window", "document", "approval"  # how an enrollment was won
# At most this many contesting fingerprints are kept for the operator: a flood adds no writes.
MAX_CONTESTED_BY = 5
# How far the document's pendingTime may be from AWS's LaunchTime (HyperPod's launch record and EC2's
# pending time are two clocks of one start; UNCONFIRMED how far apart).
PENDING_TIME_TOLERANCE = timedelta(minutes=15)
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
class IdentityDocument:
    """The fields of an instance identity document whose AWS signature verified (instance_identity.py)."""

    instance_id: str
    region: str
    account_id: str
    private_ip: str
    pending_time: datetime


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
    via: str  # WINDOW (unverified, inside the window) | DOCUMENT (verified document) | APPROVAL
    contested_by: tuple[str, ...] = ()  # fingerprints that presented themselves afterwards (bounded)
    window_ends_at: str = ""  # launch + the enrollment window ("": enrolled before it was recorded)
    # The cluster's agents were seen with verified documents when this one enrolled without: its
    # login reports wait for its window to end, as its secrets do.
    expect_document: bool = False
    # The controller's usage windows a replaced key wrote from this window on were voided: the agent
    # re-collects them from Slurm accounting (usage_store.void_writer; "": nothing to re-collect).
    recollect_from: str = ""
    # The key this record replaced, while what it left (stored report, usage windows) is still being
    # discarded: stored with the record, so a call that fails half way is finished by the agent's next
    # enroll call ("": nothing left to discard).
    replaced_key: str = ""
    # The operator said the replaced key was this node's own (an upgrade, a re-image, a lost key): its
    # usage windows and holds report stay counted; only its stored report and sequence go.
    replaced_usage_kept: bool = False
    # Keys replaced before replaced_key whose usage windows were not voided yet (a second replacement
    # came before the first discard finished): voided with it.
    earlier_replaced_keys: tuple[str, ...] = ()

    @property
    def keys_to_void(self) -> tuple[str, ...]:
        """The replaced keys whose usage windows must count for nothing (oldest first)."""
        kept = () if self.replaced_usage_kept or not self.replaced_key else (self.replaced_key,)
        return tuple(dict.fromkeys(self.earlier_replaced_keys + kept))

    @property
    def usable(self) -> bool:
        return self.status == ENROLLED

    def proven(self, now: datetime) -> bool:
        """Verified, approved, or uncontested after its window: what secrets and usage/holds need."""
        if not self.usable:
            return False
        if self.via in (DOCUMENT, APPROVAL) or not self.window_ends_at:
            return True
        return now >= parse_time(self.window_ends_at)

    def counts_reports(self, now: datetime) -> bool:
        """A login node's reports count: proven, or enrolled where no document was ever seen (as before
        documents: nothing better is known on such a cluster)."""
        return self.proven(now) or (self.usable and not self.expect_document)


KEEP, DISCARD = "keep", "discard"  # what an approval does with the replaced key's usage windows
REPLACED_KEY_USAGE = (KEEP, DISCARD)


@dataclass(frozen=True)
class Approval:
    instance_id: str
    fingerprint: str
    approved_at: str
    # The standing key whose usage windows the operator said to keep (it was this node's own); "": discard
    # whatever key the approval replaces. Kept only if that very key is still the one replaced.
    keep_usage_of: str = ""


@dataclass(frozen=True)
class EnrollmentDecision:
    """outcome: "enroll" (store, first presenter wins), "re-enroll" (store over any record: approved),
    "displace" (a verified document over the unverified key stored: store if that key is still there),
    "already" (same key: nothing to do), "contest" (mark contested), "conflict" (refuse, keep record),
    "await-approval" (refuse: outside the window, nothing enrolled), "refuse"."""

    outcome: str
    reason: str
    record: Enrollment | None = None

    @property
    def accepted(self) -> bool:
        return self.outcome in ("enroll", "re-enroll", "displace", "already")

    @property
    def resets(self) -> bool:
        """The stored record is replaced by another key's: what the old key left is discarded."""
        return self.outcome in ("re-enroll", "displace")


def replacing(record: Enrollment, existing: Enrollment, approval: Approval | None) -> Enrollment:
    """``record`` as stored over ``existing`` (another key): naming the key it replaces, whether that key's
    usage is kept (only by an approval that named that very key to keep; a verified document's
    displacement or any doubt discards), and every earlier replaced key still waiting for its windows to
    be voided (an unfinished discard is carried over, never lost)."""
    earlier = existing.keys_to_void
    keep = approval is not None and bool(approval.keep_usage_of) and approval.keep_usage_of == existing.fingerprint
    return replace(record, replaced_key=existing.fingerprint, replaced_usage_kept=keep,
                   earlier_replaced_keys=tuple(k for k in earlier if k != record.fingerprint))


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
    document = f.get("identityDocument", lambda v: v is None or identity_document_wire_ok(v), required=False)
    if bad:
        raise MalformedNodeChannelRequest("enroll request rejected; invalid field(s): {}".format(
            ", ".join(sorted(set(bad))[:5])))
    return Statement(cluster, instance_id, ip, public_key, parse_time(issued_at), nonce, document)


def identity_document_wire_ok(value: Any) -> bool:
    """{"document": <text as IMDS served it>, "signature": <base64>} (instance_identity.py verifies it);
    older agents sent the parsed document without a usable signature: accepted, and ignored."""
    if isinstance(value, dict) and isinstance(value.get("document"), dict):
        return set(value) <= {"document", "signature"} and len(str(value)) <= 4096
    return (isinstance(value, dict) and set(value) == {"document", "signature"}
            and isinstance(value["document"], str) and 0 < len(value["document"]) <= 4096
            and isinstance(value["signature"], str) and 0 < len(value["signature"]) <= 1024)


def signed_document(statement: Statement) -> tuple[str, str] | None:
    """(document text, signature) when the statement carries a document to verify; None otherwise."""
    value = statement.identity_document
    if isinstance(value, dict) and isinstance(value.get("document"), str):
        return value["document"], value["signature"]
    return None


def group_role(group: str | None, login_group: str, controller_group: str) -> str | None:
    if group == login_group:
        return "login"
    if group == controller_group:
        return "controller"
    return None


def precheck(statement: Statement, fingerprint: str, existing: Enrollment | None, approval: Approval | None,
             now: datetime) -> EnrollmentDecision | None:
    """What is decided before asking AWS (DescribeClusterNode): another key against a proven enrollment
    is refused whatever AWS says, so a flood of such attempts costs no SageMaker call."""
    if existing is None or existing.fingerprint == fingerprint or _approved(statement, fingerprint, approval):
        return None
    if existing.proven(now):
        return EnrollmentDecision("conflict", f"{statement.instance_id} is enrolled with another key, proven "
                                              f"({existing.via}); {fingerprint} refused", existing)
    return None


def decide_enrollment(statement: Statement, fingerprint: str, aws_node: dict | None, existing: Enrollment | None,
                      approval: Approval | None, now: datetime, cluster: str, login_group: str,
                      controller_group: str, window: timedelta, document: IdentityDocument | None = None,
                      region: str = "", documents_seen: bool = False) -> EnrollmentDecision:
    """Whether ``statement`` (already proven signed by its key, whose fingerprint is given) enrolls.
    ``document``: the statement's instance identity document, its signature already verified
    (instance_identity.verify), or None; ``documents_seen``: a verified document enrolled an agent of
    this cluster before."""
    if statement.cluster != cluster:
        return EnrollmentDecision("refuse", f"statement names cluster {statement.cluster}, this stack manages {cluster}")
    if abs((now - statement.issued_at).total_seconds()) > STATEMENT_SKEW_SECONDS:
        return EnrollmentDecision("refuse", f"statement issued {iso(statement.issued_at)}, more than "
                                            f"{STATEMENT_SKEW_SECONDS} s from now")
    early = precheck(statement, fingerprint, existing, approval, now)
    if early is not None:
        return early
    if aws_node is None:
        return EnrollmentDecision("refuse", f"{statement.instance_id} is not a node of cluster {cluster}")
    group = aws_node.get("InstanceGroupName")
    role = group_role(group, login_group, controller_group)
    if role is None:
        return EnrollmentDecision("refuse", f"{statement.instance_id} is not in the login or controller group: "
                                            "only their agents enroll")
    if (aws_node.get("InstanceStatus") or {}).get("Status") not in LIVE_STATUSES:
        return EnrollmentDecision("refuse", f"{statement.instance_id} is not Running or Pending")
    if aws_node.get("PrivatePrimaryIp") != statement.ip:
        return EnrollmentDecision("refuse", f"{statement.instance_id} is not at the IP the statement claims")
    document_problem = _document_problem(statement, document, aws_node, region)
    if document_problem:
        return EnrollmentDecision("refuse", document_problem)
    verified = document is not None
    in_window = _in_window(aws_node, now, window)
    launched = _launch_time(aws_node)
    record = Enrollment(cluster, statement.instance_id, statement.public_key, fingerprint, group, role, statement.ip,
                        ENROLLED, iso(now), DOCUMENT if verified else WINDOW,
                        window_ends_at=iso(launched + window) if launched else "",
                        expect_document=documents_seen or verified)
    if _approved(statement, fingerprint, approval):
        return EnrollmentDecision("re-enroll", f"operator approved {fingerprint} for {statement.instance_id}",
                                  replace(record, via=APPROVAL))
    if existing is not None:
        return _against_existing(statement, fingerprint, existing, record, verified, in_window)
    if not in_window:
        return EnrollmentDecision("await-approval", f"{statement.instance_id} was launched outside the "
                                                    f"{int(window.total_seconds() // 60)}-minute enrollment window: "
                                                    f"an operator must approve {fingerprint}")
    how = "with a verified instance identity document" if verified else "without an instance identity document"
    return EnrollmentDecision("enroll", f"{statement.instance_id} launched within the enrollment window, {how}", record)


def _approved(statement: Statement, fingerprint: str, approval: Approval | None) -> bool:
    return approval is not None and approval.instance_id == statement.instance_id and approval.fingerprint == fingerprint


def _against_existing(statement: Statement, fingerprint: str, existing: Enrollment, record: Enrollment, verified: bool,
                      in_window: bool) -> EnrollmentDecision:
    instance = statement.instance_id
    if existing.fingerprint == fingerprint:
        if existing.usable:
            return EnrollmentDecision("already", f"{instance} is enrolled with this key", existing)
        if verified and in_window:
            return EnrollmentDecision("displace", f"{instance}'s contest is settled: its instance identity document "
                                                  "verifies for this key", record)
        return EnrollmentDecision("conflict", f"{instance} is contested: an operator must re-enroll it", existing)
    if existing.via == DOCUMENT:
        return EnrollmentDecision("conflict", f"{instance} is enrolled with another key whose instance identity "
                                              f"document verified; {fingerprint} refused", existing)
    if verified and in_window:
        return EnrollmentDecision("displace", f"{instance}'s instance identity document verifies for {fingerprint}: "
                                              f"it replaces the unverified key {existing.fingerprint}", record)
    if in_window and existing.via == WINDOW:
        if fingerprint in existing.contested_by or len(existing.contested_by) >= MAX_CONTESTED_BY:
            return EnrollmentDecision("conflict", f"{instance} is already contested; {fingerprint} refused", existing)
        return EnrollmentDecision("contest", f"two keys presented themselves for new instance {instance} "
                                             f"({existing.fingerprint}, {fingerprint}) and neither with a verified "
                                             "instance identity document: kept out until an operator re-enrolls it",
                                  existing)
    return EnrollmentDecision("conflict", f"{instance} is enrolled with another key; {fingerprint} refused", existing)


def _launch_time(aws_node: dict) -> datetime | None:
    launched = aws_node.get("LaunchTime")
    if isinstance(launched, str):
        try:
            launched = parse_time(launched)
        except ValueError:
            return None
    if not isinstance(launched, datetime):
        return None
    return launched if launched.tzinfo is not None else launched.replace(tzinfo=timezone.utc)


def _in_window(aws_node: dict, now: datetime, window: timedelta) -> bool:
    launched = _launch_time(aws_node)
    if launched is None:
        return False
    return timedelta(0) - timedelta(seconds=STATEMENT_SKEW_SECONDS) <= now - launched <= window


def _document_problem(statement: Statement, document: IdentityDocument | None, aws_node: dict,
                      region: str) -> str | None:
    """A verified document must be this instance's, at this IP, in this stack's Region, started when AWS
    says it was launched. The account is not compared: HyperPod's instances run in a service account
    (UNCONFIRMED which one the document names)."""
    if document is None:
        return None
    if document.instance_id != statement.instance_id:
        return "the instance identity document is another instance's"
    if region and document.region != region:
        return "the instance identity document is from another Region"
    if document.private_ip != statement.ip:
        return "the instance identity document names another IP"
    launched = _launch_time(aws_node)
    if launched is None or abs(document.pending_time - launched) > PENDING_TIME_TOLERANCE:
        return "the instance identity document's pending time is not AWS's launch time for this instance"
    return None
