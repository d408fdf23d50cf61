"""`make chaos` part 5 in full (it is small): a cluster user holding only the node role, IAM enforced,
goes after the host private keys, other nodes' instructions and the holds list, and NodeChannel fetch
without the agent's key. Every attempt is refused with its named error, hands back nothing secret
(the planted user names, the session handle, any line of a host private key) and changes nothing."""

from __future__ import annotations

from hpops_twin import chaos
from hpops_twin.chaos_secrets import part_secret_attacker


def test_a_user_with_the_node_role_gets_no_secret_and_no_other_nodes_instruction():
    chaos.quiet()
    part = part_secret_attacker()
    assert part["findings"] == [] and part["ok"]
    assert part["tried"] == part["survived"] == 11 and part["side_effects"] == 0
    errors = {a["error"] for a in part["attacks"]}
    assert {"AccessDeniedException", "NodeProofKeyMismatchError", "NodeProofMalformedError", "MalformedFetchRequest",
            "FetchRefusedError", "FetchReplayError"} == errors
    assert all(a["leaked"] == [] for a in part["attacks"])
