"""NodeChannel `fetch`: secrets and per-node instructions, for the node's own enrolled agent only.

A user on any node holds the node role, so nothing the role can read may be a secret or an
instruction addressed to one node. The host keys (keys mode), a login node's end-session list and
the controller's user-holds list live where only the stack's functions read them (Secrets Manager;
Parameter Store under /hpops/<cluster>/instructions/, outside the role's /node/* grant); the agent
asks this function for them with a request signed by its enrolled key:

  {"action": "fetch",
   "request": {"cluster", "instanceId", "what": [FETCH_ITEMS...], "issuedAt": ISO-8601 UTC, "nonce": 32 hex},
   "proof": SSHSIG over canonical(request), namespace hpops-fetch@<cluster>}

The function answers over the synchronous invoke's response only (TLS, to the caller): nothing in
the answer is logged, put in an event or in Step Functions state. The checks, in order, each
refusal a named error and nothing stored or returned:

  1. well formed (MalformedFetchRequest);
  2. the instance is enrolled, uncontested, in this cluster (FetchRefusedError), and every item asked
     for belongs to the enrolled group's role: host keys and end-sessions to a login node, user holds
     to the controller (the role comes from the enrollment, i.e. AWS's record, never the request);
     host keys and user holds only to a proven enrollment (PROVEN_ONLY);
  3. the signature verifies with the enrolled key (node_proof's NodeProofError subclasses);
  4. issuedAt within MAX_SKEW_SECONDS of now (FetchRefusedError: stale or from the future);
  5. the nonce is new for this instance (FetchReplayError), remembered with a TTL past the skew so a
     captured request cannot be replayed while it is fresh.

Pure here (parsing and the decision); the handler does the reads and the conditional write.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hpops_core.common import validation
from hpops_core.common.errors import HpopsError
from hpops_core.common.state_table import fetch_nonce_partition
from hpops_core.node_channel import proof_format

ACTION = "fetch"
HOST_KEYS, END_SESSIONS, USER_HOLDS = "hostKeys", "endSessions", "userHolds"
# Item -> the enrolled role that may fetch it.
FETCH_ITEMS = {HOST_KEYS: "login", END_SESSIONS: "login", USER_HOLDS: "controller"}
# Items served only to a proven enrollment (verified document, approval, or its window passed uncontested):
# a key that raced a new node for its enrollment gets no key byte and learns nobody's holds.
PROVEN_ONLY = (HOST_KEYS, USER_HOLDS)
MAX_SKEW_SECONDS = 120
# A nonce is remembered for as long as a request carrying it could still be fresh, and a minute more.
NONCE_TTL_SECONDS = 2 * MAX_SKEW_SECONDS + 60
NONCE_RE = re.compile(r"\A[0-9a-f]{32}\Z")
_ISSUED_AT_RE = re.compile(r"\A[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?(Z|\+00:00)\Z")
MAX_REQUEST_BYTES = 8192


class FetchError(HpopsError):
    """A fetch request the function refused; nothing was returned or stored."""


class MalformedFetchRequest(FetchError, ValueError):
    """Not a fetch request the agent sends (the message names fields, never their values)."""


class FetchRefusedError(FetchError):
    """Well formed, but not from this instance's enrolled agent as it is now (reason says which check)."""


class FetchReplayError(FetchRefusedError):
    """The request's nonce was already used by this instance: a replay."""


@dataclass(frozen=True)
class FetchRequest:
    cluster: str
    instance_id: str
    what: tuple[str, ...]
    issued_at: dt.datetime
    nonce: str
    body: Mapping[str, Any]  # {"request": ..., "proof": ...}: what the signature covers and carries


@dataclass(frozen=True)
class Enrolled:
    """What fetch needs of an enrollment record (AWS's view of the instance, the agent's key)."""

    instance_id: str
    role: str  # login | controller, from the instance group AWS reported at enrollment
    public_key: str
    contested: bool = False
    proven: bool = True  # Enrollment.proven(now)


def _parse_time(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(dt.timezone.utc)


def parse_fetch_request(event: Any) -> FetchRequest:
    """The invoke payload -> a FetchRequest; anything else is a MalformedFetchRequest."""
    if not isinstance(event, dict) or event.get("action") != ACTION:
        raise MalformedFetchRequest("expected {\"action\": \"fetch\", \"request\": {...}, \"proof\": ...}")
    request, proof = event.get("request"), event.get(proof_format.PROOF_FIELD)
    if not isinstance(request, dict) or not isinstance(proof, str) or set(event) != {"action", "request", "proof"}:
        raise MalformedFetchRequest("fetch needs exactly action, request and proof")
    if len(proof_format.canonical(request)) + len(proof) > MAX_REQUEST_BYTES:
        raise MalformedFetchRequest("fetch request too large")
    bad = sorted(set(request) - {"cluster", "instanceId", "what", "issuedAt", "nonce"})
    what = request.get("what")
    if not validation.is_cluster_name(request.get("cluster")):
        bad.append("cluster")
    if not validation.is_instance_id(request.get("instanceId")):
        bad.append("instanceId")
    if not (isinstance(what, list) and 0 < len(what) <= len(FETCH_ITEMS) and len(set(what)) == len(what)
            and all(item in FETCH_ITEMS for item in what)):
        bad.append("what")
    issued = request.get("issuedAt")
    if not (isinstance(issued, str) and _ISSUED_AT_RE.match(issued)):
        bad.append("issuedAt")
    if not (isinstance(request.get("nonce"), str) and NONCE_RE.match(request["nonce"])):
        bad.append("nonce")
    if bad:
        raise MalformedFetchRequest(f"fetch request rejected; invalid field(s): {', '.join(bad[:5])}")
    return FetchRequest(request["cluster"], request["instanceId"], tuple(what), _parse_time(issued),
                        request["nonce"], {"request": request, "proof": proof})


def signed_body(request: FetchRequest) -> dict:
    """What node_proof.verify_body checks: the request fields plus its proof (canonical() drops it)."""
    return dict(request.body["request"], proof=request.body["proof"])


def decide_fetch(request: FetchRequest, cluster: str, enrolled: Enrolled | None, now: dt.datetime) -> None:
    """Pure: raise the named refusal for checks 2 and 4 (the signature and nonce are checked by the
    handler with the enrolled key and the table); return None when the request may proceed."""
    if request.cluster != cluster:
        raise FetchRefusedError(f"fetch for cluster {request.cluster}: this stack serves {cluster}")
    if enrolled is None or enrolled.instance_id != request.instance_id:
        raise FetchRefusedError(f"{request.instance_id} has no enrolled agent")
    if enrolled.contested:
        raise FetchRefusedError(f"{request.instance_id}'s enrollment is contested: nothing is served until an "
                                "operator re-enrolls it")
    foreign = [item for item in request.what if FETCH_ITEMS[item] != enrolled.role]
    if foreign:
        raise FetchRefusedError(f"{request.instance_id} is enrolled as a {enrolled.role} node: "
                                f"{', '.join(foreign)} is not for it")
    unproven = [item for item in request.what if item in PROVEN_ONLY and not enrolled.proven]
    if unproven:
        raise FetchRefusedError(f"{request.instance_id}'s key is not proven yet (no verified instance identity "
                                f"document or approval, its enrollment window still open): {', '.join(unproven)} "
                                "is served once it is")
    skew = (request.issued_at - now).total_seconds()
    if skew > MAX_SKEW_SECONDS:
        raise FetchRefusedError(f"fetch issued {int(skew)} s in the future (at most {MAX_SKEW_SECONDS} s)")
    if -skew > MAX_SKEW_SECONDS:
        raise FetchRefusedError(f"fetch issued {int(-skew)} s ago (at most {MAX_SKEW_SECONDS} s): stale")


def nonce_item(cluster: str, request: FetchRequest, now: dt.datetime) -> dict:
    """The conditional PutItem's item (DynamoDB wire format): unique per instance and nonce, with a TTL."""
    return {"pk": {"S": fetch_nonce_partition(cluster)}, "sk": {"S": f"{request.instance_id}#{request.nonce}"},
            "ttl": {"N": str(int(now.timestamp()) + NONCE_TTL_SECONDS)}}
