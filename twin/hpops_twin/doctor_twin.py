"""The account around the twin's stack, as `hpops doctor` reads it, and the ways it can be broken.

A fresh TwinWorld has the stack and the cluster; `DoctorAccount.prepare` adds what a working
installation has around them, each made in moto through the APIs an operator would use:
the lifecycle prefix in S3 (an on_create.sh written for the twin that runs the installer before
its final exit, and the bundle `hpops lifecycle` builds), NodeAgentPolicy attached to the groups'
execution role (CloudFormation's job: the twin does not provision IAM), the cluster's subnets with
a NAT gateway route and its security group admitting SSH from the verifier's, a CloudTrail trail
logging management events, the controller's real node agent reporting Slurm usage.

Doctor runs as the operator, under the policy `hpops iam-policy` prints for the twin's stack
(operator_permissions.py), enforced by the twin's IAM model like every other caller's requests.

Where moto lacks an answer, the twin gives it here, never in the product, behind IAM enforcement
(it wraps moto's `BotocoreStubber.process_request`, as price_list.py does, so a request is
checked before it is answered):
  * Cost Explorer's ListCostAllocationTags (moto has no such API): answered from
    `cost_allocation_tags`.
  * moto's DescribeCluster returns the VpcConfig it was created with; the simulator creates the
    cluster before the twin's VPC exists, so the cluster's VpcConfig is pointed at the twin's
    subnets and security group here (a real cluster's VpcConfig names real ones).
  * moto's ListTags finds a cluster by the name in its ARN; the simulator gives the cluster
    HyperPod's id-shaped ARN, so the cluster's tags are answered from moto's cluster object.

`BREAKS` are conditions an operator's account can be in, one per check (some checks have two):
each is a context manager that breaks the account as the operator would (an API call, a file)
and restores it on exit.
"""

from __future__ import annotations

import datetime as dt
import json
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import boto3
from moto.core.botocore_stubber import BotocoreStubber

from hpops.doctor import StackView, Target, target_of_stack
from hpops.doctor_checks import NODE_SERVICES
from hpops.lifecycle_script import INSTALL_LINE
from hpops_twin.client_vpn import ClientVpnEndpoint, client_vpn_answered
from hpops_twin.user_spend_twin import CONTROLLER_GROUP, UserSpendTwin
from hpops_twin.world import STACK_NAME

LIFECYCLE_BUCKET = "sagemaker-lifecycle-twin"  # hyperpod_sim.py's LifeCycleConfig
LIFECYCLE_PREFIX = "scripts/"
EXECUTION_ROLE = "hyperpod-exec"  # hyperpod_sim.py's ExecutionRole, the stack's ClusterExecutionRoleName
COMPUTE_ROLE = "hyperpod-compute-exec"  # the compute group's own role in a working installation
ALARM_EMAIL = "hpc-oncall@example.edu"  # the doctor world's AlarmEmail
TRAIL = "management-events"

# Written for the twin in the shape AWS's reference scripts have (run the configuration, keep its
# status, end with it): the installer runs before the final exit.
ON_CREATE = f"""#!/bin/bash
set -ex
LOG_FILE="/var/log/provision/provisioning.log"
mkdir -p /var/log/provision
touch $LOG_FILE
logger() {{ echo "$@" | tee -a $LOG_FILE; }}
python3 -u configure_slurm.py 2>&1 | tee -a $LOG_FILE
exit_code=${{PIPESTATUS[0]}}
{INSTALL_LINE}
logger "[stop] on_create.sh with exit code $exit_code"
exit $exit_code
"""
ON_CREATE_APPENDED = ON_CREATE.replace(f"{INSTALL_LINE}\n", "") + f"{INSTALL_LINE}\n"


class DoctorAccount:
    def __init__(self, world: Any):
        self.world = world
        self.aws = world.aws
        self.cost_allocation_tags: list[dict] = []
        self.controller = None
        self.denials: list = []  # what the operator policy refused in the last run

    # ------------------------------------------------------------------ setting up
    def prepare(self, weeks_old: bool = False) -> DoctorAccount:
        """A working installation; ``weeks_old``: the cluster HyperPod's common setup leaves after weeks
        (launched 30 days ago, one execution role for every group, a private VPC whose nodes reach AWS
        through interface endpoints for what the agent calls, no NAT), before `hpops adopt`: built with
        doctor_world(weeks_old=True), whose nodes have no agent yet."""
        world, ec2 = self.world, self.aws.client("ec2")
        parameters = world.resolver.parameters
        self.vpc_id = parameters["VpcId"]
        self.subnets = parameters["SubnetIds"].split(",")
        if weeks_old:
            for node in world.sim.cluster(world.cluster_name).nodes.values():
                node.launch_time -= dt.timedelta(days=30)
        self._lifecycle()
        self._node_agent_policy()
        # The cluster's own security group: all traffic between its nodes, SSH from the verifier.
        self.cluster_group = ec2.create_security_group(GroupName="hyperpod-cluster", Description="HyperPod cluster",
                                                       VpcId=self.vpc_id)["GroupId"]
        ec2.authorize_security_group_ingress(GroupId=self.cluster_group, IpPermissions=[
            {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": self.cluster_group}]}])
        self.verifier_group = world.resolver.physical_ids["VerifierSecurityGroup"]
        self.ssh_rule = [{"IpProtocol": "tcp", "FromPort": int(parameters["SshPort"]), "ToPort": int(parameters["SshPort"]),
                          "UserIdGroupPairs": [{"GroupId": self.verifier_group}]}]
        ec2.authorize_security_group_ingress(GroupId=self.cluster_group, IpPermissions=self.ssh_rule)
        # ... and from the NLB's security group: users' connections and the health checks come from it.
        self.nlb_rule = [{"IpProtocol": "tcp", "FromPort": int(parameters["SshPort"]), "ToPort": int(parameters["SshPort"]),
                          "UserIdGroupPairs": [{"GroupId": world.resolver.physical_ids["LoginLoadBalancerSecurityGroup"]}]}]
        ec2.authorize_security_group_ingress(GroupId=self.cluster_group, IpPermissions=self.nlb_rule)
        if weeks_old:
            self.agent_endpoints = self._endpoints_for_the_agent()
        else:
            self._nat_route()
        self._client_vpn()
        world.sim.cluster(world.cluster_name).vpc_config = {"SecurityGroupIds": [self.cluster_group],
                                                            "Subnets": [self.subnets[0]]}
        if not weeks_old:  # the compute group runs with a role of its own (the simulator gives every group one)
            self.group_spec(world.worker_group)["ExecutionRole"] = f"arn:aws:iam::{world.account_id}:role/{COMPUTE_ROLE}"
        # CloudFormation's AWS::SNS::Subscription for AlarmEmail (the twin does not provision subscriptions);
        # the on-call engineer confirmed it (moto lists every subscription as confirmed).
        self.aws.client("sns").subscribe(TopicArn=world.output("AlertTopicArn"), Protocol="email", Endpoint=ALARM_EMAIL)
        s3 = self.aws.client("s3")
        s3.create_bucket(Bucket="twin-cloudtrail-logs")
        cloudtrail = self.aws.client("cloudtrail")
        cloudtrail.create_trail(Name=TRAIL, S3BucketName="twin-cloudtrail-logs", IsMultiRegionTrail=True)
        cloudtrail.put_event_selectors(TrailName=TRAIL, EventSelectors=[
            {"ReadWriteType": "All", "IncludeManagementEvents": True}])
        cloudtrail.start_logging(Name=TRAIL)
        self.cost_allocation_tags = [{"TagKey": "ClusterName", "Type": "UserDefined", "Status": "Active"}]
        # Without the optional lockdown a user on the controller reaches IMDS, as on every HyperPod node.
        self.controller = UserSpendTwin(world).controller(jobs=[], partitions={"gpu": world.worker_group},
                                                          imds="reachable")
        self.controller_runs()
        # A working installation has swept once: the published host identity reached every agent.
        world.wait([world.run_schedule()])
        return self

    def _endpoints_for_the_agent(self) -> dict[str, str]:
        """Interface endpoints (private DNS) for each service the agent calls, admitting HTTPS from the
        cluster's security group: service -> endpoint id."""
        ec2 = self.aws.client("ec2")
        self.endpoint_group = ec2.create_security_group(GroupName="agent-endpoints", Description="interface endpoints",
                                                        VpcId=self.vpc_id)["GroupId"]
        ec2.authorize_security_group_ingress(GroupId=self.endpoint_group, IpPermissions=[
            {"IpProtocol": "tcp", "FromPort": 443, "ToPort": 443, "UserIdGroupPairs": [{"GroupId": self.cluster_group}]}])
        return {service: self.create_endpoint(service) for service in NODE_SERVICES}

    def create_endpoint(self, service: str) -> str:
        return self.aws.client("ec2").create_vpc_endpoint(
            VpcId=self.vpc_id, ServiceName=f"com.amazonaws.{self.aws.region_name}.{service}", VpcEndpointType="Interface",
            SubnetIds=[self.subnets[0]], SecurityGroupIds=[self.endpoint_group],
            PrivateDnsEnabled=True)["VpcEndpoint"]["VpcEndpointId"]

    def _client_vpn(self) -> None:
        """Users come in through AWS Client VPN, associated with a subnet of the VPC and authorized to all of it."""
        ec2 = self.aws.client("ec2")
        subnet = ec2.create_subnet(VpcId=self.vpc_id, CidrBlock="10.1.210.0/24")["Subnet"]["SubnetId"]
        group = ec2.create_security_group(GroupName="client-vpn", Description="Client VPN", VpcId=self.vpc_id)["GroupId"]
        self.client_vpn = ClientVpnEndpoint("cvpn-endpoint-0a1b2c3d4e5f60718", self.vpc_id, [subnet], ["10.1.0.0/16"],
                                            [group])

    def _lifecycle(self) -> None:
        from hpops_node_agent.bundle import build_bundle

        s3 = self.aws.client("s3")
        s3.create_bucket(Bucket=LIFECYCLE_BUCKET)
        self.put_on_create(ON_CREATE)
        with tempfile.TemporaryDirectory() as folder:
            bundle = build_bundle(Path(folder), self.world.cluster_name, self.aws.region_name,
                                  self.world.output("NodeReportBusName"), vendor=False)
            for path in sorted(p for p in bundle.rglob("*") if p.is_file()):
                s3.put_object(Bucket=LIFECYCLE_BUCKET, Key=f"{LIFECYCLE_PREFIX}hpops/{path.relative_to(bundle)}",
                              Body=path.read_bytes())

    def group_spec(self, group: str) -> dict:
        """The instance group as DescribeCluster returns it (moto's cluster object, changed in place)."""
        cluster = self.world.sim.cluster(self.world.cluster_name)
        return next(g for g in cluster.instance_groups if g["InstanceGroupName"] == group)

    def put_on_create(self, text: str) -> None:
        self.aws.client("s3").put_object(Bucket=LIFECYCLE_BUCKET, Key=f"{LIFECYCLE_PREFIX}on_create.sh",
                                         Body=text.encode())

    def _node_agent_policy(self) -> None:
        """What CloudFormation does for NodeAgentPolicy with ClusterExecutionRoleName set."""
        iam = self.aws.client("iam")
        trust = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                         "Principal": {"Service": "sagemaker.amazonaws.com"}}]}
        iam.create_role(RoleName=EXECUTION_ROLE, AssumeRolePolicyDocument=json.dumps(trust))
        # The compute group's own role: what its users reach through IMDS (S3 reads, as sites give them).
        iam.create_role(RoleName=COMPUTE_ROLE, AssumeRolePolicyDocument=json.dumps(trust))
        iam.put_role_policy(RoleName=COMPUTE_ROLE, PolicyName="datasets", PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:GetObject", "Resource": "*"}]}))
        properties = self.world.resolver.resolve(self.world.template.resources["NodeAgentPolicy"]["Properties"])
        self.policy_arn = iam.create_policy(PolicyName="hpops-twin-NodeAgentPolicy",
                                            PolicyDocument=json.dumps(properties["PolicyDocument"]))["Policy"]["Arn"]
        self.world.resolver.physical_ids["NodeAgentPolicy"] = self.policy_arn
        for role in properties["Roles"]:
            iam.attach_role_policy(RoleName=role, PolicyArn=self.policy_arn)

    def _nat_route(self) -> None:
        ec2 = self.aws.client("ec2")
        gateway = ec2.create_internet_gateway()["InternetGateway"]["InternetGatewayId"]
        ec2.attach_internet_gateway(InternetGatewayId=gateway, VpcId=self.vpc_id)
        public = ec2.create_subnet(VpcId=self.vpc_id, CidrBlock="10.1.200.0/24")["Subnet"]["SubnetId"]
        allocation = ec2.allocate_address(Domain="vpc")["AllocationId"]
        self.nat = ec2.create_nat_gateway(SubnetId=public, AllocationId=allocation)["NatGateway"]["NatGatewayId"]
        self.route_table = ec2.create_route_table(VpcId=self.vpc_id)["RouteTable"]["RouteTableId"]
        ec2.create_route(RouteTableId=self.route_table, DestinationCidrBlock="0.0.0.0/0", NatGatewayId=self.nat)
        ec2.associate_route_table(RouteTableId=self.route_table, SubnetId=self.subnets[0])

    def controller_runs(self) -> None:
        """The controller's agent collects and reports usage now."""
        self.controller.run_agent(dt.datetime.now(dt.timezone.utc))

    # ------------------------------------------------------------------ doctor, on this account
    @contextmanager
    def answering_what_moto_lacks(self) -> Iterator[DoctorAccount]:
        """Inside the block, the calls moto cannot answer are answered here (after IAM enforcement)."""
        real_process_request = BotocoreStubber.process_request
        answers = {"AWSInsightsIndexService.ListCostAllocationTags": self._list_cost_allocation_tags,
                   "SageMaker.ListTags": self._list_cluster_tags}

        def process_request(stubber: BotocoreStubber, request: Any) -> Any:
            target = request.headers.get("X-Amz-Target", b"")
            answer = answers.get(target.decode() if isinstance(target, bytes) else target)
            body = request.body.decode() if isinstance(request.body, bytes) else request.body
            answered = answer(json.loads(body or "{}")) if answer else None
            if answered is not None:
                return 200, {"Content-Type": "application/x-amz-json-1.1"}, json.dumps(answered)
            return real_process_request(stubber, request)

        with mock.patch.object(BotocoreStubber, "process_request", process_request), client_vpn_answered(self.client_vpn):
            yield self

    def _list_cost_allocation_tags(self, params: dict) -> dict:
        keys = params.get("TagKeys")
        return {"CostAllocationTags": [t for t in self.cost_allocation_tags if keys is None or t["TagKey"] in keys]}

    def _list_cluster_tags(self, params: dict) -> dict | None:
        cluster = self.world.sim.cluster(self.world.cluster_name)
        if params.get("ResourceArn") != cluster.arn:
            return None  # not the cluster: moto answers
        return {"Tags": list(cluster.tags or [])}

    def operator_policy(self, role: str = "operator") -> dict:
        """What `hpops iam-policy --stack-name hpops-twin --role ROLE --lifecycle-bucket sagemaker-lifecycle-twin`
        prints."""
        from hpops.operator_permissions import operator_policy

        world = self.world
        outputs = {}
        for name in world.template.raw["Outputs"]:
            try:
                value = world.output(name)
            except KeyError:  # an output of a resource a condition left out
                continue
            if isinstance(value, str) and value:
                outputs[name] = value
        stack_id = f"arn:aws:cloudformation:{self.aws.region_name}:{world.account_id}:stack/{STACK_NAME}/twin"
        resources = {k: v for k, v in world.resolver.physical_ids.items() if isinstance(v, str)}
        document, _ = operator_policy(stack_id, outputs, dict(world.resolver.parameters), resources, [LIFECYCLE_BUCKET],
                                      role=role)
        return document

    def target(self) -> Target:
        world = self.world
        stack = StackView(STACK_NAME, _Outputs(world), dict(world.resolver.parameters),
                          lambda logical_id: world.resolver.physical_ids.get(logical_id))
        return target_of_stack(stack, self.aws.region_name)

    def run(self, now: dt.datetime | None = None, policy: dict | None = None) -> list:
        """Doctor's findings, run as the operator under `policy` (default: the stack's operator policy);
        what it was refused is in `self.denials`."""
        from hpops.doctor import run_doctor

        session = boto3.session.Session(region_name=self.aws.region_name)
        with self.answering_what_moto_lacks(), self.world.iam.operator(policy or self.operator_policy()) as denials:
            findings = run_doctor(session, self.target(), now or dt.datetime.now(dt.timezone.utc))
        self.denials = denials
        return findings


class _Outputs(dict):
    """The twin stack's outputs, resolved from template.yaml when read."""

    def __init__(self, world: Any):
        super().__init__()
        self.world = world

    def __missing__(self, name: str) -> str:
        return self.world.output(name)

    def get(self, name: str, default: Any = None) -> Any:
        try:
            return self.world.output(name)
        except KeyError:
            return default

    def __contains__(self, name: object) -> bool:  # a conditional output is missing where its condition is false
        return isinstance(name, str) and self.get(name) is not None


# ---------------------------------------------------------------------------- breaking it


@contextmanager
def install_line_after_exit(account: DoctorAccount) -> Iterator[None]:
    """Someone appended the install line to the end of the reference on_create.sh."""
    account.put_on_create(ON_CREATE_APPENDED)
    yield
    account.put_on_create(ON_CREATE)


@contextmanager
def bundle_not_uploaded(account: DoctorAccount) -> Iterator[None]:
    s3 = account.aws.client("s3")
    key = f"{LIFECYCLE_PREFIX}hpops/install.sh"
    body = s3.get_object(Bucket=LIFECYCLE_BUCKET, Key=key)["Body"].read()
    s3.delete_object(Bucket=LIFECYCLE_BUCKET, Key=key)
    yield
    s3.put_object(Bucket=LIFECYCLE_BUCKET, Key=key, Body=body)


@contextmanager
def policy_detached(account: DoctorAccount) -> Iterator[None]:
    iam = account.aws.client("iam")
    iam.detach_role_policy(RoleName=EXECUTION_ROLE, PolicyArn=account.policy_arn)
    yield
    iam.attach_role_policy(RoleName=EXECUTION_ROLE, PolicyArn=account.policy_arn)


@contextmanager
def no_nat_route(account: DoctorAccount) -> Iterator[None]:
    """The cluster's subnet has no way out: its NAT route deleted, no VPC endpoints."""
    ec2 = account.aws.client("ec2")
    ec2.delete_route(RouteTableId=account.route_table, DestinationCidrBlock="0.0.0.0/0")
    yield
    ec2.create_route(RouteTableId=account.route_table, DestinationCidrBlock="0.0.0.0/0", NatGatewayId=account.nat)


@contextmanager
def _cluster_rule_revoked(account: DoctorAccount, rule: list[dict]) -> Iterator[None]:
    ec2 = account.aws.client("ec2")
    ec2.revoke_security_group_ingress(GroupId=account.cluster_group, IpPermissions=rule)
    yield
    ec2.authorize_security_group_ingress(GroupId=account.cluster_group, IpPermissions=rule)


def ssh_not_admitted(account: DoctorAccount) -> Any:
    return _cluster_rule_revoked(account, account.ssh_rule)


def nlb_not_admitted(account: DoctorAccount) -> Any:
    return _cluster_rule_revoked(account, account.nlb_rule)


@contextmanager
def client_vpn_not_authorized(account: DoctorAccount) -> Iterator[None]:
    rules, account.client_vpn.authorized_cidrs = account.client_vpn.authorized_cidrs, ["10.1.210.0/24"]
    yield
    account.client_vpn.authorized_cidrs = rules


@contextmanager
def login_node_without_agent(account: DoctorAccount) -> Iterator[None]:
    """A scale-out whose new login node never got the agent (its lifecycle script lacked the line)."""
    world = account.world
    world.hosts.lifecycle_installs_agent = False
    world.sim.scale_group(world.cluster_name, world.login_group, world.login_count + 1)
    world.sim.finish_provisioning(world.cluster_name)
    yield
    world.sim.scale_group(world.cluster_name, world.login_group, world.login_count)
    world.sim.finish_provisioning(world.cluster_name)
    world.hosts.lifecycle_installs_agent = True


@contextmanager
def agents_behind_published_identity(account: DoctorAccount) -> Iterator[None]:
    """A host key rotation was installed; no sweep has published it to the agents yet. Undone the way
    it is on AWS: the next sweep publishes it and every agent applies it."""
    from hpops_twin.node_hosts import rotation_bundle

    account.world.install_canonical_host_keys(rotation_bundle())
    yield
    account.world.wait([account.world.run_schedule()])
    account.world.agents_poll()


@contextmanager
def trail_stopped(account: DoctorAccount) -> Iterator[None]:
    cloudtrail = account.aws.client("cloudtrail")
    cloudtrail.stop_logging(Name=TRAIL)
    yield
    cloudtrail.start_logging(Name=TRAIL)


@contextmanager
def run_as_off(account: DoctorAccount) -> Iterator[None]:
    ssm = account.aws.client("ssm")
    ssm.delete_document(Name="SSM-SessionManagerRunShell")
    account.world.save_session_preferences(False)
    yield
    ssm.delete_document(Name="SSM-SessionManagerRunShell")
    account.world.save_session_preferences(True)


@contextmanager
def cost_tag_inactive(account: DoctorAccount) -> Iterator[None]:
    saved = account.cost_allocation_tags
    account.cost_allocation_tags = [tag | {"Status": "Inactive"} for tag in saved]
    yield
    account.cost_allocation_tags = saved


@contextmanager
def accounting_disabled(account: DoctorAccount) -> Iterator[None]:
    account.controller.sacct.accounting_enabled = False
    account.controller_runs()
    yield
    account.controller.sacct.accounting_enabled = True
    account.controller_runs()


@contextmanager
def gpus_not_tracked(account: DoctorAccount) -> Iterator[None]:
    """slurm.conf's AccountingStorageTRES without gres/gpu, as scontrol show config reports it."""
    import types

    sacct = account.controller.sacct
    real = sacct._scontrol

    def without_gpus() -> Any:
        answer = real()
        return types.SimpleNamespace(returncode=0, stderr=b"", stdout=answer.stdout.replace(b",gres/gpu", b""))

    sacct._scontrol = without_gpus
    account.controller_runs()
    yield
    sacct._scontrol = real
    account.controller_runs()


@contextmanager
def host_identity_never_published(account: DoctorAccount) -> Iterator[None]:
    """A fresh stack: nobody ran `hpops host-keys generate`, so the lease item has no host identity."""
    from hpops_core.common.state_table import HOST_IDENTITY_ATTRIBUTE, lease_item_key

    dynamodb, table = account.aws.client("dynamodb"), account.world.output("SyncStateTableName")
    key = lease_item_key(account.world.cluster_name)
    saved = dynamodb.get_item(TableName=table, Key=key)["Item"][HOST_IDENTITY_ATTRIBUTE]
    dynamodb.update_item(TableName=table, Key=key, UpdateExpression=f"REMOVE {HOST_IDENTITY_ATTRIBUTE}")
    yield
    dynamodb.update_item(TableName=table, Key=key, UpdateExpression=f"SET {HOST_IDENTITY_ATTRIBUTE} = :v",
                         ExpressionAttributeValues={":v": saved})


@contextmanager
def shared_role_reads_the_host_keys(account: DoctorAccount) -> Iterator[None]:
    """One execution role for every group (common), and someone gave it Secrets Manager reads with
    kms:Decrypt on everything (a broad site policy): every user can now read the host keys."""
    iam, spec = account.aws.client("iam"), account.group_spec(account.world.worker_group)
    saved = spec["ExecutionRole"]
    spec["ExecutionRole"] = f"arn:aws:iam::{account.world.account_id}:role/{EXECUTION_ROLE}"
    iam.put_role_policy(RoleName=EXECUTION_ROLE, PolicyName="site-secrets", PolicyDocument=json.dumps(
        {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": ["secretsmanager:GetSecretValue",
                                                                               "kms:Decrypt"], "Resource": "*"}]}))
    yield
    iam.delete_role_policy(RoleName=EXECUTION_ROLE, PolicyName="site-secrets")
    spec["ExecutionRole"] = saved


@contextmanager
def run_as_default_user(account: DoctorAccount) -> Iterator[None]:
    """Run As on with one default user for everyone (what an old doctor fix suggested)."""
    ssm = account.aws.client("ssm")
    ssm.delete_document(Name="SSM-SessionManagerRunShell")
    account.world.save_session_preferences(True, "ubuntu")
    yield
    ssm.delete_document(Name="SSM-SessionManagerRunShell")
    account.world.save_session_preferences(True)


@contextmanager
def network_acl_drops_ssh(account: DoctorAccount) -> Iterator[None]:
    """The nodes' subnet gets a network ACL of its own whose rule 90 denies TCP 22 from the other subnet
    (where the verifier and the NLB also sit), before its allow-all rule."""
    ec2, subnet = account.aws.client("ec2"), account.subnets[0]
    acl = ec2.create_network_acl(VpcId=account.vpc_id)["NetworkAcl"]["NetworkAclId"]
    other = ec2.describe_subnets(SubnetIds=[account.subnets[1]])["Subnets"][0]["CidrBlock"]
    ec2.create_network_acl_entry(NetworkAclId=acl, RuleNumber=90, Protocol="6", RuleAction="deny", Egress=False,
                                 CidrBlock=other, PortRange={"From": 22, "To": 22})
    for egress in (False, True):
        ec2.create_network_acl_entry(NetworkAclId=acl, RuleNumber=100, Protocol="-1", RuleAction="allow",
                                     Egress=egress, CidrBlock="0.0.0.0/0")
    [default] = ec2.describe_network_acls(Filters=[{"Name": "association.subnet-id", "Values": [subnet]}])["NetworkAcls"]
    association = next(a["NetworkAclAssociationId"] for a in default["Associations"] if a["SubnetId"] == subnet)
    association = ec2.replace_network_acl_association(AssociationId=association, NetworkAclId=acl)["NewAssociationId"]
    yield
    ec2.replace_network_acl_association(AssociationId=association, NetworkAclId=default["NetworkAclId"])
    ec2.delete_network_acl(NetworkAclId=acl)


@contextmanager
def endpoints_refuse_https(account: DoctorAccount) -> Iterator[None]:
    """Interface endpoints (private DNS) for the agents' services, whose security group admits nothing:
    with private DNS the nodes' calls go to them, NAT route or not."""
    ec2, region = account.aws.client("ec2"), account.aws.region_name
    group = ec2.create_security_group(GroupName="endpoints", Description="interface endpoints",
                                      VpcId=account.vpc_id)["GroupId"]
    created = [ec2.create_vpc_endpoint(VpcId=account.vpc_id, ServiceName=f"com.amazonaws.{region}.{service}",
                                       VpcEndpointType="Interface", SubnetIds=[account.subnets[0]],
                                       SecurityGroupIds=[group], PrivateDnsEnabled=True)["VpcEndpoint"]["VpcEndpointId"]
               for service in NODE_SERVICES]
    yield
    ec2.delete_vpc_endpoints(VpcEndpointIds=created)
    ec2.delete_security_group(GroupId=group)


@contextmanager
def key_policy_without_the_account(account: DoctorAccount) -> Iterator[None]:
    """Someone replaced the host identity key's policy with one naming only their own role."""
    kms, key = account.aws.client("kms"), account.world.resolver.physical_ids["HostIdentityKey"]
    saved = kms.get_key_policy(KeyId=key, PolicyName="default")["Policy"]
    admin = f"arn:aws:iam::{account.world.account_id}:role/key-admin"
    kms.put_key_policy(KeyId=key, PolicyName="default", BypassPolicyLockoutSafetyCheck=True, Policy=json.dumps({
        "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": {"AWS": admin}, "Action": "kms:*",
                                               "Resource": "*"}]}))
    yield
    kms.put_key_policy(KeyId=key, PolicyName="default", Policy=saved)


@contextmanager
def alarm_email_unconfirmed(account: DoctorAccount) -> Iterator[None]:
    """The on-call engineer never clicked the confirmation link. moto lists every subscription as
    confirmed; AWS lists an unconfirmed one with SubscriptionArn "PendingConfirmation", which is what
    the twin makes moto's subscription object render here."""
    from moto.sns.models import sns_backends

    backend = sns_backends[account.world.account_id][account.aws.region_name]
    [subscription] = [s for s in backend.subscriptions.values() if s.endpoint == ALARM_EMAIL]
    saved, subscription.arn = subscription.arn, "PendingConfirmation"
    yield
    subscription.arn = saved


@contextmanager
def limits_not_enforced(account: DoctorAccount) -> Iterator[None]:
    """Holds on (UserBudgetAction=hold), and slurm.conf's AccountingStorageEnforce lacks limits: the
    controller's real agent reads it with `scontrol show config` and says so in its holds report."""
    from hpops_twin.holds_twin import attach, run_holds

    parameters = account.world.resolver.parameters
    saved = parameters["UserBudgetAction"]
    parameters["UserBudgetAction"] = "hold"  # the stack as doctor reads it
    slurm = attach(account.controller, [])
    enforced, slurm.enforce = slurm.enforce, "associations"
    run_holds(account.controller, dt.datetime.now(dt.timezone.utc))
    yield
    slurm.enforce = enforced
    run_holds(account.controller, dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=1))
    parameters["UserBudgetAction"] = saved


# (check that must catch it, what is broken, how)
BREAKS: tuple[tuple[str, str, Callable[[DoctorAccount], Any]], ...] = (
    ("lifecycle-script", "install line appended after on_create.sh's final exit", install_line_after_exit),
    ("lifecycle-script", "bundle's install.sh not uploaded beside on_create.sh", bundle_not_uploaded),
    ("node-agent-policy", "NodeAgentPolicy detached from the execution role", policy_detached),
    ("execution-role", "one role for every group, and it may read every secret", shared_role_reads_the_host_keys),
    ("node-network", "no NAT route and no VPC endpoints for the nodes' subnet", no_nat_route),
    ("node-endpoints", "interface endpoints whose security group refuses HTTPS", endpoints_refuse_https),
    ("verifier-path", "cluster security group does not admit SSH from the verifier", ssh_not_admitted),
    ("nlb-path", "cluster security group does not admit SSH from the NLB's", nlb_not_admitted),
    ("nlb-path", "Client VPN authorized only to its own subnet, not the NLB's", client_vpn_not_authorized),
    ("network-acl", "the nodes' network ACL denies SSH from the verifier's and NLB's subnet", network_acl_drops_ssh),
    ("host-identity", "a fresh stack: no host identity ever published", host_identity_never_published),
    ("kms-key-policy", "the key policy no longer lets IAM grant the key's use", key_policy_without_the_account),
    ("agent-reports", "a new login node whose agent was never installed", login_node_without_agent),
    ("agent-reports", "agents behind the published host identity", agents_behind_published_identity),
    ("alert-subscription", "the alarm e-mail never confirmed", alarm_email_unconfirmed),
    ("cloudtrail", "the only trail stopped logging", trail_stopped),
    ("run-as", "Session Manager Run As off", run_as_off),
    ("run-as", "Run As on with one default user for everyone", run_as_default_user),
    ("cost-allocation-tag", "cost allocation tag ClusterName inactive", cost_tag_inactive),
    ("slurm-usage", "Slurm accounting disabled on the controller", accounting_disabled),
    ("slurm-usage", "GPUs not in AccountingStorageTRES", gpus_not_tracked),
    ("accounting-enforce", "holds on, AccountingStorageEnforce without limits", limits_not_enforced),
)


def doctor_world(weeks_old: bool = False, progress: Any = None) -> Any:
    """A fresh twin with a Slurm controller group (whose agent reports usage) and an alarm e-mail;
    ``weeks_old``: its nodes were provisioned before on_create.sh had the install line (no agents)."""
    from hpops_twin.world import TwinWorld

    return TwinWorld(extra_groups={CONTROLLER_GROUP: ("ml.m5.xlarge", 1)}, parameters={"AlarmEmail": ALARM_EMAIL},
                     agents_installed=not weeks_old, progress=progress)
