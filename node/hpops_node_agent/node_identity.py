"""The agent's proof of who it is: enrollment of its key, and signed reports (standard library + boto3).

Every process on the node holds the node's IAM role, so the stack trusts only what the agent's own
key (agent_key.py, root-only) signs. Once per instance the agent enrolls the key through the
stack's NodeChannel function (lambda:InvokeFunction), with the instance identity document and its AWS
signature where IMDS serves them (AWS's word that the request comes from this instance); from then on every report carries "sequence"
and "proof" (an SSHSIG over proof_format.canonical(report)). State (whether enrolled, the last
sequence) is kept in enrollment.json next to the key; a lost file only means one idempotent
enroll call and a sequence that still moves forward (it starts from the time in microseconds).
"""

from __future__ import annotations

import datetime
import json
import os
import secrets
import time
from typing import Any, Callable, Dict, Optional

from hpops_core.node_channel import proof_format

from . import agent_key, host_keys

STATE_FILE = "enrollment.json"
KEY_FILE = "agent-key"
# A refused enrollment (awaiting an operator's approval, contested) is asked again at most this often.
ENROLL_RETRY_SECONDS = 300
# An enrolled agent asks again (idempotent) this often: a contested enrollment, or an operator's
# re-enrollment, is noticed without a restart. 6 invokes an hour per node.
ENROLL_RECHECK_SECONDS = 600


class NodeIdentityError(Exception):
    """The agent cannot prove who it is yet (no key, not enrolled); the message says why."""


# The stack's refusal of a Region it has no certificate for: the agent enrolls without the document then.
NO_CERTIFICATE_FOR_REGION = "NoCertificateForRegionError"


class AgentIdentity:
    def __init__(self, state_dir: str, cluster: str, invoke: Callable[[dict], dict], log: Callable[..., None],
                 ssh_keygen: str = "ssh-keygen", clock: Callable[[], float] = time.time,
                 identity_document: Callable[[], Optional[dict]] = lambda: None) -> None:
        self.key_path = os.path.join(state_dir, KEY_FILE)
        self.state_path = os.path.join(state_dir, STATE_FILE)
        self.cluster = cluster
        self.invoke = invoke  # NodeChannel request -> answer (raises on transport errors)
        self.clock = clock  # the wall clock: the stack compares issuedAt and sequence with its own
        self.log = log
        self.ssh_keygen = ssh_keygen
        # IMDS's instance identity document and signature (identity.imds_identity_document), or None
        self.identity_document = identity_document
        self.state = self._load()
        self._public: Optional[str] = None

    def _load(self) -> Dict[str, Any]:
        try:
            with open(self.state_path, "r", encoding="utf-8") as handle:
                state = json.load(handle)
            return state if isinstance(state, dict) else {}
        except (OSError, ValueError):
            return {}

    def _save(self) -> None:
        os.makedirs(os.path.dirname(self.state_path), mode=0o700, exist_ok=True)
        host_keys.atomic_write(self.state_path, json.dumps(self.state, sort_keys=True).encode("utf-8"), 0o600)

    def public_key(self) -> str:
        if self._public is None:
            self._public = agent_key.ensure_key(self.key_path, self.ssh_keygen)
        return self._public

    def fingerprint(self) -> str:
        return agent_key.fingerprint(self.public_key())

    @property
    def enrolled(self) -> bool:
        return self.state.get("enrolledFingerprint") == self._fingerprint_if_known()

    def _fingerprint_if_known(self) -> Optional[str]:
        try:
            return self.fingerprint()
        except agent_key.AgentKeyError:
            return None

    def ensure_enrolled(self, instance_id: str, ip: str, force: bool = False) -> bool:
        """Enroll once; True when this key is enrolled for the instance. A refusal is logged and asked
        again after ENROLL_RETRY_SECONDS (an operator may approve the key meanwhile)."""
        now = self.clock()
        since = now - float(self.state.get("lastAttemptAt") or 0)
        if self.enrolled and not force and since < ENROLL_RECHECK_SECONDS:
            return True
        if not self.enrolled and not force and since < ENROLL_RETRY_SECONDS:
            return False
        statement = {"cluster": self.cluster, "instanceId": instance_id, "ip": ip, "agentPublicKey": self.public_key(),
                     "issuedAt": _iso(now), "nonce": secrets.token_urlsafe(24)}
        # AWS's signed word that this request comes from a process on the instance, where IMDS serves it
        # (and unless the stack said it cannot check this Region's signature).
        document = None if self.state.get("documentRefused") else self.identity_document()
        if document is not None:
            statement["identityDocument"] = document
        body = {"statement": statement}
        request = {"action": "enroll", "statement": statement,
                   "proof": agent_key.sign(self.key_path, proof_format.namespace(proof_format.ENROLL, self.cluster),
                                           proof_format.canonical(body), self.ssh_keygen)}
        self.state["lastAttemptAt"] = now
        was_enrolled = self.enrolled
        try:
            answer = self.invoke(request)
        except Exception as error:  # botocore's errors, a function error: a recheck that fails changes nothing
            if not was_enrolled:
                raise
            self.log("enrollment-recheck-failed", reason=str(error)[:300])
            self._save()
            return True
        if answer.get("ok"):
            self.state["enrolledFingerprint"] = answer.get("fingerprint")
            self.state["role"] = answer.get("role")
            self.state["via"] = answer.get("via")
            # The stack voided a replaced key's usage windows from this one on: re-collect (usage.py).
            if isinstance(answer.get("recollectFrom"), str):
                self.state["recollectFrom"] = answer["recollectFrom"]
            else:
                self.state.pop("recollectFrom", None)
            self.state.pop("refusal", None)
            self.log("enrolled", instanceId=instance_id, fingerprint=answer.get("fingerprint"), via=answer.get("via"))
        else:
            self.state.pop("enrolledFingerprint", None)
            self.state["refusal"] = "{}: {}".format(str(answer.get("error"))[:64], str(answer.get("message"))[:300])
            if answer.get("error") == NO_CERTIFICATE_FOR_REGION:
                self.state["documentRefused"] = NO_CERTIFICATE_FOR_REGION
                self.state.pop("lastAttemptAt", None)  # ask again at once, without the document
            self.log("enrollment-refused", instanceId=instance_id, fingerprint=self.fingerprint(),
                     error=str(answer.get("error"))[:64], reason=str(answer.get("message"))[:300])
        self._save()
        return bool(answer.get("ok"))

    def next_sequence(self) -> int:
        sequence = proof_format.next_sequence(int(self.state.get("lastSequence") or 0), self.clock())
        self.state["lastSequence"] = sequence
        self._save()  # before the report leaves: a crash must not reuse the number
        return sequence

    def sign_report(self, detail: Dict[str, Any]) -> Dict[str, Any]:
        """The detail with "sequence" and "proof" (ns hpops-report@<cluster>) added."""
        signed = dict(detail)
        signed.pop(proof_format.PROOF_FIELD, None)
        signed[proof_format.SEQUENCE_FIELD] = self.next_sequence()
        signed[proof_format.PROOF_FIELD] = agent_key.sign(
            self.key_path, proof_format.namespace(proof_format.REPORT, self.cluster), proof_format.canonical(signed),
            self.ssh_keygen)
        return signed


def _iso(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
