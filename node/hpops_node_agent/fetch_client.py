"""The agent's side of NodeChannel `fetch`: host keys and its own instructions, signed by its key.

The node role reads none of these (a user on the node holds that role): the agent signs a fresh
request (issuedAt, a random nonce) with its enrolled key and gets the answer over the synchronous
invoke's response. It acts on instructions only from such an answer, never from anything the role
can read or write. To spare an invoke per poll, it fetches an instruction only when its public
marker (contract.instruction_marker_parameter) names a version it has not fetched yet.

Standard library only (the invoke itself is the identity's, through boto3).
"""

from __future__ import annotations

import datetime
import secrets
from typing import Any, Callable, Dict, Iterable, Optional

from hpops_core.node_channel import contract, proof_format

from . import agent_key

HOST_KEYS, END_SESSIONS, USER_HOLDS = "hostKeys", "endSessions", "userHolds"


class FetchFailed(Exception):
    """The stack refused the fetch or could not be asked; the message names the refusal, never a value."""


def fetch_request(cluster: str, instance_id: str, what: Iterable[str], now: float) -> Dict[str, Any]:
    return {"cluster": cluster, "instanceId": instance_id, "what": list(what),
            "issuedAt": datetime.datetime.fromtimestamp(now, datetime.timezone.utc).isoformat(timespec="seconds"),
            "nonce": secrets.token_hex(16)}


def fetch(identity: Any, instance_id: str, what: Iterable[str], now: float) -> Dict[str, Optional[dict]]:
    """item -> {"value", "version"} (None: nothing instructed). ``identity``: the agent's AgentIdentity
    (its key path, cluster, ssh-keygen and NodeChannel invoke)."""
    request = fetch_request(identity.cluster, instance_id, what, now)
    try:
        proof = agent_key.sign(identity.key_path, proof_format.namespace(proof_format.FETCH, identity.cluster),
                               proof_format.canonical(request), ssh_keygen=identity.ssh_keygen)
    except agent_key.AgentKeyError as error:
        raise FetchFailed("cannot sign the fetch: {}".format(error)) from None
    try:
        answer = identity.invoke({"action": "fetch", "request": request, "proof": proof})
    except Exception as error:  # transport or AWS: the caller retries on its next poll
        raise FetchFailed("NodeChannel fetch failed: {}".format(type(error).__name__)) from None
    if not isinstance(answer, dict) or not answer.get("ok"):
        answer = answer if isinstance(answer, dict) else {}
        raise FetchFailed("NodeChannel refused the fetch: {} {}".format(answer.get("error", "no answer"),
                                                                       str(answer.get("message", ""))[:200]))
    items = answer.get("items")
    if not isinstance(items, dict) or set(items) != set(request["what"]):
        raise FetchFailed("NodeChannel answered another set of items than asked for")
    return items


class Instructions:
    """The latest instruction of one kind the agent fetched, re-fetched when its marker's version moves."""

    def __init__(self, item: str, fetcher: Callable[[str], Optional[dict]]) -> None:
        self.item = item
        self.fetcher = fetcher  # item -> {"value", "version"} | None, or raises FetchFailed
        self.version: Optional[int] = None
        self.value: Optional[str] = None

    def current(self, marker_value: Optional[str]) -> Optional[str]:
        """The instruction text to act on (None: none). Raises FetchFailed and keeps the last one when
        the marker moved but the fetch failed."""
        wanted = contract.marker_version(marker_value) if marker_value is not None else None
        if wanted is None:
            self.version, self.value = None, None
            return None
        if wanted != self.version:
            fetched = self.fetcher(self.item)
            self.value = fetched.get("value") if isinstance(fetched, dict) else None
            version = fetched.get("version") if isinstance(fetched, dict) else None
            # A marker written before its instruction was read: the next poll fetches again.
            self.version = version if isinstance(version, int) and version >= wanted else None
        return self.value
