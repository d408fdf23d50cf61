"""Host identity Lambda handlers, used by LoginNodeSync's VerifyHostIdentity map.

Per node: verify what it presents on port 22 -> if wrong, push the canonical keys with the
stack's SSM document -> poll the command -> verify again. Only then may GateTargetChanges let
it take traffic. No handler ever touches private key material: the node fetches the secret
itself, and the verifier compares against the published fingerprints.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext
from botocore.exceptions import ClientError

from hpops_core.aws.clients import client
from hpops_core.config import env_int, env_str
from hpops_core.errors import MalformedEventError
from hpops_core.host_identity import verifier
from hpops_core.host_identity.gate import gate_registrations
from hpops_core.host_identity.identity_record import HostIdentityNotConfigured, expected_fingerprints
from hpops_core.host_identity.node_commands import SsmRunCommand

logger = Logger()
tracer = Tracer()
metrics = Metrics()

MAX_PUSH_POLLS = 24


@dataclass(frozen=True)
class HostIdentityConfig:
    cluster_name: str
    state_table: str
    ssh_port: int
    document: str
    secret_arn: str
    alert_topic_arn: str
    poll_seconds: int

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> HostIdentityConfig:
        env = os.environ if env is None else env
        return cls(
            cluster_name=env_str(env, "CLUSTER_NAME"),
            state_table=env_str(env, "STATE_TABLE_NAME"),
            ssh_port=env_int(env, "SSH_PORT", 1, 65535),
            document=env_str(env, "HOST_IDENTITY_DOCUMENT"),
            secret_arn=env_str(env, "HOST_IDENTITY_SECRET_ARN"),
            alert_topic_arn=env_str(env, "ALERT_TOPIC_ARN"),
            poll_seconds=env_int(env, "PUSH_POLL_SECONDS", 0, 300),
        )


def _node(event: Any) -> tuple[str, str]:
    if not isinstance(event, dict) or not isinstance(event.get("instanceId"), str) or not isinstance(event.get("ip"), str):
        raise MalformedEventError("expected {instanceId, ip}")
    return event["instanceId"], event["ip"]


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def verify_node_identity(event: dict, context: LambdaContext) -> dict:
    """{instanceId, ip, expected} -> {instanceId, ip, ok, reason}: does the node present the canonical keys?

    `expected` (public fingerprints) comes from the lease item via the state machine.
    """
    config = HostIdentityConfig.from_env()
    instance_id, ip = _node(event)
    try:
        result = verifier.verify_node(ip, config.ssh_port, expected_fingerprints(event.get("expected")))
        ok, reason = result.ok, result.reason
    except HostIdentityNotConfigured as error:
        ok, reason = False, str(error)
    except verifier.HostUnreachable as error:
        ok, reason = False, f"port {config.ssh_port} unreachable: {error}"
    metrics.add_metric(name="HostIdentityVerified" if ok else "HostIdentityMismatch", unit=MetricUnit.Count, value=1)
    logger.info("host identity checked", extra={"instanceId": instance_id, "ip": ip, "ok": ok, "reason": reason})
    return {"instanceId": instance_id, "ip": ip, "ok": ok, "reason": reason}


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def push_host_identity(event: dict, context: LambdaContext) -> dict:
    """{instanceId, ip} -> {sent, commandId, polls, waitSeconds, reason}: run the stack's document on the node."""
    config = HostIdentityConfig.from_env()
    instance_id, _ = _node(event)
    parameters = {"SecretId": [config.secret_arn], "Region": [os.environ.get("AWS_REGION", "us-east-1")]}
    try:
        command_id = SsmRunCommand().send(instance_id, config.document, parameters)
    except ClientError as error:
        code = error.response.get("Error", {}).get("Code", "ClientError")
        if code not in ("InvalidInstanceId", "InvalidDocument", "UnsupportedPlatformType"):
            raise
        metrics.add_metric(name="HostIdentityPushUndeliverable", unit=MetricUnit.Count, value=1)
        return {"sent": False, "commandId": None, "polls": 0, "waitSeconds": 0, "reason": f"Run Command cannot reach {instance_id}: {code}"}
    metrics.add_metric(name="HostIdentityPushes", unit=MetricUnit.Count, value=1)
    logger.info("host identity pushed", extra={"instanceId": instance_id, "commandId": command_id})
    return {"sent": True, "commandId": command_id, "polls": 0, "waitSeconds": config.poll_seconds, "reason": "sent"}


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def check_host_identity_push(event: dict, context: LambdaContext) -> dict:
    """{instanceId, commandId, polls} -> {finished, succeeded, status, reason, polls, waitSeconds}."""
    config = HostIdentityConfig.from_env()
    instance_id, _ = _node(event)
    polls = int(event.get("polls", 0)) + 1
    outcome = SsmRunCommand().outcome(str(event.get("commandId")), instance_id)
    gave_up = not outcome.finished and polls >= MAX_PUSH_POLLS
    succeeded = outcome.status == "Success"
    reason = outcome.reason if outcome.finished else ("push still running after %d polls" % polls if gave_up else outcome.status)
    metrics.add_metric(name="HostIdentityPushPolls", unit=MetricUnit.Count, value=1)
    return {"finished": outcome.finished or gave_up, "succeeded": succeeded, "status": outcome.status,
            "result": outcome.result, "reason": f"key push {outcome.status}: {reason}" if not succeeded else reason,
            "commandId": event.get("commandId"), "polls": polls, "waitSeconds": config.poll_seconds}


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def gate_target_changes(event: dict, context: LambdaContext) -> dict:
    """{plan, verdicts, mode} -> the changes allowed to go ahead; rejected nodes are reported."""
    config = HostIdentityConfig.from_env()
    plan, verdicts = event.get("plan") or {}, event.get("verdicts") or []
    gated = gate_registrations(plan, verdicts, repair=event.get("mode") == "repair")
    metrics.add_metric(name="HostIdentityRejected", unit=MetricUnit.Count, value=len(gated.rejected))
    if gated.rejected:
        lines = [f"- {r['instanceId'] or '?'} ({r['ip']}): {r['reason']}" for r in gated.rejected]
        message = (
            f"{len(gated.rejected)} login node(s) of cluster {config.cluster_name} were kept out of the SSH load "
            f"balancer because they do not present the canonical host identity:\n" + "\n".join(lines) +
            "\n\nThey are retried on every sync. To retry now: hpops repair --stack-name <stack>."
        )
        client("sns").publish(
            TopicArn=config.alert_topic_arn,
            Subject=f"HyperPod {config.cluster_name}: login node kept out (host identity)"[:100],
            Message=message,
        )
        logger.warning("login nodes kept out", extra={"rejected": list(gated.rejected)})
    return gated.to_state()
