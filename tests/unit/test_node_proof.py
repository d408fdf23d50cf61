"""The agent key (node side, real ssh-keygen) and the stack's SSHSIG verifier.

OpenSSH is the referee: signatures come from `ssh-keygen -Y sign`, and the verifier must agree with
`ssh-keygen -Y verify` on what is valid; every refusal is a named NodeProofError.
"""

from __future__ import annotations

import base64
import os
import shutil
import stat
import struct
import subprocess

import pytest

from hpops_core.common.errors import HpopsError
from hpops_core.node_channel import node_proof, proof_format
from hpops_core.node_channel.node_proof import (
    NodeProofBadSignatureError,
    NodeProofError,
    NodeProofKeyMismatchError,
    NodeProofMalformedError,
)
from hpops_node_agent import agent_key

SSH_KEYGEN = shutil.which("ssh-keygen")
pytestmark = pytest.mark.skipif(SSH_KEYGEN is None and os.environ.get("CI") != "true",
                                reason="needs OpenSSH's ssh-keygen")
NS = proof_format.namespace("report", "ml-cluster")


@pytest.fixture
def key(tmp_path):
    path = str(tmp_path / "state" / "agent-key")
    return path, agent_key.ensure_key(path)


def test_ensure_key_makes_a_root_only_ed25519_key_once(tmp_path):
    path = str(tmp_path / "state" / "agent-key")
    line = agent_key.ensure_key(path)
    assert line.startswith("ssh-ed25519 AAAA") and len(line.split()) == 2
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    assert agent_key.ensure_key(path) == line  # kept, never replaced
    listed = subprocess.run([SSH_KEYGEN, "-lf", path], capture_output=True, text=True, check=True).stdout
    assert listed.split()[1] == agent_key.fingerprint(line) == node_proof.fingerprint(line)


def test_ensure_key_refuses_a_key_others_can_read(key):
    path, _ = key
    os.chmod(path, 0o644)
    with pytest.raises(agent_key.AgentKeyError, match="readable or writable by others"):
        agent_key.ensure_key(path)
    with pytest.raises(agent_key.AgentKeyError):
        agent_key.sign(path, NS, b"x")


def test_a_real_signature_verifies_and_agrees_with_ssh_keygen(key, tmp_path):
    path, line = key
    body = {"cluster": "ml-cluster", "instanceId": "i-0123456789abcdef0", "sequence": 7, "note": "é"}
    message = proof_format.canonical(body)
    proof = agent_key.sign(path, NS, message)
    node_proof.verify(proof, line, NS, message)
    node_proof.verify_body(dict(body, proof=proof), line, "report", "ml-cluster")
    (tmp_path / "signers").write_text("agent {}\n".format(line))
    (tmp_path / "sig").write_text(proof)
    referee = subprocess.run([SSH_KEYGEN, "-Y", "verify", "-f", str(tmp_path / "signers"), "-I", "agent",
                              "-n", NS, "-s", str(tmp_path / "sig")], input=message, capture_output=True)
    assert referee.returncode == 0


def test_canonical_ignores_proof_and_key_order():
    one = proof_format.canonical({"b": 1, "a": [1, "x"], "proof": "anything"})
    assert one == proof_format.canonical({"a": [1, "x"], "b": 1}) == b'{"a":[1,"x"],"b":1}'


def test_next_sequence_moves_forward_even_with_a_lost_state_file():
    assert proof_format.next_sequence(0, now_seconds=100.0) == 100_000_000
    assert proof_format.next_sequence(100_000_000, now_seconds=100.0) == 100_000_001


@pytest.mark.parametrize("change", ["altered", "other_namespace", "other_cluster", "other_key"])
def test_every_mismatch_is_refused_by_name(key, tmp_path, change):
    path, line = key
    body = {"instanceId": "i-0123456789abcdef0", "sessions": ["bob"]}
    proof = agent_key.sign(path, NS, proof_format.canonical(body))
    namespace, enrolled = NS, line
    if change == "altered":
        body["sessions"] = []
        expected = NodeProofBadSignatureError
    elif change == "other_namespace":
        namespace, expected = proof_format.namespace("enroll", "ml-cluster"), NodeProofKeyMismatchError
    elif change == "other_cluster":
        namespace, expected = proof_format.namespace("report", "other"), NodeProofKeyMismatchError
    else:
        enrolled = agent_key.ensure_key(str(tmp_path / "other" / "agent-key"))
        expected = NodeProofKeyMismatchError
    with pytest.raises(expected) as caught:
        node_proof.verify(proof, enrolled, namespace, proof_format.canonical(body))
    assert isinstance(caught.value, NodeProofError) and isinstance(caught.value, HpopsError)


def _envelope(proof: str) -> bytes:
    return base64.b64decode("".join(proof.strip().splitlines()[1:-1]))


def _armor(data: bytes) -> str:
    return "-----BEGIN SSH SIGNATURE-----\n{}\n-----END SSH SIGNATURE-----".format(base64.b64encode(data).decode())


def test_a_signature_by_another_key_with_the_enrolled_key_spliced_in_is_refused(key, tmp_path):
    """The envelope names a public key; swapping in the enrolled one must not make a stranger's signature pass."""
    path, line = key
    stranger = str(tmp_path / "stranger" / "agent-key")
    agent_key.ensure_key(stranger)
    message = b'{"x":1}'
    data = _envelope(agent_key.sign(stranger, NS, message))
    enrolled_blob = node_proof.public_key_blob(line)
    (length,) = struct.unpack(">I", data[10:14])
    spliced = data[:10] + struct.pack(">I", len(enrolled_blob)) + enrolled_blob + data[14 + length:]
    with pytest.raises(NodeProofBadSignatureError):
        node_proof.verify(_armor(spliced), line, NS, message)


@pytest.mark.parametrize("proof", [
    "", "not a signature", None, 42, "-----BEGIN SSH SIGNATURE-----\n!!!\n-----END SSH SIGNATURE-----",
    _armor(b"SSHSIG\x00\x00\x00\x02"), _armor(b"NOTSIG\x00\x00\x00\x01"), _armor(b"SSHSIG\x00\x00\x00\x01\xff\xff\xff\xff"),
    "-----BEGIN SSH SIGNATURE-----\n" + "A" * 5000 + "\n-----END SSH SIGNATURE-----",
])
def test_malformed_proofs_are_refused_by_name(key, proof):
    _, line = key
    with pytest.raises(NodeProofMalformedError):
        node_proof.verify(proof, line, NS, b"x")


def test_trailing_bytes_and_a_non_ed25519_enrolled_key_are_refused(key):
    path, line = key
    proof = agent_key.sign(path, NS, b"x")
    with pytest.raises(NodeProofMalformedError):
        node_proof.verify(_armor(_envelope(proof) + b"\x00"), line, NS, b"x")
    with pytest.raises(NodeProofMalformedError):
        node_proof.verify(proof, "ssh-rsa AAAAB3NzaC1yc2E", NS, b"x")
    with pytest.raises(NodeProofMalformedError):
        node_proof.verify_body({"no": "proof"}, line, "report", "ml-cluster")
