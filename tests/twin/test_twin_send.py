"""`hpops twin send`: events are refused the way EventBridge would, and AWS's own documented
events replay against a twin cluster of the same name, id and login group."""

import argparse
import json

import pytest
from botocore.exceptions import ClientError

from hpops import main as cli
from hpops_twin import commands
from hpops_twin.world import ACCOUNT_ID, REGION, TwinWorld

# The "SageMaker HyperPod Cluster Event" example of AWS's "SageMaker HyperPod cluster events
# reference" (event metadata trimmed), in another account and region than the twin's.
DOCUMENTED_CLUSTER_EVENT = {
    "version": "0",
    "id": "0bd4a141-0a02-9d8a-f977-3924c3fb259c",
    "detail-type": "SageMaker HyperPod Cluster Event",
    "source": "aws.sagemaker",
    "account": "111122223333",
    "time": "2026-06-01T17:20:25Z",
    "region": "us-west-2",
    "resources": ["arn:aws:sagemaker:us-west-2:111122223333:cluster/sample-cluster"],
    "detail": {
        "EventDetails": {
            "EventId": "83ea0bb5-be77-45e8-a458-0a87f778a205",
            "ClusterArn": "arn:aws:sagemaker:us-west-2:111122223333:cluster/sample-cluster",
            "ClusterName": "sample-cluster",
            "InstanceGroupName": "p5Inst",
            "InstanceId": "i-0391f86fa0fe0d465",
            "ResourceType": "Instance",
            "EventTime": 1748794825350,
            "EventLevel": "Error",
            "Description": "Instance creation in Cluster sample-cluster and InstanceGroup p5Inst failed",
            "EventDetails": {"EventMetadata": {"Instance": {}}},
        }
    },
}


def in_twin_account(event: dict, cluster_id: str) -> dict:
    """The same event as it would reach the twin's account and region, for a cluster with this id
    (real ARNs end in a 12-character id; the documented example ends in the name)."""
    text = json.dumps(event).replace("111122223333", ACCOUNT_ID).replace("us-west-2", REGION)
    return json.loads(text.replace("cluster/sample-cluster", f"cluster/{cluster_id}"))


def send(tmp_path, capsys, events: list[dict], *options: str) -> tuple[int, list[str]]:
    paths = []
    for number, event in enumerate(events):
        path = tmp_path / f"event-{number}.json"
        path.write_text(json.dumps(event), encoding="utf-8")
        paths.append(str(path))
    code = cli.main(["twin", "send", *paths, *options])
    return code, capsys.readouterr().out.splitlines()


def sections(lines: list[str]) -> dict[str, list[str]]:
    """What was printed per event file (its indented lines), by file name."""
    found: dict[str, list[str]] = {}
    current = None
    for line in lines[1:]:
        if line.startswith("  ") and current is not None:
            found[current].append(line.strip())
        elif line.startswith("login nodes: "):
            current = None
        elif not line.startswith("  "):
            current = line.split(":", 1)[0].rsplit("/", 1)[-1]
            found[current] = []
    return found


def running_ips(lines: list[str]) -> list[str]:
    return sorted(lines[0].split("Running login nodes ", 1)[1].split(", "))


def target_ips(lines: list[str]) -> list[str]:
    listed = next(line for line in lines if line.startswith("target group: ")).split(": ", 1)[1]
    return [] if listed == "(empty)" else [target.split()[0] for target in listed.split(", ")]


def listed_login_nodes(lines: list[str]) -> list[str]:
    listed = next(line for line in lines if line.startswith("login nodes: ")).split(": ", 1)[1]
    return sorted(node.split()[0] for node in listed.split(", ") if node.split()[-1] == "Running")


def oversized(event: dict) -> dict:
    big = json.loads(json.dumps(event))
    big["detail"]["Padding"] = "x" * (257 * 1024)
    return big


def test_oversized_events_are_refused_with_a_reason(tmp_path, capsys, saved_event):
    health = saved_event("hyperpod-node-health.json")

    code, lines = send(tmp_path, capsys, [oversized(health), health])

    assert code != 0
    refusals = [line for line in lines if "refused" in line]
    assert len(refusals) == 1 and "256 KB" in refusals[0]
    assert len([line for line in lines if "execution" in line]) == 1, "only the second event starts one"


def test_events_of_two_accounts_are_refused_before_the_twin_is_built(tmp_path, capsys, saved_event):
    health = saved_event("hyperpod-node-health.json")
    foreign = dict(health, account="999999999999")

    code, lines = send(tmp_path, capsys, [health, foreign])

    assert code == 2
    assert lines == [f"twin send: the events are from accounts {ACCOUNT_ID}, 999999999999: EventBridge delivers "
                     "an event only to its own account's buses, so send each account's events separately"]


def test_documented_event_of_another_cluster_converges_on_a_matching_twin(tmp_path, capsys):
    event = in_twin_account(DOCUMENTED_CLUSTER_EVENT, "k3h8q1z0w2x9")

    code, lines = send(tmp_path, capsys, [event],
                       "--cluster", "sample-cluster", "--cluster-id", "k3h8q1z0w2x9", "--login-group", "p5Inst")

    assert code == 0, "\n".join(lines)
    assert lines[0].startswith(f"twin account {ACCOUNT_ID}, region {REGION}, "
                               "cluster sample-cluster (id k3h8q1z0w2x9), login group p5Inst")
    running = running_ips(lines)
    assert len(running) == 3 and sorted(target_ips(lines)) == running
    assert lines[-1] == "in sync"


def test_documented_event_as_published_by_aws_replays_in_its_own_account_and_region(tmp_path, capsys):
    # As copied from AWS's documentation (account 111122223333, us-west-2, an ARN ending in the name).
    code, lines = send(tmp_path, capsys, [DOCUMENTED_CLUSTER_EVENT], "--cluster", "sample-cluster",
                       "--cluster-id", "sample-cluster", "--login-group", "p5Inst")

    assert code == 0, "\n".join(lines)
    assert lines[0].startswith("twin account 111122223333, region us-west-2, cluster sample-cluster")
    assert not [line for line in lines if "refused" in line]
    running = running_ips(lines)
    assert len(running) == 3 and sorted(target_ips(lines)) == running


def test_publish_refuses_like_put_events_and_starts_nothing(world, saved_event):
    health = saved_event("hyperpod-node-health.json")
    other_region = dict(health, region="eu-west-1")

    outcome = world.put_events([oversized(health), dict(health, account="999999999999"), other_region])

    assert outcome.failed_entry_count == 3
    assert [e["ErrorCode"] for e in outcome.entries] == ["InvalidArgument", "InvalidAccountIdException", "InvalidArgument"]
    assert all(e["ErrorMessage"] for e in outcome.entries)
    assert world.publish([dict(health, account="999999999999")]) == []
    sfn = world.aws.client("stepfunctions")
    assert not [e for arn in world.state_machine_arns.values() for e in sfn.list_executions(stateMachineArn=arn)["executions"]]


def test_put_events_over_256_kb_from_our_code_is_a_validation_error(world):
    entry = {"Source": "hpops.node", "DetailType": "Node Report", "Detail": json.dumps({"pad": "x" * (257 * 1024)}),
             "EventBusName": world.output("NodeReportBusName")}
    with pytest.raises(ClientError) as raised:
        world.aws.client("events").put_events(Entries=[entry])
    assert raised.value.response["Error"]["Code"] == "ValidationException"


# ---------------------------------------------------------------------------- what send explains


def test_events_of_one_invocation_replay_in_one_world_and_name_the_targets_they_registered(tmp_path, capsys, saved_event):
    code, lines = send(tmp_path, capsys, [saved_event("hyperpod-cluster-state-change.json"),
                                          saved_event("hyperpod-node-health.json")])

    assert code == 0, "\n".join(lines)
    first, second = sections(lines)["event-0.json"], sections(lines)["event-1.json"]
    running = running_ips(lines)
    assert any(line.startswith("rule LoginNodeSyncStateMachineClusterStateChange -> state machine LoginNodeSyncStateMachine: "
                               "execution ") and "SUCCEEDED: register 3" in line for line in first), first
    assert f"targets registered: {', '.join(running)}" in first
    # the second event's sync found the first one's targets already there
    assert any(line.startswith("rule LoginNodeSyncStateMachineNodeHealth ") and line.endswith("SUCCEEDED: in sync (3 targets)")
               for line in second), second
    assert not [line for line in second if line.startswith("targets ")]
    assert listed_login_nodes(lines) == running == target_ips(lines)
    assert lines[-1] == "in sync"


def test_event_of_no_rule_exits_1_naming_the_field_the_nearest_rule_wants(tmp_path, capsys, saved_event):
    other = saved_event("hyperpod-cluster-state-change.json")
    other["detail"]["ClusterName"] = "other-cluster"

    code, lines = send(tmp_path, capsys, [other, saved_event("ssm-start-session.json"), saved_event("repair-dry-run.json")])

    assert code == 1
    explained = sections(lines)
    assert explained["event-0.json"] == [
        "matched no rule",
        "nearest rule LoginNodeSyncStateMachineClusterStateChange wants detail.ClusterName = ml-research; "
        "the event has other-cluster (--cluster other-cluster would make it match)"]
    cluster_id = lines[0].split("(id ", 1)[1].split(")")[0]
    assert explained["event-1.json"][1].startswith(
        f"nearest rule SessionLimitsStateMachineSessionStarted wants detail.requestParameters.target starting with "
        f"sagemaker-cluster:{cluster_id}_login-; the event has sagemaker-cluster:abc123def456_login-")
    assert explained["event-1.json"][1].endswith("(--cluster-id abc123def456 would make it match)")
    # a dry run registers nothing, and the cluster's login nodes are still listed, with why they wait
    assert target_ips(lines) == []
    assert listed_login_nodes(lines) == running_ips(lines) and len(running_ips(lines)) == 3
    assert lines[-1].endswith(f"not passing: {', '.join(running_ips(lines))}: they present their own host keys "
                              "until a sync (not a dry run) publishes the canonical set")


def test_a_failed_execution_exits_1_with_its_error_and_cause(tmp_path, capsys):
    # A well-formed sweep for a cluster this stack does not manage: the execution refuses it.
    code, lines = send(tmp_path, capsys, [{"cluster": "ml-other", "mode": "sweep"}])

    assert code == 1
    started = sections(lines)["event-0.json"][0]
    assert started.startswith("input -> state machine LoginNodeSyncStateMachine (StartExecution): execution ")
    assert "FAILED: UnknownClusterError: cluster 'ml-other' is not managed by this stack" in started


@pytest.mark.parametrize("document", [{"cluster": "ml-research", "mode": "sweep", "extra": "x"},
                                      {"hello": "world"}, [{"Records": []}]])
def test_valid_json_that_is_neither_an_event_nor_an_input_is_one_named_line_and_no_twin(tmp_path, capsys, document):
    path = tmp_path / "not-an-event.json"
    path.write_text(json.dumps(document), encoding="utf-8")

    code = cli.main(["twin", "send", str(path)])

    captured = capsys.readouterr()
    assert code == 2
    [line] = captured.out.splitlines()
    assert line.startswith(f"twin send: {path}") and "not an event (no detail-type) and not a sweep/repair input" in line
    assert "MalformedEventError" in line
    assert "building the twin" not in captured.err, "refused before anything was built or changed"


def send_args(paths: list[str], *parameters: str) -> argparse.Namespace:
    """`twin send` arguments as main.py parses them, with --parameter NAME=VALUE settings."""
    return argparse.Namespace(events=paths, cluster="ml-research", cluster_id=None, login_group="login",
                              parameter=list(parameters))


def test_budget_event_shows_the_budget_the_guard_created_and_its_alert(tmp_path, capsys, saved_event):
    path = tmp_path / "state-change.json"
    path.write_text(json.dumps(saved_event("hyperpod-cluster-state-change.json")), encoding="utf-8")

    code = commands.send(send_args([str(path)], "MonthlyBudgetUsd=5000"))

    lines = capsys.readouterr().out.splitlines()
    assert code == 0, "\n".join(lines)
    explained = sections(lines)["state-change.json"]
    guard = next(line for line in explained if line.startswith("rule BudgetGuardStateMachineBudgetClusterStateChange "))
    assert "SUCCEEDED: projected " in guard and guard.endswith("% of the limit: alert")
    assert "budget created: hpops-ml-research, limit 5000.00 USD" in explained
    assert any(line.startswith("alert to AlertTopic: [hpops] ml-research: projected ") for line in explained), explained


@pytest.mark.parametrize("setting, reason", [
    ("MonthlyBudget=5000", "expected NAME=VALUE with NAME a parameter of template.yaml"),
    ("MonthlyBudgetUsd=lots", "template.yaml allows ^([0-9]{1,12}"),
    ("SessionLimitsDryRun=yes", "template.yaml allows true, false"),
    ("ClusterName=other", "set it with --cluster"),
])
def test_a_parameter_cloudformation_would_refuse_is_refused_before_the_twin_is_built(capsys, setting, reason):
    assert commands.send(send_args([], setting)) == 2
    assert capsys.readouterr().out.startswith(f"twin send: --parameter {setting}: {reason}")


def test_session_limits_event_shows_the_session_it_ended(tmp_path, capsys, saved_event, monkeypatch):
    opened = []

    class WorldWithSessions(TwinWorld):
        """The saved event's user, alice, already holds three sessions (the limit is two)."""

        def __enter__(self) -> TwinWorld:
            world = super().__enter__()
            opened.extend(world.sessions.add_sessions("alice", 3, role_name="Researchers"))
            return world

    monkeypatch.setattr(commands, "TwinWorld", WorldWithSessions)

    # A stack whose operator turned limits on (a new stack's are in dry run).
    code, lines = send(tmp_path, capsys, [saved_event("ssm-start-session.json")], "--cluster-id", "abc123def456",
                       "--parameter", "SessionLimitsDryRun=false")

    assert code == 0, "\n".join(lines)
    explained = sections(lines)["event-0.json"]
    limits = next(line for line in explained if line.startswith("rule SessionLimitsStateMachineSessionStarted "))
    assert limits.endswith("SUCCEEDED: 3 login sessions listed, 1 users over the limit (alice), ended 1")
    newest = opened[-1].session_id  # SessionExcessPolicy newest: running work keeps the older ones
    assert f"sessions ended: alice {newest}" in explained
    assert any(line.startswith("alert to AlertTopic: ") and "ended 1 login session(s)" in line for line in explained)
