"""`hpops twin send`: events are refused the way EventBridge would, and AWS's own documented
events replay against a twin cluster of the same name, id and login group."""

import json

import pytest
from botocore.exceptions import ClientError

from hpops import main as cli
from hpops_twin.world import ACCOUNT_ID, REGION

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


def oversized(event: dict) -> dict:
    big = json.loads(json.dumps(event))
    big["detail"]["Padding"] = "x" * (257 * 1024)
    return big


def test_oversized_and_foreign_account_events_are_refused_with_a_reason(tmp_path, capsys, saved_event):
    health = saved_event("hyperpod-node-health.json")
    foreign = dict(health, account="999999999999")

    code, lines = send(tmp_path, capsys, [oversized(health), foreign])

    assert code != 0
    refusals = [line for line in lines if "refused" in line]
    assert len(refusals) == 2
    assert "256 KB" in refusals[0]
    assert "999999999999" in refusals[1]
    assert not [line for line in lines if line.startswith("execution ")], "a refused event started an execution"


def test_documented_event_of_another_cluster_converges_on_a_matching_twin(tmp_path, capsys):
    event = in_twin_account(DOCUMENTED_CLUSTER_EVENT, "k3h8q1z0w2x9")

    code, lines = send(tmp_path, capsys, [event],
                       "--cluster", "sample-cluster", "--cluster-id", "k3h8q1z0w2x9", "--login-group", "p5Inst")

    assert code == 0, "\n".join(lines)
    assert lines[0].startswith("twin cluster sample-cluster (id k3h8q1z0w2x9), login group p5Inst")
    running = lines[0].split("Running login nodes ", 1)[1].split(", ")
    table = lines[lines.index(next(line for line in lines if line.startswith("target "))) + 1:]
    registered = [line.split()[0] for line in table[: next(i for i, line in enumerate(table) if line.startswith("Running"))]]
    assert len(running) == 3 and sorted(registered) == sorted(running)
    assert "in sync" in lines


def test_documented_event_as_published_by_aws_is_not_for_this_account(tmp_path, capsys):
    code, lines = send(tmp_path, capsys, [DOCUMENTED_CLUSTER_EVENT], "--cluster", "sample-cluster")

    assert code != 0
    assert any("refused" in line and "111122223333" in line for line in lines)


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
