"""The node-command transport: how a command reaches a login node.

Kept behind one small interface because it is UNCONFIRMED whether SSM Run Command can target
HyperPod nodes by instance id (shared/aws-facts.md). Whatever the transport, the verifier decides
whether a node takes traffic; the same node script also ships as a lifecycle (on-create) snippet.
Only the document name and public parameters travel in the command; the node fetches the secret.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Protocol

from botocore.exceptions import ClientError

from hpops_core.aws.clients import client, transient_errors_named

PENDING_STATUSES = frozenset({"Pending", "InProgress", "Delayed"})


@dataclass(frozen=True)
class CommandOutcome:
    status: str  # Pending | InProgress | Success | Failed | TimedOut | Cancelled | Undeliverable
    result: str  # the node script's own verdict: changed | unchanged | failed | unknown
    reason: str

    @property
    def finished(self) -> bool:
        return self.status not in PENDING_STATUSES


class NodeCommandTransport(Protocol):
    def send(self, instance_id: str, document: str, parameters: dict[str, list[str]], comment: str = ...) -> str: ...

    def outcome(self, command_id: str, instance_id: str) -> CommandOutcome: ...

    def output(self, command_id: str, instance_id: str) -> str: ...


class SsmRunCommand:
    """SSM Run Command with a stack-owned document (HostIdentityDocument, LoginLimitsDocument)."""

    def send(self, instance_id: str, document: str, parameters: dict[str, list[str]],
             comment: str = "hpops: install the canonical SSH host identity") -> str:
        with transient_errors_named("ssm:SendCommand"):
            response = client("ssm").send_command(
                InstanceIds=[instance_id],
                DocumentName=document,
                Parameters=parameters,
                TimeoutSeconds=60,
                Comment=comment,
            )
        return response["Command"]["CommandId"]

    def outcome(self, command_id: str, instance_id: str) -> CommandOutcome:
        try:
            with transient_errors_named("ssm:GetCommandInvocation"):
                invocation = client("ssm").get_command_invocation(CommandId=command_id, InstanceId=instance_id)
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") == "InvocationDoesNotExist":
                return CommandOutcome("Pending", "unknown", "invocation not registered yet")
            raise
        return outcome_from_invocation(invocation)

    def output(self, command_id: str, instance_id: str) -> str:
        """What the node script printed (public by design; at most 24,000 characters are kept by SSM)."""
        with transient_errors_named("ssm:GetCommandInvocation"):
            invocation = client("ssm").get_command_invocation(CommandId=command_id, InstanceId=instance_id)
        if invocation.get("Status") != "Success":
            return ""
        return invocation.get("StandardOutputContent") or ""


def outcome_from_invocation(invocation: dict) -> CommandOutcome:
    """The node script prints one JSON line of public facts; keep only its verdict and reason."""
    status = invocation.get("Status", "Pending")
    result, reason = "unknown", invocation.get("StatusDetails", status)
    for line in reversed((invocation.get("StandardOutputContent") or "").splitlines()):
        try:
            summary = json.loads(line)
        except ValueError:
            continue
        if isinstance(summary, dict) and "result" in summary:
            result = str(summary["result"])[:32]
            reason = str(summary.get("reason", result))[:300]
            break
    return CommandOutcome(status=status, result=result, reason=reason)
