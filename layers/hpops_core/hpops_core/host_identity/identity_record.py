"""The canonical host identity's PUBLIC half, where the sync reads it.

The private keys live only in Secrets Manager (read by the node agent with the node's role and
by the operator's `hpops host-keys`). What a verifier needs, the expected fingerprints, is public.
It is published as the `hostIdentity` attribute of the cluster's sync-lease item, so the lease
acquire that every reconcile makes anyway returns it (no extra read). It then travels through the
state machine to the verifier, which has no access to the secret or the table.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from hpops_core.common.errors import HpopsError
from hpops_core.common.state_table import HOST_IDENTITY_ATTRIBUTE, host_identity_of, lease_item_key


class HostIdentityNotConfigured(HpopsError):
    """No canonical host identity was published yet: run `hpops host-keys generate` or `adopt`."""


def expected_fingerprints(expected: Mapping[str, Any] | None) -> dict[str, str]:
    """Keys mode: key type -> fingerprint every node must present."""
    if not expected or expected.get("mode", "keys") != "keys" or not expected.get("fingerprints"):
        raise HostIdentityNotConfigured("no canonical host keys published; run `hpops host-keys generate|adopt`")
    return dict(expected["fingerprints"])


def expected_ca_fingerprint(expected: Mapping[str, Any] | None) -> str:
    """Certificate mode: the fingerprint of the CA every node's certificates must be signed by."""
    if not expected or expected.get("mode") != "certificate" or not expected.get("caFingerprint"):
        raise HostIdentityNotConfigured("no host certificate authority published; run `hpops host-keys ca-generate`")
    return str(expected["caFingerprint"])


def publish_expected(ddb, table: str, cluster: str, fingerprints: Mapping[str, str], version: str) -> None:
    """Keys mode, written by the operator's `hpops host-keys` right after the secret changes."""
    _publish(ddb, table, cluster, {"mode": "keys", "fingerprints": dict(sorted(fingerprints.items())), "version": version})


def publish_certificate_authority(ddb, table: str, cluster: str, ca_public_line: str, ca_fingerprint: str,
                                  version: str) -> None:
    """Certificate mode: the CA's public half (what users put after @cert-authority)."""
    _publish(ddb, table, cluster, {"mode": "certificate", "caFingerprint": ca_fingerprint, "caPublic": ca_public_line,
                                   "version": version})


def _publish(ddb, table: str, cluster: str, record: dict) -> None:
    ddb.update_item(
        TableName=table,
        Key=lease_item_key(cluster),
        UpdateExpression=f"SET {HOST_IDENTITY_ATTRIBUTE} = :identity",
        ExpressionAttributeValues={":identity": {"S": json.dumps(record, sort_keys=True)}},
    )


def read_expected(ddb, table: str, cluster: str) -> dict | None:
    """For `hpops host-keys show`."""
    item = ddb.get_item(TableName=table, Key=lease_item_key(cluster)).get("Item")
    return host_identity_of(item) if item else None
