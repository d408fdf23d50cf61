"""Certificate mode's AWS side: the CA secret (read by the signer only) and the per-node
certificate parameter (public; written by the signer, read by the node, deleted once installed)."""

from __future__ import annotations

from botocore.exceptions import ClientError

from hpops_core.aws.clients import client, transient_errors_named
from hpops_core.host_identity.identity_record import HostIdentityNotConfigured
from hpops_core.host_identity.keys import HostCA, HostCertificateBundle, InvalidHostKeyBundle


def read_certificate_authority(secret_arn: str) -> HostCA:
    """The CA private key; errors name the secret, never its content."""
    with transient_errors_named("secretsmanager:GetSecretValue"):
        value = client("secretsmanager").get_secret_value(SecretId=secret_arn)["SecretString"]
    try:
        return HostCA.from_secret_json(value)
    except InvalidHostKeyBundle:
        raise HostIdentityNotConfigured(
            "the host certificate authority secret holds no CA yet; run `hpops host-keys ca-generate`"
        ) from None


def put_certificate_bundle(name: str, bundle: HostCertificateBundle) -> int:
    """Leave the bundle for the node; returns the parameter version the node will report installing."""
    with transient_errors_named("ssm:PutParameter"):
        return client("ssm").put_parameter(
            Name=name, Value=bundle.to_json(), Type="String", Overwrite=True,
            Description="hpops: host certificates waiting for one login node (public; deleted once installed)",
        )["Version"]


def delete_certificate_bundle(name: str) -> None:
    try:
        with transient_errors_named("ssm:DeleteParameter"):
            client("ssm").delete_parameter(Name=name)
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") != "ParameterNotFound":
            raise
