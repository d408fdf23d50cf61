"""SageMaker HyperPod: list a cluster's login nodes and find their private IPs.

ListClusterNodes has no IP field, DescribeClusterNode does, and an instance id keeps its IP for
life. So IPs come from a cache (instance id -> IP, kept in the state table by the lease) and only
nodes the cache has never seen cost a DescribeClusterNode call. `InstanceGroupNameContains`
filters on the server, so nothing here grows with the number of worker nodes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from botocore.exceptions import ClientError

from hpops_core.common.clients import client, transient_errors_named
from hpops_core.common.validation import shown


@dataclass(frozen=True)
class LoginNode:
    instance_id: str
    status: str
    ip: str | None

    @property
    def serving(self) -> bool:
        return self.status == "Running" and bool(self.ip)


@dataclass(frozen=True)
class LoginGroupListing:
    nodes: tuple[LoginNode, ...]
    ip_cache: dict[str, str]  # pruned to the nodes that still exist
    described: int  # DescribeClusterNode calls made (cache misses)
    cluster_status: str | None = None  # "NotFound" when the listing itself said the cluster is gone


NEVER_SEEN = "not found, and never seen by this stack (check ClusterName and the region)"


def not_found(error: ClientError) -> bool:
    """SageMaker's answer for a cluster (or node) that does not exist, e.g. after the cluster was deleted."""
    # The error botocore's model gives DescribeCluster, ListClusterNodes and DescribeClusterNode.
    return error.response.get("Error", {}).get("Code", "") == "ResourceNotFound"


def list_login_group(cluster: str, group: str) -> list[dict]:
    pages = client("sagemaker").get_paginator("list_cluster_nodes").paginate(
        ClusterName=cluster, InstanceGroupNameContains=group, PaginationConfig={"PageSize": 100}
    )
    with transient_errors_named("sagemaker:ListClusterNodes"):
        summaries = [s for page in pages for s in page.get("ClusterNodeSummaries", [])]
    # The filter is a substring match ("login" also matches "login-gpu"): keep the exact group.
    return [s for s in summaries if s.get("InstanceGroupName") == group]


def describe_private_ip(cluster: str, instance_id: str) -> str | None:
    with transient_errors_named("sagemaker:DescribeClusterNode"):
        details = client("sagemaker").describe_cluster_node(ClusterName=cluster, NodeId=instance_id)
    return details.get("NodeDetails", {}).get("PrivatePrimaryIp")


def describe_node(cluster: str, instance_id: str) -> dict | None:
    """AWS's record of the instance (NodeDetails), or None when the cluster has no such node."""
    try:
        with transient_errors_named("sagemaker:DescribeClusterNode"):
            return client("sagemaker").describe_cluster_node(ClusterName=cluster, NodeId=instance_id)["NodeDetails"]
    except ClientError as error:
        if not_found(error):
            return None
        raise


@dataclass(frozen=True)
class ClusterDescription:
    """DescribeCluster, as much as the sync needs: the status, and each group's Slurm NodeType
    (None for a group without SlurmConfig). ``groups`` is None once the cluster is gone."""

    status: str
    groups: Mapping[str, str | None] | None


def describe_cluster(cluster: str) -> ClusterDescription:
    try:
        with transient_errors_named("sagemaker:DescribeCluster"):
            described = client("sagemaker").describe_cluster(ClusterName=cluster)
    except ClientError as error:
        if not_found(error):
            return ClusterDescription(status="NotFound", groups=None)
        raise
    groups = {}
    for group in described.get("InstanceGroups") or []:
        slurm = group.get("SlurmConfig") or {}
        groups[group.get("InstanceGroupName", "")] = slurm.get("NodeType")
    return ClusterDescription(status=described["ClusterStatus"], groups=groups)


def login_group_problem(group: str, groups: Mapping[str, str | None]) -> str | None:
    """Why ``group`` cannot be the login group of a cluster with these groups, or None when it can.

    A group with SlurmConfig (API-driven Slurm configuration) must be of NodeType Login; a cluster
    configured through provisioning_parameters.json carries none, and then only the name is checked."""
    listed = ", ".join(shown(name) + (f" ({shown(node_type)})" if node_type else "")
                       for name, node_type in sorted(groups.items())) or "none"
    if group not in groups:
        return f"LoginGroupName {shown(group)} is not an instance group of the cluster; its groups: {listed}"
    node_type = groups[group]
    if node_type is not None and node_type != "Login":
        logins = sorted(name for name, kind in groups.items() if kind == "Login")
        hint = f"the Login group is {shown(logins[0])}" if len(logins) == 1 else f"its groups: {listed}"
        return f"LoginGroupName {shown(group)} has SlurmConfig NodeType {shown(node_type)}, not Login; {hint}"
    return None


def resolve_login_group(
    cluster: str, group: str, ip_cache: Mapping[str, str], trust_cache: bool = True
) -> LoginGroupListing:
    """Current login nodes with IPs. `trust_cache=False` (manual repair) re-describes every node.

    A deleted cluster lists no node and says so (cluster_status "NotFound"), so that its targets
    are drained instead of every sync failing on ResourceNotFound. A cluster this stack has never
    listed a node of (an empty IP cache) is more likely a wrong ClusterName or region than a
    deleted cluster: its status says so, and the plan's safety guard keeps the targets.
    """
    try:
        summaries = list_login_group(cluster, group)
    except ClientError as error:
        if not_found(error):
            status = "NotFound" if ip_cache else NEVER_SEEN
            return LoginGroupListing(nodes=(), ip_cache={}, described=0, cluster_status=status)
        raise
    new_cache: dict[str, str] = {}
    nodes: list[LoginNode] = []
    described = 0
    for summary in summaries:
        instance_id = summary["InstanceId"]
        status = summary.get("InstanceStatus", {}).get("Status", "Unknown")
        ip = ip_cache.get(instance_id) if trust_cache else None
        if ip is None and status == "Running":
            described += 1
            try:
                ip = describe_private_ip(cluster, instance_id)
            except ClientError as error:
                # Gone since it was listed (the node, or the whole cluster): it serves nothing.
                if not not_found(error):
                    raise
                status = "NotFound"
        if ip:
            new_cache[instance_id] = ip
        nodes.append(LoginNode(instance_id=instance_id, status=status, ip=ip))
    return LoginGroupListing(nodes=tuple(nodes), ip_cache=new_cache, described=described)
