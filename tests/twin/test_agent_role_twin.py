"""The node agent's start on an API-driven cluster, under NodeAgentPolicy as the twin enforces it.

With no provisioning_parameters.json naming the Slurm groups (API-driven configuration, and no
copy under /opt/ml/config either), the agent reads its role from DescribeCluster's
InstanceGroups[].SlurmConfig.NodeType with the node's own role: `sagemaker:DescribeCluster` on the
cluster (NodeAgentPolicy, Sid ReadSlurmRoles). The twin's own agents are told their groups by a
file, so this is the one place that call runs under enforcement. The installer's handling of a
role it cannot tell (the node is provisioned without the agent) is in tests/node/
test_provisioning_layouts.py; here, what the agent's start says and exits with.
"""

from __future__ import annotations

import json

from test_iam_enforcement import without

from hpops_node_agent.__main__ import main as agent_main
from hpops_twin.iam.enforce import acting_as
from hpops_twin.world import TwinWorld

EX_CONFIG = 78  # what install.sh's `--print-role` check treats as "cannot tell this node's role"


def api_driven_login_node(world, tmp_path) -> str:
    """A login node's agent config with no role and no provisioning file; the cluster's groups carry
    SlurmConfig.NodeType as SageMaker returns it. Returns the config file's path."""
    for group in world.sim.cluster(world.cluster_name).instance_groups:
        node_type = "Login" if group["InstanceGroupName"] == world.login_group else "Compute"
        group["SlurmConfig"] = {"NodeType": node_type}
    node = world.sim.nodes(world.cluster_name, world.login_group)[0]
    resource_config = tmp_path / "resource_config.json"
    resource_config.write_text(json.dumps({"InstanceGroups": [{"Name": world.login_group, "Instances": [
        {"InstanceName": f"{world.login_group}-1", "CustomerIpAddress": node.ip, "InstanceId": node.instance_id}]}]}))
    config = tmp_path / "node-agent.json"
    config.write_text(json.dumps({
        "cluster": world.cluster_name, "region": world.resolver.region, "reportBus": world.output("NodeReportBusName"),
        "root": str(tmp_path / "root"), "resourceConfig": str(resource_config), "ip": node.ip,
        "provisioningParameters": str(tmp_path / "no-lifecycle-file.json"),
        "platformProvisioningParameters": str(tmp_path / "no-platform-file.json"),
    }))
    return str(config)


def test_an_agent_without_a_provisioning_file_finds_its_role_through_describe_cluster(world, tmp_path, capsys):
    config = api_driven_login_node(world, tmp_path)
    with acting_as("agent"):
        status = agent_main(["--config", config, "--print-role"])
    out, err = capsys.readouterr()
    assert (status, out.strip()) == (0, "login"), err
    cluster_arn = world.sim.cluster(world.cluster_name).arn
    assert ("agent", "sagemaker:DescribeCluster", cluster_arn) in world.iam.exercised
    assert world.iam.denials == [] and world.iam.errors == []


def test_without_describe_cluster_the_agent_cannot_tell_its_role_and_says_so(tmp_path, capsys):
    with TwinWorld(iam_policy_edit=without("agent", "sagemaker:DescribeCluster")) as world:
        config = api_driven_login_node(world, tmp_path)
        with acting_as("agent"):
            status = agent_main(["--config", config, "--print-role"])
        denials = [(d.principal, d.action, d.resource) for d in world.iam.denials]
        cluster_arn = world.sim.cluster(world.cluster_name).arn
    out, err = capsys.readouterr()
    assert status == EX_CONFIG and out == ""
    assert denials == [("agent", "sagemaker:DescribeCluster", cluster_arn)]
    assert err.strip().endswith(
        f"DescribeCluster {world.cluster_name} failed: AccessDeniedException (the node's role needs "
        "sagemaker:DescribeCluster on the cluster: NodeAgentPolicy); no provisioning_parameters.json names the "
        "controller or login group"), err
