"""The twin's instance metadata: each simulated node's instance identity document, signed as EC2 signs it.

EC2 serves every instance its own document (JSON text) and a base64 RSA PKCS#1 v1.5 SHA-256 signature over
its bytes, which AWS's published certificate for the Region verifies. The twin cannot sign with AWS's key,
so it signs with its own and, for as long as a world runs, puts its certificate in the product's table for
the world's Region (`trusted`): the product verifies the twin's documents exactly as it would AWS's,
and no product code knows the twin.

Only the node itself gets its document (NodeHosts hands it to that node's agent; an attacker on another
node has none of it). `served=False` plays a cluster whose IMDS does not serve documents (UNCONFIRMED on
HyperPod).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import Any
from unittest import mock

from hpops_core.node_channel import identity_certificates


@lru_cache(maxsize=1)
def _signer() -> tuple[Any, str]:
    """(private key, certificate PEM): one per process, like one Region's key for AWS."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "hpops twin instance identity")])
    now = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    certificate = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                   .serial_number(1).not_valid_before(now).not_valid_after(now + dt.timedelta(days=3650))
                   .sign(key, hashes.SHA256()))
    return key, certificate.public_bytes(serialization.Encoding.PEM).decode("ascii")


@contextmanager
def trusted(region: str) -> Iterator[None]:
    """The product's certificate table with the twin's certificate for ``region`` (and only there)."""
    with mock.patch.dict(identity_certificates.RSA_CERTIFICATES, {region: _signer()[1]}):
        yield


def document_text(node: Any, account_id: str) -> str:
    """The document as EC2 writes it (pretty-printed JSON, the fields its example shows)."""
    launched = node.launch_time.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    fields = {"accountId": account_id, "architecture": "x86_64", "availabilityZone": f"{node.region_name}a",
              "billingProducts": None, "devpayProductCodes": None, "marketplaceProductCodes": None,
              "imageId": "ami-0123456789abcdef0", "instanceId": node.instance_id, "instanceType": node.instance_type,
              "kernelId": None, "pendingTime": launched, "privateIp": node.ip, "ramdiskId": None,
              "region": node.region_name, "version": "2017-09-30"}
    return json.dumps(fields, indent=2, separators=(",", " : "))


def sign(text: str) -> str:
    """The base64 signature IMDS serves beside the document."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import padding

    signature = _signer()[0].sign(text.encode("utf-8"), padding.PKCS1v15(), hashes.SHA256())
    return base64.encodebytes(signature).decode("ascii").strip()


def served(node: Any, account_id: str) -> dict[str, str]:
    """What the node's IMDS answers at dynamic/instance-identity/document and .../signature."""
    text = document_text(node, account_id)
    return {"document": text, "signature": sign(text)}
