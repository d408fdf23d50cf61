"""PublishLoginLimits: the limits are published once per version, and each login node's agent
report says whether that node applied them (pure decision), with moto for the publication."""

from __future__ import annotations

import importlib.util
import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace

import boto3
import pytest
from moto import mock_aws

from hpops_core.common import clients
from hpops_core.common.errors import ConfigurationError
from hpops_core.node_channel import contract
from hpops_core.node_channel.login_limits import desired_document, parse_limits
from hpops_core.session_limits import login_limits
from hpops_core.session_limits.config import LoginLimitsConfig

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)
LIMITS = parse_limits('{"default": 2, "overrides": {"alice": 4}}')
VERSION = desired_document(LIMITS)["version"]
PARAMETER = contract.login_limits_parameter("ml")
ENV = {"CLUSTER_NAME": "ml", "CLUSTER_ID": "abc123def456", "LOGIN_GROUP_NAME": "login", "SESSION_LIMITS_DRY_RUN": "false",
       "MAX_SESSIONS_PER_USER": "2", "SESSION_LIMIT_OVERRIDES": '{"alice": 4}', "SESSION_EXEMPT_USERS": "ops, ci",
       "STATE_TABLE_NAME": "t"}
HANDLER = Path(__file__).resolve().parents[2] / "functions" / "session_limits" / "publish_login_limits.py"


def node(instance_id, launched=NOW - timedelta(days=1), status="Running"):
    return {"InstanceId": instance_id, "InstanceGroupName": "login", "LaunchTime": launched,
            "InstanceStatus": {"Status": status}}


def report(version, result="changed", reason=""):
    return {"loginLimits": {"version": version, "result": result, "reason": reason}, "receivedAt": "2026-11-22T11:00:00Z"}


def judge(running, reports, published_ago=timedelta(hours=1), version=VERSION):
    verdicts = login_limits.judge_login_limits(version, running, reports, published_at=NOW - published_ago, now=NOW)
    return {v.instance_id: v for v in verdicts}


# ---------------------------------------------------------------- the pure decision

def test_a_node_reporting_the_version_is_applied():
    verdicts = judge([node("i-done"), node("i-same")], {"i-done": report(VERSION, "unchanged"), "i-same": report(VERSION)})
    assert {i: v.state for i, v in verdicts.items()} == {"i-done": "applied", "i-same": "applied"}
    assert VERSION in verdicts["i-done"].reason


def test_within_the_grace_period_a_node_without_the_version_is_pending():
    young = NOW - timedelta(seconds=40)
    verdicts = judge([node("i-new", launched=young), node("i-old", launched=young)], {"i-old": report("previous")})
    assert {i: v.state for i, v in verdicts.items()} == {"i-new": "pending", "i-old": "pending"}
    assert "no report yet" in verdicts["i-new"].reason and "previous" in verdicts["i-old"].reason


def test_a_new_version_gives_every_node_the_grace_period_again():
    verdicts = judge([node("i-old")], {"i-old": report("previous")}, published_ago=timedelta(seconds=30))
    assert verdicts["i-old"].state == "pending"


def test_after_the_grace_period_a_node_without_the_version_failed_with_a_reason():
    verdicts = judge([node("i-behind"), node("i-silent")], {"i-behind": report("previous", "unchanged")},
                     published_ago=timedelta(seconds=181))
    assert {i: v.state for i, v in verdicts.items()} == {"i-behind": "failed", "i-silent": "failed"}
    assert "still at version previous" in verdicts["i-behind"].reason and "181 s" in verdicts["i-behind"].reason
    assert "hpops-node-agent" in verdicts["i-silent"].reason


def test_the_grace_period_ends_at_exactly_180_seconds():
    assert judge([node("i-a")], {}, published_ago=timedelta(seconds=179))["i-a"].state == "pending"
    assert judge([node("i-a")], {}, published_ago=timedelta(seconds=180))["i-a"].state == "failed"


def test_a_failed_report_for_the_version_fails_at_once_with_the_agents_reason():
    verdicts = judge([node("i-broken")], {"i-broken": report(VERSION, "failed", "cannot write limits: Read-only file system")},
                     published_ago=timedelta(seconds=5))
    assert verdicts["i-broken"].state == "failed" and "Read-only file system" in verdicts["i-broken"].reason


def test_a_failure_about_an_older_document_waits_for_the_grace_period():
    reports = {"i-x": report("previous", "failed", "limits refused: overrides: 'x' is not a valid user name")}
    assert judge([node("i-x")], reports, published_ago=timedelta(seconds=10))["i-x"].state == "pending"
    late = judge([node("i-x")], reports)["i-x"]
    assert late.state == "failed" and "limits refused" in late.reason


def test_nodes_that_left_the_group_are_not_judged():
    verdicts = judge([node("i-here")], {"i-here": report(VERSION), "i-gone": report("previous", "failed", "x")})
    assert list(verdicts) == ["i-here"]


def test_a_launch_time_without_time_zone_is_utc():
    young = (NOW - timedelta(seconds=20)).replace(tzinfo=None)
    assert judge([node("i-new", launched=young)], {})["i-new"].state == "pending"


# ---------------------------------------------------------------- publication (moto)

@pytest.fixture
def aws(monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with mock_aws():
        clients.reset_clients()
        boto3.client("dynamodb", region_name="us-east-1").create_table(
            TableName="t", BillingMode="PAY_PER_REQUEST",
            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
            AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}, {"AttributeName": "sk", "AttributeType": "S"}])
        ssm = boto3.client("ssm", region_name="us-east-1")
        puts: list[str] = []
        clients.client("ssm").meta.events.register(
            "provide-client-params.ssm.PutParameter", lambda params, **_: puts.append(params["Name"]))
        yield SimpleNamespace(ssm=ssm, puts=puts, dynamodb=boto3.client("dynamodb", region_name="us-east-1"))
        clients.reset_clients()


@pytest.fixture
def login_group(monkeypatch):
    nodes: list[dict] = []
    monkeypatch.setattr(login_limits, "list_login_group", lambda cluster, group: list(nodes))
    return nodes


def store_report(aws, instance_id, version, result="changed", reason=""):
    body = {"format": contract.REPORT_FORMAT, "instanceId": instance_id,
            "loginLimits": {"version": version, "result": result, "reason": reason}}
    aws.dynamodb.put_item(TableName="t", Item={
        "pk": {"S": "node-report#ml"}, "sk": {"S": f"node-report#{instance_id}"},
        "report": {"S": json.dumps(body)}, "receivedAt": {"S": "2026-11-22T11:59:30Z"}})


def stored(aws) -> dict:
    return aws.ssm.get_parameter(Name=PARAMETER)["Parameter"]


def test_first_publication_writes_the_document_and_an_identical_one_writes_nothing(aws, login_group):
    first = login_limits.publish_and_check("ml", "login", "t", LIMITS, NOW)
    again = login_limits.publish_and_check("ml", "login", "t", LIMITS, NOW + timedelta(minutes=5))
    assert first.published and not again.published
    assert aws.puts == [PARAMETER]
    parameter = stored(aws)
    assert parameter["Version"] == 1 and parameter["Type"] == "String"
    assert json.loads(parameter["Value"]) == {"format": contract.LOGIN_LIMITS_FORMAT, "version": VERSION, "limits": LIMITS}
    assert len(VERSION) == 16 and int(VERSION, 16) >= 0


def test_changed_limits_are_published_again_with_a_new_version(aws, login_group):
    login_limits.publish_and_check("ml", "login", "t", LIMITS, NOW)
    changed = login_limits.publish_and_check("ml", "login", "t", parse_limits('{"default": 3}'), NOW)
    assert changed.published and changed.version != VERSION
    assert stored(aws)["Version"] == 2 and json.loads(stored(aws)["Value"])["version"] == changed.version


def test_a_dry_run_writes_nothing(aws, login_group):
    login_group.append(node("i-0123456789abcdef0"))
    dry = login_limits.publish_and_check("ml", "login", "t", LIMITS, NOW, dry_run=True)
    assert not dry.published and dry.dry_run and dry.would_publish and dry.nodes == []
    assert aws.puts == []
    with pytest.raises(aws.ssm.exceptions.ParameterNotFound):
        stored(aws)
    login_limits.publish_and_check("ml", "login", "t", LIMITS, NOW)
    assert not login_limits.publish_and_check("ml", "login", "t", LIMITS, NOW, dry_run=True).would_publish


def test_reports_are_read_back_per_running_login_node(aws, login_group):
    login_limits.publish_and_check("ml", "login", "t", LIMITS, NOW - timedelta(hours=1))
    login_group += [node("i-0000000000000000a"), node("i-0000000000000000b"),
                    node("i-0000000000000000c", launched=NOW - timedelta(seconds=30)),
                    node("i-0000000000000000d", status="Pending")]
    store_report(aws, "i-0000000000000000a", VERSION, "unchanged")
    store_report(aws, "i-0000000000000000b", VERSION, "failed", "cannot write limits: No space left on device")
    store_report(aws, "i-0000000000000000e", "previous")  # a replaced node: not judged
    result = login_limits.publish_and_check("ml", "login", "t", LIMITS, NOW)
    assert not result.published
    assert {n.instance_id: n.state for n in result.nodes} == {
        "i-0000000000000000a": "applied", "i-0000000000000000b": "failed", "i-0000000000000000c": "pending"}
    assert "No space left" in result.of("failed")[0].reason


def test_an_override_with_dots_and_upper_case_goes_end_to_end(aws, login_group, tmp_path):
    from hpops_node_agent import login_limits as node_limits

    config = LoginLimitsConfig.from_env(ENV | {"SESSION_LIMIT_OVERRIDES": '{"j.doe": 4, "Alice": 3}',
                                               "SESSION_EXEMPT_USERS": "svc.backup"})
    assert config.limits == {"default": 2, "overrides": {"Alice": 3, "j.doe": 4}, "exempt": ["svc.backup"]}
    login_limits.publish_and_check("ml", "login", "t", config.limits, NOW)
    document = json.loads(stored(aws)["Value"])
    # What the agent does with the parameter it polls.
    assert node_limits.apply(tmp_path, node_limits.parse_limits(json.dumps(document["limits"]))) == "changed"
    text = (tmp_path / node_limits.RELATIVE_PATH).read_text()
    assert "Alice  hard  maxlogins  3\n" in text and "j.doe  hard  maxlogins  4\n" in text
    assert "svc.backup  hard  maxlogins  65535\n" in text


# ---------------------------------------------------------------- configuration

def test_configuration_is_validated_by_the_nodes_own_rule():
    config = LoginLimitsConfig.from_env(ENV)
    assert config.limits == {"default": 2, "exempt": ["ci", "ops"], "overrides": {"alice": 4}}


@pytest.mark.parametrize("variable, value, entry", [
    ("SESSION_LIMIT_OVERRIDES", '{"bob;rm -rf /": 1}', "'bob;rm -rf /'"),
    ("SESSION_LIMIT_OVERRIDES", '{"a b": 1}', "'a b'"),
    ("SESSION_LIMIT_OVERRIDES", '{"-rf": 1}', "'-rf'"),
    ("SESSION_LIMIT_OVERRIDES", '{"alice\\nbob": 1}', "'alice\\nbob'"),
    ("SESSION_EXEMPT_USERS", "ops, a b", "'a b'"),
    ("SESSION_EXEMPT_USERS", "ops:wheel", "'ops:wheel'"),
])
def test_a_hostile_user_name_is_refused_naming_the_variable_and_the_entry(variable, value, entry):
    with pytest.raises(ConfigurationError) as refused:
        LoginLimitsConfig.from_env(ENV | {variable: value})
    message = str(refused.value)
    assert variable in message and entry in message
    assert "not a valid user name" in message
    assert "\n" not in message, "a hostile name is shown escaped, never as a raw line break"


def test_limits_too_big_for_a_standard_parameter_are_a_configuration_error():
    many = json.dumps({f"user{i:05d}.{'x' * 20}": 1 for i in range(200)})
    with pytest.raises(ConfigurationError, match="standard SSM parameter"):
        LoginLimitsConfig.from_env(ENV | {"SESSION_LIMIT_OVERRIDES": many})


# ---------------------------------------------------------------- handler

@pytest.fixture
def app(monkeypatch):
    for name, value in (ENV | {"POWERTOOLS_METRICS_NAMESPACE": "HyperPodLoginAutopilot",
                               "POWERTOOLS_SERVICE_NAME": "session-limits", "POWERTOOLS_TRACE_DISABLED": "true"}).items():
        monkeypatch.setenv(name, value)
    spec = importlib.util.spec_from_file_location("publish_login_limits_under_test", HANDLER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CONTEXT = SimpleNamespace(function_name="PublishLoginLimits", memory_limit_in_mb=256, aws_request_id="r",
                          invoked_function_arn="arn:aws:lambda:us-east-1:123456789012:function:PublishLoginLimits")
SWEEP = {"cluster": "ml", "mode": "sweep", "dryRun": False, "trigger": "sweep", "sessionId": None, "owner": None,
         "ignored": False}


def published_metrics(output: str) -> dict:
    found = {}
    for line in output.splitlines():
        if '"_aws"' in line:
            document = json.loads(line)
            for definition in document["_aws"]["CloudWatchMetrics"][0]["Metrics"]:
                found[definition["Name"]] = document[definition["Name"]]
    return found


def logged_figures(caplog) -> dict:
    return {k: v for record in caplog.records if record.getMessage() == "figures" for k, v in record.figures.items()}


def test_the_handler_returns_the_summary_and_the_metrics(aws, login_group, app, capsys, caplog):
    version = desired_document(LoginLimitsConfig.from_env(ENV).limits)["version"]
    login_group += [node("i-0000000000000000a"), node("i-0000000000000000b")]
    store_report(aws, "i-0000000000000000a", version)
    store_report(aws, "i-0000000000000000b", "previous", "failed", "limits refused")
    capsys.readouterr()
    output = app.publish_login_limits({"request": SWEEP, "now": NOW.isoformat()}, CONTEXT)
    assert output["version"] == version and output["published"] is True
    assert output["applied"] == ["i-0000000000000000a"] and output["pending"] == ["i-0000000000000000b"]
    assert output["failed"] == [] and output["failedCount"] == 0
    # Nothing failed: the alarm's metric is not sent (a zero would cost the hour); the counts are logged.
    assert published_metrics(capsys.readouterr().out) == {}
    assert logged_figures(caplog) == {"LoginLimitsApplied": 1, "LoginLimitsPending": 1, "LoginLimitsPushFailed": 0}


@pytest.mark.filterwarnings("ignore:No application metrics")
def test_the_handler_in_a_dry_run_publishes_nothing(aws, login_group, app, monkeypatch):
    monkeypatch.setenv("SESSION_LIMITS_DRY_RUN", "true")
    output = app.publish_login_limits({"request": SWEEP, "now": NOW.isoformat()}, CONTEXT)
    assert output["dryRun"] and output["wouldPublish"] and not output["published"] and "dry run" in output["skipped"]
    assert aws.puts == []


def test_a_node_that_left_the_group_loses_its_end_sessions_instruction_and_a_node_still_listed_keeps_it(
        aws, login_group, app):
    from hpops_core.node_channel import instructions

    gone, updating, running = "i-0000000000000000a", "i-0000000000000000b", "i-0000000000000000c"
    login_group += [node(running), node(updating, status="SystemUpdating")]
    for instance in (gone, updating, running):
        instructions.write_instruction(contract.end_sessions_parameter("ml", instance), '{"sessions":[]}')
    output = app.publish_login_limits({"request": SWEEP, "now": NOW.isoformat()}, CONTEXT)
    left = {p["Name"] for p in aws.ssm.describe_parameters()["Parameters"]}
    assert output["instructionsRemoved"] == [gone]
    assert not {contract.end_sessions_parameter("ml", gone),
                contract.instruction_marker_parameter(contract.end_sessions_parameter("ml", gone))} & left
    for instance in (updating, running):  # a node still in the group may yet fetch what it was told
        assert {contract.end_sessions_parameter("ml", instance),
                contract.instruction_marker_parameter(contract.end_sessions_parameter("ml", instance))} <= left
    dry = app.publish_login_limits({"request": dict(SWEEP, dryRun=True), "now": NOW.isoformat()}, CONTEXT)
    assert "instructionsRemoved" not in dry or dry["instructionsRemoved"] == []
