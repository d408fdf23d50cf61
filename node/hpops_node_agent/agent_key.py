"""The agent's own key: the one thing a user holding the node's IAM role does not have.

Every process on a node can take the node's role credentials from the instance metadata service, so
the role alone proves nothing about who is speaking. The agent runs as root and keeps an Ed25519 key
only root can read; the stack enrolls its public half once per instance (NodeChannel "enroll") and
accepts reports, and answers fetches, only when signed by it.

Standard library only: the node signs with OpenSSH's own `ssh-keygen -Y sign` (OpenSSH >= 8.1; the
HyperPod Slurm AMI, Ubuntu 22.04, has 8.9), so the bundle ships no compiled crypto library.
"""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess

DEFAULT_KEY_PATH = "/var/lib/hpops-node-agent/agent-key"
KEY_COMMENT = "hpops-agent"
KEY_TYPE = "ssh-ed25519"
SSH_KEYGEN_TIMEOUT_SECONDS = 30


class AgentKeyError(Exception):
    """The agent key cannot be made, read or used; the message says which step failed (no key material)."""


def _run(command: list, stdin: bytes = b"", ssh_keygen: str = "ssh-keygen") -> bytes:
    try:
        result = subprocess.run([ssh_keygen] + command, input=stdin, capture_output=True,
                                timeout=SSH_KEYGEN_TIMEOUT_SECONDS, check=False)
    except FileNotFoundError:
        raise AgentKeyError("{} not found (OpenSSH >= 8.1 is needed for the agent key)".format(ssh_keygen)) from None
    except subprocess.TimeoutExpired:
        raise AgentKeyError("ssh-keygen timed out") from None
    if result.returncode != 0:
        tail = (result.stderr.decode("utf-8", "replace").strip().splitlines() or ["no output"])[-1]
        raise AgentKeyError("ssh-keygen {} failed: {}".format(command[0], tail[:200]))
    return result.stdout


def _check_private(path: str) -> None:
    """Refuse a key another user could read or replace: that key would prove nothing."""
    for target, mode_mask in ((os.path.dirname(path) or ".", 0o077), (path, 0o077)):
        info = os.lstat(target)
        if info.st_uid != os.geteuid():
            raise AgentKeyError("{} is not owned by the agent's user".format(target))
        if info.st_mode & mode_mask:
            raise AgentKeyError("{} is readable or writable by others (want 0700 dir, 0600 key)".format(target))


def ensure_key(path: str = DEFAULT_KEY_PATH, ssh_keygen: str = "ssh-keygen") -> str:
    """Make the key if missing (dir 0700, file 0600) and return its public line "ssh-ed25519 AAAA...".

    An existing key is kept (enrollment is once per instance): losing it means an operator
    re-enrollment, never a silent replacement.
    """
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=0o700, exist_ok=True)
    os.chmod(directory, 0o700)
    if not os.path.exists(path):
        if os.path.lexists(path + ".pub"):
            os.unlink(path + ".pub")  # ssh-keygen would ask before overwriting a stale public half
        old_umask = os.umask(0o077)
        try:
            _run(["-q", "-t", "ed25519", "-N", "", "-C", KEY_COMMENT, "-f", path], ssh_keygen=ssh_keygen)
        finally:
            os.umask(old_umask)
    _check_private(path)
    return public_line(path, ssh_keygen)


def public_line(path: str = DEFAULT_KEY_PATH, ssh_keygen: str = "ssh-keygen") -> str:
    """The public half, derived from the private key (the .pub file could have been swapped)."""
    output = _run(["-y", "-f", path], ssh_keygen=ssh_keygen).decode("ascii", "replace").split()
    if len(output) < 2 or output[0] != KEY_TYPE:
        raise AgentKeyError("{} is not an Ed25519 key".format(path))
    return "{} {}".format(output[0], output[1])


def fingerprint(public_key_line: str) -> str:
    """OpenSSH's "SHA256:..." fingerprint of a public key line (what `ssh-keygen -lf` prints)."""
    parts = (public_key_line or "").split()
    if len(parts) < 2:
        raise AgentKeyError("not a public key line")
    try:
        blob = base64.b64decode(parts[1], validate=True)
    except ValueError:
        raise AgentKeyError("the public key is not valid base64") from None
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode("ascii").rstrip("=")


def sign(path: str, namespace: str, message: bytes, ssh_keygen: str = "ssh-keygen") -> str:
    """The armored SSHSIG of ``message`` (given on stdin) by the key at ``path`` in ``namespace``."""
    if not namespace or any(character.isspace() for character in namespace):
        raise AgentKeyError("a signing namespace must be one word")
    _check_private(path)
    armored = _run(["-Y", "sign", "-q", "-f", path, "-n", namespace], stdin=message,
                   ssh_keygen=ssh_keygen).decode("ascii", "replace").strip()
    if not armored.startswith("-----BEGIN SSH SIGNATURE-----"):
        raise AgentKeyError("ssh-keygen -Y sign returned no signature")
    return armored
