"""Session limits: configuration, trigger parsing and the template wiring. No AWS."""

from __future__ import annotations

import json

import pytest

from hpops_core.common.errors import ConfigurationError, MalformedEventError, UnknownClusterError
from hpops_core.session_limits.config import SessionLimitsConfig, SessionTriggerConfig
from hpops_core.session_limits.trigger import SessionLimitsRequest, parse_session_input
from hpops_twin.template_model import TemplateModel

ENV = {
    "CLUSTER_NAME": "ml-research",
    "CLUSTER_ID": "abc123def456",
    "LOGIN_GROUP_NAME": "login",
    "MAX_SESSIONS_PER_USER": "2",
    "SESSION_LIMIT_OVERRIDES": '{"alice": 4, "intern": 0}',
    "SESSION_EXEMPT_USERS": "ops, backup",
    "SESSION_EXEMPT_PRINCIPALS": "arn:aws:sts::*:assumed-role/BreakGlass/*",
    "SESSION_OWNER_MAPPINGS": '[{"pattern": "arn:aws:sts::*:assumed-role/SSO_*/bob@example.com", "user": "bob"}, ["*/carol", "carol"]]',
    "UNMAPPED_SESSION_POLICY": "count-as-principal",
    "SESSION_EXCESS_POLICY": "newest",
    "SESSION_LIMITS_DRY_RUN": "false",
    "ALERT_TOPIC_ARN": "arn:aws:sns:us-east-1:111122223333:alerts",
    "STATE_TABLE_NAME": "state",
}


def test_config_reads_every_setting():
    config = SessionLimitsConfig.from_env(ENV)
    assert config.cluster_id == "abc123def456" and config.login_group == "login"
    assert config.policy.default_max == 2
    assert config.policy.limit_for("alice") == 4 and config.policy.limit_for("intern") == 0
    assert config.policy.exempt_users == {"ops", "backup"}
    assert config.policy.exempt_principal_patterns == ("arn:aws:sts::*:assumed-role/BreakGlass/*",)
    assert config.identity.mapping_rules == (("arn:aws:sts::*:assumed-role/SSO_*/bob@example.com", "bob"), ("*/carol", "carol"))
    assert config.dry_run is False and config.tag_cache_seconds == 300


def test_empty_optional_settings_mean_no_overrides_no_exemptions_no_mappings():
    env = ENV | {"SESSION_LIMIT_OVERRIDES": "", "SESSION_EXEMPT_USERS": "", "SESSION_EXEMPT_PRINCIPALS": "", "SESSION_OWNER_MAPPINGS": ""}
    config = SessionLimitsConfig.from_env(env)
    assert dict(config.policy.overrides) == {} and config.policy.exempt_users == frozenset()
    assert config.identity.mapping_rules == ()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("MAX_SESSIONS_PER_USER", "0"),
        ("MAX_SESSIONS_PER_USER", "two"),
        ("MAX_SESSIONS_PER_USER", ""),
        ("SESSION_LIMIT_OVERRIDES", "{alice: 3}"),
        ("SESSION_LIMIT_OVERRIDES", "[1]"),
        ("SESSION_LIMIT_OVERRIDES", '{"alice": "3"}'),
        ("SESSION_LIMIT_OVERRIDES", '{"alice": -1}'),
        ("SESSION_LIMIT_OVERRIDES", '{"alice": true}'),
        ("SESSION_OWNER_MAPPINGS", '{"pattern": "*", "user": "x"}'),
        ("SESSION_OWNER_MAPPINGS", '[{"pattern": "*"}]'),
        ("SESSION_OWNER_MAPPINGS", '[["*", "root"]]'),
        ("UNMAPPED_SESSION_POLICY", "guess"),
        ("SESSION_EXCESS_POLICY", "random"),
        ("SESSION_LIMITS_DRY_RUN", "maybe"),
        ("ALERT_TOPIC_ARN", "not-an-arn"),
        ("CLUSTER_ID", "ml-research"),
        ("CLUSTER_ID", ""),
        ("LOGIN_GROUP_NAME", "login;rm"),
        ("STATE_TABLE_NAME", ""),
    ],
)
def test_malformed_setting_is_a_configuration_error(name, value):
    with pytest.raises(ConfigurationError):
        SessionLimitsConfig.from_env(ENV | {name: value})


@pytest.mark.parametrize("name", ["CLUSTER_NAME", "CLUSTER_ID", "LOGIN_GROUP_NAME", "MAX_SESSIONS_PER_USER",
                                  "UNMAPPED_SESSION_POLICY", "SESSION_EXCESS_POLICY", "ALERT_TOPIC_ARN", "STATE_TABLE_NAME"])
def test_a_missing_variable_is_named(name):
    env = {k: v for k, v in ENV.items() if k != name}
    with pytest.raises(ConfigurationError, match=f"missing environment variable {name}$"):
        SessionLimitsConfig.from_env(env)


@pytest.mark.parametrize(("value", "dry_run"), [("true", True), ("TRUE", True), ("false", False), ("False", False), ("", False)])
def test_dry_run_is_read_by_the_one_boolean_parser(value, dry_run):
    assert SessionLimitsConfig.from_env(ENV | {"SESSION_LIMITS_DRY_RUN": value}).dry_run is dry_run
    assert SessionTriggerConfig.from_env({k: v for k, v in ENV.items() if k != "SESSION_LIMITS_DRY_RUN"}).dry_run is False


@pytest.mark.parametrize("value", ["yes", "no", "1", "0", "on"])
def test_dry_run_spellings_the_template_never_passes_are_refused(value):
    with pytest.raises(ConfigurationError, match="SESSION_LIMITS_DRY_RUN must be true or false"):
        SessionLimitsConfig.from_env(ENV | {"SESSION_LIMITS_DRY_RUN": value})


@pytest.mark.parametrize(("parameter", "variable"), [("SessionLimitsDryRun", "SESSION_LIMITS_DRY_RUN"),
                                                      ("SessionExcessPolicy", "SESSION_EXCESS_POLICY"),
                                                      ("UnmappedSessionPolicy", "UNMAPPED_SESSION_POLICY")])
def test_every_value_the_template_allows_is_accepted(parameter, variable):
    template = TemplateModel()
    env = template.resources["EnforceSessionLimitsFunction"]["Properties"]["Environment"]["Variables"]
    assert env[variable] == {"Ref": parameter}
    for value in template.raw["Parameters"][parameter]["AllowedValues"]:
        SessionLimitsConfig.from_env(ENV | {variable: str(value)})


def trigger_config(**overrides) -> SessionTriggerConfig:
    return SessionTriggerConfig.from_env(ENV | overrides)


def test_start_session_event_becomes_an_event_request(saved_event):
    request = parse_session_input(saved_event("ssm-start-session.json"), trigger_config())
    assert request.mode == "event" and request.ignored is None and request.dry_run is False
    assert request.session_id == "alice-0a1b2c3d4e5f67890"
    assert request.owner == "arn:aws:sts::123456789012:assumed-role/Researchers/alice"
    assert SessionLimitsRequest.from_state(json.loads(json.dumps(request.to_state()))) == request


def test_start_session_on_another_cluster_is_unknown(saved_event):
    with pytest.raises(UnknownClusterError):
        parse_session_input(saved_event("ssm-start-session.json"), trigger_config(CLUSTER_ID="0123456789ab"))


def test_start_session_on_a_sibling_group_is_ignored_not_failed(saved_event):
    event = saved_event("ssm-start-session.json")
    event["detail"]["requestParameters"]["target"] = "sagemaker-cluster:abc123def456_login-2-i-0123456789abcdef0"
    request = parse_session_input(event, trigger_config())
    assert request.ignored and "login-2" in request.ignored


@pytest.mark.parametrize(
    "mutate",
    [
        lambda e: e["detail"]["responseElements"].update(sessionId="x" * 97),
        lambda e: e["detail"]["requestParameters"].update(target="i-0123456789abcdef0"),
        lambda e: e["detail"].update(eventName="ResumeSession"),
        lambda e: e["detail"].update(errorCode="AccessDenied"),
        lambda e: e["detail"]["userIdentity"].update(arn="alice"),
        lambda e: e.update(source="aws.ec2"),
    ],
)
def test_malformed_start_session_events_are_rejected(saved_event, mutate):
    event = saved_event("ssm-start-session.json")
    mutate(event)
    with pytest.raises(MalformedEventError):
        parse_session_input(event, trigger_config())


def test_sweep_input():
    request = parse_session_input({"cluster": "ml-research", "mode": "sweep"}, trigger_config())
    assert request.mode == "sweep" and request.dry_run is False and request.session_id is None
    assert parse_session_input({"cluster": "ml-research", "mode": "sweep", "dryRun": True}, trigger_config()).dry_run
    # The deployment's dry run wins over the input.
    assert parse_session_input({"cluster": "ml-research", "mode": "sweep", "dryRun": False},
                               trigger_config(SESSION_LIMITS_DRY_RUN="true")).dry_run


@pytest.mark.parametrize(
    "raw",
    [[], "sweep", None, {}, {"cluster": "ml-research"}, {"cluster": "ml-research", "mode": "repair"},
     {"cluster": "ml-research", "mode": "sweep", "dryRun": "false"}, {"cluster": "ml-research", "mode": "sweep", "extra": 1}],
)
def test_malformed_sweep_inputs_are_rejected(raw):
    with pytest.raises(MalformedEventError):
        parse_session_input(raw, trigger_config())


def test_sweep_for_another_cluster_is_unknown():
    with pytest.raises(UnknownClusterError):
        parse_session_input({"cluster": "other", "mode": "sweep"}, trigger_config())


def test_request_state_is_validated():
    with pytest.raises(MalformedEventError):
        SessionLimitsRequest.from_state({"cluster": "ml-research", "mode": "event", "dryRun": False})
    with pytest.raises(MalformedEventError):
        SessionLimitsRequest.from_state({"cluster": "ml-research", "mode": "sweep", "dryRun": "no"})


def test_template_rule_targets_login_nodes_by_cluster_id_not_name():
    template = TemplateModel()
    machine = template.state_machines()["SessionLimitsStateMachine"]
    rule = next(e for e in machine.events if e.kind == "EventBridgeRule")
    pattern = rule.properties["Pattern"]
    assert pattern["source"] == ["aws.ssm"] and pattern["detail-type"] == ["AWS API Call via CloudTrail"]
    assert pattern["detail"]["eventName"] == ["StartSession"] and pattern["detail"]["eventSource"] == ["ssm.amazonaws.com"]
    prefix = pattern["detail"]["requestParameters"]["target"][0]["prefix"]["Fn::Sub"]
    assert prefix[0] == "sagemaker-cluster:${ClusterId}_${LoginGroupName}-"
    assert prefix[1]["ClusterId"] == {"Fn::Select": [1, {"Fn::Split": ["/", {"Ref": "ClusterArn"}]}]}
    for function in ("ParseSessionTriggerFunction", "EnforceSessionLimitsFunction"):
        env = template.resources[function]["Properties"]["Environment"]["Variables"]
        assert env["CLUSTER_ID"] == prefix[1]["ClusterId"], "the handlers and the rule agree on the cluster id"
    assert template.raw["Parameters"]["MaxSessionsPerUser"]["Default"] == 2
    assert template.raw["Parameters"]["SessionLimitsDryRun"]["Default"] == "true", "a new stack ends nothing"
