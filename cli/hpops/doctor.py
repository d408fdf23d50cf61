"""`hpops doctor`: what an account or cluster lacks for hpops to work, one line per check.

Gathers facts from AWS with the operator's credentials, then decides with doctor_checks (pure).
Given a stack it runs every check; given only a cluster and region (before a deploy) it runs those
that need no stack: the lifecycle script, the node network, CloudTrail, Run As, the cost tag.
A check whose facts cannot be read (access denied, say) is one UNKNOWN line saying why; the others
still run.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from hpops import doctor_checks as checks
from hpops.doctor_checks import SKIPPED, UNKNOWN, Finding
from hpops.errors import explain
from hpops.node_reports import read_node_reports
from hpops_core.common.errors import HpopsError

DOCTOR_FORMAT = "hpops.doctor.v1"

# Every IAM action doctor calls, for the operator policy. None of them changes anything.
DOCTOR_IAM_ACTIONS = (
    "cloudformation:DescribeStacks",
    "cloudformation:DescribeStackResource",  # the stack-created verifier security group
    "sagemaker:DescribeCluster",
    "sagemaker:ListClusterNodes",
    "sagemaker:ListTags",
    "s3:GetObject",  # on_create.sh and the bundle in the lifecycle prefix
    "s3:ListBucket",  # so that a missing bundle file reads as missing (404), not as access denied (403)
    "iam:ListAttachedRolePolicies",
    "iam:ListRolePolicies",  # imds-exposure: what the role a user can take from IMDS allows
    "iam:GetRolePolicy",
    "iam:GetPolicy",
    "iam:GetPolicyVersion",
    "ec2:DescribeSubnets",
    "ec2:DescribeRouteTables",
    "ec2:DescribeVpcEndpoints",
    "ec2:DescribeClientVpnEndpoints",  # nlb-path: users' side through Client VPN (optional: the rest is checked without)
    "ec2:DescribeClientVpnTargetNetworks",
    "ec2:DescribeClientVpnAuthorizationRules",
    "ec2:DescribeSecurityGroups",
    "ec2:DescribeNetworkAcls",  # network-acl: TCP 22 and its replies between the verifier, the NLB and the nodes
    "elasticloadbalancing:DescribeTargetGroups",
    "elasticloadbalancing:DescribeLoadBalancers",  # the NLB's security groups and subnets
    "dynamodb:GetItem",
    "dynamodb:Query",
    "cloudtrail:DescribeTrails",
    "cloudtrail:GetTrailStatus",
    "cloudtrail:GetEventSelectors",
    "ssm:GetDocument",
    "ce:ListCostAllocationTags",
    "sns:ListSubscriptionsByTopic",  # is the alert e-mail confirmed?
    "kms:GetKeyPolicy",  # the host identity key's policy
)
# Lines for checks that need what only a deployed stack has.
NEEDS_STACK = ("node-agent-policy", "verifier-path", "nlb-path", "network-acl", "host-identity", "kms-key-policy", "agent-reports",
               "enrollment", "alert-subscription", "slurm-usage", "accounting-enforce", "imds-exposure")
# Heartbeats every DEFAULT_HEARTBEAT_SECONDS: two missed and a margin mean the agent is not reporting.
REPORT_MAX_AGE = dt.timedelta(minutes=25)
# The controller collects usage every DEFAULT_USAGE_SECONDS (15 min); three missed windows is silence.
USAGE_MAX_AGE = dt.timedelta(minutes=60)
GATHER_ERRORS = (ClientError, BotoCoreError, HpopsError, NotImplementedError, ValueError, KeyError)


@dataclass(frozen=True)
class StackView:
    """What doctor reads of a deployed stack: outputs, parameters, and physical ids of its resources."""

    name: str
    outputs: Mapping[str, str]
    parameters: Mapping[str, str]
    physical_id: Callable[[str], str | None] = field(default=lambda logical_id: None)


@dataclass(frozen=True)
class Target:
    cluster: str
    region: str
    login_group: str | None  # None before a deploy: the group SlurmConfig names, else the template's default
    controller_group: str | None
    ssh_port: int
    stack: StackView | None = None


def physical_ids(session: Any, stack_name: str) -> Callable[[str], str | None]:
    """A deployed stack's resource ids by logical id (None for one a condition left out)."""
    cloudformation = session.client("cloudformation")

    def physical_id(logical_id: str) -> str | None:
        try:
            return cloudformation.describe_stack_resource(StackName=stack_name, LogicalResourceId=logical_id)[
                "StackResourceDetail"].get("PhysicalResourceId")
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") == "ValidationError":  # no such resource in the stack
                return None
            raise

    return physical_id


def target_of_stack(stack: StackView, region: str) -> Target:
    parameters = stack.parameters
    return Target(cluster=parameters["ClusterName"], region=region,
                  login_group=parameters.get("LoginGroupName") or "login",
                  controller_group=parameters.get("ControllerGroupName") or "controller-machine",
                  ssh_port=int(parameters.get("SshPort") or 22), stack=stack)


def run_doctor(session: Any, target: Target, now: dt.datetime) -> list[Finding]:
    """Every check in CHECKS order; the ones that need the stack are SKIPPED without one."""
    findings: list[Finding] = []
    try:
        cluster = session.client("sagemaker").describe_cluster(ClusterName=target.cluster)
    except GATHER_ERRORS as error:
        return [Finding("cluster", UNKNOWN, f"cannot describe cluster {target.cluster}: {explain(error, target.region)}",
                        "check --cluster / the stack's ClusterName, and --region")]
    groups = {g["InstanceGroupName"]: g for g in cluster.get("InstanceGroups", [])}
    if target.stack is None:  # before a deploy: API-driven Slurm configuration names the groups' roles
        target = replace(target, login_group=target.login_group or _group_of_type(groups, "Login") or "login",
                         controller_group=target.controller_group or _group_of_type(groups, "Controller")
                         or "controller-machine")
    named = [("login", target.login_group), ("controller", target.controller_group)]
    for role, name in named:
        if name not in groups:
            findings.append(Finding("cluster", checks.PROBLEM, f"cluster {target.cluster} has no {role} group {name} "
                                    f"(its groups: {', '.join(sorted(groups)) or 'none'})",
                                    f"set the stack's {'LoginGroupName' if role == 'login' else 'ControllerGroupName'}"
                                    " to the right group"))
    present = [(role, name) for role, name in named if name in groups]
    for check in checks.CHECKS:
        if target.stack is None and check in NEEDS_STACK:
            findings.append(Finding(check, SKIPPED, "needs the deployed stack: run with --stack-name S"))
            continue
        findings += _run_check(check, session, target, cluster, groups, present, now)
    return findings


def node_services(groups: Mapping[str, dict]) -> tuple[str, ...]:
    """What the agents call from the nodes: NODE_SERVICES, and the SageMaker API on an API-driven cluster
    (its groups carry SlurmConfig; install.sh then reads DescribeCluster for the groups' roles)."""
    api_driven = any(g.get("SlurmConfig") for g in groups.values())
    return checks.NODE_SERVICES + ((checks.SAGEMAKER_API,) if api_driven else ())


def _group_of_type(groups: Mapping[str, dict], node_type: str) -> str | None:
    """The one instance group whose SlurmConfig.NodeType is ``node_type``, if exactly one is."""
    named = [name for name, g in groups.items() if (g.get("SlurmConfig") or {}).get("NodeType") == node_type]
    return named[0] if len(named) == 1 else None


def _run_check(check: str, session: Any, target: Target, cluster: dict, groups: dict,
               present: list[tuple[str, str]], now: dt.datetime) -> list[Finding]:
    def guarded(subject: str, decide: Callable[[], Finding]) -> Finding:
        try:
            return decide()
        except GATHER_ERRORS as error:
            return Finding(check, UNKNOWN, f"could not tell: {explain(error, target.region)}", subject=subject)

    stack = target.stack
    if check == "lifecycle-script":
        return [guarded(name, lambda g=groups[name]: checks.decide_lifecycle(
            g["InstanceGroupName"], _lifecycle_facts(session, g, target), stack and stack.name)) for _, name in present]
    if check == "node-agent-policy":
        policy = stack.outputs["NodeAgentPolicyArn"]
        iam = session.client("iam")
        return [guarded(name, lambda g=groups[name]: checks.decide_policy(
            g["InstanceGroupName"], g["ExecutionRole"], _attached(iam, checks.role_name(g["ExecutionRole"])), policy))
            for _, name in present]
    if check == "execution-role":
        return [guarded("", lambda: _decide_execution_role(session, target, groups, [name for _, name in present]))]
    if check == "node-endpoints":
        ec2 = session.client("ec2")
        return [guarded(name, lambda g=groups[name]: checks.decide_endpoints(
            g["InstanceGroupName"], *_endpoint_facts(ec2, _vpc_config(cluster, g), target.region, node_services(groups))))
            for _, name in present]
    if check == "host-identity":
        return [guarded("", lambda: _decide_host_identity(session, target))]
    if check == "kms-key-policy":
        return [guarded("", lambda: _decide_key_policy(session, target))]
    if check == "alert-subscription":
        return [guarded("", lambda: _decide_subscription(session, target))]
    if check == "accounting-enforce":
        return [guarded(target.controller_group, lambda: _decide_enforce(session, target))]
    if check == "node-network":
        ec2 = session.client("ec2")
        return [guarded(name, lambda g=groups[name]: checks.decide_network(
            g["InstanceGroupName"], target.region,
            *_network_facts(ec2, _vpc_config(cluster, g), target.region, node_services(groups)),
            services=node_services(groups), node_group_ids=_vpc_config(cluster, g).get("SecurityGroupIds", [])))
            for _, name in present]
    if check == "verifier-path":
        return [guarded("", lambda: checks.decide_verifier(_verifier_facts(session, target, cluster, groups)))]
    if check == "nlb-path":
        return [guarded("", lambda: checks.decide_load_balancer_path(_load_balancer_facts(session, target, cluster, groups)))]
    if check == "network-acl":
        return [guarded("", lambda: _decide_network_acls(session, target, cluster, groups))]
    if check == "agent-reports":
        return [guarded(target.login_group, lambda: _decide_reports(session, target, now))]
    if check == "enrollment":
        return [guarded("", lambda: _decide_enrollment(session, target))]
    if check == "cloudtrail":
        return [guarded("", lambda: checks.decide_trail(target.region, _trails(session, target.region)))]
    if check == "run-as":
        return [guarded("", lambda: checks.decide_run_as(_session_preferences(session.client("ssm"))))]
    if check == "cost-allocation-tag":
        return [guarded("", lambda: _decide_cost_tag(session, target, cluster))]
    if check == "slurm-usage":
        return [guarded(target.controller_group, lambda: _decide_usage(session, target, now))]
    if check == "imds-exposure":
        return _decide_imds(session, target, groups, guarded)
    raise ValueError(f"unknown check {check}")


# ---------------------------------------------------------------------------- gathering


def _s3_location(uri: str) -> tuple[str, str]:
    """s3://bucket/prefix[/] -> (bucket, "prefix/") ("" for the bucket's root)."""
    if not uri.startswith("s3://"):
        raise ValueError(f"LifeCycleConfig.SourceS3Uri {uri!r} is not an s3:// URI")
    bucket, _, prefix = uri[len("s3://"):].partition("/")
    prefix = prefix.strip("/")
    return bucket, f"{prefix}/" if prefix else ""


def _s3_text(s3: Any, bucket: str, key: str) -> str | None:
    try:
        return s3.get_object(Bucket=bucket, Key=key)["Body"].read().decode("utf-8", "replace")
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
            return None
        raise


def _s3_exists(s3: Any, bucket: str, key: str) -> bool:
    try:
        s3.head_object(Bucket=bucket, Key=key)
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
            return False
        raise
    return True


def _lifecycle_facts(session: Any, group: dict, target: Target) -> checks.LifecycleFacts:
    config = group.get("LifeCycleConfig") or {}
    bucket, prefix = _s3_location(config.get("SourceS3Uri", ""))
    s3 = session.client("s3")
    try:
        script = _s3_text(s3, bucket, prefix + config.get("OnCreate", ""))
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") != "NoSuchBucket":
            raise
        return checks.LifecycleFacts(f"s3://{bucket}/{prefix}", config.get("OnCreate", ""), None)
    agent_json = _s3_text(s3, bucket, prefix + "hpops/agent.json")
    present = {"hpops/agent.json": agent_json is not None, "hpops/install.sh": _s3_exists(s3, bucket, prefix + "hpops/install.sh")}
    try:
        agent_config = json.loads(agent_json) if agent_json else None
    except ValueError:
        agent_config = {}
    expected = {"cluster": target.cluster, "region": target.region}
    if target.stack is not None:
        expected["reportBus"] = target.stack.outputs["NodeReportBusName"]
    return checks.LifecycleFacts(f"s3://{bucket}/{prefix}", config.get("OnCreate", ""), script, present,
                                 agent_config if isinstance(agent_config, dict) or agent_config is None else {},
                                 expected)


def _attached(iam: Any, role: str) -> list[str]:
    pages = iam.get_paginator("list_attached_role_policies").paginate(RoleName=role)
    return [p["PolicyArn"] for page in pages for p in page["AttachedPolicies"]]


def _vpc_config(cluster: dict, group: dict) -> dict:
    """The group's own VpcConfig when it overrides the cluster's."""
    return group.get("OverrideVpcConfig") or cluster.get("VpcConfig") or {}


def _network_facts(ec2: Any, vpc_config: dict, region: str,
                   services: tuple[str, ...]) -> tuple[list[checks.SubnetPath], list[checks.Endpoint]]:
    subnet_ids = list(vpc_config.get("Subnets", []))
    if not subnet_ids:
        return [], []
    subnets = {s["SubnetId"]: s for s in ec2.describe_subnets(SubnetIds=subnet_ids)["Subnets"]}
    paths, vpcs = [], sorted({s["VpcId"] for s in subnets.values()})
    tables = [t for page in ec2.get_paginator("describe_route_tables").paginate(
        Filters=[{"Name": "vpc-id", "Values": vpcs}]) for t in page["RouteTables"]]
    for subnet_id in subnet_ids:
        vpc = subnets[subnet_id]["VpcId"]
        explicit = [t for t in tables if any(a.get("SubnetId") == subnet_id for a in t.get("Associations", []))]
        main = [t for t in tables if t["VpcId"] == vpc and any(a.get("Main") for a in t.get("Associations", []))]
        table = (explicit or main or [None])[0]
        target = None
        for route in (table or {}).get("Routes", []):
            if route.get("DestinationCidrBlock") == "0.0.0.0/0" and route.get("State", "active") == "active":
                target = (route.get("NatGatewayId") or route.get("GatewayId") or route.get("TransitGatewayId")
                          or route.get("NetworkInterfaceId") or route.get("VpcPeeringConnectionId")
                          or route.get("InstanceId") or "another target")
        paths.append(checks.SubnetPath(subnet_id, vpc, table and table["RouteTableId"], target))
    names = {f"com.amazonaws.{region}.{service}": service for service in services}
    endpoints = [checks.Endpoint(e["VpcId"], names[e["ServiceName"]], bool(e.get("PrivateDnsEnabled")), e["VpcEndpointId"])
                 for page in ec2.get_paginator("describe_vpc_endpoints").paginate(
                     Filters=[{"Name": "vpc-id", "Values": vpcs}, {"Name": "service-name", "Values": list(names)}])
                 for e in page["VpcEndpoints"]
                 if e["ServiceName"] in names and e.get("VpcEndpointType", "Interface") == "Interface"
                 and e.get("State", "available").lower() == "available"]
    return paths, endpoints


def _endpoint_facts(ec2: Any, vpc_config: dict, region: str,
                    services: tuple[str, ...]) -> tuple[list[str], list[str], list[checks.EndpointFacts]]:
    """The nodes' security groups and subnet ranges, and the interface endpoints of their VPC for ``services``."""
    node_groups, subnet_ids = list(vpc_config.get("SecurityGroupIds", [])), list(vpc_config.get("Subnets", []))
    subnets = ec2.describe_subnets(SubnetIds=subnet_ids)["Subnets"] if subnet_ids else []
    vpcs = sorted({s["VpcId"] for s in subnets})
    if not vpcs:
        return node_groups, [], []
    names = {f"com.amazonaws.{region}.{service}": service for service in services}
    found = [e for page in ec2.get_paginator("describe_vpc_endpoints").paginate(
        Filters=[{"Name": "vpc-id", "Values": vpcs}, {"Name": "service-name", "Values": list(names)}])
        for e in page["VpcEndpoints"] if e["ServiceName"] in names
        and e.get("VpcEndpointType", "Interface") == "Interface"
        and e.get("State", "available").lower() in ("available", "pending", "pendingacceptance")]
    group_ids = sorted({g["GroupId"] for e in found for g in e.get("Groups", [])})
    described = {g["GroupId"]: g for g in ec2.describe_security_groups(GroupIds=group_ids)["SecurityGroups"]} \
        if group_ids else {}
    endpoints = [checks.EndpointFacts(e["VpcEndpointId"], names[e["ServiceName"]],
                                      [described[g["GroupId"]] for g in e.get("Groups", []) if g["GroupId"] in described],
                                      json.loads(e["PolicyDocument"]) if e.get("PolicyDocument") else None)
                 for e in found]
    return node_groups, [s["CidrBlock"] for s in subnets], endpoints


def _decide_host_identity(session: Any, target: Target) -> Finding:
    from hpops_core.host_identity.identity_record import read_expected

    stack = target.stack
    published = read_expected(session.client("dynamodb"), stack.outputs["SyncStateTableName"], target.cluster)
    return checks.decide_host_identity(stack.parameters.get("HostIdentityMode") or "keys", published, stack.name)


def _decide_key_policy(session: Any, target: Target) -> Finding:
    key = target.stack.physical_id("HostIdentityKey")
    if not key:
        raise ValueError("the stack has no HostIdentityKey resource")
    policy = session.client("kms").get_key_policy(KeyId=key, PolicyName="default")["Policy"]
    account = target.stack.outputs["AlertTopicArn"].split(":")[4]  # the stack's account, from an ARN it made
    return checks.decide_key_policy(key, json.loads(policy), account)


def _decide_subscription(session: Any, target: Target) -> Finding:
    topic = target.stack.outputs["AlertTopicArn"]
    pages = session.client("sns").get_paginator("list_subscriptions_by_topic").paginate(TopicArn=topic)
    return checks.decide_alert_subscription(topic, target.stack.parameters.get("AlarmEmail") or "",
                                            [s for page in pages for s in page["Subscriptions"]])


def _decide_enforce(session: Any, target: Target) -> Finding:
    from hpops_core.budget_guard.hold_state import read_agent_report
    from hpops_node_agent.slurm_holds import ENFORCE_FIX

    holds_on = (target.stack.parameters.get("UserBudgetAction") or "alert") == "hold"
    agent = read_agent_report(target.stack.outputs["SyncStateTableName"], target.cluster,
                              session.client("dynamodb")) if holds_on else None
    return checks.decide_accounting_enforce(target.controller_group, holds_on, agent, ENFORCE_FIX)


def _split(text: str | None) -> list[str]:
    return [part.strip() for part in (text or "").split(",") if part.strip()]


def _verifier_facts(session: Any, target: Target, cluster: dict, groups: dict) -> checks.VerifierFacts:
    stack = target.stack
    ec2 = session.client("ec2")
    verifier_ids = _split(stack.parameters.get("VerifierSecurityGroupIds")) or [
        i for i in [stack.physical_id("VerifierSecurityGroup")] if i]
    login = groups.get(target.login_group) or {}
    login_vpc = _vpc_config(cluster, login)
    cluster_ids = list(login_vpc.get("SecurityGroupIds", []))
    # With no ids at all DescribeSecurityGroups would list every group of the account.
    described = {g["GroupId"]: g for g in ec2.describe_security_groups(GroupIds=cluster_ids + verifier_ids)[
        "SecurityGroups"]} if cluster_ids + verifier_ids else {}
    subnet_ids = _split(stack.parameters.get("VerifierSubnetIds"))
    found = {}
    for subnet in subnet_ids:  # one at a time: DescribeSubnets refuses a whole list for one unknown id
        try:
            found[subnet] = ec2.describe_subnets(SubnetIds=[subnet])["Subnets"][0]
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") != "InvalidSubnetID.NotFound":
                raise
            found[subnet] = {}
    cluster_subnets = ec2.describe_subnets(SubnetIds=list(login_vpc.get("Subnets", [])))["Subnets"] \
        if login_vpc.get("Subnets") else []
    target_group = session.client("elbv2").describe_target_groups(
        TargetGroupArns=[stack.outputs["TargetGroupArn"]])["TargetGroups"][0]
    return checks.VerifierFacts(
        ssh_port=target.ssh_port, cluster_groups=[described[i] for i in cluster_ids if i in described],
        verifier_groups=[described[i] for i in verifier_ids if i in described], verifier_subnets=found,
        cluster_subnet_cidrs=[s["CidrBlock"] for s in cluster_subnets], target_group_vpc=target_group["VpcId"])


def _load_balancer_facts(session: Any, target: Target, cluster: dict, groups: dict) -> checks.LoadBalancerFacts:
    """The load balancers in front of the stack's target group (created or existing), their security
    groups and subnets, and the login nodes' groups."""
    ec2, elbv2 = session.client("ec2"), session.client("elbv2")
    target_group = elbv2.describe_target_groups(TargetGroupArns=[target.stack.outputs["TargetGroupArn"]])["TargetGroups"][0]
    arns = list(target_group.get("LoadBalancerArns", []))
    balancers = elbv2.describe_load_balancers(LoadBalancerArns=arns)["LoadBalancers"] if arns else []
    nlb_ids = sorted({g for lb in balancers for g in lb.get("SecurityGroups", [])})
    subnet_ids = [z["SubnetId"] for lb in balancers for z in lb.get("AvailabilityZones", []) if z.get("SubnetId")]
    login_vpc = _vpc_config(cluster, groups.get(target.login_group) or {})
    cluster_ids = list(login_vpc.get("SecurityGroupIds", []))
    described = {g["GroupId"]: g for g in ec2.describe_security_groups(GroupIds=cluster_ids + nlb_ids)[
        "SecurityGroups"]} if cluster_ids + nlb_ids else {}

    def cidrs(ids: list[str]) -> list[str]:
        return [s["CidrBlock"] for s in ec2.describe_subnets(SubnetIds=ids)["Subnets"]] if ids else []

    vpcs = sorted({lb["VpcId"] for lb in balancers if lb.get("VpcId")})
    try:
        client_vpn, unread = _client_vpn_endpoints(ec2, vpcs, cidrs), ""
    except ClientError as error:  # the rest of the path is still worth checking
        client_vpn, unread = [], explain(error, target.region)
    return checks.LoadBalancerFacts(
        ssh_port=target.ssh_port, load_balancers=balancers, nlb_groups=[described[i] for i in nlb_ids if i in described],
        nlb_subnet_cidrs=cidrs(subnet_ids), cluster_groups=[described[i] for i in cluster_ids if i in described],
        cluster_subnet_cidrs=cidrs(list(login_vpc.get("Subnets", []))), client_vpn=client_vpn, client_vpn_unread=unread)


def _client_vpn_endpoints(ec2: Any, vpcs: list[str], cidrs: Callable[[list[str]], list[str]]) -> list[checks.ClientVpnEndpoint]:
    """The Client VPN endpoints in the load balancers' VPCs: their associated subnets, active authorization
    rules and security groups (DescribeClientVpnEndpoints/TargetNetworks/AuthorizationRules, paged)."""
    if not vpcs:
        return []
    pages = ec2.get_paginator("describe_client_vpn_endpoints").paginate()
    endpoints = [e for page in pages for e in page.get("ClientVpnEndpoints", []) if e.get("VpcId") in vpcs
                 and e.get("Status", {}).get("Code") != "deleted"]
    found = []
    for endpoint in endpoints:
        endpoint_id = endpoint["ClientVpnEndpointId"]
        networks = [n for page in ec2.get_paginator("describe_client_vpn_target_networks").paginate(
            ClientVpnEndpointId=endpoint_id) for n in page.get("ClientVpnTargetNetworks", [])]
        rules = [r for page in ec2.get_paginator("describe_client_vpn_authorization_rules").paginate(
            ClientVpnEndpointId=endpoint_id) for r in page.get("AuthorizationRules", [])]
        group_ids = list(endpoint.get("SecurityGroupIds", []))
        groups = ec2.describe_security_groups(GroupIds=group_ids)["SecurityGroups"] if group_ids else []
        found.append(checks.ClientVpnEndpoint(
            endpoint_id,
            cidrs([n["TargetNetworkId"] for n in networks if n.get("Status", {}).get("Code") == "associated"]),
            # A rule for some groups only still lets those users in; one for all users says AccessAll.
            [r["DestinationCidr"] for r in rules if r.get("Status", {}).get("Code") == "active"], groups))
    return found


def _decide_reports(session: Any, target: Target, now: dt.datetime) -> Finding:
    from hpops_core.host_identity.identity_record import read_expected
    from hpops_node_agent import __version__ as agent_version

    stack = target.stack
    sagemaker, dynamodb = session.client("sagemaker"), session.client("dynamodb")
    pages = sagemaker.get_paginator("list_cluster_nodes").paginate(
        ClusterName=target.cluster, InstanceGroupNameContains=target.login_group)
    running = [(s["InstanceId"], s.get("LaunchTime")) for p in pages for s in p["ClusterNodeSummaries"]
               if s["InstanceGroupName"] == target.login_group and s["InstanceStatus"]["Status"] == "Running"]
    table = stack.outputs["SyncStateTableName"]
    published = read_expected(dynamodb, table, target.cluster) or {}
    version = published.get("version") if published.get("mode") in ("keys", "certificate") else None
    reports = read_node_reports(dynamodb, table, target.cluster)
    window = dt.timedelta(minutes=int(stack.parameters.get("EnrollmentWindowMinutes") or 60))
    return checks.decide_reports(target.login_group, [i for i, _ in running], reports, version, agent_version, now,
                                 REPORT_MAX_AGE, stack.name, _enrollment_facts(dynamodb, table, target.cluster, running),
                                 window)


def _enrollment_facts(dynamodb: Any, table: str, cluster: str,
                      running: list[tuple[str, Any]]) -> dict[str, checks.EnrollmentFacts]:
    """Each Running node's enrollment status, pending approval and launch time (ListClusterNodes')."""
    from hpops_core.node_channel import enrollment_store

    records, approvals = enrollment_store.list_enrollments(table, cluster, dynamodb=dynamodb)
    status = {r.instance_id: r.status for r in records}
    approved = {a["instanceId"]: a["fingerprint"] for a in approvals}
    return {instance: checks.EnrollmentFacts(status.get(instance), _utc(launch), approved.get(instance))
            for instance, launch in running}


def _utc(value: Any) -> dt.datetime | None:
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)
    return None


def _decide_enrollment(session: Any, target: Target) -> Finding:
    from hpops_core.node_channel import enrollment_store

    records, _, documents = enrollment_store.read_enrollments(
        target.stack.outputs["SyncStateTableName"], target.cluster, dynamodb=session.client("dynamodb"))
    return checks.decide_enrollment_proof({r.instance_id: r.via for r in records},
                                          [r.instance_id for r in records if not r.usable], documents, target.stack.name)


def _trails(session: Any, region: str) -> list[checks.TrailFacts]:
    facts = []
    for trail in session.client("cloudtrail").describe_trails(includeShadowTrails=True)["trailList"]:
        # A shadow trail (multi-region, or an organization's) is read in its home region.
        home = trail.get("HomeRegion") or region
        client = session.client("cloudtrail", region_name=home)
        arn = trail.get("TrailARN") or trail["Name"]
        multi_region = bool(trail.get("IsMultiRegionTrail"))
        try:
            status = client.get_trail_status(Name=arn)
            selectors = client.get_event_selectors(TrailName=arn)
        except ClientError as error:  # one trail we may not read does not hide another that is fine
            facts.append(checks.TrailFacts(trail["Name"], home, multi_region, False, unreadable=explain(error, home)))
            continue
        facts.append(checks.TrailFacts(trail["Name"], home, multi_region, bool(status.get("IsLogging")),
                                       selectors.get("EventSelectors") or [],
                                       selectors.get("AdvancedEventSelectors") or []))
    return facts


def _session_preferences(ssm: Any) -> dict | None:
    try:
        content = ssm.get_document(Name="SSM-SessionManagerRunShell", DocumentFormat="JSON")["Content"]
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") == "InvalidDocument":  # preferences never saved
            return None
        raise
    return json.loads(content)


def _decide_cost_tag(session: Any, target: Target, cluster: dict) -> Finding:
    from hpops_core.budget_guard.aws_budgets import ce_client
    from hpops_core.budget_guard.budget_spec import CLUSTER_TAG

    answer = ce_client(session).list_cost_allocation_tags(TagKeys=[CLUSTER_TAG])
    tags = session.client("sagemaker").list_tags(ResourceArn=cluster["ClusterArn"]).get("Tags", [])
    return checks.decide_cost_tag(CLUSTER_TAG, target.cluster, answer.get("CostAllocationTags", []),
                                  {t["Key"]: t["Value"] for t in tags})


def _decide_usage(session: Any, target: Target, now: dt.datetime) -> Finding:
    from hpops_core.budget_guard.usage_store import collector_status
    from hpops_node_agent.usage import GPU_NOT_TRACKED

    status = collector_status(target.stack.outputs["SyncStateTableName"], target.cluster, session.client("dynamodb"))
    facts = None if status is None else checks.UsageFacts(status.status, status.reason, status.collected_at,
                                                          status.instance_id)
    return checks.decide_usage(target.controller_group, facts, now, USAGE_MAX_AGE, GPU_NOT_TRACKED)


def _decide_imds(session: Any, target: Target, groups: Mapping[str, dict],
                 guarded: Callable[[str, Callable[[], Finding]], Finding]) -> list[Finding]:
    """One line per instance group: its nodes' last IMDS probe and what its execution role allows."""
    stack = target.stack
    iam, sagemaker = session.client("iam"), session.client("sagemaker")
    lockdown = (stack.parameters.get("ImdsLockdown") or "off")
    reports: dict[str, dict] = {}
    controller: dict[str, Any] = {}
    running: dict[str, list[str]] = {}
    exposures: dict[str, checks.RoleExposure] = {}

    def facts() -> None:
        from hpops_core.budget_guard.hold_state import read_agent_report

        table, dynamodb = stack.outputs["SyncStateTableName"], session.client("dynamodb")
        reports.update(read_node_reports(dynamodb, table, target.cluster))
        controller.update(read_agent_report(table, target.cluster, dynamodb) or {})
        pages = sagemaker.get_paginator("list_cluster_nodes").paginate(ClusterName=target.cluster)
        for page in pages:
            for node in page["ClusterNodeSummaries"]:
                if node["InstanceStatus"]["Status"] == "Running":
                    running.setdefault(node["InstanceGroupName"], []).append(node["InstanceId"])

    def decide(name: str) -> Finding:
        if not reports and not running:
            facts()
        role = checks.role_name(groups[name]["ExecutionRole"])
        if role not in exposures:
            exposures[role] = _role_exposure(iam, role)
        probed = checks.imds_probes(reports, controller or None)
        return checks.decide_imds_exposure(name, running.get(name, []), probed, lockdown, exposures[role], stack.name)

    return [guarded(name, lambda n=name: decide(n)) for name in sorted(groups)]


def _role_policies(iam: Any, role: str) -> checks.RoleGrants:
    """The role's attached and inline policy documents, and the names of those the operator may not read."""
    documents: dict[str, dict] = {}
    unreadable: list[str] = []
    for arn in _attached(iam, role):
        name = arn.rsplit("/", 1)[-1]
        try:
            version = iam.get_policy(PolicyArn=arn)["Policy"]["DefaultVersionId"]
            documents[name] = _document(iam.get_policy_version(PolicyArn=arn, VersionId=version)["PolicyVersion"]["Document"])
        except ClientError:
            unreadable.append(name)
    for page in iam.get_paginator("list_role_policies").paginate(RoleName=role):
        for name in page["PolicyNames"]:
            try:
                documents[f"{name} (inline)"] = _document(iam.get_role_policy(RoleName=role, PolicyName=name)["PolicyDocument"])
            except ClientError:
                unreadable.append(name)
    return checks.RoleGrants(role, documents, tuple(unreadable))


def _role_exposure(iam: Any, role: str) -> checks.RoleExposure:
    grants = _role_policies(iam, role)
    return checks.RoleExposure(role, {name: _allowed_actions(document) for name, document in grants.documents.items()},
                               grants.unreadable)


def _document(document: Any) -> dict:
    """A policy document as IAM returns it: URL-encoded JSON, or already parsed (boto3 decodes it)."""
    if isinstance(document, str):
        from urllib.parse import unquote

        return json.loads(unquote(document))
    return document


def _decide_execution_role(session: Any, target: Target, groups: Mapping[str, dict], node_groups: list[str]) -> Finding:
    """What each role the agents run with (and everyone sharing it) can read of the stack's secrets."""
    stack = target.stack
    roles = {name: g.get("ExecutionRole", "") for name, g in groups.items()}
    parameter = stack.parameters.get("ClusterExecutionRoleName") if stack else None
    names = sorted({checks.role_name(roles[g]) for g in node_groups if roles.get(g)} | ({parameter} if parameter else set()))
    iam = session.client("iam")
    grants = {name: _role_policies(iam, name) for name in names}
    account = next((arn.split(":")[4] for arn in roles.values() if arn.count(":") >= 5), "*")
    region = target.region
    secrets, absent = {}, {}
    if stack is not None:
        for label, output in (("the canonical host keys", "HostIdentitySecretArn"),
                              ("the host CA", "HostCertificateAuthoritySecretArn")):
            arn = stack.outputs.get(output)
            if arn:
                secrets[label] = arn
            elif output == "HostCertificateAuthoritySecretArn":
                absent[label] = "the stack is in keys mode, which creates no CA secret"
        key = stack.physical_id("HostIdentityKey") or "*"
        key_arn = key if key.startswith("arn:") else f"arn:aws:kms:{region}:{account}:key/{key}"
    else:  # before a deploy: a grant that would cover the stack's secret whatever its name
        secrets["the stack's secrets (any secret)"] = f"arn:aws:secretsmanager:{region}:{account}:secret:hpops-stack-secret"
        key_arn = f"arn:aws:kms:{region}:{account}:key/hpops-stack-key"
    return checks.decide_execution_role(roles, node_groups, parameter, grants,
                                        checks.Guarded(secrets, key_arn, absent))


def _decide_network_acls(session: Any, target: Target, cluster: dict, groups: dict) -> Finding:
    """The network ACLs of the login nodes' subnets and of the subnets the verifier and the NLB connect from."""
    ec2, elbv2, stack = session.client("ec2"), session.client("elbv2"), target.stack
    nodes = list(_vpc_config(cluster, groups.get(target.login_group) or {}).get("Subnets", []))
    verifier = _split(stack.parameters.get("VerifierSubnetIds"))
    target_group = elbv2.describe_target_groups(TargetGroupArns=[stack.outputs["TargetGroupArn"]])["TargetGroups"][0]
    arns = list(target_group.get("LoadBalancerArns", []))
    balancers = elbv2.describe_load_balancers(LoadBalancerArns=arns)["LoadBalancers"] if arns else []
    nlb = [z["SubnetId"] for lb in balancers for z in lb.get("AvailabilityZones", []) if z.get("SubnetId")]
    every = sorted(set(nodes + verifier + nlb))
    if not every:
        raise ValueError("no subnet of the login nodes, the verifier or the load balancer to check")
    subnets = ec2.describe_subnets(SubnetIds=every)["Subnets"]
    cidrs = {s["SubnetId"]: s["CidrBlock"] for s in subnets}
    acls = {}
    # By VPC (a few ACLs each): every subnet is associated with exactly one of them.
    for page in ec2.get_paginator("describe_network_acls").paginate(
            Filters=[{"Name": "vpc-id", "Values": sorted({s["VpcId"] for s in subnets})}]):
        for acl in page["NetworkAcls"]:
            for association in acl.get("Associations", []):
                if association.get("SubnetId") in cidrs:
                    acls[association["SubnetId"]] = acl

    def subnet_acls(ids: list[str]) -> list[checks.SubnetAcl]:
        return [checks.SubnetAcl(i, cidrs[i], acls[i]["NetworkAclId"], acls[i].get("Entries", []))
                for i in ids if i in cidrs and i in acls]

    return checks.decide_network_acls(target.ssh_port, [("the verifier", subnet_acls(verifier)),
                                                        ("the load balancer", subnet_acls(nlb))], subnet_acls(nodes))


def _allowed_actions(document: Mapping[str, Any]) -> list[str]:
    """The Allow statements' actions of a policy document."""
    statements = document.get("Statement", [])
    if isinstance(statements, dict):
        statements = [statements]
    actions: set[str] = set()
    for statement in statements:
        if statement.get("Effect") != "Allow":
            continue
        listed = statement.get("Action", [])
        actions.update([listed] if isinstance(listed, str) else listed)
        if "NotAction" in statement:
            actions.add("all but " + ",".join(statement["NotAction"] if isinstance(statement["NotAction"], list)
                                               else [statement["NotAction"]]))
    return sorted(actions)


# ---------------------------------------------------------------------------- output


def doctor_document(target: Target, findings: list[Finding]) -> dict:
    return {"format": DOCTOR_FORMAT, "cluster": target.cluster, "region": target.region,
            "stack": target.stack.name if target.stack else None,
            "checks": [f.to_json() for f in findings], "exitStatus": checks.exit_status(findings)}


def print_doctor(target: Target, findings: list[Finding], as_json: bool) -> int:
    document = doctor_document(target, findings)
    if as_json:
        print(json.dumps(document, indent=2))
    else:
        for finding in findings:
            print(finding.line())
    return document["exitStatus"]
