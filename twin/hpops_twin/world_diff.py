"""What an event changed in the twin: the world read before and after, compared (for `hpops twin send`).

Read the way an operator would see it, through the harness's own session (not counted as our
Lambdas' calls): target health, the account's budgets, Session Manager's sessions, the stack's
DynamoDB items, and SNS messages through SQS queues subscribed to the stack's topics.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from hpops_twin.ssm_sessions import ACTIVE_STATUSES, HISTORY_STATUSES

# Items every run rewrites (the sync's lease, the budget guard's last-seen baseline): listing them
# after every event would bury the changes a reader is looking for.
BOOKKEEPING = {"sync-lease", "last-seen"}


@dataclass(frozen=True)
class Snapshot:
    targets: dict[str, str]  # ip -> health state
    budgets: dict[str, tuple[str, str]]  # name -> (limit amount, last updated)
    sessions: dict[str, Any]  # session id -> SessionRecord (immutable)
    items: dict[tuple[str, str, str], dict]  # (table, pk, sk) -> item


class AlertInbox:
    """SNS messages per topic. The AlertTopic has the world's own inbox (world.notifications());
    every other topic of the stack gets a queue subscribed here."""

    def __init__(self, world: Any):
        self.world = world
        sqs = world.aws.client("sqs")
        self._queues: dict[str, str] = {}
        for logical_id in world.template.of_type("AWS::SNS::Topic"):
            arn = world.resolver.physical_ids.get(logical_id)
            if logical_id == "AlertTopic" or arn is None:  # not provisioned: its Condition is false
                continue
            url = sqs.create_queue(QueueName=f"twin-send-{logical_id}")["QueueUrl"]
            queue_arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
            world.aws.client("sns").subscribe(TopicArn=arn, Protocol="sqs", Endpoint=queue_arn)
            self._queues[logical_id] = url

    def new(self) -> list[tuple[str, str]]:
        """(topic, subject) of every message published since the last call."""
        sent = [("AlertTopic", n.get("subject") or "") for n in self.world.notifications()]
        sqs = self.world.aws.client("sqs")
        for topic, url in self._queues.items():
            while messages := sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", []):
                for message in messages:
                    sent.append((topic, json.loads(message["Body"]).get("Subject") or ""))
                    sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
        return sent


def snapshot(world: Any) -> Snapshot:
    budgets = {name: (b.get("BudgetLimit", {}).get("Amount", ""), str(b.get("LastUpdatedTime")))
               for name, b in world.budget.budgets().items()}
    return Snapshot(targets={t["ip"]: t["state"] for t in world.targets()}, budgets=budgets,
                    sessions=dict(world.sessions.store.sessions), items=_items(world))


def _items(world: Any) -> dict[tuple[str, str, str], dict]:
    dynamodb = world.aws.client("dynamodb")
    found = {}
    for logical_id in world.template.of_type("AWS::DynamoDB::Table"):
        table = world.resolver.physical_ids.get(logical_id)
        if table is None:
            continue
        for page in dynamodb.get_paginator("scan").paginate(TableName=table):
            for item in page["Items"]:
                found[(logical_id, item["pk"]["S"], item["sk"]["S"])] = item
    return found


def changes(before: Snapshot, after: Snapshot, alerts: list[tuple[str, str]]) -> list[str]:
    """One line per kind of change, in the order a reader follows an event through."""
    lines = []
    active = lambda snap: {ip for ip, state in snap.targets.items() if state != "draining"}  # noqa: E731
    if added := sorted(active(after) - active(before)):
        lines.append(f"targets registered: {', '.join(added)}")
    if removed := sorted(active(before) - active(after)):
        lines.append(f"targets deregistered: {', '.join(removed)}")
    lines += _budget_lines(before.budgets, after.budgets)
    written = {key: item for key, item in after.items.items() if before.items.get(key) != item}
    ledger = {key[2].split("#", 1)[1]: item for key, item in written.items() if key[2].startswith("session#")}
    ended = [(s, r) for s, r in after.sessions.items()
             if r.status in HISTORY_STATUSES and s in before.sessions and before.sessions[s].status in ACTIVE_STATUSES]
    if ended:
        lines.append("sessions ended: " + ", ".join(f"{_user(r, ledger.get(s))} {s}" for s, r in ended))
    reported = [(s, i) for s, i in ledger.items() if i.get("kind", {}).get("S") == "dry-run-reported"]
    if reported:
        lines.append("sessions reported (dry run, not ended): " + ", ".join(f"{i['user']['S']} {s}" for s, i in reported))
    lines += [f"alert to {topic}: {subject}" for topic, subject in alerts]
    lines += _item_lines(written, {key for key in before.items if key not in after.items})
    return lines


def _budget_lines(before: dict, after: dict) -> list[str]:
    lines = [f"budget created: {name}, limit {after[name][0]} USD" for name in sorted(after.keys() - before.keys())]
    for name in sorted(after.keys() & before.keys()):
        if after[name] != before[name]:
            (old, _), (new, _) = before[name], after[name]
            lines.append(f"budget updated: {name}, limit {old} -> {new} USD" if old != new else f"budget updated: {name}")
    lines += [f"budget deleted: {name}" for name in sorted(before.keys() - after.keys())]
    return lines


def _user(record: Any, ledger_item: dict | None) -> str:
    """The POSIX user the session limits counted it under, else the owner's session name."""
    if ledger_item and "user" in ledger_item:
        return ledger_item["user"]["S"]
    return record.owner.rsplit("/", 1)[-1]


def _item_lines(written: dict, deleted: set) -> list[str]:
    reports, windows, budget_keys, other = [], [], [], []
    for (_, pk, sk), item in sorted(written.items()):
        if sk.startswith("node-report#"):
            report = json.loads(item["report"]["S"]) if "report" in item else {}
            reports.append(report.get("ip") or sk.split("#", 1)[1])
        elif pk.startswith("usage#") and sk == "status":
            other.append(f"usage collector status {item.get('status', {}).get('S')}")
        elif sk.startswith("window#"):
            _, start, part = sk.split("#")
            windows.append(f"{start} part {int(part)}/{item.get('parts', {}).get('N', '?')}")
        elif pk.startswith("budget#") and sk not in BOOKKEEPING:
            budget_keys.append(sk)
        elif not sk.startswith("session#") and sk not in BOOKKEEPING:
            other.append(f"{pk} {sk}")
    lines = []
    if reports:
        lines.append(f"node reports stored: {', '.join(sorted(reports))}")
    if windows:
        lines.append(f"usage windows stored: {', '.join(windows)}")
    if budget_keys:
        lines.append(f"budget alerts remembered (sent once): {', '.join(budget_keys)}")
    if other:
        lines.append(f"state items written: {', '.join(other)}")
    if gone := sorted(f"{pk} {sk}" for _, pk, sk in deleted if sk not in BOOKKEEPING):
        lines.append(f"state items deleted: {', '.join(gone)}")
    return lines


def login_nodes(world: Any) -> list[str]:
    """The target group against the cluster's login nodes, and why a Running node is not to be registered."""
    nodes = sorted(world.sim.nodes(world.cluster_name, world.login_group), key=lambda n: n.ip or "")
    running = [n for n in nodes if n.status == "Running"]
    targets = sorted(world.targets(), key=lambda t: t["ip"])
    listed_nodes = ", ".join(f"{n.ip} {n.instance_id} {n.status}" for n in nodes) or "(none)"
    listed_targets = ", ".join(f"{t['ip']} {t['state']}" for t in targets) or "(empty)"
    lines = [f"login nodes: {listed_nodes}", f"target group: {listed_targets}"]
    # Only nodes that pass the host identity check belong in the target group (world.login_truth);
    # a node presents the canonical keys only once a sync has published them to its agent.
    truth = world.login_truth()
    unverified = [n.ip for n in running if n.ip not in truth]
    registered = sorted(t["ip"] for t in targets if t["state"] != "draining")
    mode = world.resolver.parameters["HostIdentityMode"]
    if registered != truth:
        lines.append(f"OUT OF SYNC: registered {', '.join(registered) or 'none'}; "
                     f"should be {', '.join(truth) or 'none'}")
    elif unverified:
        why = ("they present their own host keys until a sync (not a dry run) publishes the canonical set"
               if mode == "keys" else f"their host identity ({mode} mode) does not verify yet")
        lines.append(f"in sync (targets are the login nodes that pass the host identity check); "
                     f"not passing: {', '.join(unverified)}: {why}")
    else:
        lines.append("in sync")
    return lines
