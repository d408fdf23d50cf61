"""One SSH host identity for every login node behind the NLB.

``keys`` builds and serialises the canonical host-key bundle (and the CA used in
certificate mode), ``verifier`` reads the host keys a node actually presents on
port 22, and ``node/install_host_keys.py`` is the standard-library-only script
that installs a bundle on a node.
"""
