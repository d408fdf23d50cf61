"""Slurm holds of users over their monthly dollar limit: the one document shape both sides use.

Standard library, Python 3.8+ (the agent bundle ships this file). The stack (budget_guard.holds)
publishes the users to hold; the agent on the controller node (hpops_node_agent.slurm_holds)
holds them with a hold QOS in Slurm and reports what it applied.

Desired state, kept in the state table under holds#<cluster> as a header and pages of users
(user_holds_store: any number of users; written by the BudgetGuard sweep only; the node role cannot
read it: the controller's enrolled agent fetches it through NodeChannel, as one JSON text, when the
public marker /hpops/<cluster>/node/instructions/user-holds names a new revision):

  {"format": USER_HOLDS_FORMAT, "version": str, "month": "YYYY-MM",
   "expiresAt": ISO-8601 UTC (the month's end: an agent lifts every hold past it, even if the stack
                is gone and never publishes again),
   "dryRun": bool (true: "users" is empty; the stack decided, nothing is held),
   "users": [POSIX user, ...] (sorted, unique; never root)}

Report (the controller's agent, events:PutEvents to the node-report bus):

  Source contract.REPORT_SOURCE, DetailType HOLDS_DETAIL_TYPE, Detail:
  {"format": HOLDS_REPORT_FORMAT, "cluster": str, "instanceId": str, "agentVersion": str,
   "reportedAt": ISO-8601 UTC, "version": str|null (the document applied; null: none readable),
   "enforced": true|false|null (AccountingStorageEnforce includes limits and qos; null: unknown),
   "enforceReason": str,
   "users": [{"user": str, "state": one of HOLD_STATES, "reason": str}],
   "imds": {"nonRoot": one of contract.IMDS_PROBE_RESULTS, "lockdown": one of contract.IMDS_LOCKDOWN_VALUES,
            "reason": str} (optional: the controller's own IMDS probe, once per heartbeat, the login
            reports' "imds" section; absent where the agent has no probe configured)}

A report only informs (status, "could not apply" alerts); it never decides who is held.
"""

from __future__ import annotations

import hashlib
import json

from hpops_core.common import validation
from hpops_core.common.errors import HpopsError
from hpops_core.node_channel import contract

USER_HOLDS_FORMAT = "hpops.node.user-holds.v1"
HOLDS_REPORT_FORMAT = "hpops.node.user-holds-report.v1"
HOLDS_DETAIL_TYPE = "HyperPod Slurm Holds Report"
HELD, FAILED = "held", "failed"
HOLD_STATES = (HELD, FAILED)
# What slurmctld shows in squeue's REASON column for a job of a held user: its job is in the hold
# QOS (GrpJobs=0 is checked first, then MaxJobsPerUser=0); the Assoc* ones are holds of earlier
# versions (GrpJobs=0 MaxJobs=0 on the association), still pending until lifted.
HOLD_REASONS = ("QOSGrpJobsLimit", "QOSMaxJobsPerUserLimit", "AssocGrpJobsLimit", "AssocMaxJobsLimit")
MAX_REPORTED_USERS = 300


class BadHolds(HpopsError, ValueError):
    """The holds document is not what the stack writes; the agent changes nothing on it."""


def user_holds_parameter(cluster: str) -> str:
    """The instruction's name: its public marker (contract.instruction_marker_parameter) carries the
    revision of the document user_holds_store keeps; stacks before it kept the document here."""
    return contract.parameter_prefix(cluster) + contract.INSTRUCTIONS + "user-holds"


# /hpops/<cluster>/node/user-spend: "off" when the stack has no per-user spend (UserSpendEnabled=false);
# the controller's agent then collects no usage. Missing or anything else: on (stacks before the switch).
USER_SPEND_OFF = "off"


def user_spend_parameter(cluster: str) -> str:
    return contract.parameter_prefix(cluster) + "node/user-spend"


def holds_version(month: str, expires_at: str, dry_run: bool, users: list) -> str:
    text = json.dumps([month, expires_at, dry_run, users], separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def desired_document(month: str, expires_at: str, dry_run: bool, users: list) -> dict:
    users = sorted(set(users))
    for user in users:
        validation.check_limited_user(user, "held user")
    if dry_run:
        users = []
    return {"format": USER_HOLDS_FORMAT, "version": holds_version(month, expires_at, dry_run, users),
            "month": month, "expiresAt": expires_at, "dryRun": dry_run, "users": users}


def canonical_json(document: dict) -> str:
    return json.dumps(document, sort_keys=True, separators=(",", ":"))


def parse_document(text: str) -> dict:
    """The parameter's value -> the document, checked field by field; BadHolds otherwise."""
    try:
        document = json.loads(text)
    except ValueError:
        raise BadHolds("holds document is not JSON") from None
    if not isinstance(document, dict) or document.get("format") != USER_HOLDS_FORMAT:
        raise BadHolds("holds document format is not {}".format(USER_HOLDS_FORMAT))
    if set(document) != {"format", "version", "month", "expiresAt", "dryRun", "users"}:
        raise BadHolds("holds document has other fields than the stack writes")
    users = document["users"]
    if not isinstance(users, list) or not all(validation.is_posix_user(u) for u in users):
        raise BadHolds("holds document users are not POSIX user names")
    if "root" in users or len(set(users)) != len(users):
        raise BadHolds("holds document holds root or names a user twice")
    if not isinstance(document["dryRun"], bool) or (document["dryRun"] and users):
        raise BadHolds("holds document dryRun is not a boolean, or holds users in a dry run")
    if not isinstance(document["month"], str) or not isinstance(document["expiresAt"], str) or \
            not contract.USAGE_WINDOW_START_RE.match(document["expiresAt"]):
        raise BadHolds("holds document month or expiresAt is malformed")
    if document["version"] != holds_version(document["month"], document["expiresAt"], document["dryRun"], users):
        raise BadHolds("holds document version does not match its content")
    return document
