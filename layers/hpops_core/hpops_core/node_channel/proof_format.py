"""What a node agent signs, and under which namespace (standard library; shipped to the nodes).

The agent signs with its own key (agent_key.py, `ssh-keygen -Y sign`) and the stack verifies with
node_proof.py. Both sides must agree byte for byte on the signed message, so it is defined once here:
the request or report body WITHOUT its "proof" field, as compact sorted ASCII JSON.

The namespace binds a signature to one purpose and one cluster: an enrollment statement cannot be
replayed as a report, nor a report for cluster A on cluster B.
"""

from __future__ import annotations

import json
import time

PROOF_FIELD = "proof"
SEQUENCE_FIELD = "sequence"

ENROLL = "enroll"
REPORT = "report"
FETCH = "fetch"
PURPOSES = (ENROLL, REPORT, FETCH)


def canonical(body: dict) -> bytes:
    """The bytes signed for ``body``: its fields other than "proof", sorted, compact, ASCII-only."""
    if not isinstance(body, dict):
        raise ValueError("a signed body must be a JSON object")
    unsigned = {key: _plain(value) for key, value in body.items() if key != PROOF_FIELD}
    return json.dumps(unsigned, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def _plain(value):
    """Whole floats as ints: a JSON hop may write 2.0 as 2 (UNCONFIRMED for EventBridge), and the
    signed bytes must not depend on it."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


def namespace(purpose: str, cluster: str) -> str:
    """"hpops-<purpose>@<cluster>": the SSHSIG namespace for one purpose on one cluster."""
    if purpose not in PURPOSES:
        raise ValueError("unknown signing purpose {!r}".format(purpose))
    if not isinstance(cluster, str) or not cluster:
        raise ValueError("a signing namespace needs the cluster name")
    return "hpops-{}@{}".format(purpose, cluster)


def next_sequence(last: int, now_seconds: float = None) -> int:
    """The next report sequence: past the last one sent and at least the time in microseconds, so an
    agent whose state file was lost still moves forward (the stack refuses sequence <= last accepted)."""
    if now_seconds is None:
        now_seconds = time.time()
    return max(int(last) + 1, int(now_seconds * 1_000_000))
