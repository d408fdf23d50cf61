"""Push the per-user session limits to the login nodes as pam_limits `maxlogins` (issue 4).

Runs in the SessionLimits sweep, after enforcement, never on the StartSession path. Each login
node's last applied limits are kept in the SyncStateTable:

    pk = "cluster#<cluster name>"   sk = "login-limits#<instance id>"   limitsHash, at

A node whose item is missing (a new or replaced node) or names another hash gets the stack's
LoginLimitsDocument through the node-command transport (SsmRunCommand). All sends go out first,
then the outcomes are polled for at most ``poll_seconds``; only a Success is recorded, so a node
that failed, timed out or was unreachable is simply pushed again on the next sweep. Items of
nodes that left the login group are deleted.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone

from botocore.exceptions import BotoCoreError, ClientError

from hpops_core.aws.clients import client, transient_errors_named
from hpops_core.aws.login_nodes import list_login_group
from hpops_core.errors import HpopsError
from hpops_core.host_identity.node_commands import CommandOutcome, NodeCommandTransport

SK_PREFIX = "login-limits#"
POLL_INTERVAL_SECONDS = 2.0
COMMENT = "hpops: apply per-user maxlogins limits"


def limits_hash(limits_json: str) -> str:
    return hashlib.sha256(limits_json.encode()).hexdigest()[:32]


@dataclass
class PushReport:
    limits_hash: str
    running: int = 0
    unchanged: list[str] = field(default_factory=list)
    pushed: list[str] = field(default_factory=list)  # Success, recorded
    failed: list[dict] = field(default_factory=list)  # {instanceId, status, reason}: retried next sweep
    forgotten: list[str] = field(default_factory=list)  # items of nodes no longer in the group


def _pk(cluster: str) -> str:
    return f"cluster#{cluster}"


def applied_hashes(table: str, cluster: str) -> dict[str, str]:
    """Instance id -> the limits hash last applied there."""
    ddb = client("dynamodb")
    kwargs = {
        "TableName": table,
        "KeyConditionExpression": "pk = :pk AND begins_with(sk, :prefix)",
        "ExpressionAttributeValues": {":pk": {"S": _pk(cluster)}, ":prefix": {"S": SK_PREFIX}},
        "ProjectionExpression": "sk, limitsHash",
        "ConsistentRead": True,
    }
    found: dict[str, str] = {}
    while True:
        with transient_errors_named("dynamodb:Query"):
            page = ddb.query(**kwargs)
        for item in page.get("Items", []):
            found[item["sk"]["S"][len(SK_PREFIX):]] = item.get("limitsHash", {}).get("S", "")
        if "LastEvaluatedKey" not in page:
            return found
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def record_applied(table: str, cluster: str, instance_id: str, digest: str, now: datetime) -> None:
    with transient_errors_named("dynamodb:PutItem"):
        client("dynamodb").put_item(TableName=table, Item={
            "pk": {"S": _pk(cluster)}, "sk": {"S": SK_PREFIX + instance_id},
            "limitsHash": {"S": digest}, "at": {"S": now.astimezone(timezone.utc).isoformat()},
        })


def forget(table: str, cluster: str, instance_id: str) -> None:
    with transient_errors_named("dynamodb:DeleteItem"):
        client("dynamodb").delete_item(TableName=table, Key={"pk": {"S": _pk(cluster)}, "sk": {"S": SK_PREFIX + instance_id}})


def push_login_limits(
    transport: NodeCommandTransport, *, cluster: str, group: str, table: str, document: str, limits_json: str,
    poll_seconds: float, now: datetime, clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> PushReport:
    digest = limits_hash(limits_json)
    report = PushReport(limits_hash=digest)
    summaries = list_login_group(cluster, group)
    present = {s["InstanceId"] for s in summaries}
    running = sorted(s["InstanceId"] for s in summaries if s.get("InstanceStatus", {}).get("Status") == "Running")
    report.running = len(running)
    applied = applied_hashes(table, cluster)

    sent: dict[str, str] = {}
    for instance_id in running:
        if applied.get(instance_id) == digest:
            report.unchanged.append(instance_id)
            continue
        try:
            sent[instance_id] = transport.send(instance_id, document, {"LimitsJson": [limits_json]}, comment=COMMENT)
        except (ClientError, BotoCoreError, HpopsError) as exc:
            code = exc.response.get("Error", {}).get("Code", "ClientError") if isinstance(exc, ClientError) else type(exc).__name__
            report.failed.append({"instanceId": instance_id, "status": "NotSent", "reason": f"SendCommand: {code}"})

    outcomes: dict[str, CommandOutcome] = {}
    deadline = clock() + poll_seconds
    while True:
        for instance_id, command_id in sent.items():
            if instance_id in outcomes:
                continue
            try:
                outcome = transport.outcome(command_id, instance_id)
            except (ClientError, BotoCoreError, HpopsError) as exc:
                outcome = CommandOutcome("Pending", "unknown", f"GetCommandInvocation: {type(exc).__name__}")
            if outcome.finished:
                outcomes[instance_id] = outcome
        if len(outcomes) == len(sent) or clock() >= deadline:
            break
        sleep(min(POLL_INTERVAL_SECONDS, max(0.0, deadline - clock())))

    for instance_id in sent:
        outcome = outcomes.get(instance_id)
        if outcome is not None and outcome.status == "Success":
            record_applied(table, cluster, instance_id, digest, now)
            report.pushed.append(instance_id)
        elif outcome is None:
            report.failed.append({"instanceId": instance_id, "status": "Pending",
                                  "reason": f"no outcome within {poll_seconds:g} s; pushed again next sweep"})
        else:
            report.failed.append({"instanceId": instance_id, "status": outcome.status, "reason": outcome.reason})

    for instance_id in sorted(set(applied) - present):
        forget(table, cluster, instance_id)
        report.forgotten.append(instance_id)
    return report
