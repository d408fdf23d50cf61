"""VerifyNodeIdentity: does a login node present the canonical SSH host identity on the SSH port?

A module of its own: the verifier reads the network (paramiko, cryptography) and calls no AWS API
(it runs in the cluster's VPC, whose subnets need no NAT or endpoints), so its cold start loads no
boto3, and the other host-identity functions (app.py) never load paramiko.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from hpops_core.common.observability import handler_tools
from hpops_core.host_identity.config import VerifierConfig, node_of
from hpops_core.host_identity import certificates, verifier
from hpops_core.host_identity.identity_record import (
    HostIdentityNotConfigured,
    expected_ca_fingerprint,
    expected_fingerprints,
)

logger, tracer, metrics = handler_tools(calls_aws=False)


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def verify_node_identity(event: dict, context: LambdaContext) -> dict:
    """{instanceId, ip, expected} -> {instanceId, ip, ok, acceptable, reason, presented}: the canonical identity?

    ok: nothing to do. acceptable: clients accept it now (certificate mode: a renewal may be due).
    `expected` (the public record: fingerprints, or the CA's fingerprint) comes from the lease item
    via the state machine.
    """
    config = VerifierConfig.from_env()
    instance_id, ip = node_of(event)
    try:
        if config.certificate_policy is not None:
            result = certificates.verify_node_certificates(
                ip, config.ssh_port, expected_ca_fingerprint(event.get("expected")), config.certificate_policy,
                datetime.now(timezone.utc), verifier.read_presented_public_keys, verifier.read_presented_host_certificate,
            )
        else:
            result = verifier.verify_node(ip, config.ssh_port, expected_fingerprints(event.get("expected")))
        ok, acceptable, reason, presented = result.ok, result.acceptable, result.reason, dict(result.presented)
    except HostIdentityNotConfigured as error:
        ok, acceptable, reason, presented = False, False, str(error), {}
    except verifier.HostUnreachable as error:
        ok, acceptable, reason, presented = False, False, f"port {config.ssh_port} unreachable: {error}", {}
    metrics.add_metric(name="HostIdentityVerified" if ok else "HostIdentityMismatch", unit=MetricUnit.Count, value=1)
    logger.info("host identity checked", extra={"instanceId": instance_id, "ip": ip, "ok": ok, "reason": reason})
    return {"instanceId": instance_id, "ip": ip, "ok": ok, "acceptable": acceptable, "reason": reason,
            "presented": presented}
