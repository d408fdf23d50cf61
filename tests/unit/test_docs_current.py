"""The docs describe today's design: statements that were true of an earlier one, and misled a new
user, must not come back. Each entry is a phrase (case and line breaks ignored) and what is true now."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
PAGES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]

STALE = {
    # The agent never reads the host-key secret: NodeChannel hands it to an enrolled agent.
    "it fetches the secret with the node's own role": "the enrolled agent asks NodeChannel",
    "only the nodes' own role (through `nodeagentpolicy`) and the operator can read them":
        "the node role cannot read the secret",
    # What the agent calls from a node: SSM, Lambda, EventBridge (and the SageMaker API on API-driven clusters).
    "network path to ssm, secrets manager and eventbridge": "SSM, Lambda and EventBridge",
    "`ssm`, `secretsmanager` and `events`": "ssm, lambda and events",
    # A role shared with compute groups is fine: users hold the role anyway and it reads no secret.
    "else every user there can read the host keys": "execution-role judges what the role can read",
    "else every user on those nodes can read the canonical host keys": "execution-role judges what the role can read",
    # The nodes admit the NLB's security group (users' connections come from it), not users' range.
    "and from the nlb's clients (users' vpn range)": "admit the NLB's security group",
    # Holds move the user to the hold QOS; association limits do not hold under a site's QOS.
    "sets grpjobs=0 maxjobs=0 on their associations": "the hold QOS hpopshold",
    # Adopt does not admit nodes launched long ago by itself: their agents' keys need approval.
    "then a repair verifies and admits them": "approved keys, then admitted",
    # One way to read an agent's fingerprint (contract.READ_AGENT_FINGERPRINT), from its private key.
    "python3 -m hpops_node_agent identity": "sudo ssh-keygen -y -f /var/lib/hpops-node-agent/agent-key | ssh-keygen -lf -",
    # Never advise one default Run As user for everyone (they share one session limit).
    "(or set a default user)": "no default user",
}


def _normalised(page: Path) -> str:
    return " ".join(page.read_text(encoding="utf-8").split()).lower()


@pytest.mark.parametrize("phrase", sorted(STALE))
def test_no_page_says_what_an_earlier_design_did(phrase):
    found = [p.name for p in PAGES if phrase in _normalised(p)]
    assert not found, f"{found} still say {phrase!r}; now: {STALE[phrase]}"


def test_the_template_and_cli_say_it_neither():
    """The same phrases in the texts users read outside docs/: parameter descriptions, CLI help, fixes."""
    texts = " ".join(" ".join((REPO_ROOT / path).read_text(encoding="utf-8").split()).lower()
                     for path in ("template.yaml", "cli/hpops/main.py", "cli/hpops/doctor_checks.py",
                                  "layers/hpops_core/hpops_core/host_identity/gate.py"))
    texts = re.sub(r"\s+", " ", texts)
    assert [p for p in STALE if p in texts] == []


def test_the_readme_deploys_in_phases_each_ending_with_a_check():
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    phases = re.findall(r"^\*\*\(([abc])\) ", text, re.M)
    assert phases == ["a", "b", "c"]
    deploy = text[text.index("## Deploy"):text.index("## Update and uninstall")]
    assert deploy.count("Check:") == 3 and "HostIdentityMode=off" in deploy
    assert "## Before you start" in text and "payer account" in text and "account-wide" in text
    assert "LoadBalancerSecurityGroupId" in deploy and "VerifierSecurityGroupId" in deploy
