"""A cluster user who holds only the node role's credentials (the twin's "agent" principal), none of
the agent's files: the attacks of issue "a node identity users cannot borrow", as the twin's
tests and `make chaos` run them. The user has their own ssh-keygen key (anyone can make one) and
can read what is world-readable on a node (instance ids and IPs of every node).
"""

from __future__ import annotations

import json
import secrets
import tempfile
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from hpops_core.node_channel import proof_format
from hpops_node_agent import agent_key
from hpops_twin.iam.enforce import acting_as


def iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


class Attacker:
    def __init__(self, world: Any):
        self.world = world
        self._dir = Path(tempfile.mkdtemp(prefix="hpops-twin-attacker-"))
        self.key = str(self._dir / "key" / "agent-key")
        self.public = agent_key.ensure_key(self.key)

    @property
    def fingerprint(self) -> str:
        return agent_key.fingerprint(self.public)

    def sign(self, body: dict, purpose: str) -> str:
        return agent_key.sign(self.key, proof_format.namespace(purpose, self.world.cluster_name),
                              proof_format.canonical(body))

    def enroll(self, instance_id: str, ip: str, document: dict | None = None) -> dict:
        """NodeChannel "enroll" for someone else's instance with the attacker's own key; ``document``: an
        instance identity document the attacker read (only on that node's own IMDS can it)."""
        statement = {"cluster": self.world.cluster_name, "instanceId": instance_id, "ip": ip,
                     "agentPublicKey": self.public, "issuedAt": iso(datetime.now(timezone.utc)),
                     "nonce": secrets.token_urlsafe(24)}
        if document is not None:
            statement["identityDocument"] = document
        request = {"action": "enroll", "statement": statement, "proof": self.sign({"statement": statement}, "enroll")}
        return self.invoke(request)

    def fetch(self, instance_id: str, what: list[str]) -> dict:
        """NodeChannel "fetch" (host keys, holds...) signed with the attacker's key, for an instance it enrolled."""
        request = {"cluster": self.world.cluster_name, "instanceId": instance_id, "what": what,
                   "issuedAt": iso(datetime.now(timezone.utc)), "nonce": secrets.token_hex(16)}
        return self.invoke({"action": "fetch", "request": request, "proof": self.sign(request, "fetch")})

    def invoke(self, request: dict) -> dict:
        with acting_as("agent"):
            response = self.world.aws.client("lambda").invoke(
                FunctionName=self.world.output("NodeChannelFunctionName"), Payload=json.dumps(request).encode())
        return json.loads(response["Payload"].read())

    def put_report(self, detail_type: str, detail: dict, sign: bool = True, sequence: int | None = None) -> None:
        """A report on the node-report bus, signed with the attacker's key (or not at all); ``sequence``:
        one the attacker picks (2**63 - 1 would pin the real agent's reports as replays)."""
        body = dict(detail)
        if sign:
            body["sequence"] = sequence or proof_format.next_sequence(0)
            body["proof"] = self.sign(body, "report")
        with acting_as("agent"):
            self.world.aws.client("events").put_events(Entries=[{
                "Source": "hpops.node", "DetailType": detail_type, "EventBusName": self.world.output("NodeReportBusName"),
                "Detail": json.dumps(body)}])


def far_future() -> str:
    return "2099-01-01T00:00:00Z"


def soon(seconds: int) -> str:
    return iso(datetime.now(timezone.utc) + timedelta(seconds=seconds))
