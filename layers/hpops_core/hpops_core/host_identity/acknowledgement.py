"""Has a node acknowledged what the state machine is waiting for? A pure decision with a reason.

The LoginNodeSync map waits in an ASL Wait loop (bounded there) and asks this after each wait:

  phase "collect"  certificate mode: the node has reported its own public host keys;
  phase "install"  keys mode: the node reports presenting exactly the canonical fingerprints;
                   certificate mode: the node reports it installed the very bundle the signer
                   wrote (its digest).

A node that reports a failure after the wait began ends the wait early with the node's own reason.
The verdict never admits a node; VerifyAfterPush does that over the network.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hpops_core.host_identity.identity_record import (
    HostIdentityNotConfigured,
    expected_ca_fingerprint,
    expected_fingerprints,
)

NO_AGENT_HINT = ("no report from the node agent yet: is hpops-node-agent installed by the lifecycle script "
                 "and is the node's role allowed the NodeAgentPolicy?")


@dataclass(frozen=True)
class AckVerdict:
    acknowledged: bool
    finished: bool  # stop waiting (acknowledged, or the node reported a failure)
    reason: str

    def to_state(self) -> dict:
        return {"acknowledged": self.acknowledged, "finished": self.finished, "reason": self.reason}


def judge_acknowledgement(mode: str, report: Mapping[str, Any] | None, phase: str, expected: Mapping[str, Any] | None,
                          certificate_digest: str | None, waiting_since: str) -> AckVerdict:
    try:
        # Nothing published yet: no agent can converge, so waiting would only delay the reason.
        expected_ca_fingerprint(expected) if mode == "certificate" else expected_fingerprints(expected)
    except HostIdentityNotConfigured as error:
        return AckVerdict(False, True, str(error))
    if report is None:
        return AckVerdict(False, False, NO_AGENT_HINT)
    identity = report.get("hostIdentity") or {}
    received = str(report.get("receivedAt") or "")
    failed_since_wait = identity.get("result") == "failed" and received >= waiting_since
    if phase == "collect":
        if identity.get("mode") == "certificate" and identity.get("publicKeys"):
            return AckVerdict(True, True, f"node reported {len(identity['publicKeys'])} public host keys")
        return AckVerdict(False, False, "waiting for the node to report its public host keys (certificate mode)")
    if phase != "install":
        raise ValueError("phase must be collect or install")
    if (expected or {}).get("mode") == "certificate":
        if certificate_digest is not None and identity.get("certificateDigest") == certificate_digest:
            return AckVerdict(True, True, f"node installed the certificates signed for it ({certificate_digest})")
        if failed_since_wait:
            return AckVerdict(False, True, f"node failed to install its certificates: {identity.get('reason', '')}")
        return AckVerdict(False, False, f"waiting for the node to install the certificates signed for it ({certificate_digest})")
    wanted = dict((expected or {}).get("fingerprints") or {})
    if wanted and dict(identity.get("fingerprints") or {}) == wanted:
        return AckVerdict(True, True, "node reports presenting the canonical host keys")
    if failed_since_wait:
        return AckVerdict(False, True, f"node failed to install the canonical host keys: {identity.get('reason', '')}")
    return AckVerdict(False, False, f"waiting for the node to install the canonical host keys ({identity.get('reason') or 'no change reported yet'})")
