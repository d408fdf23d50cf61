"""Canonical SSH host keys and host certificates, built with `cryptography` only.

Two ways to give every login node the same identity:

* shared keys: one ``HostKeyBundle`` (ed25519, ecdsa nistp256, rsa 3072) is kept in
  Secrets Manager and installed on every node; users pin those keys;
* certificate mode: every node keeps its own keys and gets host certificates
  signed by one ``HostCA``; users trust a single ``@cert-authority`` line.

Private key text lives only in fields excluded from ``repr``; error messages
name files and key types, never key material, so nothing here can leak a
secret into a log line.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import secrets
import struct
from dataclasses import dataclass, field
from datetime import datetime
from typing import Mapping

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from hpops_core.common.errors import HpopsError

BUNDLE_FORMAT = "hpops.host-keys.v1"
CA_FORMAT = "hpops.host-ca.v1"
CERTIFICATE_BUNDLE_FORMAT = "hpops.host-certificates.v1"

# Short name (as in /etc/ssh/ssh_host_<name>_key) -> SSH public key type.
KEY_TYPES: dict[str, str] = {
    "ed25519": "ssh-ed25519",
    "ecdsa": "ecdsa-sha2-nistp256",
    "rsa": "ssh-rsa",
}
RSA_BITS = 3072
# Adopting an existing cluster's keys: OpenSSH's own default was 2048 before 8.x.
MIN_ADOPTED_RSA_BITS = 2048

_OPENSSH_PRIVATE_HEADER = b"-----BEGIN OPENSSH PRIVATE KEY-----"
_PRIVATE_FORMAT = serialization.PrivateFormat.OpenSSH


class HostIdentityError(HpopsError):
    """Base class for every host-identity failure."""


class InvalidHostKeyBundle(HostIdentityError):
    """A bundle (secret JSON or adopted key files) is malformed or inconsistent."""


class InvalidPublicKey(HostIdentityError):
    """A public key line or blob cannot be parsed."""


class InvalidCertificateRequest(HostIdentityError):
    """A host certificate cannot be issued with the given parameters."""


# --------------------------------------------------------------------------- public keys


def public_key_blob(public_key_line_or_blob: str | bytes) -> bytes:
    """Return the SSH wire blob of a public key given as a line or as the blob itself."""
    value = public_key_line_or_blob
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        if raw[:1] == b"\x00":  # wire blobs start with a uint32 length, lines with ASCII
            _blob_key_type(raw)
            return raw
        try:
            value = raw.decode("ascii")
        except UnicodeDecodeError:
            raise InvalidPublicKey("public key line is not ASCII") from None
    parts = value.split()
    if len(parts) < 2:
        raise InvalidPublicKey("public key line needs '<type> <base64>'")
    try:
        blob = base64.b64decode(parts[1], validate=True)
    except binascii.Error:
        raise InvalidPublicKey(f"{parts[0]}: public key is not valid base64") from None
    if _blob_key_type(blob) != parts[0]:
        raise InvalidPublicKey(f"{parts[0]}: line type does not match the key blob")
    return blob


def fingerprint(public_key_line_or_blob: str | bytes) -> str:
    """SHA256 fingerprint exactly as ``ssh-keygen -lf`` prints it (base64, no '=' padding)."""
    digest = hashlib.sha256(public_key_blob(public_key_line_or_blob)).digest()
    return "SHA256:" + base64.b64encode(digest).decode("ascii").rstrip("=")


def _blob_key_type(blob: bytes) -> str:
    if len(blob) < 4:
        raise InvalidPublicKey("public key blob is truncated")
    (length,) = struct.unpack(">I", blob[:4])
    if length == 0 or len(blob) < 4 + length:
        raise InvalidPublicKey("public key blob is truncated")
    try:
        return blob[4 : 4 + length].decode("ascii")
    except UnicodeDecodeError:
        raise InvalidPublicKey("public key blob has a non-ASCII type") from None


def _public_line(key) -> str:
    return key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    ).decode("ascii")


def _private_text(key) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM, _PRIVATE_FORMAT, serialization.NoEncryption()
    ).decode("ascii")


# --------------------------------------------------------------------------- shared keys


@dataclass(frozen=True)
class HostKeyPair:
    """One host key: ``name`` is the short name (ed25519, ecdsa, rsa)."""

    name: str
    private_openssh: str = field(repr=False)
    public_line: str

    def __repr__(self) -> str:  # never the private text
        return f"HostKeyPair(name={self.name!r}, fingerprint={fingerprint(self.public_line)!r})"

    __str__ = __repr__


@dataclass(frozen=True)
class HostKeyBundle:
    """The canonical host keys every login node must present."""

    ed25519: HostKeyPair
    ecdsa: HostKeyPair
    rsa: HostKeyPair

    def __post_init__(self) -> None:
        for name in KEY_TYPES:
            if getattr(self, name).name != name:
                raise InvalidHostKeyBundle(f"{name}: key pair is filed under the wrong type")

    def __repr__(self) -> str:  # never the private text
        return f"HostKeyBundle(fingerprints={self.public_fingerprints()!r})"

    __str__ = __repr__

    def pairs(self) -> tuple[HostKeyPair, ...]:
        return tuple(getattr(self, name) for name in KEY_TYPES)

    def public_fingerprints(self) -> dict[str, str]:
        """SSH key type (ssh-ed25519, ecdsa-sha2-nistp256, ssh-rsa) -> SHA256 fingerprint."""
        return {KEY_TYPES[p.name]: fingerprint(p.public_line) for p in self.pairs()}

    def known_hosts_lines(self, host_pattern: str) -> list[str]:
        return [f"{host_pattern} {p.public_line}" for p in self.pairs()]

    def to_secret_json(self) -> str:
        """The Secrets Manager value, also what the node agent reads."""
        keys = {p.name: {"private": p.private_openssh, "public": p.public_line} for p in self.pairs()}
        return json.dumps({"format": BUNDLE_FORMAT, "keys": keys}, sort_keys=True)

    @classmethod
    def from_secret_json(cls, text: str | bytes) -> HostKeyBundle:
        document = _load_json_object(text, InvalidHostKeyBundle)
        if document.get("format") != BUNDLE_FORMAT:
            raise InvalidHostKeyBundle(f"bundle format must be {BUNDLE_FORMAT!r}")
        keys = document.get("keys")
        if not isinstance(keys, dict) or set(keys) != set(KEY_TYPES):
            raise InvalidHostKeyBundle(f"bundle must hold exactly the keys {sorted(KEY_TYPES)}")
        pairs = {name: _pair_from_entry(name, keys[name]) for name in KEY_TYPES}
        return cls(**pairs)


def generate_bundle() -> HostKeyBundle:
    """Fresh ed25519, ecdsa nistp256 and rsa-3072 host keys."""
    new_keys = {
        "ed25519": ed25519.Ed25519PrivateKey.generate(),
        "ecdsa": ec.generate_private_key(ec.SECP256R1()),
        "rsa": rsa.generate_private_key(public_exponent=65537, key_size=RSA_BITS),
    }
    return HostKeyBundle(
        **{name: HostKeyPair(name, _private_text(key), _public_line(key)) for name, key in new_keys.items()}
    )


def adopt_bundle(files: Mapping[str, bytes]) -> HostKeyBundle:
    """Build a bundle from a node's existing ``ssh_host_<type>_key`` files.

    ``files`` maps a file name or path to its content. ``.pub`` files are ignored:
    public lines are derived from the private keys, which are the authority.
    """
    wanted = {f"ssh_host_{name}_key": name for name in KEY_TYPES}
    found: dict[str, bytes] = {}
    for path, content in files.items():
        base = os.path.basename(path)
        if base.endswith(".pub"):
            continue
        if base not in wanted:
            raise InvalidHostKeyBundle(f"unexpected host key file {base!r}")
        found[wanted[base]] = bytes(content)
    missing = sorted(f"ssh_host_{name}_key" for name in KEY_TYPES if name not in found)
    if missing:
        raise InvalidHostKeyBundle(f"missing host key files: {', '.join(missing)}")
    return HostKeyBundle(**{name: _adopt_private_file(name, found[name]) for name in KEY_TYPES})


def _adopt_private_file(name: str, content: bytes) -> HostKeyPair:
    key = _load_private_key(name, content, allow_pem=True)
    # Keep OpenSSH-format files byte for byte so the source node sees "unchanged";
    # convert older PEM files (ssh-keygen -m PEM) to the OpenSSH format sshd prefers.
    if content.lstrip().startswith(_OPENSSH_PRIVATE_HEADER):
        private_text = content.decode("ascii")
    else:
        private_text = _private_text(key)
    return HostKeyPair(name, private_text, _public_line(key))


def _pair_from_entry(name: str, entry: object) -> HostKeyPair:
    if not isinstance(entry, dict):
        raise InvalidHostKeyBundle(f"{name}: entry must be an object")
    private_text, public_line = entry.get("private"), entry.get("public")
    if not isinstance(private_text, str) or not isinstance(public_line, str):
        raise InvalidHostKeyBundle(f"{name}: 'private' and 'public' must be strings")
    key = _load_private_key(name, private_text.encode("ascii", "replace"), allow_pem=False)
    try:
        declared = public_key_blob(public_line)
    except InvalidPublicKey as exc:
        raise InvalidHostKeyBundle(f"{name}: public line is invalid ({exc})") from None
    if declared != public_key_blob(_public_line(key)):
        raise InvalidHostKeyBundle(f"{name}: public line does not belong to the private key")
    return HostKeyPair(name, private_text, public_line.strip())


def _load_private_key(name: str, content: bytes, *, allow_pem: bool):
    """Parse and type-check one private key; messages never quote the content."""
    loaders = [serialization.load_ssh_private_key]
    if allow_pem:
        loaders.append(serialization.load_pem_private_key)
    key = None
    for load in loaders:
        try:
            key = load(content, password=None)
            break
        except TypeError:
            raise InvalidHostKeyBundle(f"{name}: private key is passphrase-protected") from None
        except (ValueError, UnsupportedAlgorithm):
            continue
    if key is None:
        raise InvalidHostKeyBundle(f"{name}: private key does not parse")
    _check_key_type(name, key)
    return key


def _check_key_type(name: str, key) -> None:
    if name == "ed25519" and isinstance(key, ed25519.Ed25519PrivateKey):
        return
    if name == "ecdsa" and isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp256r1":
        return
    if name == "rsa" and isinstance(key, rsa.RSAPrivateKey):
        if key.key_size < MIN_ADOPTED_RSA_BITS:
            raise InvalidHostKeyBundle(f"rsa: {key.key_size}-bit key is below {MIN_ADOPTED_RSA_BITS} bits")
        return
    raise InvalidHostKeyBundle(f"{name}: private key is not a {KEY_TYPES[name]} key")


def _load_json_object(text: str | bytes, error: type[HostIdentityError]) -> dict:
    try:
        document = json.loads(text)
    except (ValueError, TypeError) as exc:
        # JSONDecodeError's message is position-only; the document itself is never echoed.
        raise error(f"not valid JSON ({type(exc).__name__})") from None
    if not isinstance(document, dict):
        raise error("JSON document must be an object")
    return document


# --------------------------------------------------------------------------- certificate mode


@dataclass(frozen=True)
class HostCA:
    """The ed25519 key that signs host certificates (kept in Secrets Manager)."""

    private_openssh: str = field(repr=False)
    public_line: str

    def __repr__(self) -> str:  # never the private text
        return f"HostCA(fingerprint={self.fingerprint()!r})"

    __str__ = __repr__

    def fingerprint(self) -> str:
        return fingerprint(self.public_line)

    def known_hosts_line(self, host_pattern: str) -> str:
        """The single line users add to known_hosts to trust every login node."""
        return f"@cert-authority {host_pattern} {self.public_line}"

    def to_secret_json(self) -> str:
        return json.dumps(
            {"format": CA_FORMAT, "private": self.private_openssh, "public": self.public_line}, sort_keys=True
        )

    @classmethod
    def from_secret_json(cls, text: str | bytes) -> HostCA:
        document = _load_json_object(text, InvalidHostKeyBundle)
        if document.get("format") != CA_FORMAT:
            raise InvalidHostKeyBundle(f"CA format must be {CA_FORMAT!r}")
        pair = _pair_from_entry("ed25519", document)
        return cls(pair.private_openssh, pair.public_line)


def generate_ca() -> HostCA:
    key = ed25519.Ed25519PrivateKey.generate()
    return HostCA(_private_text(key), _public_line(key))


def sign_host_certificate(
    ca: HostCA,
    host_public_key_line: str,
    principals: list[str],
    key_id: str,
    valid_after: datetime | int | float,
    valid_before: datetime | int | float,
) -> str:
    """Sign a host key; returns the ``<type>-cert-v01@openssh.com AAAA...`` line."""
    # OpenSSH treats a host certificate without principals as valid for ANY host.
    if not principals or any(not p or any(c.isspace() or c == "," for c in p) for p in principals):
        raise InvalidCertificateRequest("principals must be non-empty names without spaces or commas")
    if not key_id:
        raise InvalidCertificateRequest("key_id must not be empty")
    after, before = _epoch_seconds(valid_after), _epoch_seconds(valid_before)
    if before <= after:
        raise InvalidCertificateRequest("valid_before must be later than valid_after")
    try:
        host_key = serialization.load_ssh_public_key(host_public_key_line.strip().encode("ascii"))
    except (ValueError, UnsupportedAlgorithm, UnicodeEncodeError):
        raise InvalidCertificateRequest("host public key line does not parse") from None
    ca_key = serialization.load_ssh_private_key(ca.private_openssh.encode("ascii"), password=None)
    certificate = (
        serialization.SSHCertificateBuilder()
        .public_key(host_key)
        .serial(secrets.randbits(64))
        .type(serialization.SSHCertificateType.HOST)
        .key_id(key_id.encode("utf-8"))
        .valid_principals([p.encode("utf-8") for p in principals])
        .valid_after(after)
        .valid_before(before)
        .sign(ca_key)
    )
    return certificate.public_bytes().decode("ascii")


def _epoch_seconds(moment: datetime | int | float) -> int:
    if isinstance(moment, datetime):
        if moment.tzinfo is None:
            raise InvalidCertificateRequest("validity datetimes must be timezone-aware")
        return int(moment.timestamp())
    if isinstance(moment, (int, float)) and not isinstance(moment, bool) and moment >= 0:
        return int(moment)
    raise InvalidCertificateRequest("validity must be a datetime or epoch seconds")


@dataclass(frozen=True)
class HostCertificateBundle:
    """What the node agent installs in certificate mode: certs for that node's own keys."""

    ca_public_line: str
    certificates: Mapping[str, str]  # short name (ed25519, ...) -> cert line

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": CERTIFICATE_BUNDLE_FORMAT,
                "ca_public": self.ca_public_line,
                "certificates": dict(self.certificates),
            },
            sort_keys=True,
        )


def certify_host_keys(
    ca: HostCA,
    host_public_lines: Mapping[str, str],
    principals: list[str],
    key_id: str,
    valid_after: datetime | int | float,
    valid_before: datetime | int | float,
) -> HostCertificateBundle:
    """Sign every public key of one node (short name -> public line) into a certificate bundle."""
    unknown = sorted(set(host_public_lines) - set(KEY_TYPES))
    if unknown:
        raise InvalidCertificateRequest(f"unknown key names: {', '.join(unknown)}")
    certificates = {
        name: sign_host_certificate(ca, line, principals, key_id, valid_after, valid_before)
        for name, line in host_public_lines.items()
    }
    return HostCertificateBundle(ca.public_line, certificates)
