"""The host-identity functions' configuration: frozen, read from the environment at call time."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hpops_core.common.config import env_choice, env_int, env_str, environment
from hpops_core.common.errors import MalformedEventError

if TYPE_CHECKING:
    from hpops_core.host_identity.certificates import CertificatePolicy

MODES = ("keys", "certificate", "off")


def certificate_policy(env: Mapping[str, str]) -> CertificatePolicy:
    """Certificate mode's policy. certificates.py (cryptography) loads only when the mode needs it."""
    from hpops_core.host_identity.certificates import CertificatePolicy

    return CertificatePolicy.from_strings(
        env.get("HOST_CERTIFICATE_PRINCIPALS", ""),
        env_int(env, "HOST_CERTIFICATE_VALIDITY_DAYS", 1, 3650),
        env_int(env, "HOST_CERTIFICATE_RENEW_DAYS", 0, 3649),
    )


@dataclass(frozen=True)
class HostIdentityConfig:
    cluster_name: str
    state_table: str
    ssh_port: int
    secret_arn: str
    alert_topic_arn: str
    mode: str  # keys | certificate | off
    ca_secret_arn: str  # certificate mode only: keys mode creates no CA secret ("")
    certificate_policy: CertificatePolicy | None  # certificate mode only

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> HostIdentityConfig:
        env = environment(env)
        mode = env_choice(env, "HOST_IDENTITY_MODE", MODES)
        policy = certificate_policy(env) if mode == "certificate" else None
        return cls(
            cluster_name=env_str(env, "CLUSTER_NAME"),
            state_table=env_str(env, "STATE_TABLE_NAME"),
            ssh_port=env_int(env, "SSH_PORT", 1, 65535),
            secret_arn=env_str(env, "HOST_IDENTITY_SECRET_ARN"),
            alert_topic_arn=env_str(env, "ALERT_TOPIC_ARN"),
            mode=mode,
            ca_secret_arn=env_str(env, "HOST_CA_SECRET_ARN") if mode == "certificate" else env.get("HOST_CA_SECRET_ARN", "").strip(),
            certificate_policy=policy,
        )


@dataclass(frozen=True)
class VerifierConfig:
    """What the verifier reads: the port, and in certificate mode the policy certificates must meet."""

    ssh_port: int
    certificate_policy: CertificatePolicy | None  # certificate mode only

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> VerifierConfig:
        env = environment(env)
        mode = env_choice(env, "HOST_IDENTITY_MODE", MODES)
        return cls(ssh_port=env_int(env, "SSH_PORT", 1, 65535),
                   certificate_policy=certificate_policy(env) if mode == "certificate" else None)


def node_of(event: Any) -> tuple[str, str]:
    if not isinstance(event, dict) or not isinstance(event.get("instanceId"), str) or not isinstance(event.get("ip"), str):
        raise MalformedEventError("expected {instanceId, ip}")
    return event["instanceId"], event["ip"]
