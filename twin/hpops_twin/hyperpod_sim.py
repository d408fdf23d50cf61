"""A HyperPod simulator on top of moto's SageMaker backend.

moto serves the real ListClusterNodes / DescribeClusterNode / DescribeCluster APIs, but its
nodes have no IPs and never change. The simulator swaps in nodes that have instance ids and
private IPs, replaces and scales them the way HyperPod does (old node ShuttingDown, new node
Pending with a new IP, then Running), and emits the three event shapes AWS documents.
It emits events; the world decides whether EventBridge delivers them.
"""

from __future__ import annotations

import hashlib
import ipaddress
import itertools
import secrets
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any
from unittest import mock

import boto3
from moto.sagemaker.exceptions import ResourceNotFound, ValidationError
from moto.sagemaker.models import ClusterNode, sagemaker_backends

STATE_CHANGE = "SageMaker HyperPod Cluster State Change"
NODE_HEALTH = "SageMaker HyperPod Cluster Node Health Event"
CLUSTER_EVENT = "SageMaker HyperPod Cluster Event"


class SimulatedNode(ClusterNode):
    """moto's ClusterNode plus what a real node has: an instance id, a private IP, a hostname."""

    def __init__(self, *args: Any, ip: str, availability_zone: str, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.ip = ip
        self.availability_zone = availability_zone
        self.hostname = "ip-" + ip.replace(".", "-")

    def summary(self) -> dict[str, Any]:
        return super().summary() | {"PrivateDnsHostname": self.hostname}

    def describe(self) -> dict[str, Any]:
        return super().describe() | {
            "PrivatePrimaryIp": self.ip,
            "PrivateDnsHostname": self.hostname,
            "Placement": {"AvailabilityZone": self.availability_zone, "AvailabilityZoneId": "use1-az1"},
        }


class HyperPodSimulator:
    def __init__(self, region: str, account_id: str, clock: Callable[[], datetime], cidr: str = "10.1.0.0/16"):
        self.region = region
        self.account_id = account_id
        self.clock = clock
        self._ips = (str(ip) for ip in itertools.islice(ipaddress.ip_network(cidr).hosts(), 10, None))
        self._sagemaker = boto3.session.Session().client("sagemaker", region_name=region)
        self._deleted: dict[str, Any] = {}  # name -> the cluster as it was (no nodes), once deleted

    # ------------------------------------------------------------------ state
    @property
    def backend(self):
        return sagemaker_backends[self.account_id][self.region]

    def cluster(self, name: str):
        """The cluster; after delete_cluster, its last state (status Deleting, no nodes)."""
        if name not in self.backend.clusters and name in self._deleted:
            return self._deleted[name]
        return self.backend.clusters[name]

    def nodes(self, cluster: str, group: str | None = None) -> list[SimulatedNode]:
        return [n for n in self.cluster(cluster).nodes.values() if group is None or n.instance_group_name == group]

    def _group(self, cluster: str, group: str) -> dict:
        return next(g for g in self.cluster(cluster).instance_groups if g["InstanceGroupName"] == group)

    def _new_node(self, cluster: str, group: str, status: str) -> SimulatedNode:
        spec = self._group(cluster, group)
        node = SimulatedNode(
            region_name=self.region,
            account_id=self.account_id,
            cluster_name=cluster,
            instance_group_name=group,
            instance_type=spec["InstanceType"],
            life_cycle_config=spec["LifeCycleConfig"],
            execution_role=spec["ExecutionRole"],
            node_id="i-" + secrets.token_hex(8) + "a",
            threads_per_core=spec.get("ThreadsPerCore"),
            ip=next(self._ips),
            availability_zone=f"{self.region}a",
        )
        node.status = status
        node.launch_time = self.clock()
        self.cluster(cluster).nodes[node.instance_id] = node
        return node

    def _recount(self, cluster: str, group: str) -> None:
        self._group(cluster, group)["CurrentCount"] = sum(1 for n in self.nodes(cluster, group) if n.status == "Running")

    # ------------------------------------------------------------------ lifecycle
    def create_cluster(self, name: str, groups: dict[str, tuple[str, int]]) -> list[dict]:
        """groups: {group name: (instance type, count)}. Returns the InService state-change event."""
        self._answer_not_found_like_sagemaker()
        self._sagemaker.create_cluster(
            ClusterName=name,
            InstanceGroups=[
                {
                    "InstanceGroupName": group,
                    "InstanceType": instance_type,
                    "InstanceCount": count,
                    "LifeCycleConfig": {"SourceS3Uri": "s3://sagemaker-lifecycle-twin/scripts/", "OnCreate": "on_create.sh"},
                    "ExecutionRole": f"arn:aws:iam::{self.account_id}:role/hyperpod-exec",
                    "ThreadsPerCore": 1,
                }
                for group, (instance_type, count) in groups.items()
            ],
            VpcConfig={"SecurityGroupIds": ["sg-0123456789abcdef0"], "Subnets": ["subnet-0123456789abcdef0"]},
            Tags=[{"Key": "ClusterName", "Value": name}],
        )
        cluster = self.cluster(name)
        # moto puts the cluster *name* in the ARN; HyperPod uses a 12-character id (botocore's
        # ClusterArn pattern ends in cluster/[a-z0-9]{12}), and Session Manager targets are built
        # from that id, so the twin gives the cluster a stable id of the real shape.
        cluster.arn = f"{cluster.arn.rsplit('/', 1)[0]}/{hashlib.sha256(name.encode()).hexdigest()[:12]}"
        cluster.nodes.clear()  # moto's nodes are named "group-0"; real ones are EC2 instances
        for group, (_, count) in groups.items():
            for _ in range(count):
                self._new_node(name, group, "Running")
        return [self.state_change_event(name)]

    def replace_node(self, cluster: str, instance_id: str) -> list[dict]:
        """A node fails its health check: HyperPod starts terminating it and launches a replacement."""
        old = self.cluster(cluster).nodes[instance_id]
        old.status = "ShuttingDown"
        new = self._new_node(cluster, old.instance_group_name, "Pending")
        self._recount(cluster, old.instance_group_name)
        self._pending_removals = getattr(self, "_pending_removals", set()) | {instance_id}
        return [
            self.node_health_event(cluster, instance_id, "Unhealthy", "Replace"),
            self.cluster_event(cluster, old.instance_group_name, instance_id, "Warn",
                               f"Instance replacement started for EC2 Instance {instance_id} as {new.instance_id}"),
        ]

    def scale_group(self, cluster: str, group: str, count: int) -> list[dict]:
        spec = self._group(cluster, group)
        live = [n for n in self.nodes(cluster, group) if n.status in ("Running", "Pending")]
        spec["TargetCount"] = count
        self.cluster(cluster).status = "Updating"
        for _ in range(count - len(live)):
            self._new_node(cluster, group, "Pending")
        for node in sorted(live, key=lambda n: n.launch_time, reverse=True)[: max(0, len(live) - count)]:
            node.status = "ShuttingDown"
            self._pending_removals = getattr(self, "_pending_removals", set()) | {node.instance_id}
        return [self.state_change_event(cluster)]

    def finish_provisioning(self, cluster: str) -> list[dict]:
        """Pending nodes come up Running; terminating nodes disappear; the cluster is InService."""
        events = []
        for node in list(self.cluster(cluster).nodes.values()):
            if node.status == "Pending":
                node.status = "Running"
                events.append(self.cluster_event(cluster, node.instance_group_name, node.instance_id, "Info",
                                                 f"EC2 Instance {node.instance_id} successfully provisioned and lifecycle scripts completed"))
        for instance_id in getattr(self, "_pending_removals", set()):
            self.cluster(cluster).nodes.pop(instance_id, None)
        self._pending_removals = set()
        for spec in self.cluster(cluster).instance_groups:
            self._recount(cluster, spec["InstanceGroupName"])
        self.cluster(cluster).status = "InService"
        return events + [self.state_change_event(cluster)]

    def delete_cluster(self, cluster: str) -> list[dict]:
        """DeleteCluster: HyperPod reports Deleting, terminates every node, and the cluster is gone.

        From then on ListClusterNodes, DescribeCluster and DescribeClusterNode answer ResourceNotFound
        (the error code botocore's model gives them), as SageMaker does. Returns the Deleting event.
        """
        gone = self.cluster(cluster)
        gone.status = "Deleting"
        event = self.state_change_event(cluster)
        self._sagemaker.delete_cluster(ClusterName=cluster)
        # moto forgets it; the simulator keeps it, node-less, so the twin's view of the truth resolves.
        gone.nodes = {}
        self._deleted[cluster] = gone
        self._answer_not_found_like_sagemaker()
        return [event]

    def _answer_not_found_like_sagemaker(self) -> None:
        """moto answers ValidationException "Could not find cluster ..." for a missing cluster or
        node; SageMaker answers ResourceNotFound. Installed on this backend instance only (a moto
        reset starts a fresh one), and it looks the real method up at call time, so class-level
        patches such as listing_outage still apply."""
        backend = self.backend
        for operation in ("describe_cluster", "list_cluster_nodes", "describe_cluster_node"):
            if operation in vars(backend):
                continue

            def answer(*args: Any, _operation: str = operation, **kwargs: Any) -> Any:
                try:
                    return getattr(type(backend), _operation)(backend, *args, **kwargs)
                except ValidationError as error:
                    if error.message.startswith(("Could not find cluster", "Could not find node")):
                        raise ResourceNotFound(error.message.replace("Could not find", "Resource not found:", 1)) from None
                    raise

            setattr(backend, operation, answer)

    @contextmanager
    def listing_outage(self, cluster: str, group: str) -> Iterator[None]:
        """ListClusterNodes returns no node of `group` (an API/eventual-consistency fault), nodes still up."""
        real = type(self.backend).list_cluster_nodes

        def without_group(backend, *args: Any, **kwargs: Any):
            nodes = real(backend, *args, **kwargs)
            if isinstance(nodes, tuple):  # moto's paginate decorator returns (items, token)
                return [n for n in nodes[0] if n.instance_group_name != group], nodes[1]
            return [n for n in nodes if n.instance_group_name != group]

        with mock.patch.object(type(self.backend), "list_cluster_nodes", without_group):
            yield

    # ------------------------------------------------------------------ events (documented shapes)
    def _envelope(self, detail_type: str, cluster: str, detail: dict) -> dict:
        return {
            "version": "0",
            "id": str(uuid.uuid4()),
            "detail-type": detail_type,
            "source": "aws.sagemaker",
            "account": self.account_id,
            "time": self.clock().astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "region": self.region,
            "resources": [self.cluster(cluster).arn],
            "detail": detail,
        }

    def state_change_event(self, cluster: str) -> dict:
        c = self.cluster(cluster)
        groups = [
            {k: g.get(k) for k in ("InstanceGroupName", "CurrentCount", "TargetCount", "InstanceType",
                                    "ExecutionRole", "LifeCycleConfig", "ThreadsPerCore")}
            | {"Status": "InService" if g.get("CurrentCount") == g.get("TargetCount") else "Updating"}
            for g in c.instance_groups
        ]
        detail = {"ClusterArn": c.arn, "ClusterName": c.cluster_name, "ClusterStatus": c.status, "InstanceGroups": groups}
        return self._envelope(STATE_CHANGE, cluster, detail)

    def node_health_event(self, cluster: str, instance_id: str, status: str, repair_action: str) -> dict:
        detail = {
            "ClusterName": cluster,
            "ClusterArn": self.cluster(cluster).arn,
            "InstanceId": instance_id,
            "Tags": [],
            "HealthSummary": {
                "HealthStatus": status,
                "HealthStatusReason": "Deep health check failed" if status != "Healthy" else "",
                "RepairAction": repair_action,
                "Recommendation": "Node will be replaced" if repair_action == "Replace" else "",
            },
        }
        return self._envelope(NODE_HEALTH, cluster, detail)

    def cluster_event(self, cluster: str, group: str, instance_id: str, level: str, description: str) -> dict:
        detail = {
            "EventDetails": {
                "EventId": str(uuid.uuid4()),
                "ClusterArn": self.cluster(cluster).arn,
                "ClusterName": cluster,
                "InstanceGroupName": group,
                "InstanceId": instance_id,
                "ResourceType": "Instance",
                "EventTime": int(self.clock().timestamp() * 1000),
                "EventLevel": level,
                "Description": description,
                "EventMetadata": {"Instance": {"LcsExecutionState": "Completed", "NodeLogicalId": str(uuid.uuid4())}},
            }
        }
        return self._envelope(CLUSTER_EVENT, cluster, detail)
