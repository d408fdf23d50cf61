"""`hpops node enrollments` and `hpops node approve-enrollment`: which agent key speaks for each node.

An agent enrolls its own key at on_create, inside the enrollment window after launch. A node that
was running before the stack had enrollment (an upgrade), a node whose agent lost its key, and a
contested node need the operator: read the fingerprint on the node (Session Manager:
contract.READ_AGENT_FINGERPRINT) and approve exactly that instance and fingerprint. The approval is single use and expires after a day.
"""

from __future__ import annotations

import datetime as dt
import re
import time
from typing import Any

from hpops_core.common.validation import check_instance_id
from hpops_core.node_channel import enrollment_store
from hpops_core.node_channel.enrollment import FINGERPRINT_RE

from .errors import CliError

_FINGERPRINT_HINT = re.compile(r"\ASHA256:")


def approve(dynamodb: Any, sagemaker: Any, table: str, cluster: str, login_group: str, controller_group: str,
            instance_id: str, fingerprint: str) -> str:
    """Record the approval; the line to print. Refuses an instance that is not this cluster's
    login or controller node (only their agents enroll)."""
    check_instance_id(instance_id, "--node")
    if not FINGERPRINT_RE.match(fingerprint or ""):
        hint = "" if _FINGERPRINT_HINT.match(fingerprint or "") else " (it starts with SHA256:)"
        raise CliError(f"--fingerprint is not an OpenSSH SHA256 fingerprint{hint}")
    try:
        node = sagemaker.describe_cluster_node(ClusterName=cluster, NodeId=instance_id)["NodeDetails"]
    except sagemaker.exceptions.ResourceNotFound:
        raise CliError(f"{instance_id} is not a node of cluster {cluster}") from None
    group = node.get("InstanceGroupName")
    if group not in (login_group, controller_group):
        raise CliError(f"{instance_id} is in group {group}: only the login ({login_group}) and controller "
                       f"({controller_group}) groups' agents enroll")
    now = time.time()
    approved_at = dt.datetime.fromtimestamp(now, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    enrollment_store.put_approval(table, cluster, instance_id, fingerprint, approved_at, int(now), dynamodb=dynamodb)
    return (f"approved {fingerprint} for {instance_id} (group {group}); its agent enrolls at its next attempt "
            f"(within 5 minutes); the approval is single use and expires in 24 hours")


def listing(dynamodb: Any, table: str, cluster: str) -> list[str]:
    """One line per enrollment and per pending approval."""
    records, approvals = enrollment_store.list_enrollments(table, cluster, dynamodb=dynamodb, with_approvals=True)
    lines = [f"{r.instance_id}  {r.role:<10} {r.status:<9} {r.fingerprint}  since {r.enrolled_at} via {r.via}"
             + (f"  contested by {', '.join(r.contested_by)}" if r.contested_by else "")
             for r in sorted(records, key=lambda r: r.instance_id)]
    lines += [f"{a['instanceId']}  approval pending for {a['fingerprint']} (given {a['approvedAt']})"
              for a in sorted(approvals, key=lambda a: a["instanceId"])]
    return lines or [f"no node of cluster {cluster} has enrolled an agent key yet"]
