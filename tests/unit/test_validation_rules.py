"""One rule per name and id (hpops_core/common/validation.py), and every place that applies one agrees with it:
the template's AllowedPatterns, the session limits, the budget guard and the login nodes' limits."""

import json
import re

import pytest

from hpops_core.common import validation
from hpops_core.budget_guard.config import UserSpendConfig
from hpops_core.common.errors import ConfigurationError
from hpops_core.node_channel import contract
from hpops_core.node_channel.login_limits import BadInput, parse_limits
from hpops_core.session_limits.config import LoginLimitsConfig, SessionLimitsConfig
from hpops_twin.template_model import TemplateModel

TEMPLATE = TemplateModel()

# name -> is it a POSIX user name hpops accepts?
USER_NAMES = {
    "j.doe": True,
    "Alice": True,
    "_svc": True,
    "bob-2": True,
    "123": True,
    "root": True,  # a valid name; it is only never counted or limited
    "123?": False,
    "-x": False,
    ".x": False,
    "a b": False,
    "a:b": False,
    "a/b": False,
    "a@b": True,  # SSSD/realmd fully-qualified directory names
    "alice@example.edu": True,
    "J.Doe@AD.Example.EDU": True,
    "alice@" + "x" * 63: True,
    "alice@" + "x" * 64: False,  # a DNS label has at most 63
    "a@b.c.d.e.f.g": True,
    "a@b.c.d.e.f.g.h": False,  # at most 6 labels: over-long
    "a" * 33 + "@example.edu": False,
    "@example.edu": False,  # pam_limits reads a leading '@' as a group
    "alice@": False,
    "alice@@example.edu": False,
    "alice@b@c": False,
    "alice@example..edu": False,
    "alice@../etc": False,
    "alice@-x": False,
    "alice@x.": False,
    "alice@example.edu\n": False,
    "alice@example.edu;id": False,
    "alice@$(reboot)": False,
    "EXAMPLE\\alice": False,  # the DOMAIN\user format is not taken
    "alice@ex ample": False,
    "a" * 32: True,
    "a" * 33: False,
    "": False,
    "alice\n": False,
    "$(reboot)": False,
}

USER_LIST_PARAMETERS = ("SessionExemptUsers", "UserBudgetExemptUsers")


def _java_like_fullmatch(pattern: str, value: str) -> bool:
    # CloudFormation matches AllowedPattern against the whole value; these patterns use only
    # syntax that Java and Python read alike (^, $, classes, groups, counted repeats).
    return re.fullmatch(pattern.removeprefix("^").removesuffix("$"), value) is not None


@pytest.mark.parametrize("parameter", USER_LIST_PARAMETERS)
@pytest.mark.parametrize("name, accepted", sorted(USER_NAMES.items()))
def test_template_user_patterns_agree_with_the_posix_user_rule(parameter, name, accepted):
    pattern = TEMPLATE.raw["Parameters"][parameter]["AllowedPattern"]
    assert validation.is_posix_user(name) is accepted
    if name:  # the empty list is allowed: "no users"
        assert _java_like_fullmatch(pattern, name) is accepted, f"{parameter} and validation.py disagree on {name!r}"
        assert _java_like_fullmatch(pattern, f"ops,{name}") is accepted
    else:
        assert _java_like_fullmatch(pattern, "")


@pytest.mark.parametrize("name, accepted", sorted(USER_NAMES.items()))
def test_the_user_budget_overrides_pattern_agrees_with_the_posix_user_rule(name, accepted):
    pattern = TEMPLATE.raw["Parameters"]["UserBudgetOverrides"]["AllowedPattern"]
    if name:
        assert _java_like_fullmatch(pattern, f"{name}=500") is accepted
        assert _java_like_fullmatch(pattern, f"ops=1.50,{name}=500") is accepted
    assert _java_like_fullmatch(pattern, "")


@pytest.mark.parametrize("parameter", ("ClusterName", "LoginGroupName", "ControllerGroupName"))
@pytest.mark.parametrize("name", ["ml-research", "a", "A1", "lab--x", "a" * 63, "", "-lab", "lab-", "lab_1",
                                  "a" * 64, "lab;x", "läb"])
def test_template_cluster_and_group_patterns_agree(parameter, name):
    pattern = TEMPLATE.raw["Parameters"][parameter]["AllowedPattern"]
    ours = validation.is_cluster_name(name) if parameter == "ClusterName" else validation.is_instance_group(name)
    assert _java_like_fullmatch(pattern, name) is ours


def test_instance_ids_strict_for_api_calls_lenient_as_events_spell_them():
    documented = "i-12345678abcdefghi"  # AWS's own node-health event example: not hex
    assert validation.is_event_instance_id(documented) and not validation.is_instance_id(documented)
    for real in ("i-0123456789abcdef0", "i-0123abcd"):
        assert validation.is_instance_id(real) and validation.is_event_instance_id(real)
    for bad in ("i-0123456789abcdef", "i-XYZ; curl evil", "i-0123456789abcdef0\n", "0123456789abcdef0", "i-"):
        assert not validation.is_instance_id(bad)
    assert not validation.is_event_instance_id("i-XYZ; curl evil")


@pytest.mark.parametrize("session_id, accepted", [
    ("alice+ops=1,x-0123456789abcdef0", True),  # session names may carry +=,.@_-
    ("alice@example.com-0a1b2c3d4e5f67890", True),
    ("a" * 96, True),
    ("a" * 97, False),
    ("", False),
    ("alice-1\nFAKE LOG", False),
    ("a;rm -rf /", False),  # spaces
    ("alice\x1b[31m", False),
    ("alice\u2028x", False),
    ("mallory-$(reboot)", False),  # no space, still not a name IAM allows
    ("mallory-\u202egnp.exe", False),  # a bidi override would spoof the alert's text
])
def test_session_ids_are_iam_style_names_never_shell_or_control_characters(session_id, accepted):
    assert validation.is_session_id(session_id) is accepted


def test_messages_name_the_entry_and_never_echo_a_long_value():
    with pytest.raises(validation.InvalidValue, match=r"^overrides: 'bad name' is not a valid user name"):
        validation.check_posix_user("bad name", "overrides")
    with pytest.raises(validation.InvalidValue) as long_one:
        validation.check_cluster_name("x" * 5000)
    assert "xxxxx" not in str(long_one.value) and "5000-character" in str(long_one.value)
    with pytest.raises(validation.InvalidValue) as escape:
        validation.check_posix_user("a\nb\x1b[31m")
    assert "\n" not in str(escape.value) and "\x1b" not in str(escape.value)
    with pytest.raises(validation.InvalidValue, match="never counted or limited"):
        validation.check_limited_user("root", "overrides")


SESSION_ENV = {
    "CLUSTER_NAME": "ml-research",
    "CLUSTER_ID": "abc123def456",
    "LOGIN_GROUP_NAME": "login",
    "MAX_SESSIONS_PER_USER": "2",
    "SESSION_LIMIT_OVERRIDES": "{}",
    "SESSION_EXEMPT_USERS": "",
    "SESSION_EXEMPT_PRINCIPALS": "",
    "SESSION_OWNER_MAPPINGS": "[]",
    "UNMAPPED_SESSION_POLICY": "count-as-principal",
    "SESSION_EXCESS_POLICY": "newest",
    "SESSION_LIMITS_DRY_RUN": "false",
    "ALERT_TOPIC_ARN": "arn:aws:sns:us-east-1:123456789012:alerts",
    "STATE_TABLE_NAME": "state",
}
BAD_OVERRIDE = json.dumps({"j.doe": 4, "Alice": 3, "bad name": 1})


@pytest.mark.parametrize("config", [SessionLimitsConfig, LoginLimitsConfig])
def test_a_bad_session_limit_override_is_refused_at_parse_time_naming_the_entry(config):
    assert SessionLimitsConfig.from_env(SESSION_ENV | {"SESSION_LIMIT_OVERRIDES": '{"j.doe": 4, "Alice": 3, "alice@example.edu": 1}'})
    with pytest.raises(ConfigurationError) as refused:
        config.from_env(SESSION_ENV | {"SESSION_LIMIT_OVERRIDES": BAD_OVERRIDE})
    assert "SESSION_LIMIT_OVERRIDES" in str(refused.value) and "'bad name'" in str(refused.value)


def test_a_limit_for_root_is_refused_because_root_is_never_counted():
    with pytest.raises(ConfigurationError, match="'root' is never counted or limited"):
        SessionLimitsConfig.from_env(SESSION_ENV | {"SESSION_LIMIT_OVERRIDES": '{"root": 1}'})
    with pytest.raises(BadInput, match="never counted or limited"):
        parse_limits('{"default": 2, "overrides": {"root": 1}}')


def test_a_bad_exempt_user_is_refused_naming_the_entry():
    with pytest.raises(ConfigurationError, match="SESSION_EXEMPT_USERS: 'a@b..c'"):
        SessionLimitsConfig.from_env(SESSION_ENV | {"SESSION_EXEMPT_USERS": "ops,alice@example.edu,a@b..c"})


def test_the_nodes_refuse_the_same_override_naming_the_entry():
    with pytest.raises(BadInput, match="'bad name' is not a valid user name"):
        parse_limits(json.dumps({"default": 2, "overrides": json.loads(BAD_OVERRIDE)}))


BUDGET_ENV = {
    "CLUSTER_NAME": "ml-research",
    "CLUSTER_ARN": "arn:aws:sagemaker:us-east-1:123456789012:cluster/abcdef012345",
    "ACCOUNT_ID": "123456789012",
    "ALERT_TOPIC_ARN": "arn:aws:sns:us-east-1:123456789012:alerts",
    "MONTHLY_BUDGET_USD": "",
    "USER_MONTHLY_BUDGET_USD": "500",
    "DELETE_BUDGETS_WITH_CLUSTER": "false",
    "STATE_TABLE_NAME": "state",
    "PROJECTION_THRESHOLDS_PERCENT": "80,100",
    "USER_THRESHOLDS_PERCENT": "80,100",
    "AWS_REGION": "us-east-1",
}


def test_user_budget_overrides_follow_the_same_rule_and_a_bad_one_is_named():
    config = UserSpendConfig.from_env(BUDGET_ENV | {"USER_BUDGET_OVERRIDES": "j.doe=10,Alice=20.5,_svc=30,carol@ad.example.edu=40"})
    assert set(config.limits.overrides) == {"j.doe", "Alice", "_svc", "carol@ad.example.edu"}
    with pytest.raises(ConfigurationError) as refused:
        UserSpendConfig.from_env(BUDGET_ENV | {"USER_BUDGET_OVERRIDES": "j.doe=10,bad name=5"})
    assert "USER_BUDGET_OVERRIDES" in str(refused.value) and "'bad name=5'" in str(refused.value)


def test_node_channel_names_use_the_same_rules():
    assert contract.parameter_prefix("ml-research") == "/hpops/ml-research/"
    with pytest.raises(ValueError):
        contract.parameter_prefix("ml_research")
    # A node whose id AWS spells like its documented examples still has a certificate parameter.
    assert contract.certificate_parameter("ml", "i-12345678abcdefghi").endswith("/host-certificates/i-12345678abcdefghi")
    with pytest.raises(ValueError):
        contract.certificate_parameter("ml", "i-../../x")


def test_the_cli_takes_a_directory_user_name_and_refuses_a_hostile_one_naming_the_argument():
    from argparse import Namespace

    from hpops.main import CliError, _stack_and_user

    _stack_and_user(Namespace(stack_name="hpops", user="alice@example.edu"))
    with pytest.raises(CliError, match=r"^USER: 'alice@example.edu;id' is not a valid user name"):
        _stack_and_user(Namespace(stack_name="hpops", user="alice@example.edu;id"))
