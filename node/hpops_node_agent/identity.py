"""Who this node is: role (login/controller/compute), own IP and own instance id.

HyperPod writes /opt/ml/config/resource_config.json on every node (groups, their instances and
IPs; the lifecycle scripts may be pointed elsewhere with SAGEMAKER_RESOURCE_CONFIG_PATH, which
install.sh records). Which group is the controller group and which the login group comes from the
first provisioning_parameters.json that names them (HyperPod's /opt/ml/config copy, then the
lifecycle folder's), else from DescribeCluster's SlurmConfig.NodeType (cluster_layout.py). The
node finds its own entry by its primary IP. Every value can be overridden in the agent config
(tests, the local twin).
"""

from __future__ import annotations

import json
import socket
import urllib.request
from dataclasses import dataclass
from typing import Any, Callable, Optional

from hpops_core.node_channel import contract

from . import cluster_layout
from .config import AgentConfig

# Reads DescribeCluster's InstanceGroups with the node's own role; None where it cannot.
DescribeGroups = Callable[[], Any]

IMDS = "http://169.254.169.254"
IMDS_TIMEOUT_SECONDS = 1
IMDS_TOKEN_TTL_SECONDS = 60


class IdentityError(Exception):
    """The node cannot tell who it is; the message says which file or source failed."""


@dataclass(frozen=True)
class NodeIdentity:
    role: str
    ip: str
    instance_id: Optional[str]  # None for roles that never need it (compute, controller)
    group: Optional[str]


def read_json(path: str, what: str) -> dict:
    try:
        with open(path, "rb") as handle:
            document = json.loads(handle.read().decode("utf-8"))
    except FileNotFoundError:
        raise IdentityError("{} not found at {}".format(what, path)) from None
    except OSError as error:
        raise IdentityError("cannot read {} at {}: {}".format(what, path, error.strerror)) from None
    except (ValueError, UnicodeDecodeError):
        raise IdentityError("{} at {} is not valid JSON".format(what, path)) from None
    if not isinstance(document, dict):
        raise IdentityError("{} at {} must be a JSON object".format(what, path))
    return document


def primary_ip() -> str:
    """The source address the kernel picks for off-host traffic; UDP connect sends no packet."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(("10.254.254.254", 1))
            return sock.getsockname()[0]
        except OSError as error:
            raise IdentityError("cannot determine this node's IP: {}".format(error.strerror)) from None


def own_ip(config: AgentConfig) -> str:
    return config.ip or primary_ip()


def find_instance(resource_config: dict, ip: str):
    """(group name, instance entry) of the instance with CustomerIpAddress == ip, or (None, None)."""
    groups = resource_config.get("InstanceGroups")
    if not isinstance(groups, list):
        raise IdentityError("resource_config.json has no InstanceGroups list")
    for group in groups:
        if not isinstance(group, dict):
            continue
        for instance in group.get("Instances") or []:
            if isinstance(instance, dict) and instance.get("CustomerIpAddress") == ip:
                return group.get("Name"), instance
    return None, None


def provisioning_files(config: AgentConfig):
    """[(path, document or None)] in the order they are trusted, and why each unread one was not read."""
    files, problems = [], []
    for path in (config.platform_provisioning_parameters, config.provisioning_parameters):
        try:
            files.append((path, read_json(path, "provisioning_parameters.json")))
        except IdentityError as error:
            files.append((path, None))
            problems.append(str(error))
        except RecursionError:  # json gives up on very deep nesting with this, not ValueError
            files.append((path, None))
            problems.append("provisioning_parameters.json at {} is nested too deeply".format(path))
    return files, problems


def read_layout(config: AgentConfig, describe_groups: Optional[DescribeGroups] = None,
                for_partitions: bool = False):
    """(SlurmLayout or None, why not). DescribeCluster is asked only when no file names the groups,
    or, ``for_partitions``, when the lifecycle folder has no file of its own (API-driven Slurm
    configuration: the partitions are the groups' SlurmConfig.PartitionNames)."""
    files, problems = provisioning_files(config)
    layout = cluster_layout.resolve(files)
    api_driven = layout is not None and layout.source != config.provisioning_parameters
    if describe_groups is not None and (layout is None or (for_partitions and api_driven)):
        try:
            groups = describe_groups()
        except IdentityError as error:
            groups = None
            problems.append(str(error))
        if groups is not None:
            layout = cluster_layout.resolve(files, groups) or layout
    if layout is None:
        problems.append("no provisioning_parameters.json names the controller or login group")
    return layout, "; ".join(problems)


def imds_instance_id(timeout: float = IMDS_TIMEOUT_SECONDS) -> str:
    """IMDSv2: a session token, then the instance id."""
    try:
        token_request = urllib.request.Request(
            IMDS + "/latest/api/token",
            method="PUT",
            headers={"X-aws-ec2-metadata-token-ttl-seconds": str(IMDS_TOKEN_TTL_SECONDS)},
        )
        with urllib.request.urlopen(token_request, timeout=timeout) as response:
            token = response.read().decode("ascii").strip()
        id_request = urllib.request.Request(
            IMDS + "/latest/meta-data/instance-id", headers={"X-aws-ec2-metadata-token": token}
        )
        with urllib.request.urlopen(id_request, timeout=timeout) as response:
            return response.read().decode("ascii").strip()
    except (OSError, ValueError) as error:  # URLError and timeouts are OSErrors
        raise IdentityError(
            "instance id: not in resource_config.json and IMDSv2 did not answer ({}); "
            "set instanceId in the agent config".format(type(error).__name__)
        ) from None


def imds_identity_document(address: str = "169.254.169.254", timeout: float = IMDS_TIMEOUT_SECONDS) -> Optional[dict]:
    """{"document": text, "signature": base64} exactly as IMDS at ``address`` serves them (the signature
    covers the document's bytes), or None where IMDS does not serve them (UNCONFIRMED on HyperPod: the
    stack then enrolls the key without AWS's word, as it did before documents)."""
    base = "http://[{}]".format(address) if ":" in address else "http://" + address
    try:
        token_request = urllib.request.Request(
            base + "/latest/api/token", method="PUT",
            headers={"X-aws-ec2-metadata-token-ttl-seconds": str(IMDS_TOKEN_TTL_SECONDS)})
        with urllib.request.urlopen(token_request, timeout=timeout) as response:
            token = response.read().decode("ascii").strip()
        served = {}
        for name in ("document", "signature"):
            request = urllib.request.Request(base + "/latest/dynamic/instance-identity/" + name,
                                             headers={"X-aws-ec2-metadata-token": token})
            with urllib.request.urlopen(request, timeout=timeout) as response:
                served[name] = response.read(8192).decode("utf-8")
    except (OSError, ValueError, UnicodeDecodeError):  # 404 (HTTPError is an OSError), no IMDS, timeouts
        return None
    return served if served["document"].strip() and served["signature"].strip() else None


def describe_groups_with(session_factory: Callable[[], Any], config: AgentConfig) -> DescribeGroups:
    """DescribeCluster's InstanceGroups, for the API-driven layout (needs sagemaker:DescribeCluster)."""

    def describe() -> Any:
        try:
            client = session_factory().client("sagemaker", region_name=config.region)
            return client.describe_cluster(ClusterName=config.cluster).get("InstanceGroups")
        except Exception as error:  # botocore's errors, no credentials, no route: all mean "unknown"
            raise IdentityError("DescribeCluster {} failed: {}".format(config.cluster, _why(error))) from None

    return describe


def _why(error: Exception) -> str:
    """An AWS error's code, and the permission when it is access denied (the node role lacks it)."""
    code = (getattr(error, "response", None) or {}).get("Error", {}).get("Code")
    if not code:
        return type(error).__name__
    if "AccessDenied" in code:
        return "{} (the node's role needs sagemaker:DescribeCluster on the cluster: NodeAgentPolicy)".format(code)
    return code


def resolve(config: AgentConfig, need_instance_id: bool = True, imds=imds_instance_id,
            describe_groups: Optional[DescribeGroups] = None) -> NodeIdentity:
    """Role, IP and (for login nodes) instance id, overrides first."""
    ip = own_ip(config)
    group, instance = None, None
    if config.role is None or (need_instance_id and config.instance_id is None):
        resource_config = read_json(config.resource_config, "resource_config.json")
        group, instance = find_instance(resource_config, ip)
        if instance is None and config.role is None:
            raise IdentityError("this node's IP {} is not in {}".format(ip, config.resource_config))
    role = config.role
    if role is None:
        layout, why_not = read_layout(config, describe_groups)
        if layout is None:
            raise IdentityError(why_not)
        role = cluster_layout.role_of_group(group, layout)
    instance_id = config.instance_id
    if instance_id is None and need_instance_id and role == "login":
        instance_id = (instance or {}).get("InstanceId") or imds()
    if instance_id is not None:
        try:
            contract.check_instance_id(instance_id)
        except ValueError as error:
            raise IdentityError(str(error)) from None
    return NodeIdentity(role=role, ip=ip, instance_id=instance_id, group=group)
