"""Names and document shapes shared by the stack and the node agent (standard library, Python 3.8+).

Desired state (written by the stack, read by the agent with the instance group's execution role):

  /hpops/<cluster>/node/host-identity        {"format": HOST_IDENTITY_FORMAT, "mode": "keys"|"certificate"|"off",
                                              "version": str, "secretArn": str (keys),
                                              "fingerprints": {key type: "SHA256:..."} (keys),
                                              "caFingerprint": "SHA256:..." (certificate)}
  /hpops/<cluster>/node/login-limits         {"format": LOGIN_LIMITS_FORMAT, "version": str,
                                              "limits": {"default": int, "overrides": {user: int}, "exempt": [user]}}
  /hpops/<cluster>/host-certificates/<id>    the node's certificate bundle (public), written by the signer

Host private keys stay in Secrets Manager: the parameter names the secret and the fingerprints the
node must end up presenting, never key material.

Report (sent by the agent with events:PutEvents to the stack's bus):

  Source REPORT_SOURCE, DetailType REPORT_DETAIL_TYPE, Detail:
  {"format": REPORT_FORMAT, "cluster": str, "instanceId": str, "ip": str, "role": "login",
   "agentVersion": str, "reportedAt": ISO-8601, "trigger": "start"|"change"|"heartbeat",
   "hostIdentity": {"mode": str, "version": str|null, "result": "changed"|"unchanged"|"failed"|"waiting",
                    "reason": str, "fingerprints": {key type: "SHA256:..."},
                    "publicKeys": {key type: "<type> <base64>"} (certificate mode),
                    "certificateVersion": int|null, "certificateDigest": str|null (certificate mode:
                    the SSM parameter version and the digest of the bundle last installed)},
   "loginLimits": {"version": str|null, "result": str, "reason": str}}

Everything in a report is public: versions, fingerprints, public keys, short reasons.
"""

from __future__ import annotations

import hashlib

# Relative, so it resolves to hpops_core.common.validation in the layer and in the lifecycle bundle alike.
from hpops_core.common import validation

HOST_IDENTITY_FORMAT = "hpops.node.host-identity.v1"
LOGIN_LIMITS_FORMAT = "hpops.node.login-limits.v1"
REPORT_FORMAT = "hpops.node.report.v1"
REPORT_SOURCE = "hpops.node"
REPORT_DETAIL_TYPE = "HyperPod Login Node Report"
MAX_REPORT_BYTES = 16 * 1024  # far below EventBridge's 256 KB entry limit; reports are small by design

MODES = ("keys", "certificate", "off")
RESULTS = ("changed", "unchanged", "failed", "waiting")
TRIGGERS = ("start", "change", "heartbeat")
ROLES = ("login", "controller", "compute")

DEFAULT_POLL_SECONDS = 30
DEFAULT_HEARTBEAT_SECONDS = 600


# The only parameter paths either side reads or writes; names come from a validated cluster name.
def _cluster(cluster: str) -> str:
    if not validation.is_cluster_name(cluster):
        raise ValueError("cluster name is not a HyperPod cluster name")
    return cluster


def certificate_digest(bundle_text: str) -> str:
    """Names one certificate bundle exactly: what the signer wrote is what the node reports installed.

    Not the parameter version: the stack deletes a node's parameter once installed, and SSM
    numbers a re-created parameter from 1 again."""
    return hashlib.sha256(bundle_text.encode("utf-8")).hexdigest()[:16]


def parameter_prefix(cluster: str) -> str:
    return "/hpops/%s/" % _cluster(cluster)


def host_identity_parameter(cluster: str) -> str:
    return parameter_prefix(cluster) + "node/host-identity"


def login_limits_parameter(cluster: str) -> str:
    return parameter_prefix(cluster) + "node/login-limits"


def check_instance_id(instance_id: object, what: str = "instance id") -> str:
    """The id a node names itself by (parameter paths); ValueError naming `what` otherwise.

    The event rule, not botocore's: safe in a parameter path, and a node whose id AWS spells
    differently (as its own event examples do) still gets its certificate."""
    return validation.check_event_instance_id(instance_id, what)


def certificate_parameter(cluster: str, instance_id: str) -> str:
    return parameter_prefix(cluster) + "host-certificates/" + check_instance_id(instance_id)
