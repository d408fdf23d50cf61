"""The agent's enrollment carries its node's instance identity document where IMDS serves it, and goes on
without it where the stack has no certificate for the Region (a named refusal, asked again at once)."""

from __future__ import annotations

from hpops_node_agent.node_identity import AgentIdentity

INSTANCE = "i-0123456789abcdef0"
SERVED = {"document": '{"instanceId" : "i-0123456789abcdef0"}', "signature": "c2lnbmF0dXJl"}


def test_the_document_goes_with_the_statement_and_a_region_without_certificate_drops_it(tmp_path):
    sent, answers = [], [
        {"ok": False, "error": "NoCertificateForRegionError", "message": "no AWS instance identity certificate"},
        {"ok": True, "fingerprint": "SHA256:x", "role": "login", "via": "window"},
    ]

    def invoke(request: dict) -> dict:
        sent.append(request["statement"])
        return answers.pop(0)

    identity = AgentIdentity(str(tmp_path / "state"), "ml-research", invoke, lambda *args, **fields: None,
                             identity_document=lambda: dict(SERVED))
    assert not identity.ensure_enrolled(INSTANCE, "10.1.0.11")
    assert sent[0]["identityDocument"] == SERVED, "exactly as IMDS served it: the signature covers those bytes"
    # Refused for the Region only: asked again at once (no 5-minute wait), without the document.
    assert identity.ensure_enrolled(INSTANCE, "10.1.0.11")
    assert "identityDocument" not in sent[1] and identity.state["via"] == "window"


def test_without_a_served_document_the_statement_is_as_before(tmp_path):
    sent = []
    identity = AgentIdentity(str(tmp_path / "state"), "ml-research",
                             lambda request: sent.append(request["statement"]) or {"ok": True, "fingerprint": "f"},
                             lambda *args, **fields: None)
    assert identity.ensure_enrolled(INSTANCE, "10.1.0.11")
    assert "identityDocument" not in sent[0]
