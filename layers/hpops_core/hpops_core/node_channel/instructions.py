"""Writing a per-node instruction: the private parameter, then its public marker.

The instruction (sessions to end on one login node, the users to hold on the controller) goes to
/hpops/<cluster>/instructions/..., which only the stack's functions read; the node's enrolled agent
gets it from NodeChannel `fetch`. So that the agent need not invoke the function on every 30 s
poll, a marker under node/instructions/ (readable with the desired state) carries the instruction
parameter's version and nothing else: no user names, no handles.
"""

from __future__ import annotations

import json

from hpops_core.common.clients import client, transient_errors_named
from hpops_core.node_channel import contract


def marker_value(version: int) -> str:
    return json.dumps({"format": contract.INSTRUCTION_MARKER_FORMAT, "version": int(version)}, sort_keys=True,
                      separators=(",", ":"))


def mark(name: str, version: int) -> None:
    """Write the marker of instruction parameter ``name`` at ``version`` (after the instruction itself)."""
    with transient_errors_named("ssm:PutParameter"):
        client("ssm").put_parameter(Name=contract.instruction_marker_parameter(name), Type="String", Overwrite=True,
                                    Value=marker_value(version))


def write_instruction(name: str, value: str, description: str = "") -> int:
    """Put the instruction, then its marker; returns the instruction parameter's new version."""
    extra = {"Description": description[:1024]} if description else {}
    with transient_errors_named("ssm:PutParameter"):
        version = client("ssm").put_parameter(Name=name, Value=value, Type="String", Overwrite=True, **extra)["Version"]
    mark(name, version)
    return version
