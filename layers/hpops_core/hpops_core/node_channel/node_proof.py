"""Verify a node agent's SSHSIG signature against the key the stack enrolled for that node.

The agent signs with OpenSSH's own `ssh-keygen -Y sign` (no compiled libraries on the node), which
writes the armored SSHSIG format of OpenSSH's PROTOCOL.sshsig. `cryptography` verifies Ed25519 but has
no SSHSIG reader, so the envelope is parsed here by hand (a few length-prefixed strings); the
signature check itself is cryptography's.

Signed data (PROTOCOL.sshsig):  "SSHSIG" || string(namespace) || string(reserved="") ||
                                string(hash_algorithm) || string(H(message))
Envelope (base64 between the armor lines): "SSHSIG" || uint32(1) || string(publickey) ||
                                string(namespace) || string(reserved) || string(hash_algorithm) ||
                                string(signature), signature = string("ssh-ed25519") || string(64 bytes).

Only Ed25519 keys are accepted: the agent makes nothing else, and a narrow parser is a safer parser.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import struct

from hpops_core.common.errors import HpopsError
from hpops_core.node_channel.proof_format import canonical, namespace  # noqa: F401 (one import for verifiers)

ARMOR_BEGIN = "-----BEGIN SSH SIGNATURE-----"
ARMOR_END = "-----END SSH SIGNATURE-----"
MAGIC = b"SSHSIG"
VERSION = 1
KEY_TYPE = b"ssh-ed25519"
HASHES = {b"sha512": hashlib.sha512, b"sha256": hashlib.sha256}
# An Ed25519 SSHSIG is ~300 armored characters; anything far larger is not one.
MAX_ARMORED = 4096


class NodeProofError(HpopsError):
    """A node's proof was refused: it is not a valid signature by that node's enrolled key."""


class NodeProofMalformedError(NodeProofError, ValueError):
    """The proof is not an armored Ed25519 SSHSIG, or the enrolled key is not an ssh-ed25519 line."""


class NodeProofKeyMismatchError(NodeProofError):
    """The proof was made by another key than the one enrolled, or for another namespace."""


class NodeProofBadSignatureError(NodeProofError):
    """The signature does not verify over this message: altered, or signed for something else."""


def _read_string(data: bytes, offset: int) -> tuple[bytes, int]:
    if offset + 4 > len(data):
        raise NodeProofMalformedError("SSHSIG ends inside a length field")
    (length,) = struct.unpack(">I", data[offset:offset + 4])
    start, end = offset + 4, offset + 4 + length
    if end > len(data):
        raise NodeProofMalformedError("SSHSIG string runs past the end")
    return data[start:end], end


def _pack_string(value: bytes) -> bytes:
    return struct.pack(">I", len(value)) + value


def public_key_blob(public_key_line: str) -> bytes:
    """The wire blob of an "ssh-ed25519 AAAA... [comment]" line, checked to hold a 32-byte key."""
    if not isinstance(public_key_line, str):
        raise NodeProofMalformedError("the enrolled key is not a public key line")
    parts = public_key_line.strip().split()
    if len(parts) < 2 or parts[0] != KEY_TYPE.decode():
        raise NodeProofMalformedError("the enrolled key is not an ssh-ed25519 public key line")
    try:
        blob = base64.b64decode(parts[1], validate=True)
    except (binascii.Error, ValueError):
        raise NodeProofMalformedError("the enrolled key is not valid base64") from None
    _raw_ed25519(blob)
    return blob


def _raw_ed25519(blob: bytes) -> bytes:
    key_type, offset = _read_string(blob, 0)
    raw, offset = _read_string(blob, offset)
    if key_type != KEY_TYPE or len(raw) != 32 or offset != len(blob):
        raise NodeProofMalformedError("not an ssh-ed25519 public key")
    return raw


def fingerprint(public_key_line: str) -> str:
    """OpenSSH's "SHA256:..." fingerprint (unpadded base64 of SHA-256 over the key blob)."""
    digest = hashlib.sha256(public_key_blob(public_key_line)).digest()
    return "SHA256:" + base64.b64encode(digest).decode("ascii").rstrip("=")


def _unarmor(proof_armored: str) -> bytes:
    if not isinstance(proof_armored, str) or len(proof_armored) > MAX_ARMORED:
        raise NodeProofMalformedError("the proof is not an armored SSH signature")
    lines = [line.strip() for line in proof_armored.strip().splitlines()]
    if len(lines) < 3 or lines[0] != ARMOR_BEGIN or lines[-1] != ARMOR_END:
        raise NodeProofMalformedError("the proof lacks the SSH SIGNATURE armor")
    try:
        return base64.b64decode("".join(lines[1:-1]), validate=True)
    except (binascii.Error, ValueError):
        raise NodeProofMalformedError("the proof's body is not valid base64") from None


def verify(proof_armored: str, public_key_line: str, namespace: str, message: bytes) -> None:
    """Return if ``proof_armored`` is the enrolled key's SSHSIG over ``message`` in ``namespace``;
    raise a NodeProofError subclass naming why not otherwise."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    enrolled_blob = public_key_blob(public_key_line)
    data = _unarmor(proof_armored)
    if not data.startswith(MAGIC) or len(data) < len(MAGIC) + 4:
        raise NodeProofMalformedError("the proof is not an SSHSIG (magic)")
    (version,) = struct.unpack(">I", data[len(MAGIC):len(MAGIC) + 4])
    if version != VERSION:
        raise NodeProofMalformedError("SSHSIG version {} is not supported".format(version))
    offset = len(MAGIC) + 4
    signer_blob, offset = _read_string(data, offset)
    signed_namespace, offset = _read_string(data, offset)
    reserved, offset = _read_string(data, offset)
    hash_name, offset = _read_string(data, offset)
    signature_blob, offset = _read_string(data, offset)
    if offset != len(data):
        raise NodeProofMalformedError("SSHSIG has trailing bytes")
    if hash_name not in HASHES:
        raise NodeProofMalformedError("SSHSIG hash algorithm is not sha512 or sha256")
    sig_type, sig_offset = _read_string(signature_blob, 0)
    raw_signature, sig_offset = _read_string(signature_blob, sig_offset)
    if sig_type != KEY_TYPE or len(raw_signature) != 64 or sig_offset != len(signature_blob):
        raise NodeProofMalformedError("SSHSIG does not hold an ssh-ed25519 signature")
    _raw_ed25519(signer_blob)
    if signer_blob != enrolled_blob:
        raise NodeProofKeyMismatchError("the proof was signed by another key than the enrolled one")
    if signed_namespace != namespace.encode("utf-8"):
        raise NodeProofKeyMismatchError("the proof was signed for another purpose or cluster")
    if not isinstance(message, (bytes, bytearray)):
        raise NodeProofMalformedError("the signed message must be bytes")
    signed_data = (MAGIC + _pack_string(signed_namespace) + _pack_string(reserved)
                   + _pack_string(hash_name) + _pack_string(HASHES[hash_name](bytes(message)).digest()))
    try:
        Ed25519PublicKey.from_public_bytes(_raw_ed25519(enrolled_blob)).verify(raw_signature, signed_data)
    except InvalidSignature:
        raise NodeProofBadSignatureError("the signature does not match this message") from None


def verify_body(body: dict, public_key_line: str, purpose: str, cluster: str) -> None:
    """Verify ``body["proof"]`` over canonical(body) in the purpose's namespace for ``cluster``."""
    if not isinstance(body, dict) or "proof" not in body:
        raise NodeProofMalformedError("the body carries no proof")
    try:
        message = canonical(body)
    except (TypeError, ValueError):
        raise NodeProofMalformedError("the body cannot be put in canonical form") from None
    verify(body["proof"], public_key_line, namespace(purpose, cluster), message)
