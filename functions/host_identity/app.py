"""Host identity Lambda handlers, used by LoginNodeSync.

Before the per-node map, PublishHostIdentity writes the desired identity for the node agents.
Per node: verify what it presents on port 22 -> if wrong, wait (ASL Wait loop) until the node's
agent reports it applied the desired identity -> verify again. Only then may GateTargetChanges
let it take traffic.

  keys mode         the agent fetches the canonical keys from Secrets Manager with its own role.
  certificate mode  the agent reports its public keys -> the signer certifies the ones the
                    verifier saw at the node's IP into a per-node parameter -> the agent installs them.

Only the signer reads a private key (the CA); the verifier compares against the published public
record, and host private keys never leave the node (certificate mode) or Secrets Manager (keys).

The verifier (VerifyNodeIdentity) is verify.py: it reads the network with paramiko and calls no AWS
API, so it loads no boto3 and the functions here never load paramiko. The signer imports
certificates.py (cryptography) on its first call; the other three never load it (except in
certificate mode, where HostIdentityConfig needs certificates.py's CertificatePolicy).
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from hpops_core.common.observability import handler_tools
from hpops_core.common.clients import client
from hpops_core.cluster.login_group import describe_private_ip
from hpops_core.host_identity.config import HostIdentityConfig, node_of
from hpops_core.common.errors import MalformedEventError
from hpops_core.common import notices
from hpops_core.host_identity import certificate_delivery
from hpops_core.host_identity.gate import gate_registrations
from hpops_core.host_identity.identity_record import HostIdentityNotConfigured
from hpops_core.node_channel import contract, desired_state, enrollment_store, report_store
from hpops_core.host_identity.acknowledgement import judge_acknowledgement

logger, tracer, metrics = handler_tools(calls_aws=True)

@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def publish_host_identity(event: dict, context: LambdaContext) -> dict:
    """{expected} -> {published, version}: the desired identity the node agents converge to.

    `expected` is the public record from the lease item; the document names the key secret and
    the fingerprints, never key material. Written only when it changed.
    """
    config = HostIdentityConfig.from_env()
    expected = event.get("expected") if isinstance(event, dict) else None
    if expected is not None and not isinstance(expected, dict):
        raise MalformedEventError("expected must be the published identity record or null")
    document = desired_state.host_identity_document(config.mode, expected, config.secret_arn)
    published = desired_state.publish_if_changed(
        contract.host_identity_parameter(config.cluster_name), document,
        "hpops: the SSH host identity login nodes converge to (public; written by LoginNodeSync)")
    if published:
        metrics.add_metric(name="HostIdentityPublished", unit=MetricUnit.Count, value=1)
        logger.info("desired host identity published", extra={"version": document["version"], "mode": config.mode})
    return {"published": published, "version": document["version"]}


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def check_node_report(event: dict, context: LambdaContext) -> dict:
    """{instanceId, phase, polls, since, expected, certificateDigest?} -> {acknowledged, finished, reason, polls, ...}.

    One read of the node's latest report; the wait between reads and its bound are in the ASL.
    """
    config = HostIdentityConfig.from_env()
    instance_id, _ = node_of(event)
    phase, since, polls = event.get("phase"), event.get("since"), event.get("polls", 0)
    if phase not in ("collect", "install") or not isinstance(since, str) or type(polls) is not int:
        raise MalformedEventError("expected phase collect|install, since (the time the wait began) and polls")
    digest = event.get("certificateDigest")
    report = report_store.latest_report(config.state_table, config.cluster_name, instance_id)
    verdict = judge_acknowledgement(config.mode, report, phase, event.get("expected"), digest if isinstance(digest, str) else None, since)
    if verdict.finished and not verdict.acknowledged:
        metrics.add_metric(name="NodeReportedFailure", unit=MetricUnit.Count, value=1)
    if verdict.acknowledged and phase == "install" and config.mode == "certificate":
        # Installed: the node keeps its certificates; a replaced node leaves no parameter behind.
        certificate_delivery.delete_certificate_bundle(contract.certificate_parameter(config.cluster_name, instance_id))
    return verdict.to_state() | {"phase": phase, "polls": polls + 1, "since": since,
                                 "certificateDigest": digest}


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def sign_host_certificates(event: dict, context: LambdaContext) -> dict:
    """{instanceId, ip, seen} -> {signed, reason, validUntil, certificateDigest}: certificate mode's signer.

    Certifies the public keys the node reported (read from the state table, never from the state
    machine's input), only if `seen` (what the verifier read at the node's IP) has the same keys,
    for principals from the stack and the IP AWS records for the instance.
    """
    from hpops_core.host_identity import certificates  # cryptography: certificate mode's functions only
    from hpops_core.host_identity.keys import InvalidCertificateRequest, fingerprint

    config = HostIdentityConfig.from_env()
    instance_id, ip = node_of(event)
    if config.certificate_policy is None:
        raise MalformedEventError("the signer only runs in certificate mode")
    now = datetime.now(timezone.utc)
    try:
        report = report_store.latest_report(config.state_table, config.cluster_name, instance_id)
        reported = certificates.keys_seen_on_network(certificates.reported_public_keys(report), event.get("seen"))
        aws_ip = describe_private_ip(config.cluster_name, instance_id)
        if aws_ip != ip:
            raise certificates.NodeKeyReportInvalid(f"AWS records IP {aws_ip} for {instance_id}, not {ip}")
        ca = certificate_delivery.read_certificate_authority(config.ca_secret_arn)
        bundle = certificates.issue_certificates(ca, reported, config.certificate_policy, config.cluster_name,
                                                 instance_id, aws_ip, now)
    except (certificates.NodeKeyReportInvalid, HostIdentityNotConfigured, InvalidCertificateRequest) as error:
        metrics.add_metric(name="HostCertificatesRefused", unit=MetricUnit.Count, value=1)
        logger.warning("host certificates not issued", extra={"instanceId": instance_id, "reason": str(error)})
        return {"signed": False, "reason": f"not certified: {error}", "validUntil": None, "certificateDigest": None}
    digest = certificate_delivery.put_certificate_bundle(contract.certificate_parameter(config.cluster_name, instance_id), bundle)
    valid_until = (now + config.certificate_policy.validity).isoformat()
    certified = {line.split()[0]: fingerprint(line) for line in reported.values()}
    metrics.add_metric(name="HostCertificatesIssued", unit=MetricUnit.Count, value=len(reported))
    logger.info("host certificates issued", extra={"instanceId": instance_id, "certified": certified, "validUntil": valid_until})
    return {"signed": True, "reason": f"certified {len(reported)} host keys until {valid_until}",
            "validUntil": valid_until, "certificateDigest": digest}


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def gate_target_changes(event: dict, context: LambdaContext) -> dict:
    """{plan, verdicts, mode} -> the changes allowed to go ahead; rejected nodes are reported."""
    config = HostIdentityConfig.from_env()
    plan, verdicts = event.get("plan") or {}, event.get("verdicts") or []
    enrollments, approvals = _enrollments(config)
    gated = gate_registrations(plan, verdicts, repair=event.get("mode") == "repair", enrollments=enrollments,
                               approvals=approvals)
    metrics.add_metric(name="HostIdentityRejected", unit=MetricUnit.Count, value=len(gated.rejected))
    metrics.add_metric(name="HostCertificateRenewalFailed", unit=MetricUnit.Count, value=len(gated.renewal_failed))
    notice = _notice(gated, config.cluster_name)
    if notice is not None:
        subject, message = notice
        # The same message at most once an hour, however many executions see it (common/notices.py).
        key, now = notices.notice_key(config.cluster_name, subject, message), int(time.time())
        if not notices.sent_recently(config.state_table, key, now):
            client("sns").publish(TopicArn=config.alert_topic_arn, Subject=subject, Message=message)
            notices.record_sent(config.state_table, key, now)
        logger.warning("host identity problems", extra={"rejected": list(gated.rejected),
                                                         "renewalFailed": list(gated.renewal_failed)})
    return gated.to_state()


def _enrollments(config) -> tuple[dict[str, str], dict[str, str]]:
    """(instance id -> enrollment status, instance id -> the fingerprint of a pending approval): only
    enrolled, uncontested agents' nodes are admitted (a registered node that became contested stays:
    host_identity/gate.py)."""
    records, approvals = enrollment_store.list_enrollments(config.state_table, config.cluster_name)
    return {r.instance_id: r.status for r in records}, {a["instanceId"]: a["fingerprint"] for a in approvals}


def _notice(gated, cluster: str) -> tuple[str, str] | None:
    """(subject, message) telling the operator which nodes were kept out or not renewed; None if none."""
    sections = []
    if gated.rejected:
        sections.append(
            f"{len(gated.rejected)} login node(s) of cluster {cluster} were kept out of the SSH load "
            "balancer because they do not present the canonical host identity:\n" + _node_lines(gated.rejected)
        )
    if gated.renewal_failed:
        sections.append(
            f"{len(gated.renewal_failed)} login node(s) could not get renewed host certificates. They keep serving "
            "until their current certificates expire; renewal is retried daily:\n" + _node_lines(gated.renewal_failed)
        )
    if not sections:
        return None
    subject = "login node kept out" if gated.rejected else "host certificate renewal failed"
    return (f"HyperPod {cluster}: {subject} (host identity)"[:100],
            "\n\n".join(sections) + "\n\nTo retry now: hpops repair --stack-name <stack>.")


def _node_lines(nodes) -> str:
    return "\n".join(f"- {n['instanceId'] or '?'} ({n['ip']}): {n['reason']}" for n in nodes)
