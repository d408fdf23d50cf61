"""Pure: which Session Manager sessions are interactive shells of their run-as user, and so count.

A session's ``DocumentName`` says what kind of session it is (Session document schema, AWS
Systems Manager User Guide: ``sessionType`` Standard_Stream | InteractiveCommands |
NonInteractiveCommands | Port):

* ``SSM-SessionManagerRunShell`` (also what a session without a document gets) is a
  Standard_Stream shell: counted.
* ``AWS-StartInteractiveCommand`` (InteractiveCommands) runs a caller-chosen command on a
  terminal as the run-as user; with ``command=bash`` it *is* a shell, so it is counted, or the
  limit would be one flag away from useless.
* ``AWS-StartNonInteractiveCommand`` runs one command without a terminal (diagnostics,
  automation): not a shell.
* Port sessions (``AWS-StartPortForwardingSession*``) carry no shell at all, and
  ``AWS-StartSSHSession`` tunnels to sshd, where the login is bounded by the node's pam_limits
  ``maxlogins`` (node agent), not here.
* Any other name is a customer's own Session document. Most are Standard_Stream preferences
  documents, and only GetDocument could tell otherwise, so they are counted (a port-type custom
  document is then counted too; the report names the document).
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_SHELL_DOCUMENT = "SSM-SessionManagerRunShell"

NOT_SHELLS = {
    "AWS-StartPortForwardingSession": "port forwarding, no shell",
    "AWS-StartPortForwardingSessionToRemoteHost": "port forwarding, no shell",
    "AWS-StartPortForwardingSessionToSocket": "port forwarding, no shell",
    "AWS-StartSSHSession": "an SSH tunnel; the SSH login is bounded by the node's maxlogins instead",
    "AWS-StartNonInteractiveCommand": "a non-interactive command, no shell",
}


@dataclass(frozen=True)
class SessionKind:
    counted: bool
    reason: str


def document_short_name(document_name: str | None) -> str | None:
    """A shared document may be named by ARN (``arn:aws:ssm:...:document/Name``); its name is the last part."""
    if not isinstance(document_name, str) or not document_name:
        return None
    return document_name.rsplit("/", 1)[-1]


def session_kind(document_name: str | None) -> SessionKind:
    name = document_short_name(document_name)
    if name is None:
        return SessionKind(True, f"no document: a {DEFAULT_SHELL_DOCUMENT} shell")
    if name in NOT_SHELLS:
        return SessionKind(False, f"document {name}: {NOT_SHELLS[name]}")
    if name == DEFAULT_SHELL_DOCUMENT:
        return SessionKind(True, f"document {name}: an interactive shell")
    if name == "AWS-StartInteractiveCommand":
        return SessionKind(True, f"document {name}: an interactive command on a terminal, counted like a shell")
    return SessionKind(True, f"document {name[:128]}: a custom Session document, counted as a shell")
