"""Read the SSH host identity a node actually presents on the network.

The verifier Lambda runs inside the VPC and registers a login node in the NLB
target group only when the node presents the canonical identity. It performs
SSH key exchanges only and never authenticates: one handshake per host key
algorithm, each restricted to that algorithm, so a node cannot hide a wrong
key of one type behind a correct key of another.

Certificate mode: paramiko's client negotiates the ``*-cert-v01@openssh.com``
host key algorithms (listed in ``Transport._key_info`` in 3.5 and 5.1) and
verifies the key-exchange signature with the certified key. It does not check
the CA signature; that and the certificate fields are checked here with
``cryptography``. No ssh-keyscan fallback is needed.
"""

from __future__ import annotations

import base64
import socket
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Mapping

import paramiko
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from paramiko.ssh_exception import IncompatiblePeer

from .keys import HostIdentityError, fingerprint, public_key_blob

DEFAULT_KEY_TYPES = ("ssh-ed25519", "ecdsa-sha2-nistp256", "rsa-sha2-512")

# Key type (as in a .pub line) -> host key algorithm to negotiate. RSA keys are
# only ever offered with SHA-2 signatures; OpenSSH >= 8.8 refuses ssh-rsa (SHA-1).
_ALGORITHM_FOR_KEY_TYPE = {
    "ssh-ed25519": "ssh-ed25519",
    "ecdsa-sha2-nistp256": "ecdsa-sha2-nistp256",
    "ssh-rsa": "rsa-sha2-512",
}
_CERTIFICATE_ALGORITHM_FOR_KEY_TYPE = {
    "ssh-ed25519": "ssh-ed25519-cert-v01@openssh.com",
    "ecdsa-sha2-nistp256": "ecdsa-sha2-nistp256-cert-v01@openssh.com",
    "ssh-rsa": "rsa-sha2-512-cert-v01@openssh.com",
}


class HostUnreachable(HostIdentityError):
    """No SSH handshake could be completed with the node (refused, timeout, reset)."""


class HostCertificateMissing(HostIdentityError):
    """The node does not offer a host certificate for the requested key type."""


class InvalidHostCertificate(HostIdentityError):
    """The node offers a certificate that is not a correctly signed host certificate."""


@dataclass(frozen=True)
class VerificationResult:
    ok: bool
    reason: str
    presented: Mapping[str, str]
    expected: Mapping[str, str]
    # Clients accept the node right now, even if not ok (certificate mode: only renewal is due).
    acceptable: bool = False


@dataclass(frozen=True)
class PresentedHostCertificate:
    key_type: str  # of the certified host key, e.g. ssh-ed25519
    host_key_fingerprint: str
    ca_fingerprint: str
    key_id: str
    serial: int
    principals: tuple[str, ...]
    valid_after: datetime
    valid_before: datetime

    def is_valid_at(self, moment: datetime) -> bool:
        return self.valid_after <= moment < self.valid_before


# --------------------------------------------------------------------------- plain host keys


def read_presented_public_keys(
    host: str, port: int, key_types: tuple[str, ...] = DEFAULT_KEY_TYPES, timeout: float = 5.0
) -> dict[str, str]:
    """Key type -> public key line of each host key the node presents.

    ``key_types`` are host key algorithms; results are keyed by the key's own
    type (rsa-sha2-512 reports under ``ssh-rsa``) so they compare directly with
    ``HostKeyBundle.public_fingerprints()``. Algorithms the node does not offer
    are left out. Raises ``HostUnreachable`` when no handshake completes.
    """
    presented: dict[str, str] = {}
    for algorithm in key_types:
        key = _handshake_host_key(host, port, algorithm, timeout)
        if key is not None:
            presented[key.get_name()] = f"{key.get_name()} {key.get_base64()}"
    return presented


def read_presented_host_keys(
    host: str, port: int, key_types: tuple[str, ...] = DEFAULT_KEY_TYPES, timeout: float = 5.0
) -> dict[str, str]:
    """Key type -> SHA256 fingerprint of each host key the node presents."""
    lines = read_presented_public_keys(host, port, key_types, timeout)
    return {key_type: fingerprint(line) for key_type, line in lines.items()}


def compare_fingerprints(expected: Mapping[str, str], presented: Mapping[str, str]) -> tuple[bool, str]:
    """Pure comparison; a node passes only if it presents exactly the expected keys."""
    if not expected:
        return False, "no expected fingerprints given"
    problems = []
    for key_type in sorted(expected):
        if key_type not in presented:
            problems.append(f"{key_type}: not presented")
        elif presented[key_type] != expected[key_type]:
            problems.append(f"{key_type}: presented {presented[key_type]}, expected {expected[key_type]}")
    # A key users were never told about would be pinned by fresh clients.
    problems += [f"{key_type}: presented but not expected" for key_type in sorted(set(presented) - set(expected))]
    if problems:
        return False, "; ".join(problems)
    return True, f"all {len(expected)} host keys match"


def verify_node(host: str, port: int, expected: Mapping[str, str], timeout: float = 5.0) -> VerificationResult:
    """Read the node's keys for every expected key type and compare.

    Raises ``HostUnreachable`` (not a failed result) so callers can tell
    "retry later" from "wrong identity".
    """
    algorithms = tuple(_ALGORITHM_FOR_KEY_TYPE.get(key_type, key_type) for key_type in sorted(expected))
    presented = read_presented_host_keys(host, port, algorithms, timeout) if algorithms else {}
    ok, reason = compare_fingerprints(expected, presented)
    return VerificationResult(ok=ok, reason=reason, presented=presented, expected=dict(expected), acceptable=ok)


# --------------------------------------------------------------------------- certificate mode


def read_presented_host_certificate(
    host: str, port: int, key_type: str = "ssh-ed25519", timeout: float = 5.0
) -> PresentedHostCertificate:
    """Negotiate ``<key_type>-cert-v01@openssh.com`` and return the certificate's facts.

    Raises ``HostCertificateMissing`` if the node offers no certificate of that
    type and ``InvalidHostCertificate`` if the CA signature does not verify or
    the certificate is not a host certificate.
    """
    algorithm = _CERTIFICATE_ALGORITHM_FOR_KEY_TYPE.get(key_type)
    if algorithm is None:
        raise ValueError(f"unsupported key type {key_type!r}")
    key = _handshake_host_key(host, port, algorithm, timeout)
    if key is None or key.public_blob is None:
        raise HostCertificateMissing(f"{host}:{port} offers no {algorithm} host certificate")
    cert_line = f"{key.public_blob.key_type} {base64.b64encode(key.public_blob.key_blob).decode('ascii')}"
    return _describe_certificate(cert_line, key_type, f"{host}:{port}")


def check_host_certificate(
    certificate: PresentedHostCertificate, ca_fingerprint: str, principal: str, moment: datetime | None = None
) -> tuple[bool, str]:
    """Would an ``@cert-authority`` client accept this certificate for ``principal`` now?"""
    moment = moment or datetime.now(timezone.utc)
    if certificate.ca_fingerprint != ca_fingerprint:
        return False, f"signed by {certificate.ca_fingerprint}, expected CA {ca_fingerprint}"
    if principal not in certificate.principals:
        return False, f"principal {principal!r} not in {list(certificate.principals)}"
    if not certificate.is_valid_at(moment):
        return False, f"not valid at {moment.isoformat()}"
    return True, "certificate accepted"


def _describe_certificate(cert_line: str, key_type: str, where: str) -> PresentedHostCertificate:
    try:
        certificate = serialization.load_ssh_public_identity(cert_line.encode("ascii"))
        certificate.verify_cert_signature()
    except (ValueError, InvalidSignature):
        raise InvalidHostCertificate(f"{where}: {key_type} certificate does not verify") from None
    if not isinstance(certificate, serialization.SSHCertificate):
        raise HostCertificateMissing(f"{where}: offered a plain {key_type} key, not a certificate")
    if certificate.type != serialization.SSHCertificateType.HOST:
        raise InvalidHostCertificate(f"{where}: {key_type} certificate is not a host certificate")
    return PresentedHostCertificate(
        key_type=key_type,
        host_key_fingerprint=fingerprint(_openssh_public_line(certificate.public_key())),
        ca_fingerprint=fingerprint(_openssh_public_line(certificate.signature_key())),
        key_id=certificate.key_id.decode("utf-8", "replace"),
        serial=certificate.serial,
        principals=tuple(p.decode("utf-8", "replace") for p in certificate.valid_principals),
        valid_after=datetime.fromtimestamp(certificate.valid_after, timezone.utc),
        valid_before=_utc_or_forever(certificate.valid_before),
    )


def _utc_or_forever(epoch: int) -> datetime:
    # OpenSSH uses 2**64-1 for "forever", beyond what datetime can hold.
    try:
        return datetime.fromtimestamp(epoch, timezone.utc)
    except (OverflowError, OSError, ValueError):
        return datetime.max.replace(tzinfo=timezone.utc)


def _openssh_public_line(public_key) -> str:
    return public_key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode(
        "ascii"
    )


# --------------------------------------------------------------------------- one handshake


def _handshake_host_key(host: str, port: int, algorithm: str, timeout: float) -> paramiko.PKey | None:
    """Key-exchange only, restricted to one host key algorithm; None if the node lacks it."""
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as exc:
        raise HostUnreachable(f"{host}:{port}: connect failed ({exc.__class__.__name__}: {exc})") from None
    transport = paramiko.Transport(sock)
    try:
        transport.banner_timeout = timeout
        transport.handshake_timeout = timeout
        transport.get_security_options().key_types = (algorithm,)
        transport.start_client(timeout=timeout)
        # start_client returns silently when its own timeout expires.
        if transport.host_key is None:
            raise HostUnreachable(f"{host}:{port}: SSH handshake did not finish within {timeout}s")
        key = transport.get_remote_server_key()
        public_key_blob(key.asbytes())  # sanity: a well-formed blob
        return key
    except IncompatiblePeer as exc:
        if "host key" in str(exc):  # the node simply has no key of this algorithm
            return None
        raise HostUnreachable(f"{host}:{port}: no common SSH algorithms ({exc})") from None
    except (paramiko.SSHException, EOFError, OSError) as exc:
        raise HostUnreachable(f"{host}:{port}: SSH handshake failed ({exc.__class__.__name__}: {exc})") from None
    finally:
        transport.close()
        sock.close()
