"""Budget holds, step by step: read (releases, the last sweep's holds, the agent's report) -> decide
(holds) -> publish the holds document -> queue the alerts -> remember the holds.

Items in the stack's state table:
  pk usage#<cluster>             sk user-holds               the header of the holds last decided: the
                                                             execution that wrote them, a revision
                                                             (conditional writes), where their pages are
  pk usage#<cluster>#hold-state  sk state#<rev>#...          the pages: [user, state, since, reason, month]
                                                             (common/paged_items: any number of users)
  pk usage#<cluster>             sk holds-report             the controller agent's latest holds report
  pk budget#<cluster>            sk hold-release#<month>#<user>  an operator's release: by, reason, at (TTL 40 days)
  pk holds#<cluster>                                         the document the agent fetches (user_holds_store)

The header and the agent's report sit beside the usage collector's status, so a sweep reads all
three in one Query (usage_store.cluster_items).

Alerts are queued (alert_outbox) before the holds are remembered: a retried step of the same
execution finds its own write and queues nothing again; a step that died between the two queues the
same alerts again (the same items). Two executions at once: the second's write fails its condition
(TransientAwsError, retried by the state machine against the new state).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from typing import Any

from botocore.exceptions import ClientError

from hpops_core.budget_guard import alert_outbox, holds
from hpops_core.budget_guard.alert_state import partition_key
from hpops_core.budget_guard.user_spend import SpendReport
from hpops_core.budget_guard.usage_store import status_key
from hpops_core.common.clients import client, transient_errors_named
from hpops_core.common.errors import TransientAwsError
from hpops_core.common.paged_items import page_prefix, put_header, read_pages, write_pages
from hpops_core.node_channel import user_holds_store
from hpops_core.node_channel.report_proof import ReportReplayError

STATE_SK = "user-holds"
STATE_PAGES = "state"
RELEASE_PREFIX = "hold-release#"
AGENT_REPORT_SK = "holds-report"
RELEASE_TTL = dt.timedelta(days=40)


def _dynamodb(dynamodb: Any = None) -> Any:
    return dynamodb or client("dynamodb")


def _item(table: str, cluster: str, sk: str, dynamodb: Any, items: Mapping[str, Any] | None) -> Any:
    """One item under usage#<cluster>: from usage_store.cluster_items() when read already, else a GetItem."""
    if items is not None:
        return items.get(sk)
    with transient_errors_named("dynamodb:GetItem"):
        return _dynamodb(dynamodb).get_item(TableName=table, Key={"pk": {"S": status_key(cluster)}, "sk": {"S": sk}},
                                            ConsistentRead=True).get("Item")


def state_partition(cluster: str) -> str:
    return f"{status_key(cluster)}#hold-state"


def read_state(table: str, cluster: str, dynamodb: Any = None, items: Mapping[str, Any] | None = None) -> dict[str, Any]:
    item = _item(table, cluster, STATE_SK, dynamodb, items)
    if not item:
        return {"holds": {}, "owner": None, "revision": 0, "version": None}
    if "holds" in item:  # kept whole in the header by earlier versions
        held = json.loads(item["holds"]["S"])
    else:
        rows = read_pages(table, state_partition(cluster), item["prefix"]["S"], int(item["pages"]["N"]), dynamodb)
        held = {user: {"state": state, "since": since, "reason": reason, "month": month}
                for user, state, since, reason, month in rows}
    return {"holds": held, "owner": item.get("owner", {}).get("S"), "revision": int(item["revision"]["N"]),
            "version": item.get("version", {}).get("S"), "decidedAt": item.get("decidedAt", {}).get("S")}


def _save_state(table: str, cluster: str, previous_revision: int, held: Mapping[str, Any], owner: str, version: str,
                now: dt.datetime) -> None:
    revision = previous_revision + 1
    prefix = page_prefix(STATE_PAGES, revision, f"{owner}@{now.isoformat()}")
    rows = [[user, v["state"], v.get("since"), v.get("reason"), v.get("month")] for user, v in sorted(held.items())]
    pages = write_pages(table, state_partition(cluster), prefix, rows, now)
    item = {"pk": {"S": status_key(cluster)}, "sk": {"S": STATE_SK}, "prefix": {"S": prefix},
            "pages": {"N": str(pages)}, "users": {"N": str(len(rows))},
            "owner": {"S": owner}, "revision": {"N": str(revision)}, "version": {"S": version},
            "decidedAt": {"S": now.strftime("%Y-%m-%dT%H:%M:%SZ")}}
    # Revisions start at 1: 0 is "none read".
    if not put_header(table, item, str(previous_revision) if previous_revision else None):
        raise TransientAwsError("dynamodb:PutItem: another execution decided the holds first; retry")


def read_releases(table: str, cluster: str, month: str, dynamodb: Any = None) -> dict[str, holds.Release]:
    releases = {}
    paginator = _dynamodb(dynamodb).get_paginator("query")
    with transient_errors_named("dynamodb:Query"):
        for page in paginator.paginate(
            TableName=table, KeyConditionExpression="pk = :pk AND begins_with(sk, :prefix)", ConsistentRead=True,
            ExpressionAttributeValues={":pk": {"S": partition_key(cluster)}, ":prefix": {"S": f"{RELEASE_PREFIX}{month}#"}},
        ):
            for item in page.get("Items", []):
                user = item["sk"]["S"].rsplit("#", 1)[1]
                releases[user] = holds.Release(user, month, item["by"]["S"], item["reason"]["S"], item["at"]["S"])
    return releases


def put_release(table: str, release: holds.Release, cluster: str, now: dt.datetime, dynamodb: Any) -> None:
    """The operator's release (``hpops cost release``); a second release of the same month replaces the first."""
    item = {"pk": {"S": partition_key(cluster)}, "sk": {"S": f"{RELEASE_PREFIX}{release.month}#{release.user}"},
            "by": {"S": release.by}, "reason": {"S": release.reason}, "at": {"S": release.at},
            "ttl": {"N": str(int((now + RELEASE_TTL).timestamp()))}}
    dynamodb.put_item(TableName=table, Item=item)


def read_agent_report(table: str, cluster: str, dynamodb: Any = None,
                      items: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    item = _item(table, cluster, AGENT_REPORT_SK, dynamodb, items)
    if not item:
        return None
    return dict(json.loads(item["report"]["S"]), receivedAt=item.get("receivedAt", {}).get("S"))


def store_agent_report(table: str, report: Mapping[str, Any], received_at: str, sequence: int | None = None) -> bool:
    """Kept only when newer than the one kept (a replayed older report changes nothing). With a
    sequence (a signed report), an older one is refused by name: ReportReplayError."""
    item = {"pk": {"S": status_key(report["cluster"])}, "sk": {"S": AGENT_REPORT_SK},
            "reportedAt": {"S": report["reportedAt"]}, "receivedAt": {"S": received_at},
            "report": {"S": json.dumps(report, sort_keys=True)}}
    condition, values, names = "attribute_not_exists(pk) OR reportedAt < :at", {":at": {"S": report["reportedAt"]}}, {}
    if sequence is not None:
        item["sequence"] = {"N": str(sequence)}
        # Same second, newer sequence: a change reported within a second is still newer; the same
        # sequence is the same report delivered again (EventBridge delivers at least once).
        condition = "attribute_not_exists(pk) OR (reportedAt <= :at AND (attribute_not_exists(#s) OR #s <= :s))"
        values[":s"], names["#s"] = {"N": str(sequence)}, "sequence"
    try:
        with transient_errors_named("dynamodb:PutItem"):
            client("dynamodb").put_item(TableName=table, Item=item, ConditionExpression=condition,
                                        ExpressionAttributeValues=values, **({"ExpressionAttributeNames": names} if names else {}))
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
            if sequence is not None:
                raise ReportReplayError(f"holds report sequence {sequence} is older than the kept report "
                                        "(replayed or reordered)") from None
            return False
        raise
    return True


def forget_agent_report(table: str, cluster: str) -> None:
    """Drop the controller agent's holds report and its sequence: its key was replaced (an operator's
    approval, a verified document), and what that key said counts for nothing."""
    with transient_errors_named("dynamodb:DeleteItem"):
        client("dynamodb").delete_item(TableName=table,
                                       Key={"pk": {"S": status_key(cluster)}, "sk": {"S": AGENT_REPORT_SK}})


def check_holds(config: Any, report: SpendReport, now: dt.datetime, owner: str, stack: str,
                items: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Decide, publish, remember; the step's output: each decision with its reason, and the alerts.

    ``items``: usage_store.cluster_items() as the sweep read them (the state and the agent's report)."""
    policy = config.hold_policy
    table, cluster = config.state_table, config.cluster_name
    previous = read_state(table, cluster, items=items)
    if policy.action != "hold" and not previous["holds"]:
        # Alerts only and nobody held: one read, nothing to publish (the agent's parameter, if any,
        # was emptied when the last hold ended).
        decisions = holds.decide_holds(report, policy, {}, now)
        return _output(policy, decisions, {}, [], None, False, None)
    decisions = holds.decide_holds(report, policy, read_releases(table, cluster, report.month), now)
    document = holds.holds_document(decisions, policy, now)
    agent_report = read_agent_report(table, cluster, items=items)
    if previous["owner"] == owner:  # this execution's retry: what it decided is published and queued
        held, alerts = previous["holds"], []
        published = False
    else:
        agent = holds.agent_states(agent_report, document["version"])
        held, alerts = holds.transitions(previous["holds"], decisions, policy, agent, now, cluster, stack)
        try:
            published = user_holds_store.publish(table, cluster, document, owner, now) is not None
        except user_holds_store.HoldsUndeliverable as error:  # named: the execution fails and its alarm fires
            raise holds.HoldsTooLarge(str(error)) from None
        alert_outbox.queue(table, cluster, alerts, now)
        if held != previous["holds"] or alerts:
            _save_state(table, cluster, previous["revision"], held, owner, document["version"], now)
    return _output(policy, decisions, held, alerts, document["version"], published, agent_report)


def _output(policy: holds.HoldPolicy, decisions: list, held: Mapping[str, Any], alerts: list, version: str | None,
            published: bool, agent_report: Mapping[str, Any] | None) -> dict[str, Any]:
    rows = holds.decision_rows(decisions)
    held_names = sorted(u for u, v in held.items() if v["state"] == "held")
    failed = sorted(u for u, v in held.items() if v["state"] == "failed")
    wanted = holds.held_users(decisions)
    verb = "would hold" if policy.dry_run or policy.action != "hold" else "holds"
    return {
        "action": policy.action, "dryRun": policy.dry_run, "version": version, "published": published,
        "decisions": rows, "held": held_names[:holds.MAX_DECISION_ROWS], "heldCount": len(held_names),
        "failed": failed[:holds.MAX_DECISION_ROWS], "alerts": len(alerts),
        "agent": None if agent_report is None else {k: agent_report.get(k) for k in (
            "version", "reportedAt", "enforced", "enforceReason")},
        "reason": (f"UserBudgetAction {policy.action}{' (dry run)' if policy.dry_run else ''}: {verb} "
                   f"{len(wanted)} user(s) over their limit{': ' + ', '.join(wanted[:10]) if wanted else ''}; "
                   f"{len(alerts)} hold alert(s)"),
    }


def holds_view(config: Any, report: SpendReport, now: dt.datetime, dynamodb: Any) -> dict[str, Any]:
    """Read only (`hpops cost`, `hpops status`): who the last sweep holds, what the agent applied, who
    was released this month and why, and what a sweep now would decide."""
    table, cluster = config.state_table, config.cluster_name
    releases = read_releases(table, cluster, report.month, dynamodb)
    state = read_state(table, cluster, dynamodb)
    agent = read_agent_report(table, cluster, dynamodb)
    decisions = holds.decide_holds(report, config.hold_policy, releases, now)
    applied = {row["user"]: row for row in (agent or {}).get("users") or []}
    held = [{"user": user, "state": value["state"], "since": value.get("since"), "reason": value.get("reason"),
             "agent": (applied.get(user) or {}).get("state"), "agentReason": (applied.get(user) or {}).get("reason")}
            for user, value in sorted(state["holds"].items())]
    return {
        "action": config.hold_policy.action, "dryRun": config.hold_policy.dry_run, "decidedAt": state.get("decidedAt"),
        "held": held, "wouldHold": holds.held_users(decisions),
        "releases": [{"user": r.user, "by": r.by, "reason": r.reason, "at": r.at}
                     for r in sorted(releases.values(), key=lambda r: r.user)],
        "agent": None if agent is None else {k: agent.get(k) for k in ("version", "reportedAt", "enforced",
                                                                      "enforceReason")},
        "ends": holds.ends_text(now, config.stack_name),
    }
