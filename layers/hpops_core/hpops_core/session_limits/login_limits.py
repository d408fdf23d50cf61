"""The per-user session limits on the login nodes themselves, as pam_limits `maxlogins`.

Runs in the SessionLimits sweep, never on the StartSession path. Nothing is pushed to a node
(SSM Run Command cannot reach HyperPod nodes): the sweep publishes the limits in
/hpops/<cluster>/node/login-limits (only when they changed), each login node's agent applies them
within one poll and reports the version it applied, and the sweep reads those reports back:

    applied   the node reports the published version
    pending   not yet, but the node (or this version) is younger than the grace period
    failed    the node reported a failure, or the grace period passed without the version

A failed node is counted (LoginLimitsPushFailed, alarmed after 3 sweeps in a row); it is not an
error of the run. The decision is pure; publication and reading are the effects around it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from hpops_core.aws.clients import client, transient_errors_named
from hpops_core.aws.login_nodes import list_login_group
from hpops_core.node_channel import contract, desired_state
from hpops_core.node_channel.login_limits import desired_document
from hpops_core.node_channel.reports import SK_PREFIX, report_from_item

DEFAULT_GRACE = timedelta(minutes=3)  # several 30 s agent polls


@dataclass(frozen=True)
class NodeLimits:
    instance_id: str
    state: str  # applied | pending | failed
    reason: str


@dataclass
class LoginLimitsReport:
    version: str
    published: bool
    nodes: list[NodeLimits] = field(default_factory=list)

    def of(self, state: str) -> list[NodeLimits]:
        return [n for n in self.nodes if n.state == state]


def judge_login_limits(version: str, running: list[Mapping], reports: Mapping[str, Mapping], published_at: datetime,
                       now: datetime, grace: timedelta = DEFAULT_GRACE) -> list[NodeLimits]:
    """Pure: per Running login node, has its agent applied `version`? `running`: ListClusterNodes summaries."""
    verdicts = []
    for summary in sorted(running, key=lambda s: s["InstanceId"]):
        instance_id = summary["InstanceId"]
        limits = (reports.get(instance_id) or {}).get("loginLimits") or {}
        since = max(published_at, summary.get("LaunchTime") or published_at)
        if limits.get("version") == version and limits.get("result") != "failed":
            verdicts.append(NodeLimits(instance_id, "applied", f"applied version {version}"))
        elif limits.get("result") == "failed":
            verdicts.append(NodeLimits(instance_id, "failed", f"the node agent failed: {limits.get('reason', '')}"[:300]))
        elif now - since < grace:
            verdicts.append(NodeLimits(instance_id, "pending", f"waiting for the node agent to apply version {version}"))
        elif not reports.get(instance_id):
            verdicts.append(NodeLimits(instance_id, "failed", "no report from the node agent (is hpops-node-agent installed?)"))
        else:
            verdicts.append(NodeLimits(instance_id, "failed", f"still at version {limits.get('version')} after "
                                                              f"{int(grace.total_seconds())} s"))
    return verdicts


def read_reports(table: str, cluster: str) -> dict[str, dict]:
    """Instance id -> that node's latest agent report."""
    kwargs = {
        "TableName": table,
        "KeyConditionExpression": "pk = :pk AND begins_with(sk, :prefix)",
        "ExpressionAttributeValues": {":pk": {"S": f"cluster#{cluster}"}, ":prefix": {"S": SK_PREFIX}},
        "ConsistentRead": True,
    }
    found: dict[str, dict] = {}
    pages = client("dynamodb").get_paginator("query").paginate(**kwargs)
    with transient_errors_named("dynamodb:Query"):
        for page in pages:
            for item in page.get("Items", []):
                found[item["sk"]["S"][len(SK_PREFIX):]] = report_from_item(item) or {}
    return found


def published_at(cluster: str, now: datetime) -> datetime:
    """When the current limits document was written (the grace period starts there)."""
    with transient_errors_named("ssm:GetParameter"):
        parameter = client("ssm").get_parameter(Name=contract.login_limits_parameter(cluster))["Parameter"]
    moment = parameter.get("LastModifiedDate") or now
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def publish_and_check(cluster: str, group: str, table: str, limits: dict, now: datetime,
                      grace: timedelta = DEFAULT_GRACE) -> LoginLimitsReport:
    document = desired_document(limits)
    published = desired_state.publish_if_changed(
        contract.login_limits_parameter(cluster), document,
        "hpops: per-user maxlogins the login nodes' agents apply (written by SessionLimits)")
    since = now if published else published_at(cluster, now)
    running = [s for s in list_login_group(cluster, group) if s.get("InstanceStatus", {}).get("Status") == "Running"]
    reports = read_reports(table, cluster) if running else {}
    report = LoginLimitsReport(version=document["version"], published=published)
    report.nodes = judge_login_limits(document["version"], running, reports, since, now, grace)
    return report
