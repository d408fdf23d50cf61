"""Operator actions on the canonical host identity (run from `hpops host-keys`, never by a Lambda).

Generating or adopting keys is an explicit operator action, and so is rotation: the new bundle is
written to Secrets Manager (private half) and its fingerprints published for the verifier
(public half). A manual repair then pushes and re-verifies every login node.
"""

from __future__ import annotations

from hpops_core.host_identity.identity_record import publish_expected
from hpops_core.host_identity.keys import HostKeyBundle


def install_canonical_bundle(secretsmanager, dynamodb, secret_id: str, table: str, cluster: str,
                             bundle: HostKeyBundle) -> dict[str, str]:
    """Store the bundle and publish its fingerprints; returns the fingerprints (public)."""
    version = secretsmanager.put_secret_value(SecretId=secret_id, SecretString=bundle.to_secret_json())["VersionId"]
    fingerprints = bundle.public_fingerprints()
    publish_expected(dynamodb, table, cluster, fingerprints, version)
    return fingerprints
