"""Node reports as they arrive from EventBridge: validated, checked against AWS, stored.

A report only says what a node claims to have applied. It never admits a node to the load
balancer (the verifier checks over the network for that); it tells the state machine when to
verify, and gives the signer a node's public host keys. So a report is accepted only from an
instance that DescribeClusterNode places in this cluster's login group at the IP it claims.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from hpops_core.common import validation
from hpops_core.common.errors import HpopsError, MalformedEventError
from hpops_core.node_channel import contract

ClusterNameStr = Annotated[str, StringConstraints(pattern=validation.anchored(validation.CLUSTER_NAME_PATTERN))]
# Reports come from our agent, which reads its id from the node, and the id goes to
# DescribeClusterNode: botocore's rule, stricter than an event hint.
InstanceIdStr = Annotated[str, StringConstraints(pattern=validation.anchored(validation.INSTANCE_ID_PATTERN))]
IpStr = Annotated[str, StringConstraints(pattern=r"^[0-9]{1,3}(\.[0-9]{1,3}){3}$")]
FingerprintStr = Annotated[str, StringConstraints(pattern=r"^SHA256:[A-Za-z0-9+/]{43}$")]
KeyTypeStr = Annotated[str, StringConstraints(pattern=r"^[a-z0-9@.-]{3,64}$")]
PublicKeyStr = Annotated[str, StringConstraints(pattern=r"^[a-z0-9@.-]{3,64} [A-Za-z0-9+/=]{40,1024}$")]
VersionStr = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9:._-]{1,128}$")]
ReasonStr = Annotated[str, StringConstraints(max_length=300)]


class MalformedNodeReport(MalformedEventError):
    """A node report that is not what the agent sends. Nothing was recorded."""


class NodeReportRejected(HpopsError):
    """A well-formed report from an instance that is not one of this cluster's login nodes at that IP."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class HostIdentityReport(_Strict):
    mode: Literal["keys", "certificate", "off"]
    version: VersionStr | None = None
    result: Literal["changed", "unchanged", "failed", "waiting"]
    reason: ReasonStr = ""
    fingerprints: dict[KeyTypeStr, FingerprintStr] = Field(default_factory=dict, max_length=8)
    publicKeys: dict[Literal["ed25519", "ecdsa", "rsa"], PublicKeyStr] = Field(default_factory=dict, max_length=8)
    certificateVersion: int | None = Field(default=None, ge=1)
    certificateDigest: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{16}$")] | None = None


class LoginLimitsReport(_Strict):
    version: VersionStr | None = None
    result: Literal["changed", "unchanged", "failed", "waiting"]
    reason: ReasonStr = ""


class NodeReport(_Strict):
    format: Literal["hpops.node.report.v1"]
    cluster: ClusterNameStr
    instanceId: InstanceIdStr
    ip: IpStr
    role: Literal["login", "controller", "compute"]
    agentVersion: VersionStr
    reportedAt: Annotated[str, StringConstraints(max_length=40)]
    trigger: Literal["start", "change", "heartbeat"]
    hostIdentity: HostIdentityReport | None = None
    loginLimits: LoginLimitsReport | None = None


class NodeReportEvent(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    source: Literal["hpops.node"]
    detail_type: Literal["HyperPod Login Node Report"] = Field(alias="detail-type")
    detail: NodeReport


assert contract.REPORT_SOURCE == "hpops.node" and contract.REPORT_DETAIL_TYPE == "HyperPod Login Node Report"
assert contract.REPORT_FORMAT == "hpops.node.report.v1"


def parse_report_event(event: Any) -> NodeReport:
    """The EventBridge event -> its validated report; anything else is a MalformedNodeReport."""
    if not isinstance(event, dict) or len(json.dumps(event, default=str)) > contract.MAX_REPORT_BYTES + 4096:
        raise MalformedNodeReport("expected an EventBridge event of a size a node report has")
    try:
        return NodeReportEvent.model_validate(event).detail
    except ValidationError as error:
        fields = sorted({".".join(str(p) for p in e["loc"]) for e in error.errors()})[:5]
        raise MalformedNodeReport(f"node report rejected; invalid field(s): {', '.join(fields)}") from None


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
