"""Certificate mode: every login node keeps its own host keys and presents host certificates
signed by one CA, so users trust a single ``@cert-authority`` line.

Per node the flow is: the node agent reports its public host keys (EventBridge, from an instance
AWS places in the login group at that IP) -> the signer certifies those keys, and only if the
verifier saw the very same keys presented at the node's IP -> the certificate bundle (public)
waits in a per-node SSM parameter -> the agent installs it -> the verifier checks over the
network what the node now presents. Only the signer Lambda reads the CA private key.

Decisions here are pure (time is an input); reading the network is verifier.py's job.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Union

from .keys import KEY_TYPES, HostCA, HostCertificateBundle, HostIdentityError, certify_host_keys, fingerprint, public_key_blob

if TYPE_CHECKING:  # verifier.py imports paramiko: only the functions that read the network load it
    from .verifier import PresentedHostCertificate, VerificationResult

# Clock skew between the signer and the nodes must not make a fresh certificate "not yet valid".
BACKDATE = timedelta(minutes=5)


class NodeKeyReportInvalid(HostIdentityError):
    """The node's report of its own public host keys is missing or malformed."""


class CertificatePolicyError(HostIdentityError):
    """Certificate mode is configured in a way that cannot produce usable certificates."""


@dataclass(frozen=True)
class CertificatePolicy:
    """What every login node's certificates must say (from the stack's parameters)."""

    principals: tuple[str, ...]  # the names users type: the NLB DNS name, DNS aliases
    validity: timedelta
    renew_before: timedelta  # re-sign when a certificate expires sooner than this

    def __post_init__(self) -> None:
        if not self.principals:
            raise CertificatePolicyError(
                "no certificate principals: set HostCertificatePrincipals (or let the stack create the load balancer)"
            )
        if self.renew_before >= self.validity:
            raise CertificatePolicyError("renewal window must be shorter than the certificate validity")

    @classmethod
    def from_strings(cls, principals: str, validity_days: int, renew_days: int) -> CertificatePolicy:
        names = tuple(dict.fromkeys(p.strip() for p in principals.split(",") if p.strip()))
        bad = [p for p in names if not _principal_ok(p)]
        if bad:
            raise CertificatePolicyError(f"invalid certificate principal(s): {', '.join(repr(p)[:80] for p in bad)}")
        return cls(names, timedelta(days=validity_days), timedelta(days=renew_days))

    def principals_for(self, node_ip: str) -> list[str]:
        """The shared names plus the node's own IP (for users who reach one node directly)."""
        return list(dict.fromkeys([*self.principals, node_ip]))


def _principal_ok(name: str) -> bool:
    return bool(re.fullmatch(r"[A-Za-z0-9*?][A-Za-z0-9.*?:-]{0,252}", name))


def reported_public_keys(report: Mapping | None) -> dict[str, str]:
    """Short key name -> public line, from the node agent's latest report (certificate mode)."""
    identity = (report or {}).get("hostIdentity") or {}
    if identity.get("mode") != "certificate" or not identity.get("publicKeys"):
        raise NodeKeyReportInvalid("the node has not reported its public host keys")
    return _validated_keys(identity["publicKeys"])


def keys_seen_on_network(reported: Mapping[str, str], seen: Mapping[str, str] | None) -> dict[str, str]:
    """The reported keys, provided the verifier saw each one presented at the node's own IP.

    A report is the node's claim; the network read is what clients will meet. The CA vouches for
    a key only when both agree, so neither a forged report nor whoever answers at an IP alone
    can get a key certified.
    """
    seen = dict(seen or {})
    if not seen:
        raise NodeKeyReportInvalid("the verifier saw no host keys at the node's IP")
    for name, line in reported.items():
        key_type = line.split()[0]
        if seen.get(key_type) != fingerprint(line):
            raise NodeKeyReportInvalid(f"{name}: the reported key is not the one presented at the node's IP")
    return dict(reported)


def _validated_keys(keys: object) -> dict[str, str]:
    if not isinstance(keys, dict) or not keys:
        raise NodeKeyReportInvalid("public_keys must be a non-empty object")
    validated = {}
    for name, line in keys.items():
        if name not in KEY_TYPES or not isinstance(line, str):
            raise NodeKeyReportInvalid(f"unexpected key entry {str(name)[:20]!r}")
        parts = line.split()
        try:
            public_key_blob(line)
        except HostIdentityError:
            raise NodeKeyReportInvalid(f"{name}: public key line does not parse") from None
        if parts[0] != KEY_TYPES[name]:
            raise NodeKeyReportInvalid(f"{name}: reported a {parts[0][:40]} key")
        validated[name] = f"{parts[0]} {parts[1]}"
    return validated


def issue_certificates(ca: HostCA, public_lines: Mapping[str, str], policy: CertificatePolicy, cluster: str,
                       instance_id: str, node_ip: str, now: datetime) -> HostCertificateBundle:
    """Certify exactly the keys the node reported, for the shared names and the node's IP."""
    return certify_host_keys(
        ca, public_lines, policy.principals_for(node_ip), key_id=f"hpops:{cluster}/{instance_id}",
        valid_after=now - BACKDATE, valid_before=now + policy.validity,
    )


# --------------------------------------------------------------------------- verification (pure)

# What a node presents for one key type: its plain key line and its certificate (or why none).
CertificateReading = Union["PresentedHostCertificate", HostIdentityError]


def judge_certificates(ca_fingerprint: str, policy: CertificatePolicy, node_ip: str,
                       plain_keys: Mapping[str, str], certificates: Mapping[str, CertificateReading],
                       now: datetime) -> VerificationResult:
    """Would every ``@cert-authority`` client accept every host key this node presents, for a while yet?

    ``plain_keys``: key type -> public line the node presents; ``certificates``: key type ->
    what it presents under the matching ``-cert-v01`` algorithm. A presented key without a good
    certificate fails the node: a client negotiating that key type would see an unknown key.
    """
    if not plain_keys:
        return _result(False, False, "the node presents no host keys", plain_keys, ca_fingerprint)
    problems, renewals, expires = [], [], []
    for key_type in sorted(plain_keys):
        reading = certificates.get(key_type)
        if reading is None or isinstance(reading, HostIdentityError):
            problems.append(f"{key_type}: no certificate ({reading})" if reading else f"{key_type}: no certificate")
        elif reading.host_key_fingerprint != fingerprint(plain_keys[key_type]):
            problems.append(f"{key_type}: certificate is for another key")
        elif reading.ca_fingerprint != ca_fingerprint:
            problems.append(f"{key_type}: signed by {reading.ca_fingerprint}, expected CA {ca_fingerprint}")
        elif missing := [p for p in policy.principals_for(node_ip) if p not in reading.principals]:
            problems.append(f"{key_type}: certificate lacks principal(s) {', '.join(missing)}")
        elif not reading.is_valid_at(now):
            problems.append(f"{key_type}: certificate not valid now")
        elif reading.valid_before - now < policy.renew_before:
            # Still accepted by clients: a failed renewal must not take the node out of service.
            renewals.append(f"{key_type}: certificate expires {reading.valid_before.isoformat()}, renewal due")
        else:
            expires.append(reading.valid_before)
    if problems or renewals:
        return _result(False, not problems, "; ".join(problems + renewals), plain_keys, ca_fingerprint)
    return _result(True, True, f"all {len(plain_keys)} host keys carry certificates from the CA, valid until "
                               f"{min(expires).date().isoformat()}", plain_keys, ca_fingerprint)


def _result(ok: bool, acceptable: bool, reason: str, plain_keys: Mapping[str, str], ca_fingerprint: str) -> VerificationResult:
    from .verifier import VerificationResult

    presented = {key_type: fingerprint(line) for key_type, line in plain_keys.items()}
    return VerificationResult(ok=ok, reason=reason, presented=presented, expected={"ca": ca_fingerprint},
                              acceptable=acceptable)


def verify_node_certificates(host: str, port: int, ca_fingerprint: str, policy: CertificatePolicy, now: datetime,
                             read_keys: Callable[..., dict[str, str]], read_certificate: Callable[..., PresentedHostCertificate],
                             key_types: Iterable[str] = tuple(KEY_TYPES.values()), timeout: float = 5.0) -> VerificationResult:
    """Read what the node presents (plain keys, then one certificate handshake per key type) and judge it.

    The readers are verifier.read_presented_public_keys / read_presented_host_certificate; they raise
    HostUnreachable when the node cannot be reached, which callers report as "retry later".
    """
    from .verifier import HostUnreachable

    plain = read_keys(host, port, timeout=timeout)
    plain = {t: line for t, line in plain.items() if t in set(key_types)}
    readings: dict[str, CertificateReading] = {}
    for key_type in plain:
        try:
            readings[key_type] = read_certificate(host, port, key_type, timeout=timeout)
        except HostUnreachable:
            raise
        except HostIdentityError as error:  # missing or invalid certificate: a verdict, not an outage
            readings[key_type] = error
    return judge_certificates(ca_fingerprint, policy, host, plain, readings, now)
