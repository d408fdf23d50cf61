"""Desired state in Parameter Store: what the node agents converge to.

Documents are built by pure functions from the public identity record (the sync-lease item's
`hostIdentity`), so they never hold key material: keys mode names the secret and the
fingerprints a node must end up presenting. Publishing writes only when the document changed,
so a sweep that changes nothing costs one GetParameter.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from botocore.exceptions import ClientError

from hpops_core.common.clients import client, transient_errors_named
from hpops_core.node_channel import contract, instructions

MAX_STANDARD_PARAMETER_BYTES = 4096


def host_identity_document(mode: str, expected: Mapping[str, Any] | None, secret_arn: str) -> dict:
    """Pure. `expected` is the published public record, or None before the operator initialised it."""
    document: dict[str, Any] = {"format": contract.HOST_IDENTITY_FORMAT, "mode": mode}
    record = dict(expected or {})
    if mode == "keys" and record.get("mode", "keys") == "keys" and record.get("fingerprints"):
        document |= {"version": str(record.get("version") or "unversioned")[:128], "secretArn": secret_arn,
                     "fingerprints": dict(sorted(record["fingerprints"].items()))}
    elif mode == "certificate" and record.get("mode") == "certificate" and record.get("caFingerprint"):
        document |= {"version": str(record.get("version") or "unversioned")[:128],
                     "caFingerprint": record["caFingerprint"]}
    else:
        # Nothing to converge to yet (mode off, or no identity initialised): agents wait and say so.
        document["version"] = "uninitialized"
    return document


def serialise(document: Mapping[str, Any]) -> str:
    text = json.dumps(document, sort_keys=True, separators=(",", ":"))
    if len(text.encode()) > MAX_STANDARD_PARAMETER_BYTES:
        raise ValueError("desired-state document exceeds a standard parameter's 4 KB")
    return text


def publish_if_changed(name: str, document: Mapping[str, Any], description: str) -> bool:
    """Write the parameter when its value differs; True when it was written. An instruction parameter
    (contract.INSTRUCTIONS) gets its public marker written after it."""
    text = serialise(document)
    ssm = client("ssm")
    try:
        with transient_errors_named("ssm:GetParameter"):
            current = ssm.get_parameter(Name=name)["Parameter"]["Value"]
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") != "ParameterNotFound":
            raise
        current = None
    if current == text:
        return False
    if "/" + contract.INSTRUCTIONS in name:
        instructions.write_instruction(name, text, description)
        return True
    with transient_errors_named("ssm:PutParameter"):
        ssm.put_parameter(Name=name, Value=text, Type="String", Overwrite=True, Description=description[:1024])
    return True
