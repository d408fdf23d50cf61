"""Host identity Lambda handlers, used by LoginNodeSync's VerifyHostIdentity map.

Per node: verify what it presents on port 22 -> if wrong, fix it with the stack's SSM document
-> poll the command -> verify again. Only then may GateTargetChanges let it take traffic.

  keys mode         one push: the node fetches the canonical keys from Secrets Manager itself.
  certificate mode  two pushes: the node reports its own public keys (collect) -> the signer
                    certifies them into a per-node SSM parameter -> the node installs them.

Only the signer reads a private key (the CA); the verifier compares against the published public
record, and host private keys never leave the node (certificate mode) or Secrets Manager (keys).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext
from botocore.exceptions import ClientError

from hpops_core.aws.clients import client
from hpops_core.config import env_choice, env_int, env_str
from hpops_core.errors import MalformedEventError
from hpops_core.host_identity import certificate_delivery, certificates, verifier
from hpops_core.host_identity.certificates import CertificatePolicy
from hpops_core.host_identity.gate import gate_registrations
from hpops_core.host_identity.identity_record import (
    HostIdentityNotConfigured,
    expected_ca_fingerprint,
    expected_fingerprints,
)
from hpops_core.host_identity.keys import InvalidCertificateRequest, fingerprint
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
    mode: str  # keys | certificate | off
    ca_secret_arn: str
    certificate_policy: CertificatePolicy | None  # certificate mode only

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> HostIdentityConfig:
        env = os.environ if env is None else env
        mode = env_choice(env, "HOST_IDENTITY_MODE", ("keys", "certificate", "off"))
        policy = None
        if mode == "certificate":
            policy = CertificatePolicy.from_strings(
                env.get("HOST_CERTIFICATE_PRINCIPALS", ""),
                env_int(env, "HOST_CERTIFICATE_VALIDITY_DAYS", 1, 3650),
                env_int(env, "HOST_CERTIFICATE_RENEW_DAYS", 0, 3649),
            )
        return cls(
            cluster_name=env_str(env, "CLUSTER_NAME"),
            state_table=env_str(env, "STATE_TABLE_NAME"),
            ssh_port=env_int(env, "SSH_PORT", 1, 65535),
            document=env_str(env, "HOST_IDENTITY_DOCUMENT"),
            secret_arn=env_str(env, "HOST_IDENTITY_SECRET_ARN"),
            alert_topic_arn=env_str(env, "ALERT_TOPIC_ARN"),
            poll_seconds=env_int(env, "PUSH_POLL_SECONDS", 0, 300),
            mode=mode,
            ca_secret_arn=env_str(env, "HOST_CA_SECRET_ARN"),
            certificate_policy=policy,
        )


def _node(event: Any) -> tuple[str, str]:
    if not isinstance(event, dict) or not isinstance(event.get("instanceId"), str) or not isinstance(event.get("ip"), str):
        raise MalformedEventError("expected {instanceId, ip}")
    return event["instanceId"], event["ip"]


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def verify_node_identity(event: dict, context: LambdaContext) -> dict:
    """{instanceId, ip, expected} -> {instanceId, ip, ok, acceptable, reason}: does it present the canonical identity?

    ok: nothing to do. acceptable: clients accept it now (certificate mode: a renewal may be due).
    `expected` (the public record: fingerprints, or the CA's fingerprint) comes from the lease item
    via the state machine.
    """
    config = HostIdentityConfig.from_env()
    instance_id, ip = _node(event)
    try:
        if config.certificate_policy is not None:
            result = certificates.verify_node_certificates(
                ip, config.ssh_port, expected_ca_fingerprint(event.get("expected")), config.certificate_policy,
                datetime.now(timezone.utc), verifier.read_presented_public_keys, verifier.read_presented_host_certificate,
            )
        else:
            result = verifier.verify_node(ip, config.ssh_port, expected_fingerprints(event.get("expected")))
        ok, acceptable, reason = result.ok, result.acceptable, result.reason
    except HostIdentityNotConfigured as error:
        ok, acceptable, reason = False, False, str(error)
    except verifier.HostUnreachable as error:
        ok, acceptable, reason = False, False, f"port {config.ssh_port} unreachable: {error}"
    metrics.add_metric(name="HostIdentityVerified" if ok else "HostIdentityMismatch", unit=MetricUnit.Count, value=1)
    logger.info("host identity checked", extra={"instanceId": instance_id, "ip": ip, "ok": ok, "reason": reason})
    return {"instanceId": instance_id, "ip": ip, "ok": ok, "acceptable": acceptable, "reason": reason}


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def push_host_identity(event: dict, context: LambdaContext) -> dict:
    """{instanceId, ip, phase?} -> {sent, phase, commandId, polls, waitSeconds, reason}: run the stack's document.

    phase "collect" (certificate mode's first push) asks the node for its public keys; "install"
    installs the keys (keys mode) or the certificates the signer left for this node.
    """
    config = HostIdentityConfig.from_env()
    instance_id, _ = _node(event)
    phase = event.get("phase") or ("collect" if config.mode == "certificate" else "install")
    if phase not in ("collect", "install") or (phase == "collect" and config.mode != "certificate"):
        raise MalformedEventError("phase must be collect (certificate mode) or install")
    mode, source, comment = _document_call(config, instance_id, phase)
    parameters = {"Mode": [mode], "Source": [source], "Region": [os.environ.get("AWS_REGION", "us-east-1")]}
    try:
        command_id = SsmRunCommand().send(instance_id, config.document, parameters, comment)
    except ClientError as error:
        code = error.response.get("Error", {}).get("Code", "ClientError")
        if code not in ("InvalidInstanceId", "InvalidDocument", "UnsupportedPlatformType"):
            raise
        metrics.add_metric(name="HostIdentityPushUndeliverable", unit=MetricUnit.Count, value=1)
        return {"sent": False, "phase": phase, "commandId": None, "polls": 0, "waitSeconds": 0,
                "reason": f"Run Command cannot reach {instance_id}: {code}"}
    metrics.add_metric(name="HostIdentityPushes", unit=MetricUnit.Count, value=1)
    logger.info("host identity pushed", extra={"instanceId": instance_id, "commandId": command_id, "phase": phase})
    return {"sent": True, "phase": phase, "commandId": command_id, "polls": 0, "waitSeconds": config.poll_seconds,
            "reason": "sent"}


def _document_call(config: HostIdentityConfig, instance_id: str, phase: str) -> tuple[str, str, str]:
    """(Mode, Source, comment) for the HostIdentityDocument. Only names travel; never key material."""
    if config.mode != "certificate":
        return "keys", config.secret_arn, "hpops: install the canonical SSH host keys"
    if phase == "collect":
        return "report-public-keys", "none", "hpops: report this login node's public host keys"
    parameter = certificates.certificate_parameter_name(config.cluster_name, instance_id)
    return "certificate", parameter, "hpops: install this login node's host certificates"


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def check_host_identity_push(event: dict, context: LambdaContext) -> dict:
    """{instanceId, commandId, polls, phase} -> {finished, succeeded, status, reason, phase, polls, waitSeconds}."""
    config = HostIdentityConfig.from_env()
    instance_id, _ = _node(event)
    phase = event.get("phase") or "install"
    polls = int(event.get("polls", 0)) + 1
    outcome = SsmRunCommand().outcome(str(event.get("commandId")), instance_id)
    gave_up = not outcome.finished and polls >= MAX_PUSH_POLLS
    succeeded = outcome.status == "Success"
    reason = outcome.reason if outcome.finished else ("push still running after %d polls" % polls if gave_up else outcome.status)
    if config.mode == "certificate" and phase == "install" and (outcome.finished or gave_up):
        # The node has read its certificates (or never will): don't leave per-node parameters behind.
        certificate_delivery.delete_certificate_bundle(certificates.certificate_parameter_name(config.cluster_name, instance_id))
    metrics.add_metric(name="HostIdentityPushPolls", unit=MetricUnit.Count, value=1)
    what = "key report" if phase == "collect" else "host identity push"
    return {"finished": outcome.finished or gave_up, "succeeded": succeeded, "status": outcome.status,
            "result": outcome.result, "reason": f"{what} {outcome.status}: {reason}" if not succeeded else reason,
            "phase": phase, "commandId": event.get("commandId"), "polls": polls, "waitSeconds": config.poll_seconds}


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def sign_host_certificates(event: dict, context: LambdaContext) -> dict:
    """{instanceId, ip, commandId} -> {signed, reason, validUntil, certified}: certificate mode's signer.

    Certifies exactly the public keys the node reported in its collect command (read from SSM, not
    from the state machine's input) and leaves the bundle in the node's certificate parameter.
    """
    config = HostIdentityConfig.from_env()
    instance_id, ip = _node(event)
    if config.certificate_policy is None:
        raise MalformedEventError("the signer only runs in certificate mode")
    now = datetime.now(timezone.utc)
    try:
        reported = certificates.reported_public_keys(SsmRunCommand().output(str(event.get("commandId")), instance_id))
        ca = certificate_delivery.read_certificate_authority(config.ca_secret_arn)
        bundle = certificates.issue_certificates(ca, reported, config.certificate_policy, config.cluster_name,
                                                 instance_id, ip, now)
    except (certificates.NodeKeyReportInvalid, HostIdentityNotConfigured, InvalidCertificateRequest) as error:
        metrics.add_metric(name="HostCertificatesRefused", unit=MetricUnit.Count, value=1)
        logger.warning("host certificates not issued", extra={"instanceId": instance_id, "reason": str(error)})
        return {"signed": False, "reason": f"not certified: {error}", "validUntil": None, "certified": {}}
    certificate_delivery.put_certificate_bundle(certificates.certificate_parameter_name(config.cluster_name, instance_id), bundle)
    valid_until = (now + config.certificate_policy.validity).isoformat()
    certified = {line.split()[0]: fingerprint(line) for line in reported.values()}
    metrics.add_metric(name="HostCertificatesIssued", unit=MetricUnit.Count, value=len(reported))
    logger.info("host certificates issued", extra={"instanceId": instance_id, "certified": certified, "validUntil": valid_until})
    return {"signed": True, "reason": f"certified {len(reported)} host keys until {valid_until}",
            "validUntil": valid_until, "certified": certified}



@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def gate_target_changes(event: dict, context: LambdaContext) -> dict:
    """{plan, verdicts, mode} -> the changes allowed to go ahead; rejected nodes are reported."""
    config = HostIdentityConfig.from_env()
    plan, verdicts = event.get("plan") or {}, event.get("verdicts") or []
    gated = gate_registrations(plan, verdicts, repair=event.get("mode") == "repair")
    metrics.add_metric(name="HostIdentityRejected", unit=MetricUnit.Count, value=len(gated.rejected))
    metrics.add_metric(name="HostCertificateRenewalFailed", unit=MetricUnit.Count, value=len(gated.renewal_failed))
    sections = []
    if gated.rejected:
        sections.append(
            f"{len(gated.rejected)} login node(s) of cluster {config.cluster_name} were kept out of the SSH load "
            "balancer because they do not present the canonical host identity:\n" + _node_lines(gated.rejected)
        )
    if gated.renewal_failed:
        sections.append(
            f"{len(gated.renewal_failed)} login node(s) could not get renewed host certificates. They keep serving "
            "until their current certificates expire; renewal is retried daily:\n" + _node_lines(gated.renewal_failed)
        )
    if sections:
        message = "\n\n".join(sections) + "\n\nTo retry now: hpops repair --stack-name <stack>."
        subject = "login node kept out" if gated.rejected else "host certificate renewal failed"
        client("sns").publish(
            TopicArn=config.alert_topic_arn,
            Subject=f"HyperPod {config.cluster_name}: {subject} (host identity)"[:100],
            Message=message,
        )
        logger.warning("host identity problems", extra={"rejected": list(gated.rejected),
                                                         "renewalFailed": list(gated.renewal_failed)})
    return gated.to_state()


def _node_lines(nodes) -> str:
    return "\n".join(f"- {n['instanceId'] or '?'} ({n['ip']}): {n['reason']}" for n in nodes)
