"""Operator actions on the canonical host identity (run from `hpops host-keys`, never by a Lambda).

Generating or adopting keys is an explicit operator action, and so is rotation: the new bundle is
written to Secrets Manager (private half) and its fingerprints published for the verifier
(public half). A manual repair then pushes and re-verifies every login node.
"""

from __future__ import annotations

from hpops_core.host_identity.identity_record import publish_certificate_authority, publish_expected
from hpops_core.host_identity.keys import HostCA, HostKeyBundle


def install_canonical_bundle(secretsmanager, dynamodb, secret_id: str, table: str, cluster: str,
                             bundle: HostKeyBundle) -> dict[str, str]:
    """Store the bundle and publish its fingerprints; returns the fingerprints (public)."""
    version = secretsmanager.put_secret_value(SecretId=secret_id, SecretString=bundle.to_secret_json())["VersionId"]
    fingerprints = bundle.public_fingerprints()
    publish_expected(dynamodb, table, cluster, fingerprints, version)
    return fingerprints


def install_certificate_authority(secretsmanager, dynamodb, secret_id: str, table: str, cluster: str, ca: HostCA) -> str:
    """Certificate mode: store the CA (private half, read only by the signer) and publish its public half.

    Returns the CA fingerprint. Rotating the CA means users need the new @cert-authority line:
    add it next to the old one before rotating, then run a repair to re-sign every node.
    """
    version = secretsmanager.put_secret_value(SecretId=secret_id, SecretString=ca.to_secret_json())["VersionId"]
    publish_certificate_authority(dynamodb, table, cluster, ca.public_line, ca.fingerprint(), version)
    return ca.fingerprint()
