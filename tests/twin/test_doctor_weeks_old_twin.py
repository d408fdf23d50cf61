"""`hpops doctor` on the cluster a new user brings: launched 30 days ago, one execution role for every
group, a private VPC whose nodes reach AWS only through interface endpoints for what the agent calls
(SSM, Lambda, EventBridge), and no agent until it is installed on the running nodes.

The agents installed today cannot enroll on their own (their nodes launched long before the enrollment
window): doctor names that and the fix; the operator reads each agent's fingerprint with the one
documented command and approves it; the next sweep admits every login node and doctor exits 0. With
the Lambda endpoint gone, doctor fails naming the endpoint to create.
"""

from __future__ import annotations

import datetime as dt
import subprocess
import warnings

import boto3
import pytest

from hpops.doctor_checks import NOTE, OK, PROBLEM, exit_status
from hpops.enrollments import approve
from hpops_core.node_channel.contract import AGENT_KEY_PATH, READ_AGENT_FINGERPRINT
from hpops_twin.doctor_twin import DoctorAccount, doctor_world
from hpops_twin.user_spend_twin import CONTROLLER_GROUP


@pytest.fixture(scope="module")
def account():
    with warnings.catch_warnings(), doctor_world(weeks_old=True) as world:
        warnings.filterwarnings("ignore", message="No application metrics to publish")
        yield DoctorAccount(world).prepare(weeks_old=True)


def _fingerprint(key_file) -> str:
    """What the operator runs on the node as root (READ_AGENT_FINGERPRINT), on the twin node's key file."""
    command = READ_AGENT_FINGERPRINT.replace("sudo ", "").replace(AGENT_KEY_PATH, str(key_file))
    return subprocess.run(command, shell=True, check=True, capture_output=True, text=True).stdout.split()[1]


def _problems(findings) -> list[str]:
    return [f.line() for f in findings if f.status not in (OK, NOTE)]


def test_a_weeks_old_cluster_is_named_outside_the_window_then_approved_admitted_and_all_ok(account):
    world = account.world
    login = sorted(n.instance_id for n in world.sim.nodes(world.cluster_name, world.login_group))
    # What `hpops adopt` does on each running login node: the installer, and the agent's first cycle.
    for instance in login:
        assert world.hosts.install_agent(instance)
    account.controller_runs()
    findings = account.run()
    reports = next(f for f in findings if f.check == "agent-reports")
    assert reports.status == PROBLEM
    for instance in login:
        assert (f"{instance} was launched 30 days ago, outside the 60-minute enrollment window, and no approval "
                "names its agent's key") in reports.message, reports.line()
    assert "hpops adopt --stack-name hpops-twin" in reports.fix and READ_AGENT_FINGERPRINT in reports.fix
    # The shared role, the endpoints-only network: not problems.
    assert {f.check for f in findings if f.status not in (OK, NOTE)} <= {"agent-reports", "slurm-usage"}, _problems(findings)
    role = next(f for f in findings if f.check == "execution-role")
    assert role.status == OK and "hyperpod-exec is shared with gpu" in role.message
    network = [f for f in findings if f.check == "node-network"]
    assert all("SSM, Lambda and EventBridge (interface endpoints)" in f.message for f in network)

    # The administrator (approvals are the administrator's job) reads each agent's fingerprint on its node and
    # approves exactly that key.
    keys = {i: next(world.hosts.root(i).rglob("agent-key")) for i in login}  # the node's /var/lib/hpops-node-agent
    [controller] = world.sim.nodes(world.cluster_name, CONTROLLER_GROUP)
    keys[controller.instance_id] = next(account.controller._dir.rglob("agent-key"))
    session = boto3.session.Session(region_name=world.region)
    with account.answering_what_moto_lacks(), world.iam.operator(account.operator_policy("administrator")) as denials:
        for instance, key in sorted(keys.items()):
            approve(session.client("dynamodb"), session.client("sagemaker"), world.output("SyncStateTableName"),
                    world.cluster_name, world.login_group, CONTROLLER_GROUP, instance, _fingerprint(key))
    assert denials == []
    # Each agent enrolls at its next attempt (ENROLL_RETRY_SECONDS after its refusal), then reports.
    for instance in login:
        node = world._node_by_instance(instance)
        agent = world.hosts.agents[instance]
        assert agent.proof.ensure_enrolled(instance, node.ip, force=True)
        agent._pending_start = True
    assert account.controller.agent.proof.ensure_enrolled(controller.instance_id, controller.ip, force=True)
    world.agents_poll()
    account.controller_runs()
    world.wait([world.start_repair()])
    world.agents_poll()
    assert world.target_ips() == world.login_truth() and len(world.target_ips()) == len(login)
    findings = account.run()
    assert _problems(findings) == [] and exit_status(findings) == 0


def test_without_the_lambda_endpoint_doctor_fails_naming_the_endpoint_to_create(account):
    ec2 = account.aws.client("ec2")
    ec2.delete_vpc_endpoints(VpcEndpointIds=[account.agent_endpoints["lambda"]])
    try:
        findings = account.run()
    finally:
        account.agent_endpoints["lambda"] = account.create_endpoint("lambda")
    network = [f for f in findings if f.check == "node-network"]
    assert network and all(f.status == PROBLEM for f in network)
    line = network[0].line()
    assert "no interface endpoint with private DNS for lambda" in line and "every login node is kept out" in line
    assert (f"aws ec2 create-vpc-endpoint --vpc-id {account.vpc_id} --vpc-endpoint-type Interface --service-name "
            f"com.amazonaws.{account.aws.region_name}.lambda") in network[0].fix
    assert exit_status(findings) == 1
