"""The stack's state table: the one item two features share.

The cluster's sync-lease item is written by the login node sync (holder, expiry, IP cache) and by
the operator's `hpops host-keys` (the published host identity, public half only), so the lease
acquire that every reconcile makes anyway returns the identity the verifier expects.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

HOST_IDENTITY_ATTRIBUTE = "hostIdentity"


def lease_item_key(cluster: str) -> dict[str, dict[str, str]]:
    return {"pk": {"S": f"cluster#{cluster}"}, "sk": {"S": "sync-lease"}}


def host_identity_of(item: Mapping[str, Any]) -> dict | None:
    """The published identity record in a lease item (DynamoDB wire format), or None."""
    raw = item.get(HOST_IDENTITY_ATTRIBUTE, {}).get("S")
    return json.loads(raw) if raw else None
