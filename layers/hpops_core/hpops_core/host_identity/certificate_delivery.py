"""Certificate mode's AWS side: the CA secret (read by the signer only) and the per-node
certificate parameter (public; written by the signer, read by the node, deleted once installed)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from botocore.exceptions import ClientError

from hpops_core.common.clients import client, transient_errors_named
from hpops_core.host_identity.identity_record import HostIdentityNotConfigured
from hpops_core.node_channel import contract

if TYPE_CHECKING:  # keys.py imports cryptography: only the signer's path loads it
    from hpops_core.host_identity.keys import HostCA, HostCertificateBundle


def read_certificate_authority(secret_arn: str) -> HostCA:
    """The CA private key; errors name the secret, never its content."""
    from hpops_core.host_identity.keys import HostCA, InvalidHostKeyBundle

    with transient_errors_named("secretsmanager:GetSecretValue"):
        value = client("secretsmanager").get_secret_value(SecretId=secret_arn)["SecretString"]
    try:
        return HostCA.from_secret_json(value)
    except InvalidHostKeyBundle:
        raise HostIdentityNotConfigured(
            "the host certificate authority secret holds no CA yet; run `hpops host-keys ca-generate`"
        ) from None


def put_certificate_bundle(name: str, bundle: HostCertificateBundle) -> str:
    """Leave the bundle for the node; returns its digest, which the node reports once installed."""
    text = bundle.to_json()
    with transient_errors_named("ssm:PutParameter"):
        client("ssm").put_parameter(
            Name=name, Value=text, Type="String", Overwrite=True,
            Description="hpops: host certificates waiting for one login node (public; deleted once installed)",
        )
    return contract.certificate_digest(text)


def delete_certificate_bundle(name: str) -> None:
    try:
        with transient_errors_named("ssm:DeleteParameter"):
            client("ssm").delete_parameter(Name=name)
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") != "ParameterNotFound":
            raise
