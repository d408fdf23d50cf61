import pytest

from hpops_core.login_sync.config import SyncConfig
from hpops_core.common.errors import ConfigurationError

ENV = {
    "CLUSTER_NAME": "ml-research",
    "CLUSTER_ARN": "arn:aws:sagemaker:us-east-1:123456789012:cluster/abc",
    "LOGIN_GROUP_NAME": "login",
    "TARGET_GROUP_ARN": "arn:aws:elasticloadbalancing:us-east-1:123456789012:targetgroup/tg/1",
    "SSH_PORT": "22",
    "STATE_TABLE_NAME": "table",
    "LEASE_SECONDS": "960",
    "HOST_IDENTITY_MODE": "keys",
    "NODE_REPORT_POLL_SECONDS": "10",
    "NODE_REPORT_MAX_POLLS": "18",
}


def test_reads_every_field():
    config = SyncConfig.from_env(ENV)
    assert config.ssh_port == 22 and config.lease_seconds == 960 and config.login_group == "login"
    assert (config.node_report_poll_seconds, config.node_report_max_polls) == (10, 18)


@pytest.mark.parametrize("missing", sorted(ENV))
def test_missing_variable_is_named(missing):
    env = {k: v for k, v in ENV.items() if k != missing}
    with pytest.raises(ConfigurationError, match=missing):
        SyncConfig.from_env(env)


@pytest.mark.parametrize("value", ["0", "70000", "ssh"])
def test_bad_port_is_named(value):
    with pytest.raises(ConfigurationError, match="SSH_PORT"):
        SyncConfig.from_env(ENV | {"SSH_PORT": value})


def test_host_identity_mode_is_one_of_the_known_modes():
    with pytest.raises(ConfigurationError, match="HOST_IDENTITY_MODE"):
        SyncConfig.from_env(ENV | {"HOST_IDENTITY_MODE": "maybe"})


@pytest.mark.parametrize(("variable", "parameter"), [
    ("NODE_REPORT_POLL_SECONDS", "NodeReportPollSeconds"), ("NODE_REPORT_MAX_POLLS", "NodeReportMaxPolls")])
def test_node_report_pacing_accepts_exactly_what_the_template_allows(variable, parameter):
    # The sync's TimeoutSeconds is computed for the template's maxima: a larger value must not
    # slip in through the environment either.
    from hpops_twin.template_model import TemplateModel

    spec = TemplateModel().raw["Parameters"][parameter]
    low, high = int(spec["MinValue"]), int(spec["MaxValue"])
    for ok in (low, high):
        SyncConfig.from_env(ENV | {variable: str(ok)})
    for bad in (low - 1, high + 1):
        with pytest.raises(ConfigurationError, match=variable):
            SyncConfig.from_env(ENV | {variable: str(bad)})


HOST_IDENTITY_ENV = {"CLUSTER_NAME": "ml-research", "STATE_TABLE_NAME": "table", "SSH_PORT": "22",
                     "HOST_IDENTITY_SECRET_ARN": "arn:aws:secretsmanager:us-east-1:123456789012:secret:keys-AbCdEf",
                     "ALERT_TOPIC_ARN": "arn:aws:sns:us-east-1:123456789012:alerts",
                     "HOST_CERTIFICATE_PRINCIPALS": "login.example.edu", "HOST_CERTIFICATE_VALIDITY_DAYS": "30",
                     "HOST_CERTIFICATE_RENEW_DAYS": "7"}


def test_keys_mode_has_no_host_ca_and_certificate_mode_needs_one():
    """template.yaml gives HOST_CA_SECRET_ARN "" in keys mode (no CA secret is created there)."""
    from hpops_core.host_identity.config import HostIdentityConfig

    keys = HostIdentityConfig.from_env(HOST_IDENTITY_ENV | {"HOST_IDENTITY_MODE": "keys", "HOST_CA_SECRET_ARN": ""})
    assert (keys.mode, keys.ca_secret_arn, keys.certificate_policy) == ("keys", "", None)
    with pytest.raises(ConfigurationError, match="HOST_CA_SECRET_ARN"):
        HostIdentityConfig.from_env(HOST_IDENTITY_ENV | {"HOST_IDENTITY_MODE": "certificate", "HOST_CA_SECRET_ARN": ""})
    ca = "arn:aws:secretsmanager:us-east-1:123456789012:secret:ca-AbCdEf"
    certificate = HostIdentityConfig.from_env(HOST_IDENTITY_ENV | {"HOST_IDENTITY_MODE": "certificate", "HOST_CA_SECRET_ARN": ca})
    assert certificate.ca_secret_arn == ca and certificate.certificate_policy is not None
