"""Which instance group is the Slurm controller, which the login group, and which partitions the
others serve, however AWS provisioned the cluster.

Three layouts are in use (aws-facts, "HyperPod nodes as AWS's own lifecycle scripts see them"):

1. provisioning_parameters.json in the lifecycle S3 prefix (``controller_group``, ``login_group``,
   ``worker_groups[{instance_group_name, partition_name}]``), downloaded with the scripts;
2. API-driven Slurm configuration: ``InstanceGroups[].SlurmConfig{NodeType, PartitionNames}`` in
   DescribeCluster, no file in the prefix; HyperPod writes /opt/ml/config/provisioning_parameters.json
   on every node (AWS's detect_node.sh reads ``controller_group``/``login_group`` from it; the rest
   of its contents are not published, so nothing else of it is relied on);
3. the Terraform module's file: every non-controller group, the login group included, under
   ``worker_groups`` with partition ``dev``.

Pure functions over already-read documents; the agent reads the files and calls DescribeCluster.
"""

from __future__ import annotations

from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

from hpops_core.common import validation

class SlurmLayout(NamedTuple):
    """The groups with a Slurm role, (partition, compute group) pairs as listed (the usage collector
    checks their names), and where each came from (a file path, or DescribeCluster's SlurmConfig)."""

    login_group: Optional[str]
    controller_group: Optional[str]
    partition_pairs: Tuple[Tuple[Any, Any], ...]
    source: str
    partition_source: str


def _group_name(value: Any) -> Optional[str]:
    return value if isinstance(value, str) and validation.is_instance_group(value) else None


def names_groups(provisioning: Any) -> bool:
    """Does this provisioning document say which group is the controller (or login) group?"""
    return isinstance(provisioning, dict) and bool(
        _group_name(provisioning.get("controller_group")) or _group_name(provisioning.get("login_group")))


def worker_partitions(provisioning: Any, not_workers: Sequence[Optional[str]]) -> Optional[List[Tuple[Any, Any]]]:
    """(partition, group) pairs of ``worker_groups``, without the login and controller groups
    (the Terraform module lists the login group there too), or None without a worker_groups list.
    Entries are returned as found; the usage collector checks their names."""
    workers = provisioning.get("worker_groups") if isinstance(provisioning, dict) else None
    if not isinstance(workers, list):
        return None
    skip = {name for name in not_workers if name}
    pairs = []
    for worker in workers:
        if not isinstance(worker, dict):
            pairs.append((None, None))
            continue
        group = worker.get("instance_group_name")
        if isinstance(group, str) and group in skip:
            continue
        pairs.append((worker.get("partition_name"), group))
    return pairs


def slurm_groups(instance_groups: Any) -> Dict[str, dict]:
    """{group name: its SlurmConfig} for the DescribeCluster groups that carry one."""
    found = {}
    for group in instance_groups if isinstance(instance_groups, list) else []:
        if not isinstance(group, dict):
            continue
        name = _group_name(group.get("InstanceGroupName"))
        config = group.get("SlurmConfig")
        if name and isinstance(config, dict):
            found[name] = config
    return found


def cluster_partitions(instance_groups: Any, not_workers: Sequence[Optional[str]]) -> Optional[List[Tuple[Any, Any]]]:
    """(partition, group) pairs from SlurmConfig.PartitionNames of the compute groups, or None when
    no group carries a SlurmConfig."""
    configs = slurm_groups(instance_groups)
    if not configs:
        return None
    skip = {name for name in not_workers if name}
    pairs = []
    for group, config in sorted(configs.items()):
        if group in skip or config.get("NodeType") in ("Login", "Controller"):
            continue
        names = config.get("PartitionNames")
        for partition in names if isinstance(names, list) else []:
            pairs.append((partition, group))
    return pairs


def group_of_type(instance_groups: Any, node_type: str) -> Optional[str]:
    """The one group whose SlurmConfig.NodeType is ``node_type`` (None if none or several)."""
    groups = sorted(name for name, config in slurm_groups(instance_groups).items()
                    if config.get("NodeType") == node_type)
    return groups[0] if len(groups) == 1 else None


def resolve(files: Sequence[Tuple[str, Any]], instance_groups: Any = None) -> Optional[SlurmLayout]:
    """The layout from the first file that names the groups, else from DescribeCluster's SlurmConfig.

    ``files``: (path, parsed document or None) in the order they are trusted: HyperPod's own
    /opt/ml/config copy first, then the lifecycle folder's. ``instance_groups``: DescribeCluster's
    InstanceGroups, or None when it was not read. Partitions come from SlurmConfig.PartitionNames
    where the cluster has them, else from the first file with a worker_groups list. None when
    nothing names the groups."""
    login = controller = None
    source = ""
    for path, document in files:
        if names_groups(document):
            login = _group_name(document.get("login_group"))
            controller = _group_name(document.get("controller_group"))
            source = path
            break
    if not source and instance_groups is not None and slurm_groups(instance_groups):
        login = group_of_type(instance_groups, "Login")
        controller = group_of_type(instance_groups, "Controller")
        if login or controller:
            source = "DescribeCluster SlurmConfig"
    if not source:
        return None
    pairs = cluster_partitions(instance_groups, (login, controller)) if instance_groups is not None else None
    partition_source = "DescribeCluster SlurmConfig.PartitionNames" if pairs is not None else ""
    if pairs is None:
        for path, document in files:
            pairs = worker_partitions(document, (login, controller))
            if pairs is not None:
                partition_source = path
                break
    return SlurmLayout(login, controller, tuple(pairs or ()), source, partition_source)


def role_of_group(group: Optional[str], layout: SlurmLayout) -> str:
    if group and group == layout.login_group:
        return "login"
    if group and group == layout.controller_group:
        return "controller"
    return "compute"
