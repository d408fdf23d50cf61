"""LoginNodeSync Lambda handlers: where events enter and effects are triggered.

Each handler is thin: parse its input, read config, call the adapters in hpops_core.aws and the
pure decision in hpops_core.login_sync.target_plan, return plain JSON for the next state. The order of the
steps, retries, error routing and the "one more pass" loop live in
statemachines/login_node_sync.asl.json.

The two steps that validate events with pydantic have a module each, so that the steps here never
load it on a cold start: parse_trigger.py (ParseTrigger) and ended_sync.py (ReleaseLeaseOfEndedSync).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from datetime import datetime, timezone

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext
from botocore.exceptions import BotoCoreError, ClientError

from hpops_core.common.observability import handler_tools
from hpops_core.cluster import login_group as login_nodes
from hpops_core.login_sync import admission, admission_store, leave_notices, slots, sync_lease, target_group
from hpops_core.login_sync.config import ADMISSION_RECORD_MAX_AGE_SECONDS, SyncConfig
from hpops_core.common.errors import EmptyListingGuardError, LoginGroupError, MalformedEventError, TransientAwsError
from hpops_core.login_sync.target_plan import LoginNode, plan_targets, still_to_apply
from hpops_core.node_channel import contract

logger, tracer, metrics = handler_tools(calls_aws=True)

MAX_PASSES = 5  # after this many back-to-back passes, release and let the sweep finish the job


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def sync_lease_handler(event: dict, context: LambdaContext) -> dict:
    """{"action": "acquire"|"release"|"abandon", "holder", "ipCache"?, "pass"?} -> lease outcome."""
    config = SyncConfig.from_env()
    action, holder = event.get("action"), event.get("holder")
    if not isinstance(holder, str) or not holder:
        raise MalformedEventError("lease request needs a holder")
    if action == "acquire":
        grant = sync_lease.acquire(config.state_table, config.cluster_name, holder, int(time.time()), config.lease_seconds)
        metrics.add_metric(name="ReconcilesCoalesced", unit=MetricUnit.Count, value=0 if grant.acquired else 1)
        logger.info(grant.reason)
        return {"acquired": grant.acquired, "reason": grant.reason, "ipCache": grant.ip_cache, "pass": 1,
                "expectedIdentity": grant.host_identity}
    if action == "release":
        passes = int(event.get("pass", 1))
        outcome = sync_lease.release(
            config.state_table, config.cluster_name, holder, event.get("ipCache") or {}, force=passes >= MAX_PASSES
        )
        metrics.add_metric(name="ExtraPasses", unit=MetricUnit.Count, value=1 if outcome.rerun else 0)
        logger.info(outcome.reason, extra={"pass": passes})
        # Echo the cache: a rerun pass reads it from the same place as the first pass.
        return {"rerun": outcome.rerun, "reason": outcome.reason, "pass": passes + 1, "ipCache": event.get("ipCache") or {},
                "expectedIdentity": event.get("expectedIdentity")}
    if action == "abandon":
        outcome = sync_lease.abandon(config.state_table, config.cluster_name, holder)
        metrics.add_metric(name="LeasesAbandoned", unit=MetricUnit.Count, value=1)
        logger.info(outcome.reason)
        return {"rerun": False, "reason": outcome.reason}
    raise MalformedEventError("lease action must be acquire, release or abandon")


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def resolve_login_nodes(event: dict, context: LambdaContext) -> dict:
    """{"mode", "ipCache"} -> the login group's nodes with IPs (a repair trusts no cached IP)."""
    config = SyncConfig.from_env()
    listing = login_nodes.resolve_login_group(
        config.cluster_name, config.login_group, event.get("ipCache") or {}, trust_cache=event.get("mode") != "repair"
    )
    serving = [n for n in listing.nodes if n.serving]
    # One DescribeCluster a pass (none when the listing already said the cluster is gone): the login
    # group must be one of the cluster's, and its status feeds the safety guard when nothing serves.
    described = login_nodes.describe_cluster(config.cluster_name) if listing.cluster_status is None else None
    if described is not None and described.groups is not None:
        problem = login_nodes.login_group_problem(config.login_group, described.groups)
        if problem:
            raise LoginGroupError(problem)
    status = listing.cluster_status or (described.status if not serving else None)
    metrics.add_metric(name="LoginNodesServing", unit=MetricUnit.Count, value=len(serving))
    logger.info("login group resolved", extra={"nodes": len(listing.nodes), "serving": len(serving),
                                               "described": listing.described, "clusterStatus": status})
    return {
        "nodes": [{"instanceId": n.instance_id, "status": n.status, "ip": n.ip} for n in listing.nodes],
        "ipCache": listing.ip_cache,
        "clusterStatus": status,
    }


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def plan_target_changes(event: dict, context: LambdaContext) -> dict:
    """{"nodes", "clusterStatus", "dryRun"} + DescribeTargetHealth -> the plan, with reasons."""
    config = SyncConfig.from_env()
    nodes = [LoginNode(instance_id=n["instanceId"], status=n["status"], ip=n.get("ip")) for n in event.get("nodes", [])]
    targets = target_group.describe_targets(config.target_group_arn)
    held_out = _held_out(config)
    plan = plan_targets(nodes, targets, config.ssh_port, event.get("clusterStatus"), config.cluster_name, held_out)
    # Nodes whose host identity must be checked before they take traffic: every new one, and in
    # a repair every registered one too (and those out of rotation: their certificates are renewed too).
    instance_of = {n.ip: n.instance_id for n in nodes if n.ip}
    to_verify = list(plan.register) + (list(plan.keep) + list(plan.held_out) if event.get("mode") == "repair" else [])
    logger.info(plan.summary, extra={"reasons": list(plan.reasons)})
    metrics.add_metric(name="TargetDrift", unit=MetricUnit.Count, value=len(plan.register) + len(plan.deregister))
    if plan.guard and not event.get("dryRun"):
        # The alarm on this metric pages the operator; the failed execution says why.
        metrics.add_metric(name="SafetyGuardTripped", unit=MetricUnit.Count, value=1)
        raise EmptyListingGuardError(plan.guard)
    if config.slot_target_group_arns and not event.get("dryRun"):
        # Slots follow the nodes that stay registered or out of rotation (their users come back by the
        # slot); a new node gets one once ApplyTargetChanges registers it.
        _reconcile_slots(config, plan.keep + plan.held_out)
    notices = _tell_users_of_leaving_nodes(config, nodes, plan, {ip: held_out[ip] for ip in plan.held_out},
                                           event.get("dryRun"))
    return plan.to_state() | ({"leaveNotices": list(notices)} if notices else {}) | {"verify": [{"ip": ip, "instanceId": instance_of[ip]} for ip in to_verify]}


def _held_out(config: SyncConfig) -> dict[str, str]:
    """ip -> reason for the nodes load-aware admission keeps out of rotation (LoadAwareAdmission=on), oldest first."""
    if config.admission_mode != "on":
        return {}
    try:
        state, _ = admission_store.read_admission(config.state_table, config.cluster_name)
    except admission_store.MalformedAdmissionRecord as error:
        # Admission only ever narrows rotation: a record it cannot read must not stop the sync.
        logger.warning("admission record ignored: every node stays in rotation", extra={"reason": str(error)})
        return {}
    entries = admission.held_out(state, int(time.time()), ADMISSION_RECORD_MAX_AGE_SECONDS)
    return {ip: entry.reason for ip, entry in sorted(entries.items(), key=lambda e: (e[1].since, e[0]))}


def _tell_users_of_leaving_nodes(config: SyncConfig, nodes: list[LoginNode], plan, held_out: dict[str, str],
                                 dry_run: bool) -> tuple[str, ...]:
    """Publish which login nodes leave rotation; each node's agent tells its users (LeaveNoticeMinutes).

    Read only when a node may be leaving or rotation changes, so a quiet pass costs no call. A
    failure to publish never stops the sync: the target group matters more than the notice, and the
    LeaveNoticesFailed metric's alarm tells the operator."""
    if config.leave_notice_minutes is None or dry_run or plan.guard:
        return ()
    if not (plan.has_changes or held_out or any(n.ip and not n.serving for n in nodes)):
        return ()
    try:
        notices = leave_notices.publish_leave_notices(
            contract.leave_notices_parameter(config.cluster_name), nodes, held_out, datetime.now(timezone.utc),
            config.leave_notice_minutes, config.load_balancer_dns_name)
    except (ClientError, BotoCoreError, TransientAwsError) as error:
        metrics.add_metric(name="LeaveNoticesFailed", unit=MetricUnit.Count, value=1)
        logger.error("leave notices not published: the sync goes on", extra={"reason": str(error)})
        return ()
    if notices.reasons:
        logger.info("leave notices published", extra={"reasons": list(notices.reasons)})
    return notices.reasons


def _reconcile_slots(config: SyncConfig, eligible: Iterable[str]) -> None:
    outcome = slots.reconcile_slots(config.slot_target_group_arns, eligible, config.ssh_port, config.target_group_vpc_id,
                                    contract.login_slots_parameter(config.cluster_name), config.load_balancer_dns_name)
    if outcome.has_changes:
        logger.info("login-node slots updated", extra={"reasons": list(outcome.reasons), "slots": outcome.assignment})


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def apply_target_changes(event: dict, context: LambdaContext) -> dict:
    """{"register", "deregister", "attempt"} -> one RegisterTargets and one DeregisterTargets call.

    The state machine calls this only when something changes; only then are the target group's
    VPC CIDRs read (DescribeVpcs, plus DescribeTargetGroups for a target group the stack did not
    create), which decide whether a target is named with AvailabilityZone=all.
    """
    config = SyncConfig.from_env()
    register, deregister = list(event.get("register", [])), list(event.get("deregister", []))
    if int(event.get("attempt") or 0) > 0:
        # A retry: the previous attempt may have applied part of the change set already.
        current = target_group.describe_targets(config.target_group_arn)
        register, deregister = still_to_apply(register, deregister, current, config.ssh_port)
    cidrs = target_group.vpc_cidrs(config.target_group_arn, config.target_group_vpc_id) if register or deregister else ()
    # Register first: during a replacement the new node takes traffic before the old one leaves.
    target_group.register_ips(config.target_group_arn, register, config.ssh_port, cidrs)
    target_group.deregister_ips(config.target_group_arn, deregister, config.ssh_port, cidrs)
    metrics.add_metric(name="TargetsRegistered", unit=MetricUnit.Count, value=len(register))
    metrics.add_metric(name="TargetsDeregistered", unit=MetricUnit.Count, value=len(deregister))
    logger.info("target group updated", extra={"registered": register, "deregistered": deregister})
    if config.slot_target_group_arns:
        live = [t.ip for t in target_group.describe_targets(config.target_group_arn)
                if t.port == config.ssh_port and t.state != slots.DRAINING]
        _reconcile_slots(config, live + [ip for ip in _held_out(config) if ip not in live])
    return {"registered": register, "deregistered": deregister}
