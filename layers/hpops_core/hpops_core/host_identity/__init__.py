"""One SSH host identity for every login node behind the NLB.

``keys`` builds and serialises the canonical host-key bundle (and the CA used in
certificate mode), ``verifier`` reads the host keys a node actually presents on
port 22, ``certificates`` decides what a node's certificates must say. What runs on
the nodes (the agent that installs a bundle) lives in the repository's ``node/``.
"""
