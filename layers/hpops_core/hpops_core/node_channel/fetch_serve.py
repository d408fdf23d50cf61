"""NodeChannel `fetch`, the effects: enrollment lookup, signature, nonce, then the reads (fetch.py decides).

The answer carries the secret or the instruction to the invoking agent only; this module logs
nothing of it and returns nothing else (the handler logs the refusal's class and reason only).
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from hpops_core.common.clients import client, transient_errors_named
from hpops_core.node_channel import contract, enrollment_store, fetch, node_proof, user_holds_store


@dataclass(frozen=True)
class FetchConfig:
    """Read at call time from the function's environment (template.yaml's Globals)."""

    host_identity_mode: str
    host_identity_secret_arn: str

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> FetchConfig:
        env = os.environ if env is None else env
        return cls(env.get("HOST_IDENTITY_MODE", "keys"), env.get("HOST_IDENTITY_SECRET_ARN", ""))


def _parameter(name: str) -> dict | None:
    try:
        with transient_errors_named("ssm:GetParameter"):
            parameter = client("ssm").get_parameter(Name=name)["Parameter"]
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") == "ParameterNotFound":
            return None  # nothing instructed: the agent clears what it held
        raise
    return {"value": parameter["Value"], "version": parameter["Version"]}


def _host_keys(cluster: str, instance_id: str, config: FetchConfig) -> dict:
    if config.host_identity_mode != "keys" or not config.host_identity_secret_arn:
        raise fetch.FetchRefusedError(f"host keys are served in keys mode only (this stack: {config.host_identity_mode})")
    with transient_errors_named("secretsmanager:GetSecretValue"):
        secret = client("secretsmanager").get_secret_value(SecretId=config.host_identity_secret_arn)
    return {"value": secret["SecretString"], "version": secret.get("VersionId", "")}


# item -> reader(cluster, instance id, fetch config, state table)
READERS: dict[str, Callable[[str, str, FetchConfig, str], dict | None]] = {
    fetch.HOST_KEYS: lambda cluster, instance, config, _table: _host_keys(cluster, instance, config),
    fetch.END_SESSIONS: lambda cluster, instance, _config, _table: _parameter(
        contract.end_sessions_parameter(cluster, instance)),
    # Any number of held users: DynamoDB pages, not a parameter (user_holds_store).
    fetch.USER_HOLDS: lambda cluster, _instance, _config, table: user_holds_store.read(table, cluster),
}


def remember_nonce(table: str, cluster: str, request: fetch.FetchRequest, now: dt.datetime) -> None:
    """First use of the nonce wins (conditional PutItem); a second is a FetchReplayError."""
    try:
        with transient_errors_named("dynamodb:PutItem"):
            client("dynamodb").put_item(TableName=table, Item=fetch.nonce_item(cluster, request, now),
                                        ConditionExpression="attribute_not_exists(pk)")
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
            raise fetch.FetchReplayError(f"{request.instance_id} already used this fetch nonce: a replay") from None
        raise


def serve(config: Any, event: dict, now: dt.datetime, fetch_config: FetchConfig | None = None) -> dict:
    """{"action": "fetch", "request", "proof"} -> {"ok": True, "instanceId", "items": {item: {"value",
    "version"} | None}}; ``config`` is the NodeChannel function's (cluster_name, state_table)."""
    fetch_config = fetch_config or FetchConfig.from_env()
    request = fetch.parse_fetch_request(event)
    record = enrollment_store.get_enrollment(config.state_table, config.cluster_name, request.instance_id)
    enrolled = None if record is None else fetch.Enrolled(record.instance_id, record.role, record.public_key,
                                                          contested=not record.usable, proven=record.proven(now))
    fetch.decide_fetch(request, config.cluster_name, enrolled, now)
    node_proof.verify_body(fetch.signed_body(request), enrolled.public_key, "fetch", config.cluster_name)
    remember_nonce(config.state_table, config.cluster_name, request, now)
    items = {item: READERS[item](config.cluster_name, request.instance_id, fetch_config, config.state_table)
             for item in request.what}
    return {"ok": True, "instanceId": request.instance_id, "items": items}
