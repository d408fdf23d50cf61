"""Every `hpops` command answers a setup problem (region, credentials, stack, permissions) or a
bad file with one line naming the problem and the fix, and exit status 2; never a traceback.

AWS's error answers (expired token, access denied) come from botocore's own error parsing: a
before-call hook on the CLI's session answers the call with the HTTP error AWS would send. Nothing
here reaches AWS: the endpoint is a closed local port, and moto answers where a stack must exist.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
from botocore.awsrequest import AWSResponse
from moto import mock_aws

from hpops.event_files import EVENT_LIMIT_BYTES, event_size, load_event_files
from hpops.errors import CliError
from hpops.main import main

REGION = "us-east-1"
STACK = "hpops-ml"
REPO = Path(__file__).resolve().parents[2]

# Every command that reads a stack, in the order it is documented.
STACK_COMMANDS = {
    "status": ["status", "--stack-name", STACK],
    "status --json": ["status", "--stack-name", STACK, "--json"],
    "repair": ["repair", "--stack-name", STACK, "--dry-run"],
    "host-keys generate": ["host-keys", "generate", "--stack-name", STACK],
    "host-keys rotate": ["host-keys", "rotate", "--stack-name", STACK],
    "host-keys adopt": ["host-keys", "adopt", "--stack-name", STACK, "--from-dir", "{keys}"],
    "host-keys show": ["host-keys", "show", "--stack-name", STACK],
    "host-keys ca-generate": ["host-keys", "ca-generate", "--stack-name", STACK],
    "host-keys ca-show": ["host-keys", "ca-show", "--stack-name", STACK],
    "lifecycle": ["lifecycle", "--stack-name", STACK, "--no-vendor"],
    "cost": ["cost", "--stack-name", STACK],
    "cost subscribe": ["cost", "subscribe", "--stack-name", STACK, "alice", "alice@example.edu"],
    "adopt": ["adopt", "--stack-name", STACK, "--print"],
}
CREDENTIAL_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN",
                        "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                        "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN")


def run(capsys, argv: list[str]) -> tuple[int, str]:
    status = main(argv)
    captured = capsys.readouterr()
    return status, captured.out + captured.err


def assert_one_line(status: int, text: str, label: str, *says: str) -> str:
    """Exit 2, one line, starting with the command's name (`status --json` is `hpops status`)."""
    assert status == 2, text
    assert "Traceback" not in text
    assert text.count("\n") == 1 and text.endswith("\n"), text
    assert text.startswith(f"hpops {label.split(' --')[0]}: "), text
    for part in says:
        assert part in text, text
    return text.rstrip("\n")


@pytest.fixture
def bare_aws(monkeypatch, tmp_path):
    """No AWS configuration at all: no credentials, no region, no profile files, no instance metadata,
    and an endpoint nothing listens on, so a call that got through would fail here, not reach AWS."""
    for name in (*CREDENTIAL_VARIABLES, "AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setattr("hpops.main._utc_now", lambda: dt.datetime(2026, 11, 20, 12, 0, tzinfo=dt.timezone.utc))
    return monkeypatch


@pytest.fixture
def configured(bare_aws):
    """A region and (fake) credentials: what gets past the SDK to the first API call."""
    bare_aws.setenv("AWS_DEFAULT_REGION", REGION)
    for name, value in {"AWS_ACCESS_KEY_ID": "AKIAEXAMPLE", "AWS_SECRET_ACCESS_KEY": "secret"}.items():
        bare_aws.setenv(name, value)
    return bare_aws


@pytest.fixture
def moto_aws(configured):
    """moto answers (it matches AWS's own endpoints, so the closed local one is dropped)."""
    configured.delenv("AWS_ENDPOINT_URL")
    with mock_aws():
        yield configured


@pytest.fixture(scope="module")
def node_keys(tmp_path_factory) -> Path:
    """A login node's /etc/ssh host keys, for `host-keys adopt --from-dir`."""
    from hpops_core.host_identity.keys import generate_bundle

    folder = tmp_path_factory.mktemp("etc-ssh")
    for pair in generate_bundle().pairs():
        (folder / f"ssh_host_{pair.name}_key").write_text(pair.private_openssh)
    return folder


def argv(label: str, node_keys: Path) -> list[str]:
    return [str(node_keys) if word == "{keys}" else word for word in STACK_COMMANDS[label]]


def answer_every_call_with(monkeypatch, code: str, message: str, status: int = 400) -> list[str]:
    """The CLI's sessions answer every API call with this AWS error; returns the IAM actions called."""
    called: list[str] = []

    def refuse(model, **_):
        action = f"{model.service_model.signing_name}:{model.name}"
        called.append(action)
        return AWSResponse("https://aws", status, {}, None), {
            "Error": {"Code": code, "Message": message.format(action=action)},
            "ResponseMetadata": {"HTTPStatusCode": status}}

    def session(region_name=None):
        made = boto3.session.Session(region_name=region_name)
        made.events.register("before-call.*.*", refuse)
        return made

    monkeypatch.setattr("hpops.main._session", session)
    return called


# --------------------------------------------------------------------------- region and credentials


@pytest.mark.parametrize("label", STACK_COMMANDS)
def test_no_region(bare_aws, capsys, tmp_path, node_keys, label):
    bare_aws.chdir(tmp_path)  # lifecycle's default --out is relative
    status, text = run(capsys, argv(label, node_keys))
    assert_one_line(status, text, label, "no AWS region: pass --region, or set AWS_REGION")


def test_aws_region_is_read_as_the_aws_cli_reads_it(bare_aws, capsys, monkeypatch):
    """--region, then AWS_REGION, then AWS_DEFAULT_REGION, then the profile's (boto3 alone skips AWS_REGION)."""
    from hpops.main import region_of

    assert region_of("eu-west-1", {"AWS_REGION": "us-west-2"}) == "eu-west-1"
    assert region_of(None, {"AWS_REGION": "us-west-2", "AWS_DEFAULT_REGION": "us-east-1"}) == "us-west-2"
    assert region_of(None, {"AWS_DEFAULT_REGION": "us-east-1"}) is None  # boto3 reads that one itself
    seen = []
    monkeypatch.setattr("hpops.main._session", lambda region: seen.append(region) or boto3.session.Session(region_name=region))
    bare_aws.setenv("AWS_REGION", "us-west-2")
    status, text = run(capsys, ["status", "--stack-name", STACK])
    assert seen == ["us-west-2"] and "no AWS region" not in text
    assert_one_line(status, text, "status", "no AWS credentials found")


@pytest.mark.parametrize("label", STACK_COMMANDS)
def test_no_credentials(bare_aws, capsys, tmp_path, node_keys, label):
    bare_aws.chdir(tmp_path)
    status, text = run(capsys, [*argv(label, node_keys), "--region", REGION])
    assert_one_line(status, text, label, "no AWS credentials found: run `aws configure` or `aws sso login`")


@pytest.mark.parametrize("label", STACK_COMMANDS)
def test_partial_credentials(bare_aws, capsys, tmp_path, node_keys, label):
    bare_aws.chdir(tmp_path)
    bare_aws.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")  # and no secret key
    status, text = run(capsys, [*argv(label, node_keys), "--region", REGION])
    assert_one_line(status, text, label, "incomplete AWS credentials", "AWS_SECRET_ACCESS_KEY",
                    "set the missing value")


@pytest.mark.parametrize("code", ["ExpiredToken", "ExpiredTokenException"])
@pytest.mark.parametrize("label", STACK_COMMANDS)
def test_expired_token(configured, capsys, tmp_path, node_keys, label, code):
    configured.chdir(tmp_path)
    called = answer_every_call_with(configured, code, "The security token included in the request is expired")
    status, text = run(capsys, argv(label, node_keys))
    line = assert_one_line(status, text, label, "AWS credentials expired", code, "renew them (`aws sso login`")
    assert len(called) == 1, "it stopped at the first refused call"
    assert called[0].split(":")[1] in line  # names the call that was refused


@pytest.mark.parametrize("label", STACK_COMMANDS)
def test_access_denied_names_the_action(configured, capsys, tmp_path, node_keys, label):
    configured.chdir(tmp_path)
    called = answer_every_call_with(configured, "AccessDenied", "User: arn:aws:sts::123456789012:assumed-role/"
                                    "ReadOnly/alice is not authorized to perform: {action} on resource: stack/hpops-ml")
    status, text = run(capsys, argv(label, node_keys))
    assert_one_line(status, text, label, f"access denied to {called[0]} (",
                    f"use a role or profile allowed {called[0]}")


def test_access_denied_without_the_action_in_the_message_names_the_operation(configured, capsys):
    answer_every_call_with(configured, "AccessDeniedException", "Access denied")
    status, text = run(capsys, STACK_COMMANDS["status"])
    assert_one_line(status, text, "status", "access denied to DescribeStacks (DescribeStacks: AccessDeniedException")


# --------------------------------------------------------------------------- unknown stack, missing output


@pytest.mark.parametrize("label", STACK_COMMANDS)
def test_unknown_stack(moto_aws, capsys, tmp_path, node_keys, label):
    moto_aws.chdir(tmp_path)
    status, text = run(capsys, argv(label, node_keys))
    assert_one_line(status, text, label, f"stack {STACK} not found in {REGION} (",
                    f"Stack with id {STACK} does not exist", "check --stack-name, and --region")


def test_unknown_stack_names_the_region_given(moto_aws, capsys):
    status, text = run(capsys, [*STACK_COMMANDS["status"], "--region", "eu-west-1"])
    assert_one_line(status, text, "status", f"stack {STACK} not found in eu-west-1 (")


def test_a_stack_without_an_output_the_command_needs(moto_aws, capsys):
    boto3.client("cloudformation").create_stack(StackName=STACK, TemplateBody=json.dumps({
        "Parameters": {"ClusterName": {"Type": "String"}},
        "Resources": {"Topic": {"Type": "AWS::SNS::Topic"}}}),
        Parameters=[{"ParameterKey": "ClusterName", "ParameterValue": "ml-research"}])
    status, text = run(capsys, STACK_COMMANDS["status"])
    assert_one_line(status, text, "status", f"stack {STACK} has no output TargetGroupArn: is it an hpops stack?",
                    "update it with this version's template.yaml")


def test_access_denied_on_an_alarm_read_is_the_one_line_not_a_partial_status(moto_aws, capsys):
    """Alarms decide the exit status: unreadable, status cannot tell (2), rather than claim none."""
    calls = []

    def deny_alarms(model, **_):
        calls.append(model.name)
        if model.name == "ListStackResources":
            return AWSResponse("https://aws", 403, {}, None), {"Error": {
                "Code": "AccessDenied", "Message": "not authorized to perform: cloudformation:ListStackResources"},
                "ResponseMetadata": {"HTTPStatusCode": 403}}
        return None

    def session(region_name=None):
        made = boto3.session.Session(region_name=region_name)
        made.events.register("before-call.*.*", deny_alarms)
        return made

    moto_aws.setattr("hpops.main._session", session)
    _minimal_status_stack()
    status, text = run(capsys, STACK_COMMANDS["status"])
    assert_one_line(status, text, "status", "access denied to cloudformation:ListStackResources")
    assert "DescribeTargetHealth" in calls  # it got that far: the denial came later than the first call


def _minimal_status_stack() -> None:
    """The least `hpops status` reads: a cluster, an empty target group, a state machine, the table."""
    from moto.core import DEFAULT_ACCOUNT_ID

    from hpops_twin.hyperpod_sim import HyperPodSimulator

    sim = HyperPodSimulator(REGION, DEFAULT_ACCOUNT_ID, clock=lambda: dt.datetime.now(dt.timezone.utc))
    sim.create_cluster("ml-research", {"login": ("ml.m5.xlarge", 1)})
    vpc = boto3.client("ec2").create_vpc(CidrBlock="10.1.0.0/16")["Vpc"]["VpcId"]
    group = boto3.client("elbv2").create_target_group(Name="login", Protocol="TCP", Port=22, TargetType="ip",
                                                      VpcId=vpc)["TargetGroups"][0]["TargetGroupArn"]
    machine = boto3.client("stepfunctions").create_state_machine(
        name="sync", roleArn="arn:aws:iam::123456789012:role/sync",
        definition=json.dumps({"StartAt": "A", "States": {"A": {"Type": "Pass", "End": True}}}))["stateMachineArn"]
    table = {"Type": "AWS::DynamoDB::Table", "Properties": {
        "BillingMode": "PAY_PER_REQUEST",
        "AttributeDefinitions": [{"AttributeName": "pk", "AttributeType": "S"}, {"AttributeName": "sk", "AttributeType": "S"}],
        "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}]}}
    values = {"ClusterName": "ml-research", "Group": group, "Machine": machine}
    boto3.client("cloudformation").create_stack(StackName=STACK, TemplateBody=json.dumps({
        "Parameters": {name: {"Type": "String"} for name in values},
        "Resources": {"SyncStateTable": table},
        "Outputs": {"TargetGroupArn": {"Value": {"Ref": "Group"}},
                    "LoginNodeSyncStateMachineArn": {"Value": {"Ref": "Machine"}},
                    "SyncStateTableName": {"Value": {"Ref": "SyncStateTable"}}}}),
        Parameters=[{"ParameterKey": k, "ParameterValue": v} for k, v in values.items()])


def test_access_denied_to_sessions_leaves_the_rest_of_status_standing(moto_aws, capsys):
    def deny_sessions(model, **_):
        if model.name == "DescribeSessions":
            return AWSResponse("https://aws", 400, {}, None), {"Error": {
                "Code": "AccessDeniedException",
                "Message": "User: arn:aws:iam::123456789012:user/ops is not authorized to perform: ssm:DescribeSessions"},
                "ResponseMetadata": {"HTTPStatusCode": 400}}
        return None

    def session(region_name=None):
        made = boto3.session.Session(region_name=region_name)
        made.events.register("before-call.*.*", deny_sessions)
        return made

    moto_aws.setattr("hpops.main._session", session)
    _minimal_status_stack()
    status, text = run(capsys, STACK_COMMANDS["status"])
    assert status == 1, text  # the Running login node is not registered
    assert [line for line in text.splitlines() if line.startswith("sessions: ")] == [
        "sessions: unavailable (access denied to ssm:DescribeSessions (DescribeSessions: AccessDeniedException: "
        "User: arn:aws:iam::123456789012:user/ops is not authorized to perform: ssm:DescribeSessions): use a role "
        "or profile allowed ssm:DescribeSessions, or ask your AWS administrator to grant it)"]


# --------------------------------------------------------------------------- twin send: event files


def write(tmp_path: Path, name: str, content: str | bytes) -> str:
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return str(path)


def send(capsys, *paths: str) -> tuple[int, str]:
    return run(capsys, ["twin", "send", *paths])


def test_send_a_missing_file(capsys, tmp_path):
    good = write(tmp_path, "sweep.json", '{"cluster": "ml-research", "mode": "sweep"}')
    status, text = send(capsys, good, str(tmp_path / "no-such.json"))
    assert_one_line(status, text, "twin send", f"{tmp_path / 'no-such.json'}: no such file: give the path")


def test_send_an_unreadable_file(capsys, tmp_path):
    folder = tmp_path / "events"
    folder.mkdir()  # a folder cannot be read as a file, whoever runs the test (root reads any file)
    status, text = send(capsys, str(folder))
    assert_one_line(status, text, "twin send", f"{folder}: cannot read it (Is a directory): give a readable JSON file")


def test_send_invalid_json_names_the_line_and_column(capsys, tmp_path):
    path = write(tmp_path, "broken.json", '{\n  "detail-type": "x",\n  "detail": {"a": 1,}\n}\n')
    status, text = send(capsys, path)
    assert_one_line(status, text, "twin send", f"{path}: invalid JSON at line 3, column 21 (Expecting property name "
                    "enclosed in double quotes): fix the file")


def test_send_a_file_that_is_not_utf8(capsys, tmp_path):
    path = write(tmp_path, "latin1.json", '{"detail": "caf\xe9"}'.encode("latin-1"))
    status, text = send(capsys, path)
    assert_one_line(status, text, "twin send", f"{path}: not UTF-8 text (byte 15): save it as UTF-8 JSON")


@pytest.mark.parametrize("content, kind", [
    ("42", "is a number"), ('"events/sweep.json"', "is a string"), ("null", "is null"), ("true", "is true/false"),
])
def test_send_json_of_the_wrong_type(capsys, tmp_path, content, kind):
    path = write(tmp_path, "event.json", content)
    status, text = send(capsys, path)
    assert_one_line(status, text, "twin send", f"{path} {kind}; expected a JSON object (an event or a state machine "
                    "input) or a non-empty list of them")


def test_send_an_empty_list_is_refused_not_a_silent_success(capsys, tmp_path):
    path = write(tmp_path, "none.json", "[]")
    status, text = send(capsys, path)
    assert_one_line(status, text, "twin send", f"{path}: holds an empty list; expected a JSON object")


def test_send_a_list_with_an_item_that_is_not_an_object_names_the_item(capsys, tmp_path):
    path = write(tmp_path, "mixed.json", '[{"cluster": "ml-research", "mode": "sweep"}, [1]]')
    status, text = send(capsys, path)
    assert_one_line(status, text, "twin send", f"{path}: item 2 of 2 is a list; expected a JSON object")


def oversized_event(size: int) -> dict:
    """An EventBridge event whose PutEvents entry is exactly ``size`` bytes."""
    event = {"detail-type": "Node Report", "source": "hpops.node", "detail": {"pad": ""}}
    event["detail"]["pad"] = "x" * (size - event_size(event))
    assert event_size(event) == size
    return event


def test_an_event_of_256_kb_or_more_is_refused_naming_its_size(tmp_path):
    path = write(tmp_path, "big.json", json.dumps([oversized_event(EVENT_LIMIT_BYTES - 1),
                                                    oversized_event(EVENT_LIMIT_BYTES)]))
    with pytest.raises(CliError) as raised:
        load_event_files([path])
    assert str(raised.value) == (f"{path}: item 2 of 2: event entry is 262,144 bytes; EventBridge takes entries "
                                 "under 262,144 (256 KB): trim its detail")


def test_a_state_machine_input_over_256_kb_is_refused_naming_its_size(tmp_path):
    path = write(tmp_path, "input.json", json.dumps({"cluster": "ml-research", "pad": "x" * EVENT_LIMIT_BYTES}))
    with pytest.raises(CliError) as raised:
        load_event_files([path])
    assert str(raised.value) == (f"{path}: state machine input is 262,178 bytes; Step Functions takes at most "
                                 "262,144 (256 KB): trim it")


def test_saved_events_load_as_the_twin_sends_them():
    paths = sorted(str(p) for p in (REPO / "events").glob("*.json"))
    events = load_event_files(paths)
    assert len(events) >= len(paths) and all(isinstance(event, dict) for event in events)


# --------------------------------------------------------------------------- other files


def test_adopt_from_a_folder_that_does_not_exist(capsys, tmp_path):
    status, text = run(capsys, ["host-keys", "adopt", "--stack-name", STACK, "--from-dir", str(tmp_path / "etc-ssh")])
    assert_one_line(status, text, "host-keys adopt", f"--from-dir {tmp_path / 'etc-ssh'}: no such folder: copy a "
                    "login node's /etc/ssh/ssh_host_{ed25519,ecdsa,rsa}_key files")


def test_adopt_from_a_file_instead_of_a_folder(capsys, tmp_path):
    path = write(tmp_path, "ssh_host_rsa_key", "not a folder")
    status, text = run(capsys, ["host-keys", "adopt", "--stack-name", STACK, "--from-dir", path])
    assert_one_line(status, text, "host-keys adopt", f"--from-dir {path}: not a folder")


def test_adopt_with_an_unreadable_key_file_names_it(capsys, tmp_path):
    (tmp_path / "ssh_host_rsa_key").mkdir()  # unreadable as a file even for root
    status, text = run(capsys, ["host-keys", "adopt", "--stack-name", STACK, "--from-dir", str(tmp_path)])
    assert_one_line(status, text, "host-keys adopt", f"{tmp_path / 'ssh_host_rsa_key'}: cannot read it (Is a directory)")


def test_adopt_a_file_that_is_not_a_key(capsys, tmp_path):
    for name in ("ed25519", "ecdsa", "rsa"):
        write(tmp_path, f"ssh_host_{name}_key", "-----BEGIN OPENSSH PRIVATE KEY-----\nnot really\n")
    status, text = run(capsys, ["host-keys", "adopt", "--stack-name", STACK, "--from-dir", str(tmp_path)])
    line = assert_one_line(status, text, "host-keys adopt", f"(in {tmp_path})")
    assert "not really" not in line  # never key material, even a broken one


@pytest.mark.parametrize("command", ["demo", "bench"])
def test_json_output_into_a_missing_folder_is_refused_before_the_run(capsys, tmp_path, command):
    path = tmp_path / "reports" / "out.json"
    status, text = run(capsys, [command, "--json", str(path)])
    assert_one_line(status, text, command, f"--json {path}: folder {path.parent} does not exist: create it")


def test_json_output_onto_a_folder_is_refused(capsys, tmp_path):
    status, text = run(capsys, ["demo", "--json", str(tmp_path)])
    assert_one_line(status, text, "demo", f"--json {tmp_path}: is a folder: give a file name")


def test_lifecycle_out_below_a_file_is_refused(capsys, tmp_path):
    blocker = write(tmp_path, "dist", "a file where the folder should be")
    status, text = run(capsys, ["lifecycle", "--cluster", "ml-research", "--report-bus", "b", "--region", REGION,
                                "--out", f"{blocker}/lifecycle"])
    assert_one_line(status, text, "lifecycle", f"{blocker} is a file, not a folder: choose another path")


def test_lifecycle_with_a_cluster_name_the_agent_would_refuse(capsys, tmp_path):
    status, text = run(capsys, ["lifecycle", "--cluster", "ml research;", "--report-bus", "b", "--region", REGION,
                                "--out", str(tmp_path)])
    assert_one_line(status, text, "lifecycle", "cluster name is not a HyperPod cluster name",
                    "give the HyperPod cluster's name and region")


# --------------------------------------------------------------------------- the installed entry point


@pytest.mark.parametrize("argv, says", [
    (["status", "--stack-name", STACK], "hpops status: no AWS region"),
    (["twin", "send", "no-such.json"], "hpops twin send: no-such.json: no such file"),
])
def test_the_command_line_prints_one_line_and_exits_2(tmp_path, argv, says):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env |= {"AWS_CONFIG_FILE": str(tmp_path / "none"), "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
            "AWS_EC2_METADATA_DISABLED": "true", "AWS_ENDPOINT_URL": "http://127.0.0.1:9"}
    done = subprocess.run([sys.executable, "-m", "hpops", *argv], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120)
    assert done.returncode == 2
    assert done.stderr == "" and done.stdout.count("\n") == 1 and done.stdout.startswith(says), done


def test_a_refused_head_object_names_the_actions_its_bare_403_does_not():
    from botocore.exceptions import ClientError

    from hpops.errors import explain

    refused = ClientError({"Error": {"Code": "403", "Message": "Forbidden"}}, "HeadObject")
    assert explain(refused, "us-east-1").startswith(
        "access denied to s3:GetObject, or to s3:ListBucket for a missing object (HeadObject: 403: Forbidden)")
