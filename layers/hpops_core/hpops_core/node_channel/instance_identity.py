"""The EC2 instance identity document: AWS's signed word that a request came from a process on instance i-….

The agent reads the document and its base64 `signature` from IMDS (`/latest/dynamic/instance-identity/
document` and `.../signature`) and sends both, as served, with its enroll statement. The stack checks the
signature (RSA PKCS#1 v1.5 over SHA-256 of the document's exact bytes, the EC2 User Guide's "Verify the
instance identity document" with the base64 signature) with the Region's public certificate
(identity_certificates.py), then reads the document. A user on another node cannot obtain another
instance's document: IMDS serves each instance its own. What it does not prove is WHICH process on the
instance asked (any one that reaches IMDS can read it): the agent enrolls first on a new node for that.

PURE: no AWS call. The certificate table is read at call time (RSA_CERTIFICATES), so a Region AWS adds
is one entry, and a harness with its own signer extends the table where it runs.

UNCONFIRMED: whether HyperPod nodes' IMDS serves the document, and which accountId it names (HyperPod
instances run in a service account): the account is recorded, never required to be the stack's.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from datetime import datetime, timezone
from typing import Any

from hpops_core.node_channel.enrollment import EnrollmentRefusedError, IdentityDocument, MalformedNodeChannelRequest
from hpops_core.node_channel.identity_certificates import RSA_CERTIFICATES, SOURCE

_REGION = re.compile(r"\A[a-z]{2}(-[a-z]+)+-[0-9]\Z")
_PENDING = re.compile(r"\A[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z\Z")


class IdentityDocumentRefusedError(EnrollmentRefusedError):
    """An instance identity document was sent and does not hold: bad signature, another instance,
    another Region, or a Region whose certificate this release does not carry."""


class NoCertificateForRegionError(IdentityDocumentRefusedError):
    """The document names a Region whose AWS certificate this release does not carry (identity_certificates.py)."""


def verify(document_text: str, signature_b64: str, certificates: dict[str, str] | None = None) -> IdentityDocument:
    """The document, if AWS's certificate for the Region it names verifies its signature; a named refusal
    otherwise. The Region is taken from the document, then must be the stack's (checked by the caller)."""
    from cryptography import x509
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import padding, rsa

    try:
        document = json.loads(document_text)
    except ValueError:
        raise MalformedNodeChannelRequest("the instance identity document is not JSON") from None
    if not isinstance(document, dict):
        raise MalformedNodeChannelRequest("the instance identity document is not a JSON object")
    region = document.get("region")
    if not (isinstance(region, str) and _REGION.match(region)):
        raise MalformedNodeChannelRequest("the instance identity document names no Region")
    table = RSA_CERTIFICATES if certificates is None else certificates
    pem = table.get(region)
    if pem is None:
        raise NoCertificateForRegionError(f"no AWS instance identity certificate for Region {region} in this "
                                          f"release ({SOURCE}): the document cannot be verified")
    try:
        signature = base64.b64decode("".join(signature_b64.split()), validate=True)
    except (binascii.Error, ValueError):
        raise MalformedNodeChannelRequest("the instance identity signature is not base64") from None
    key = x509.load_pem_x509_certificate(pem.encode("ascii")).public_key()
    if not isinstance(key, rsa.RSAPublicKey):
        raise IdentityDocumentRefusedError(f"the certificate kept for {region} holds no RSA key")
    try:
        # AWS's procedure checks the signature with the certificate's key and no validity dates (openssl
        # dgst -verify): the same key signs documents older than the certificate now published.
        key.verify(signature, document_text.encode("utf-8"), padding.PKCS1v15(), hashes.SHA256())
    except InvalidSignature:
        raise IdentityDocumentRefusedError("the instance identity document's signature does not verify with "
                                           f"AWS's certificate for {region}") from None
    fields = {name: document.get(name) for name in ("instanceId", "accountId", "privateIp", "pendingTime")}
    if not all(isinstance(value, str) for value in fields.values()) or not _PENDING.match(fields["pendingTime"]):
        raise IdentityDocumentRefusedError("the signed instance identity document lacks a field the stack reads")
    pending = datetime.strptime(fields["pendingTime"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    return IdentityDocument(fields["instanceId"], region, fields["accountId"], fields["privateIp"], pending)
