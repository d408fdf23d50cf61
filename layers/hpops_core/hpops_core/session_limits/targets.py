"""Pure: Session Manager targets of HyperPod nodes, and which of them are this cluster's login nodes.

Kept apart from the pydantic event model (models.py) so enforcement, which never parses an event,
loads without pydantic.
"""

from __future__ import annotations

import re
from typing import Any

from hpops_core.common import validation

from .errors import MalformedSessionEvent

# --- patterns (the rules themselves live in hpops_core/common/validation.py) ----------------------------

# botocore: 1-96 characters, no pattern; ids start with the caller's session name, which may carry
# `+=,.@_-`. Only whitespace and control characters are refused (they would forge log lines).
SESSION_ID_PATTERN = validation.SESSION_ID_PATTERN
SESSION_ID_RE = validation.SESSION_ID_RE

CLUSTER_ID_PATTERN = validation.CLUSTER_ID_PATTERN
INSTANCE_GROUP_PATTERN = validation.INSTANCE_GROUP_PATTERN
# Targets name real nodes (botocore's ClusterNodeId), never an event's loose spelling.
INSTANCE_ID_PATTERN = validation.INSTANCE_ID_PATTERN

# The instance id is anchored at the end, so a group name that itself contains hyphens
# ("login-b") still parses unambiguously: the regex backtracks to the last "-i-<hex>".
TARGET_RE = re.compile(
    rf"\Asagemaker-cluster:(?P<cluster_id>{CLUSTER_ID_PATTERN})"
    rf"_(?P<group>{INSTANCE_GROUP_PATTERN})-(?P<instance_id>{INSTANCE_ID_PATTERN})\Z"
)
CLUSTER_ID_RE = validation.CLUSTER_ID_RE
INSTANCE_GROUP_RE = validation.INSTANCE_GROUP_RE

# IAM/STS principal ARNs as they appear in userIdentity.arn and DescribeSessions' Owner.
PRINCIPAL_ARN_RE = re.compile(
    r"\Aarn:aws[a-z-]*:(?:iam|sts)::[0-9]{12}:[A-Za-z0-9+=,.@_/-]{1,400}\Z"
)


def cluster_id_from_arn(cluster_arn: str) -> str:
    """``arn:aws:sagemaker:us-east-1:111122223333:cluster/abc123def456`` -> ``abc123def456``."""
    cluster_id = cluster_arn.rsplit("/", 1)[-1] if isinstance(cluster_arn, str) else None
    if not validation.is_cluster_arn(cluster_arn) or not validation.is_cluster_id(cluster_id):
        raise MalformedSessionEvent(f"not a SageMaker HyperPod cluster ARN: {validation.shown(cluster_arn)}")
    return cluster_id


def login_target_prefix(cluster_id: str, login_group: str) -> str:
    """The Session Manager target prefix of a cluster's login-group nodes.

    Only a *prefix*: group ``login`` is also a prefix of group ``login-2``'s targets, so callers
    must confirm a full match with :func:`login_target_matches` after prefix filtering.
    """
    try:
        validation.check_cluster_id(cluster_id)
        validation.check_instance_group(login_group)
    except validation.InvalidValue as exc:
        raise MalformedSessionEvent(str(exc)) from None
    return f"sagemaker-cluster:{cluster_id}_{login_group}-"


def parse_target(target: str) -> tuple[str, str, str] | None:
    """Split a HyperPod session target into ``(cluster_id, group, instance_id)``; None if not one."""
    if not isinstance(target, str):
        return None
    match = TARGET_RE.match(target)
    if not match:
        return None
    return match.group("cluster_id"), match.group("group"), match.group("instance_id")


def login_target_matches(target: str, cluster_id: str, login_group: str) -> bool:
    """True only for a node of exactly ``login_group`` in exactly ``cluster_id``."""
    return target_mismatch(target, cluster_id, login_group) is None


def target_mismatch(target: Any, cluster_id: str, login_group: str) -> str | None:
    """Why ``target`` is not a login node of this cluster (None when it is one). Names the group,
    never echoes an unrecognised target."""
    parsed = parse_target(target)
    if parsed is None:
        return "target does not look like sagemaker-cluster:<cluster-id>_<group>-<instance-id>"
    if parsed[0] != cluster_id:
        return f"target is on cluster id {parsed[0]}, not {cluster_id}"
    if parsed[1] != login_group:
        return f"target is on instance group {parsed[1]!r}, not the login group {login_group!r}"
    return None
