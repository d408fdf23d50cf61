"""The per-user session limits on the login nodes themselves, as pam_limits `maxlogins`.

Runs in the SessionLimits sweep, never on the StartSession path. Nothing is pushed to a node
(SSM Run Command cannot reach HyperPod nodes): the sweep publishes the limits in
/hpops/<cluster>/node/login-limits (only when they changed), each login node's agent applies them
within one poll and reports the version it applied, and the sweep reads those reports back:

    applied   the node reports the published version, not failed
    pending   not yet, but the node (or this version) is younger than the grace period
    failed    the node reported a failure for this version, or the grace period passed without it

A failed node is counted (LoginLimitsPushFailed, alarmed after 3 sweeps in a row); it is not an
error of the run. The decision is pure; publication and reading are the effects around it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from hpops_core.common.clients import client, transient_errors_named
from hpops_core.cluster.login_group import list_login_group
from hpops_core.node_channel import contract, user_sessions
from hpops_core.node_channel.login_limits import canonical_json
from hpops_core.node_channel.user_caps import caps_document
from hpops_core.common.state_table import node_report_partition
from hpops_core.node_channel.report_store import SK_PREFIX, report_from_item

from . import node_sessions
from .config import LoginLimitsConfig, document_text
from .task_result import OUTPUT_LIST_MAX, LogLine, TaskResult

if TYPE_CHECKING:
    from .request import SessionLimitsRequest

DEFAULT_GRACE = timedelta(seconds=180)  # several 30 s agent polls, with their jitter
DESCRIPTION = "hpops: per-user maxlogins the login nodes' agents apply (written by SessionLimits)"


@dataclass(frozen=True)
class NodeLimits:
    instance_id: str
    state: str  # applied | pending | failed
    reason: str


@dataclass
class LoginLimitsReport:
    version: str
    published: bool
    dry_run: bool = False
    would_publish: bool = False  # dry run: the parameter differs from these limits
    nodes: list[NodeLimits] = field(default_factory=list)
    listed: tuple[str, ...] = ()  # every login node ListClusterNodes named, whatever its status

    def of(self, state: str) -> list[NodeLimits]:
        return [n for n in self.nodes if n.state == state]


def _utc(moment: datetime | None) -> datetime | None:
    if moment is None:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def judge_login_limits(version: str, running: list[Mapping], reports: Mapping[str, Mapping], published_at: datetime,
                       now: datetime, grace: timedelta = DEFAULT_GRACE) -> list[NodeLimits]:
    """Pure: per Running login node, has its agent applied `version`?

    `running`: ListClusterNodes summaries of the Running login nodes (reports of other instances,
    e.g. replaced nodes, are ignored). A node's grace period starts at its LaunchTime or at the
    publication of `version`, whichever is later: a new version gives every node time to poll.
    """
    verdicts = []
    for summary in sorted(running, key=lambda s: s["InstanceId"]):
        instance_id = summary["InstanceId"]
        report = reports.get(instance_id) or {}
        limits = report.get("loginLimits") or {}
        reported, result = limits.get("version"), limits.get("result")
        agent_reason = str(limits.get("reason") or "no reason given")
        since = max(published_at, _utc(summary.get("LaunchTime")) or published_at)
        waited = int((now - since).total_seconds())
        if reported == version and result != "failed":
            verdict = NodeLimits(instance_id, "applied", f"applied version {version} ({result})")
        elif reported == version:
            verdict = NodeLimits(instance_id, "failed", f"the node agent failed to apply version {version}: {agent_reason}")
        elif now - since < grace:
            # A failure about an older document says nothing yet about this one.
            seen = "no report yet" if not report else f"reports version {reported} ({result})"
            verdict = NodeLimits(instance_id, "pending", f"{seen}; waiting {waited} of "
                                                         f"{int(grace.total_seconds())} s for version {version}")
        elif not report:
            verdict = NodeLimits(instance_id, "failed", f"no report from the node agent after {waited} s "
                                                        "(is hpops-node-agent installed and running?)")
        elif result == "failed":
            verdict = NodeLimits(instance_id, "failed", f"the node agent failed: {agent_reason}")
        else:
            verdict = NodeLimits(instance_id, "failed", f"still at version {reported} ({result}) after {waited} s, "
                                                        f"last report received {report.get('receivedAt') or 'unknown'}")
        verdicts.append(NodeLimits(verdict.instance_id, verdict.state, verdict.reason[:300]))
    return verdicts


def read_reports(table: str, cluster: str) -> dict[str, dict]:
    """Instance id -> that node's latest agent report (one Query, paginated only past 1 MB)."""
    kwargs = {
        "TableName": table,
        "KeyConditionExpression": "pk = :pk AND begins_with(sk, :prefix)",
        "ExpressionAttributeValues": {":pk": {"S": node_report_partition(cluster)}, ":prefix": {"S": SK_PREFIX}},
        "ConsistentRead": True,
    }
    found: dict[str, dict] = {}
    pages = client("dynamodb").get_paginator("query").paginate(**kwargs)
    with transient_errors_named("dynamodb:Query"):
        for page in pages:
            for item in page.get("Items", []):
                try:
                    report = report_from_item(item) or {}
                except ValueError:  # an unreadable item counts as no report, never fails the sweep
                    report = {}
                found[item["sk"]["S"][len(SK_PREFIX):]] = report
    return found


def _current_parameter(name: str) -> dict | None:
    try:
        with transient_errors_named("ssm:GetParameter"):
            return client("ssm").get_parameter(Name=name)["Parameter"]
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") != "ParameterNotFound":
            raise
        return None


def publish_and_check(cluster: str, group: str, table: str, limits: dict, now: datetime, dry_run: bool = False,
                      grace: timedelta = DEFAULT_GRACE) -> LoginLimitsReport:
    """Publish the limits if the parameter differs (one GetParameter when not), then judge the nodes.

    A dry run reads the parameter to say whether it would publish, and writes nothing."""
    text = document_text(limits)
    version = json.loads(text)["version"]
    name = contract.login_limits_parameter(cluster)
    current = _current_parameter(name)
    changed = current is None or current.get("Value") != text
    if dry_run:
        return LoginLimitsReport(version=version, published=False, dry_run=True, would_publish=changed)
    if changed:
        with transient_errors_named("ssm:PutParameter"):
            client("ssm").put_parameter(Name=name, Value=text, Type="String", Overwrite=True, Description=DESCRIPTION)
    published_at = now if changed else (_utc(current.get("LastModifiedDate")) or now)
    listed = list_login_group(cluster, group)
    running = [s for s in listed if s.get("InstanceStatus", {}).get("Status") == "Running"]
    reports = read_reports(table, cluster) if running else {}
    report = LoginLimitsReport(version=version, published=changed, listed=tuple(s["InstanceId"] for s in listed))
    report.nodes = judge_login_limits(version, running, reports, published_at, now, grace)
    return report


def publish_user_caps(cluster: str, caps: dict | None, dry_run: bool) -> str:
    """The caps parameter brought to ``caps`` (None: deleted, so the agents remove their drop-ins).
    Returns what happened: published, unchanged, removed, off, or "would ..." in a dry run."""
    name = contract.user_caps_parameter(cluster)
    current = _current_parameter(name)
    if caps is None:
        if current is None:
            return "off"
        if dry_run:
            return "would remove"
        with transient_errors_named("ssm:DeleteParameter"):
            try:
                client("ssm").delete_parameter(Name=name)
            except ClientError as error:
                if error.response.get("Error", {}).get("Code") != "ParameterNotFound":
                    raise
        return "removed"
    text = canonical_json(caps_document(caps))
    if current is not None and current.get("Value") == text:
        return "unchanged"
    if dry_run:
        return "would publish"
    with transient_errors_named("ssm:PutParameter"):
        client("ssm").put_parameter(Name=name, Value=text, Type="String", Overwrite=True,
                                    Description="hpops: per-user caps the login nodes' agents apply")
    return "published"


def publish_task(config: LoginLimitsConfig, request: SessionLimitsRequest, now: datetime) -> TaskResult:
    """PublishLoginLimits (sweeps only): publish, judge the nodes, and say so in the output and logs.

    The handler emits the node counts (``appliedCount``, ``pendingCount``, ``failedCount``) as
    metrics, except in a dry run (``dryRun``): nothing was published, so no node was judged.
    """
    dry_run = request.dry_run or config.dry_run
    result = publish_and_check(config.cluster_name, config.login_group, config.state_table, config.limits, now,
                               dry_run=dry_run)
    applied, pending, failed = result.of("applied"), result.of("pending"), result.of("failed")
    caps = publish_user_caps(config.cluster_name, config.user_caps, dry_run)
    # Nodes that left the login group leave their end-sessions instruction behind: removed here, so
    # parameters do not pile up over years of replacements (10,000 standard ones per account and Region).
    removed = [] if dry_run else node_sessions.remove_departed_instructions(config.cluster_name, set(result.listed))
    # Their per-user session items too (a departed node's presence is stale, so they already count for nothing).
    departed = [] if dry_run else user_sessions.remove_departed_nodes(
        config.state_table, config.cluster_name, set(result.listed), lambda: read_reports(config.state_table, config.cluster_name))
    output: dict[str, Any] = {
        "userCaps": caps,
        "instructionsRemoved": removed[:OUTPUT_LIST_MAX],
        "sessionItemsRemoved": departed[:OUTPUT_LIST_MAX],
        "version": result.version, "published": result.published,
        "applied": [n.instance_id for n in applied][:OUTPUT_LIST_MAX],
        "pending": [n.instance_id for n in pending][:OUTPUT_LIST_MAX],
        "failed": [{"instanceId": n.instance_id, "reason": n.reason} for n in failed][:OUTPUT_LIST_MAX],
        "appliedCount": len(applied), "pendingCount": len(pending), "failedCount": len(failed),
    }
    if dry_run:
        output |= {"dryRun": True, "wouldPublish": result.would_publish,
                   "skipped": "dry run: login node limits are not changed"}
        return TaskResult(output, log=(LogLine("info", "login node limits: dry run", {"report": output}),))
    return TaskResult(output, log=(LogLine("warning" if failed else "info", "login node limits checked",
                                           {"report": output}),))
