"""The stack's state table: each item kind's partition key, and the one item two features share.

Every kind of item has a partition of its own (pk = "<kind>#<cluster>"), so each function's role can
be limited to the kinds it owns or reads (`dynamodb:LeadingKeys` in template.yaml) and a function
that writes one kind cannot overwrite another. Kinds of other modules: budget_guard's `budget#`,
`usage#`, `ce-cache#` and hold items (their modules name their keys).

The cluster's sync-lease item is written by the login node sync (holder, expiry, IP cache) and by
the operator's `hpops host-keys` (the published host identity, public half only), so the lease
acquire that every reconcile makes anyway returns the identity the verifier expects. It keeps the
key it had when every kind shared one partition: the identity it carries must survive an upgrade.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

HOST_IDENTITY_ATTRIBUTE = "hostIdentity"


def lease_partition(cluster: str) -> str:
    """The sync lease and the published host identity (one item)."""
    return f"cluster#{cluster}"


def node_report_partition(cluster: str) -> str:
    """Each login or controller node's latest agent report (node_channel/report_store.py)."""
    return f"node-report#{cluster}"


def session_partition(cluster: str) -> str:
    """The session limits' ledger of ended sessions and the Run As state (session_limits/ledger.py)."""
    return f"session#{cluster}"


def user_sessions_partition(cluster: str, user: str) -> str:
    """One user's sessions on each login node (sk = instance id), kept from the nodes' reports by
    RecordNodeReport (node_channel/user_sessions.py) so that a session change reads that user alone."""
    return f"user-sessions#{cluster}#{user}"


def node_sessions_partition(cluster: str) -> str:
    """Each login node's last report time and session counts (node_channel/user_sessions.py): which
    nodes' per-user items are fresh enough to count."""
    return f"node-sessions#{cluster}"


def node_users_partition(cluster: str) -> str:
    """Which users may hold a per-user session item on each login node (sk = "<instance id>#<page>";
    node_channel/user_sessions.py): how a full rewrite finds the items of users it does not know by name."""
    return f"node-users#{cluster}"


def enrollment_partition(cluster: str) -> str:
    """Which agent key speaks for each login/controller instance (node_channel/enrollment_store.py)."""
    return f"enroll#{cluster}"


def approval_partition(cluster: str) -> str:
    """Operators' single-use approvals of an agent key (node_channel/enrollment_store.py): a partition of
    their own, so an operator's policy may write approvals and never an enrollment (dynamodb:LeadingKeys)."""
    return f"approval#{cluster}"


def fetch_nonce_partition(cluster: str) -> str:
    """Nonces of NodeChannel fetch requests already served, kept (TTL) while such a request could still
    be fresh, so none is served twice (node_channel/fetch.py)."""
    return f"fetch-nonce#{cluster}"


def user_holds_partition(cluster: str) -> str:
    """The users the controller's agent holds in Slurm: the document's header and its pages, which only
    the BudgetGuard sweep writes and NodeChannel reads (node_channel/user_holds_store.py)."""
    return f"holds#{cluster}"


def notice_partition(cluster: str) -> str:
    """When each "kept out" notice was last sent (common/notices.py)."""
    return f"notice#{cluster}"


def admission_partition(cluster: str) -> str:
    """Load-aware admission's record: which login nodes are out of rotation, and why (login_sync/admission_store.py)."""
    return f"admission#{cluster}"


def lease_item_key(cluster: str) -> dict[str, dict[str, str]]:
    return {"pk": {"S": lease_partition(cluster)}, "sk": {"S": "sync-lease"}}


def host_identity_of(item: Mapping[str, Any]) -> dict | None:
    """The published identity record in a lease item (DynamoDB wire format), or None."""
    raw = item.get(HOST_IDENTITY_ATTRIBUTE, {}).get("S")
    return json.loads(raw) if raw else None
