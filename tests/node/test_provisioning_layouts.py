"""install.sh under `set -e`, in each way AWS provisions Slurm nodes, on each role.

The on_create.sh here is our own, shaped like AWS's reference (awsome-distributed-training,
LifecycleScripts/base-config/on_create.sh: `set -ex`, the Slurm setup, then `exit $exit_code`),
patched by `hpops lifecycle --patch`'s code. The layouts, written from the formats AWS documents:

- lifecycle: provisioning_parameters.json in the lifecycle folder (controller_group, login_group,
  worker_groups[{instance_group_name, partition_name}]);
- api-driven: no file in the lifecycle folder; HyperPod's /opt/ml/config/provisioning_parameters.json
  names the controller and login groups; the partitions are DescribeCluster's
  InstanceGroups[].SlurmConfig.PartitionNames;
- terraform: the Terraform module's file, where every non-controller group, the login group too,
  is a worker of partition "dev";
- api-driven, no file at all: the groups from DescribeCluster's SlurmConfig.NodeType.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
from real_tools import MotoServer

from hpops import lifecycle_script
from hpops_node_agent import bundle as bundle_module
from hpops_node_agent import usage
from hpops_node_agent.config import load_config
from hpops_node_agent.identity import describe_groups_with, read_layout

CLUSTER = "layout-cluster"
REGION = "us-west-2"
BUS = "hpops-node-reports"
NODES = {"login": ("login", "10.1.0.5", "i-0123456789abcdef0"),
         "controller": ("controller-machine", "10.1.2.2", "i-0123456789abcdef1"),
         "compute": ("gpu-workers", "10.1.1.9", "i-0123456789abcdef2")}
ON_CREATE = """#!/bin/bash

set -ex

LOG_FILE="$(pwd)/provisioning.log"
logger() {
  echo "$@" | tee -a $LOG_FILE
}

logger "configuring sshd, users and Slurm"
true  # stands for: python3 -u lifecycle_script.py -rc ... -pp provisioning_parameters.json

exit_code=$?

exit $exit_code
"""
LIFECYCLE_FILE = {"version": "1.0.0", "workload_manager": "slurm", "controller_group": "controller-machine",
                  "login_group": "login",
                  "worker_groups": [{"instance_group_name": "gpu-workers", "partition_name": "gpu"}]}
TERRAFORM_FILE = {"version": "1.0.0", "workload_manager": "slurm", "controller_group": "controller-machine",
                  "login_group": "login",
                  "worker_groups": [{"instance_group_name": "login", "partition_name": "dev"},
                                    {"instance_group_name": "gpu-workers", "partition_name": "dev"}]}
PLATFORM_FILE = {"controller_group": "controller-machine", "login_group": "login"}
SLURM_CONFIG = {"login": {"NodeType": "Login"}, "controller-machine": {"NodeType": "Controller"},
                "gpu-workers": {"NodeType": "Compute", "PartitionNames": ["gpu"]}}
LAYOUTS = {
    # name: (lifecycle folder's file, /opt/ml/config file, groups carry SlurmConfig)
    "lifecycle": (LIFECYCLE_FILE, None, False),
    "api-driven": (None, PLATFORM_FILE, True),
    "terraform": (TERRAFORM_FILE, None, False),
    "api-driven-no-file": (None, None, True),
}
# What each layout must give: the partition map the usage collector prices with.
EXPECTED_PARTITIONS = {"lifecycle": {"gpu": "gpu-workers"}, "api-driven": {"gpu": "gpu-workers"},
                       "terraform": {"dev": "gpu-workers"}, "api-driven-no-file": {"gpu": "gpu-workers"}}


@pytest.fixture(scope="module")
def moto_endpoint():
    moto = MotoServer().start()
    endpoint = moto.endpoint
    sagemaker = boto3.client("sagemaker", region_name=REGION, endpoint_url=endpoint, aws_access_key_id="testing",
                             aws_secret_access_key="testing")
    for name, with_slurm in (("layout-cluster", True), ("files-only", False)):
        groups = []
        for group in ("login", "controller-machine", "gpu-workers"):
            entry = {"InstanceGroupName": group, "InstanceType": "ml.m5.xlarge", "InstanceCount": 1,
                     "LifeCycleConfig": {"SourceS3Uri": "s3://sagemaker-lifecycle-bucket/base-config/", "OnCreate": "on_create.sh"},
                     "ExecutionRole": "arn:aws:iam::123456789012:role/hyperpod-nodes", "ThreadsPerCore": 1}
            if with_slurm:
                entry["SlurmConfig"] = SLURM_CONFIG[group]
            groups.append(entry)
        sagemaker.create_cluster(ClusterName=name, InstanceGroups=groups)
    yield endpoint
    moto.close()


class MotoSession:
    """A boto3 session whose clients talk to the moto server."""

    def __init__(self, endpoint: str):
        self.session = boto3.session.Session(aws_access_key_id="testing", aws_secret_access_key="testing")
        self.endpoint = endpoint

    def client(self, service: str, **kwargs):
        return self.session.client(service, endpoint_url=self.endpoint, **kwargs)


def lifecycle_folder(tmp_path: Path, layout: str, role: str) -> tuple[Path, Path]:
    """(the lifecycle folder with on_create.sh patched and the bundle beside it, the node's root)."""
    lifecycle_file, platform_file, with_slurm = LAYOUTS[layout]
    folder = tmp_path / "lifecycle"
    folder.mkdir()
    patched, _ = lifecycle_script.patch(ON_CREATE)
    (folder / "on_create.sh").write_text(patched)
    if lifecycle_file is not None:
        (folder / "provisioning_parameters.json").write_text(json.dumps(lifecycle_file))
    platform = tmp_path / "opt-ml-config" / "provisioning_parameters.json"
    platform.parent.mkdir()
    if platform_file is not None:
        platform.write_text(json.dumps(platform_file))
    resource = tmp_path / "opt-ml-config" / "resource_config.json"
    resource.write_text(json.dumps({"ClusterConfig": {"ClusterName": CLUSTER}, "InstanceGroups": [
        {"Name": group, "InstanceType": "ml.m5.xlarge",
         "Instances": [{"InstanceName": f"{group}-1", "CustomerIpAddress": ip, "InstanceId": instance_id}]}
        for group, ip, instance_id in NODES.values()]}))
    bundle = bundle_module.build_bundle(folder, CLUSTER if with_slurm else "files-only", REGION, BUS, vendor=False)
    config = json.loads((bundle / "agent.json").read_text())
    config.update(ip=NODES[role][1], platformProvisioningParameters=str(platform), sshdCmd="true", reloadCmd="true")
    (bundle / "agent.json").write_text(json.dumps(config))
    root = tmp_path / "root"
    (root / "etc" / "ssh").mkdir(parents=True)
    (root / "etc" / "ssh" / "sshd_config").write_text("Port 22\n")
    return folder, root


def run_on_create(folder: Path, root: Path, endpoint: str, extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if not key.startswith("AWS_")}
    env.update({"HPOPS_ROOT": str(root), "HPOPS_SYSTEMD": "0", "HPOPS_PYTHON": sys.executable,
                "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": REGION,
                "AWS_ENDPOINT_URL": endpoint,
                "SAGEMAKER_RESOURCE_CONFIG_PATH": str(folder.parent / "opt-ml-config" / "resource_config.json")})
    env.update(extra or {})
    return subprocess.run(["bash", "on_create.sh"], cwd=folder, capture_output=True, text=True, timeout=180, env=env)


@pytest.mark.parametrize("role", sorted(NODES))
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_install_finds_the_role_and_never_fails_on_create(tmp_path, moto_endpoint, layout, role):
    folder, root = lifecycle_folder(tmp_path, layout, role)
    result = run_on_create(folder, root, moto_endpoint)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"hpops install: node role: {role}" in result.stdout, result.stdout + result.stderr
    unit = root / "etc" / "systemd" / "system" / "hpops-node-agent.service"
    assert unit.exists() == (role in ("login", "controller"))
    config = load_config(str(root / "etc" / "hpops" / "node-agent.json"))
    assert config.resource_config == str(folder.parent / "opt-ml-config" / "resource_config.json")
    if role == "controller":
        partitions = usage.layout_partition_groups(
            *read_layout(config, describe_groups_with(lambda: MotoSession(moto_endpoint), config), for_partitions=True))
        assert partitions.groups == EXPECTED_PARTITIONS[layout], partitions


def test_a_node_whose_role_cannot_be_found_is_still_provisioned(tmp_path, moto_endpoint):
    folder, root = lifecycle_folder(tmp_path, "api-driven-no-file", "login")
    # No file names the groups and DescribeCluster cannot be reached: the role is unknown.
    result = run_on_create(folder, root, "http://127.0.0.1:9", {"AWS_MAX_ATTEMPTS": "1"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "cannot tell this node's role" in result.stdout
    assert "no provisioning_parameters.json names the controller or login group" in result.stderr
    assert "the node is provisioned without the agent" in result.stdout
    assert not (root / "etc" / "systemd").exists()
    strict = run_on_create(folder, root, "http://127.0.0.1:9", {"AWS_MAX_ATTEMPTS": "1", "HPOPS_REQUIRED": "1"})
    assert strict.returncode == 78, strict.stdout + strict.stderr


def test_an_installer_that_crashes_does_not_fail_on_create(tmp_path, moto_endpoint):
    folder, root = lifecycle_folder(tmp_path, "lifecycle", "login")
    # A read-only root: the installer cannot write the agent, whatever the reason in the field.
    (root / "opt").write_text("not a directory")
    result = run_on_create(folder, root, moto_endpoint)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "not installed (exit" in result.stdout
    assert run_on_create(folder, root, moto_endpoint, {"HPOPS_REQUIRED": "1"}).returncode != 0


def test_the_python_the_agent_asks_for_is_what_the_bundled_botocore_needs():
    from importlib import metadata

    from hpops_node_agent.__main__ import MIN_PYTHON

    requires = metadata.metadata("botocore")["Requires-Python"]  # e.g. ">= 3.10"
    floor = tuple(int(part) for part in requires.replace(">=", "").strip().split(",")[0].strip().split("."))
    assert MIN_PYTHON == floor[:2]
    assert bundle_module.NODE_PYTHON_VERSION == "{}.{}".format(*floor[:2])
