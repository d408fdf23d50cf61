"""`hpops node enrollments` and `hpops node approve-enrollment`: which agent key speaks for each node.

An agent enrolls its own key at on_create, inside the enrollment window after launch. A node that
was running before the stack had enrollment (an upgrade), a node whose agent lost its key, and a
contested node need the operator: read the fingerprint on the node (Session Manager:
contract.READ_AGENT_FINGERPRINT) and approve exactly that instance and fingerprint. The approval is single use and expires after a day.
On a controller it also says what becomes of the replaced key's usage windows (replaced_key_usage).
"""

from __future__ import annotations

import datetime as dt
import re
import time
from typing import Any

from hpops_core.common.validation import check_instance_id
from hpops_core.node_channel import enrollment_store
from hpops_core.node_channel.enrollment import (
    APPROVAL,
    DISCARD,
    DOCUMENT,
    FINGERPRINT_RE,
    KEEP,
    REPLACED_KEY_USAGE,
    Enrollment,
)

from .errors import CliError

_FINGERPRINT_HINT = re.compile(r"\ASHA256:")


class ReplacedKeyUsageRequired(CliError):
    """The approval replaces a controller key the stack cannot vouch for: the operator says whether its
    usage windows were this node's own (keep) or not (discard)."""


def replaced_key_usage(existing: Enrollment | None, fingerprint: str, role: str, given: str | None,
                       default: str | None = None) -> tuple[str, str]:
    """(keep|discard|"", why) for the usage windows of the key an approval of ``fingerprint`` replaces. PURE.

    Only a controller's key writes usage. Where the stack knows whose the standing key was, that is the
    default: proven by AWS's instance identity document or by an earlier approval (read as root on the
    node) it was the node's own, keep; a contested key never counted, discard. A key that enrolled first
    inside the window and was never contested may be the node's agent or a user's impostor: nobody
    may guess (a wrong keep holds the wrong user, a wrong discard releases every held user until the
    hours are re-collected), so without ``given`` (or ``default``: `hpops adopt` keeps, it read the key
    as root on a re-imaged node) it is ReplacedKeyUsageRequired."""
    if existing is None or existing.fingerprint == fingerprint or role != "controller":
        return "", "no controller key is replaced"
    if given:
        return given, "as the operator said"
    if not existing.usable:
        return DISCARD, f"the standing key {existing.fingerprint} is contested and never counted"
    if existing.via in (DOCUMENT, APPROVAL):
        how = "its instance identity document verified" if existing.via == DOCUMENT else "an operator approved it"
        return KEEP, f"the standing key {existing.fingerprint} was the node's own ({how})"
    if default:
        return default, "the key was read as root on the node"
    doubt = (" on a cluster whose agents present instance identity documents, without one: likely not the "
             "node's agent, --replaced-key-usage discard" if existing.expect_document else "")
    raise ReplacedKeyUsageRequired(
        f"ReplacedKeyUsageRequired: {existing.instance_id}'s standing controller key {existing.fingerprint} enrolled first inside its window "
        f"(since {existing.enrolled_at}), proven by nothing else{doubt}: say whether its usage windows were the "
        "node's own (--replaced-key-usage keep: a re-image, a lost key) or not (--replaced-key-usage discard: "
        "someone else's key; every window it wrote is voided and re-collected from Slurm accounting)")


def approve(dynamodb: Any, sagemaker: Any, table: str, cluster: str, login_group: str, controller_group: str,
            instance_id: str, fingerprint: str, usage: str | None = None) -> str:
    """Record the approval; the line to print. Refuses an instance that is not this cluster's
    login or controller node (only their agents enroll). ``usage``: keep|discard the replaced
    controller key's usage windows (replaced_key_usage decides when not given, or refuses)."""
    check_instance_id(instance_id, "--node")
    if not FINGERPRINT_RE.match(fingerprint or ""):
        hint = "" if _FINGERPRINT_HINT.match(fingerprint or "") else " (it starts with SHA256:)"
        raise CliError(f"--fingerprint is not an OpenSSH SHA256 fingerprint{hint}")
    if usage not in (None, *REPLACED_KEY_USAGE):
        raise CliError(f"--replaced-key-usage is one of {', '.join(REPLACED_KEY_USAGE)}")
    try:
        node = sagemaker.describe_cluster_node(ClusterName=cluster, NodeId=instance_id)["NodeDetails"]
    except sagemaker.exceptions.ResourceNotFound:
        raise CliError(f"{instance_id} is not a node of cluster {cluster}") from None
    group = node.get("InstanceGroupName")
    if group not in (login_group, controller_group):
        raise CliError(f"{instance_id} is in group {group}: only the login ({login_group}) and controller "
                       f"({controller_group}) groups' agents enroll")
    existing = enrollment_store.get_enrollment(table, cluster, instance_id, dynamodb=dynamodb)
    role = "controller" if group == controller_group else "login"
    chosen, why = replaced_key_usage(existing, fingerprint, role, usage)
    now = time.time()
    approved_at = dt.datetime.fromtimestamp(now, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    enrollment_store.put_approval(table, cluster, instance_id, fingerprint, approved_at, int(now), dynamodb=dynamodb,
                                  replaced_key_usage=chosen, replacing=existing.fingerprint if chosen else "")
    line = (f"approved {fingerprint} for {instance_id} (group {group}); its agent enrolls at its next attempt "
            f"(within 5 minutes); the approval is single use and expires in 24 hours")
    return line + (f"\n{usage_line(chosen, existing.fingerprint)} ({why})" if chosen else "")


def usage_line(chosen: str, replaced: str) -> str:
    if chosen == KEEP:
        return f"the usage windows of the key it replaces, {replaced}, stay counted"
    return (f"the usage windows of the key it replaces, {replaced}, are voided when the agent enrolls and "
            "re-collected from Slurm accounting, the current month first")


def listing(dynamodb: Any, table: str, cluster: str) -> list[str]:
    """One line per enrollment and per pending approval."""
    records, approvals = enrollment_store.list_enrollments(table, cluster, dynamodb=dynamodb, with_approvals=True)
    lines = [f"{r.instance_id}  {r.role:<10} {r.status:<9} {r.fingerprint}  since {r.enrolled_at} via {r.via}"
             + (f"  contested by {', '.join(r.contested_by)}" if r.contested_by else "")
             for r in sorted(records, key=lambda r: r.instance_id)]
    lines += [f"{a['instanceId']}  approval pending for {a['fingerprint']} (given {a['approvedAt']})"
              for a in sorted(approvals, key=lambda a: a["instanceId"])]
    return lines or [f"no node of cluster {cluster} has enrolled an agent key yet"]
