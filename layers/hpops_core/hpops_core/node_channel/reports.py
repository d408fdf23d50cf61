"""Node reports as they arrive from EventBridge: validated, checked against AWS, stored.

A report only says what a node claims to have applied. It never admits a node to the load
balancer (the verifier checks over the network for that); it tells the state machine when to
verify, and gives the signer a node's public host keys. So a report is accepted only from an
instance that DescribeClusterNode places in this cluster's login group at the IP it claims.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from hpops_core.common import validation
from hpops_core.common.errors import HpopsError, MalformedEventError
from hpops_core.node_channel import contract

# Checked with the validation rules and the regular expressions below rather than a pydantic model:
# pydantic alone would add half an `import boto3` to this function's cold start, and a report has
# a dozen flat fields. Every field is checked, unknown fields are refused, and an error names the
# fields, never their values.
_IP = re.compile(r"\A[0-9]{1,3}(\.[0-9]{1,3}){3}\Z")
_FINGERPRINT = re.compile(r"\ASHA256:[A-Za-z0-9+/]{43}\Z")
_KEY_TYPE = re.compile(r"\A[a-z0-9@.-]{3,64}\Z")
_PUBLIC_KEY = re.compile(r"\A[a-z0-9@.-]{3,64} [A-Za-z0-9+/=]{40,1024}\Z")
_VERSION = re.compile(r"\A[A-Za-z0-9:._-]{1,128}\Z")
_DIGEST = re.compile(r"\A[0-9a-f]{16}\Z")
_MAX_REASON = 300
_MAX_REPORTED_AT = 40
_MAX_KEYS = 8
_PUBLIC_KEY_TYPES = ("ed25519", "ecdsa", "rsa")


class MalformedNodeReport(MalformedEventError):
    """A node report that is not what the agent sends. Nothing was recorded."""


class NodeReportRejected(HpopsError):
    """A well-formed report from an instance that is not one of this cluster's login nodes at that IP."""


@dataclass(frozen=True)
class HostIdentityReport:
    mode: str
    result: str
    version: str | None = None
    reason: str = ""
    fingerprints: dict[str, str] = field(default_factory=dict)
    publicKeys: dict[str, str] = field(default_factory=dict)
    certificateVersion: int | None = None
    certificateDigest: str | None = None


@dataclass(frozen=True)
class LoginLimitsReport:
    result: str
    version: str | None = None
    reason: str = ""


@dataclass(frozen=True)
class UserCapsReport:
    result: str
    reason: str = ""
    atCap: tuple | None = None  # [{"user", "caps": ["cpu"|"memory"|"tasks"]}]: who reached a cap since the last poll


@dataclass(frozen=True)
class ImdsReport:
    """Whether a non-root process on the node reached IMDS (the node's role) when the agent last probed."""

    nonRoot: str
    lockdown: str
    reason: str = ""


@dataclass(frozen=True)
class SshKeepaliveReport:
    """sshd's keepalives as the agent set them under the listener's idle timeout (sshd_keepalive.py)."""

    result: str
    reason: str = ""
    clientAliveInterval: int | None = None
    clientAliveCountMax: int | None = None
    idleTimeoutSeconds: int | None = None


@dataclass(frozen=True)
class LoadReport:
    """The node's pressure stall information (PSI avg60, percent) and load average (node_load.py).
    The PSI figures are absent on a kernel without PSI; `reason` then says so."""

    cpuSome60: float | None = None
    memorySome60: float | None = None
    memoryFull60: float | None = None
    load1: float | None = None
    cpus: int | None = None
    reason: str = ""


@dataclass(frozen=True)
class SessionsReport:
    """The node's interactive sessions (contract: "sessions"); each entry already validated."""

    list: tuple = ()
    omitted: int = 0
    ended: tuple = ()
    omittedByUser: dict | None = None  # user -> SSH sessions counted but not listed (a busy node)


@dataclass(frozen=True)
class NodeReport:
    format: str
    cluster: str
    instanceId: str
    ip: str
    role: str
    agentVersion: str
    reportedAt: str
    trigger: str
    hostIdentity: HostIdentityReport | None = None
    loginLimits: LoginLimitsReport | None = None
    sessions: SessionsReport | None = None
    userCaps: UserCapsReport | None = None
    imds: ImdsReport | None = None
    sshKeepalive: SshKeepaliveReport | None = None
    load: LoadReport | None = None

    def to_json(self) -> str:
        """The report as stored: fields that are None left out, no blanks (DynamoDB bills items by the KB)."""
        return json.dumps(_without_none(asdict(self)), sort_keys=True, separators=(",", ":"))


def _without_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    return value


def _matching(rule: re.Pattern[str]) -> Any:
    return lambda value: isinstance(value, str) and rule.match(value) is not None


def _host_identity(data: Any, bad: list[str]) -> HostIdentityReport | None:
    if data is None:
        return None
    f = validation.JsonFields(data, "hostIdentity", tuple(HostIdentityReport.__dataclass_fields__), bad)
    return HostIdentityReport(
        mode=f.one_of("mode", contract.MODES),
        result=f.one_of("result", contract.RESULTS),
        version=f.text("version", _VERSION, nullable=True, required=False),
        reason=f.short("reason", _MAX_REASON, default="", required=False),
        fingerprints=f.mapping("fingerprints", _matching(_KEY_TYPE), _matching(_FINGERPRINT), _MAX_KEYS),
        publicKeys=f.mapping("publicKeys", lambda k: k in _PUBLIC_KEY_TYPES, _matching(_PUBLIC_KEY), _MAX_KEYS),
        certificateVersion=f.get("certificateVersion", lambda v: v is None or (type(v) is int and v >= 1),
                                 required=False),
        certificateDigest=f.text("certificateDigest", _DIGEST, nullable=True, required=False),
    )


def _login_limits(data: Any, bad: list[str]) -> LoginLimitsReport | None:
    if data is None:
        return None
    f = validation.JsonFields(data, "loginLimits", tuple(LoginLimitsReport.__dataclass_fields__), bad)
    return LoginLimitsReport(
        result=f.one_of("result", contract.RESULTS),
        version=f.text("version", _VERSION, nullable=True, required=False),
        reason=f.short("reason", _MAX_REASON, default="", required=False),
    )


_MAX_AT_CAP = 50
_CAPS = ("cpu", "memory", "tasks")
_STARTED_AT = re.compile(r"\A[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z\Z")
_SSM_SESSION_ID = re.compile(r"\A[A-Za-z0-9._@+=-]{1,96}\Z")


def _session_entry(entry: Any, where: str, bad: list[str]) -> dict:
    f = validation.JsonFields(entry, where, ("handle", "user", "path", "tty", "startedAt", "sessionId"), bad)
    checked = {
        "handle": f.text("handle", contract.SESSION_HANDLE_RE),
        "user": f.get("user", validation.is_limited_user),  # root is never reported: never limited
        "path": f.one_of("path", contract.SESSION_PATHS),
        "tty": f.boolean("tty"),
        "startedAt": f.text("startedAt", _STARTED_AT),
    }
    if checked["path"] == "ssm":
        checked["sessionId"] = f.text("sessionId", _SSM_SESSION_ID)
    elif "sessionId" in f.data:
        bad.append(f"{where}.sessionId")
    return checked


def _ended_entry(entry: Any, where: str, bad: list[str]) -> dict:
    f = validation.JsonFields(entry, where, ("handle", "user", "result", "reason"), bad)
    return {"handle": f.text("handle", contract.SESSION_HANDLE_RE), "user": f.get("user", validation.is_limited_user),
            "result": f.one_of("result", contract.END_RESULTS), "reason": f.short("reason", _MAX_REASON)}


def _sessions(data: Any, bad: list[str]) -> SessionsReport | None:
    if data is None:
        return None
    f = validation.JsonFields(data, "sessions", ("list", "omitted", "ended", "omittedByUser"), bad)
    listed = f.get("list", lambda v: isinstance(v, list) and len(v) <= contract.MAX_REPORTED_SESSIONS, default=[])
    ended = f.get("ended", lambda v: isinstance(v, list) and len(v) <= contract.MAX_END_SESSIONS, default=[],
                  required=False)
    entries = tuple(_session_entry(e, "sessions.list[]", bad) for e in listed)
    if len({e["handle"] for e in entries}) != len(entries):
        bad.append("sessions.list[].handle")  # one session listed twice would count twice
    return SessionsReport(
        list=entries,
        omitted=f.count("omitted", 1_000_000, default=0, required=False),
        ended=tuple(_ended_entry(e, "sessions.ended[]", bad) for e in ended),
        omittedByUser=f.get("omittedByUser", _omitted_by_user, default=None, required=False) or None,
    )


def _omitted_by_user(value: Any) -> bool:
    return isinstance(value, dict) and len(value) <= contract.MAX_OMITTED_USERS and all(
        validation.is_limited_user(user) and type(count) is int and 0 < count <= 1_000_000
        for user, count in value.items())


def _user_caps(data: Any, bad: list[str]) -> UserCapsReport | None:
    if data is None:
        return None
    f = validation.JsonFields(data, "userCaps", tuple(UserCapsReport.__dataclass_fields__), bad)

    def at_cap(value: Any) -> bool:
        return isinstance(value, list) and len(value) <= _MAX_AT_CAP and all(
            isinstance(e, dict) and set(e) == {"user", "caps"} and validation.is_limited_user(e["user"])
            and isinstance(e["caps"], list) and 0 < len(e["caps"]) <= 3 and all(c in _CAPS for c in e["caps"])
            for e in value)

    return UserCapsReport(result=f.one_of("result", contract.RESULTS),
                          reason=f.short("reason", _MAX_REASON, default="", required=False),
                          atCap=tuple(f.get("atCap", at_cap, default=[], required=False)) or None)


def imds_section(data: Any, bad: list[str]) -> ImdsReport | None:
    """The "imds" section of a login or controller report (None when absent); field names appended to `bad`."""
    if data is None:
        return None
    f = validation.JsonFields(data, "imds", tuple(ImdsReport.__dataclass_fields__), bad)
    return ImdsReport(nonRoot=f.one_of("nonRoot", contract.IMDS_PROBE_RESULTS),
                      lockdown=f.one_of("lockdown", contract.IMDS_LOCKDOWN_VALUES),
                      reason=f.short("reason", _MAX_REASON, default="", required=False))


def _ssh_keepalive(data: Any, bad: list[str]) -> SshKeepaliveReport | None:
    if data is None:
        return None
    f = validation.JsonFields(data, "sshKeepalive", tuple(SshKeepaliveReport.__dataclass_fields__), bad)
    return SshKeepaliveReport(result=f.one_of("result", contract.RESULTS),
                              reason=f.short("reason", _MAX_REASON, default="", required=False),
                              clientAliveInterval=f.count("clientAliveInterval", 6000, default=None, required=False),
                              clientAliveCountMax=f.count("clientAliveCountMax", 100, default=None, required=False),
                              idleTimeoutSeconds=f.count("idleTimeoutSeconds", 6000, default=None, required=False))


def _percent(value: Any) -> bool:
    return type(value) in (int, float) and 0 <= value <= 100


def _load(data: Any, bad: list[str]) -> LoadReport | None:
    if data is None:
        return None
    f = validation.JsonFields(data, "load", tuple(LoadReport.__dataclass_fields__), bad)
    psi = [f.get(name, _percent, default=None, required=False) for name in ("cpuSome60", "memorySome60", "memoryFull60")]
    if len({value is None for value in psi}) > 1:
        bad.append("load.cpuSome60")  # all three PSI figures or none: a half section cannot be compared
    return LoadReport(*psi,
                      load1=f.get("load1", lambda v: type(v) in (int, float) and 0 <= v <= 1e6, default=None,
                                  required=False),
                      cpus=f.get("cpus", lambda v: type(v) is int and 1 <= v <= 4096, default=None, required=False),
                      reason=f.short("reason", _MAX_REASON, default="", required=False))


def _report(detail: Any, bad: list[str]) -> NodeReport:
    f = validation.JsonFields(detail, "", tuple(NodeReport.__dataclass_fields__), bad)
    return NodeReport(
        format=f.one_of("format", (contract.REPORT_FORMAT,)),
        cluster=f.get("cluster", validation.is_cluster_name),
        instanceId=f.get("instanceId", validation.is_instance_id),
        ip=f.text("ip", _IP),
        role=f.one_of("role", contract.ROLES),
        agentVersion=f.text("agentVersion", _VERSION),
        reportedAt=f.short("reportedAt", _MAX_REPORTED_AT),
        trigger=f.one_of("trigger", contract.TRIGGERS),
        hostIdentity=_host_identity(f.data.get("hostIdentity"), bad),
        loginLimits=_login_limits(f.data.get("loginLimits"), bad),
        sessions=_sessions(f.data.get("sessions"), bad),
        userCaps=_user_caps(f.data.get("userCaps"), bad),
        imds=imds_section(f.data.get("imds"), bad),
        sshKeepalive=_ssh_keepalive(f.data.get("sshKeepalive"), bad),
        load=_load(f.data.get("load"), bad),
    )


def parse_report_event(event: Any) -> NodeReport:
    """The EventBridge event -> its validated report; anything else is a MalformedNodeReport."""
    if not isinstance(event, dict) or len(json.dumps(event, default=str)) > contract.MAX_REPORT_BYTES + 4096:
        raise MalformedNodeReport("expected an EventBridge event of a size a node report has")
    bad: list[str] = []
    if event.get("source") != contract.REPORT_SOURCE:
        bad.append("source")
    if event.get("detail-type") != contract.REPORT_DETAIL_TYPE:
        bad.append("detail-type")
    report = _report(event.get("detail"), bad)
    if bad:
        fields = sorted(set(bad))[:5]
        raise MalformedNodeReport(f"node report rejected; invalid field(s): {', '.join(fields)}")
    return report


@dataclass(frozen=True)
class ReportCheck:
    accepted: bool
    reason: str


def check_report_origin(report: NodeReport, cluster: str, login_group: str, node: dict | None) -> ReportCheck:
    """Pure: does AWS's own record of the instance (DescribeClusterNode's NodeDetails) back the report?"""
    if report.cluster != cluster:
        return ReportCheck(False, f"report names cluster {report.cluster}, this stack manages {cluster}")
    if node is None:
        return ReportCheck(False, f"{report.instanceId} is not a node of cluster {cluster}")
    if node.get("InstanceGroupName") != login_group:
        return ReportCheck(False, f"{report.instanceId} is in group {node.get('InstanceGroupName')}, not {login_group}")
    if node.get("PrivatePrimaryIp") != report.ip:
        return ReportCheck(False, f"{report.instanceId} reported IP {report.ip}, AWS says {node.get('PrivatePrimaryIp')}")
    if report.role != "login":
        return ReportCheck(False, f"{report.instanceId} reported role {report.role} from the login group")
    return ReportCheck(True, "report matches the cluster's record of the node")
