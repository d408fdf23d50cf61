"""`hpops doctor`'s decisions: pure functions from gathered facts to one finding per check and subject.

Nothing here calls AWS (doctor.py gathers); each function takes what it needs as plain values and
returns Findings whose message says what is wrong and whose fix says what to do.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

OK, PROBLEM, UNKNOWN, SKIPPED = "OK", "PROBLEM", "UNKNOWN", "SKIPPED"
# A fact the operator should know and may accept (exit status unchanged): the node role reachable to users.
NOTE = "NOTE"

# The order lines are printed in (and the order of value to an operator installing the product).
CHECKS = ("lifecycle-script", "node-agent-policy", "execution-role", "node-network", "node-endpoints", "verifier-path", "nlb-path",
          "network-acl", "host-identity", "kms-key-policy", "agent-reports", "enrollment", "alert-subscription",
          "cloudtrail", "run-as",
          "cost-allocation-tag", "slurm-usage", "accounting-enforce", "imds-exposure")
# What each check looks at, for `hpops doctor --help` (one line each, in CHECKS order).
CHECK_HELP = {
    "lifecycle-script": "on_create.sh runs hpops/install.sh before its final exit; the bundle is beside it",
    "node-agent-policy": "the login and controller groups' execution roles have NodeAgentPolicy",
    "execution-role": "those roles (shared with other groups or not) cannot read the stack's secrets",
    "node-network": "the nodes reach SSM, Lambda and EventBridge (and the SageMaker API on API-driven clusters): "
                    "NAT or interface endpoints",
    "node-endpoints": "those interface endpoints admit HTTPS from the nodes, with full-access policies",
    "verifier-path": "the login nodes' security group admits SSH from the verifier's",
    "nlb-path": "the login nodes' security group admits SSH from the NLB's; Client VPN users reach the NLB",
    "network-acl": "network ACLs pass SSH and its replies between the verifier, the NLB and the login nodes",
    "host-identity": "a host identity (keys or CA) is published",
    "kms-key-policy": "the host identity key's policy lets IAM grant its use",
    "agent-reports": "every Running login node's agent reports; else why (enrollment: outside the window, "
                     "contested, approval pending)",
    "enrollment": "no node is contested; whether the agents enrolled with AWS's signed identity documents "
                  "(a NOTE where IMDS serves none)",
    "alert-subscription": "the alert topic has a confirmed subscription",
    "cloudtrail": "a trail logs StartSession (session limits act at once)",
    "run-as": "Session Manager Run As is on, with no default user shared by everyone",
    "cost-allocation-tag": "the ClusterName cost allocation tag is active and on the cluster",
    "slurm-usage": "the controller's agent reports Slurm usage, GPUs included",
    "accounting-enforce": "with holds on, slurm.conf enforces limits",
    "imds-exposure": "which nodes leave their role to every user (a NOTE, not a failure)",
}
# Checks with one line per agent group (login, controller).
PER_GROUP = ("lifecycle-script", "node-agent-policy", "node-network", "node-endpoints")
# What the node agent calls from a node: desired state (SSM), NodeChannel (Lambda: enrollment, the
# host keys, its instructions), its reports (EventBridge). Secrets Manager is never called from a node.
NODE_SERVICES = ("ssm", "lambda", "events")
# install.sh reads DescribeCluster when no provisioning_parameters.json names the groups (API-driven
# Slurm configuration): then the nodes need the SageMaker API too.
SAGEMAKER_API = "sagemaker.api"
SERVICE_NAMES = {"ssm": "SSM", "lambda": "Lambda", "events": "EventBridge", SAGEMAKER_API: "the SageMaker API"}
BUNDLE_FILES = ("hpops/install.sh", "hpops/agent.json")
RUN_AS_OFF = "Run As is off: sessions run as root, per-user limits cannot apply"
RUN_AS_SHARED = "every principal without an SSMSessionRunAs tag runs as"
# A StartSession call as CloudTrail records it: what a trail's selectors must admit.
START_SESSION_EVENT = {"eventCategory": "Management", "readOnly": "false", "eventSource": "ssm.amazonaws.com",
                       "eventName": "StartSession"}


@dataclass(frozen=True)
class Finding:
    check: str
    status: str  # OK | PROBLEM | UNKNOWN (could not tell) | SKIPPED (needs the stack)
    message: str
    fix: str = ""
    subject: str = ""  # the instance group (or trail) the line is about, when a check has several

    def line(self) -> str:
        name = f"{self.check}[{self.subject}]" if self.subject else self.check
        text = f"{self.status} {name}: {self.message}"
        return text + (f". Fix: {self.fix}" if self.fix else "")

    def to_json(self) -> dict[str, str]:
        return asdict(self)


def exit_status(findings: Sequence[Finding]) -> int:
    """Every hpops command's rule (errors.EXIT_*): 1 when a check found a problem; else 2 when one could
    not tell (access denied, an unreadable fact); else 0. NOTE and SKIPPED lines change nothing."""
    from hpops.errors import EXIT_PROBLEM, EXIT_USAGE

    if any(f.status == PROBLEM for f in findings):
        return EXIT_PROBLEM
    return EXIT_USAGE if any(f.status == UNKNOWN for f in findings) else 0


# ---------------------------------------------------------------------------- 1. lifecycle script


@dataclass(frozen=True)
class LifecycleFacts:
    source_uri: str  # s3://bucket/prefix
    on_create: str
    script: str | None  # None: not found in S3
    bundle_present: Mapping[str, bool] = field(default_factory=dict)  # BUNDLE_FILES -> exists
    agent_config: Mapping[str, Any] | None = None  # agent.json as read, when present
    expected_agent_config: Mapping[str, str] | None = None  # what `hpops lifecycle` writes for this stack


def decide_lifecycle(group: str, facts: LifecycleFacts, stack_name: str | None) -> Finding:
    from hpops.lifecycle_script import INSTALL_LINE, check

    where = f"{facts.source_uri.rstrip('/')}/{facts.on_create}"
    lifecycle_cmd = f"hpops lifecycle --stack-name {stack_name or 'S'}"
    if facts.script is None:
        return Finding("lifecycle-script", PROBLEM, f"{where} not found",
                       "upload the cluster's on_create.sh there, or correct LifeCycleConfig", group)
    verdict = check(facts.script)
    if not verdict.reached:
        return Finding("lifecycle-script", PROBLEM, f"{where}: {verdict.reason}",
                       f"{lifecycle_cmd} --patch on_create.sh inserts `{INSTALL_LINE}` before its final exit; "
                       "upload it, then UpdateClusterSoftware for the nodes already running", group)
    missing = [name for name in BUNDLE_FILES if not facts.bundle_present.get(name)]
    prefix = facts.source_uri.rstrip("/")
    if missing:
        return Finding("lifecycle-script", PROBLEM, f"{where} runs hpops/install.sh but {', '.join(missing)} "
                       f"{'is' if len(missing) == 1 else 'are'} not beside it in {prefix}/",
                       f"{lifecycle_cmd} --out dist/lifecycle && aws s3 sync dist/lifecycle/hpops {prefix}/hpops/", group)
    expected, found = facts.expected_agent_config or {}, facts.agent_config or {}
    wrong = [f"{key} {found.get(key)!r} (this stack: {value!r})" for key, value in sorted(expected.items())
             if found.get(key) != value]
    if wrong:
        return Finding("lifecycle-script", PROBLEM, f"{prefix}/hpops/agent.json names {', '.join(wrong)}",
                       f"{lifecycle_cmd} --out dist/lifecycle && aws s3 sync dist/lifecycle/hpops {prefix}/hpops/", group)
    return Finding("lifecycle-script", OK, f"{where}: {verdict.reason}, before its final exit; the bundle is beside it",
                   subject=group)


# ---------------------------------------------------------------------------- 2. NodeAgentPolicy


def role_name(role_arn: str) -> str:
    """arn:aws:iam::123456789012:role/path/name -> name (IAM's role APIs take the name, not the path)."""
    return role_arn.rsplit("/", 1)[-1]


def decide_policy(group: str, role_arn: str, attached: Iterable[str], policy_arn: str) -> Finding:
    name = role_name(role_arn)
    if policy_arn in set(attached):
        return Finding("node-agent-policy", OK, f"execution role {name} has NodeAgentPolicy", subject=group)
    return Finding("node-agent-policy", PROBLEM,
                   f"execution role {name} does not have NodeAgentPolicy: its agent cannot read desired state or report",
                   f"aws iam attach-role-policy --role-name {name} --policy-arn {policy_arn} "
                   "(or set the stack's ClusterExecutionRoleName to it)", group)


# ---------------------------------------------------------------------------- 3. node network


@dataclass(frozen=True)
class SubnetPath:
    """A subnet's default route (0.0.0.0/0) as its route table has it."""

    subnet_id: str
    vpc_id: str
    route_table_id: str | None
    default_target: str | None  # nat-…, igw-…, tgw-…, eni-…, pcx-…; None: no active default route


@dataclass(frozen=True)
class Endpoint:
    vpc_id: str
    service: str  # the short name: ssm, lambda, events, sagemaker.api
    private_dns: bool
    endpoint_id: str


def _reaches_internet(target: str | None) -> bool:
    return bool(target) and target.startswith(("nat-", "igw-"))


def spoken(services: Sequence[str]) -> str:
    """ssm, lambda, events -> "SSM, Lambda and EventBridge"."""
    names = [SERVICE_NAMES.get(s, s) for s in services]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def create_endpoint_command(region: str, vpc: str, service: str, subnets: Sequence[str], groups: Sequence[str]) -> str:
    return (f"aws ec2 create-vpc-endpoint --vpc-id {vpc} --vpc-endpoint-type Interface --service-name "
            f"com.amazonaws.{region}.{service} --subnet-ids {' '.join(subnets) or 'SUBNET'} --security-group-ids "
            f"{' '.join(groups) or 'SG'} --private-dns-enabled")


def decide_network(group: str, region: str, subnets: Sequence[SubnetPath], endpoints: Sequence[Endpoint],
                   services: Sequence[str] = NODE_SERVICES, node_group_ids: Sequence[str] = ()) -> Finding:
    """``services``: what the agents call from these subnets (NODE_SERVICES, plus SAGEMAKER_API on an
    API-driven cluster); ``node_group_ids``: the nodes' security groups (for the fix's endpoint)."""
    if not subnets:
        return Finding("node-network", UNKNOWN, "the cluster's VpcConfig names no subnet for this group",
                       "check DescribeCluster's VpcConfig and the group's OverrideVpcConfig", group)
    problems, unsure, ways, lacking = [], [], set(), {}
    for subnet in subnets:
        if _reaches_internet(subnet.default_target):
            ways.add(f"{subnet.default_target.split('-', 1)[0]} gateway")
            continue
        have = {e.service for e in endpoints if e.vpc_id == subnet.vpc_id and e.private_dns}
        without_dns = sorted({e.service for e in endpoints if e.vpc_id == subnet.vpc_id and not e.private_dns} - have)
        missing = [s for s in services if s not in have]
        if not missing:
            ways.add("interface endpoints")
            continue
        for service in missing:
            lacking.setdefault((subnet.vpc_id, service), []).append(subnet.subnet_id)
        route = (f"its default route goes to {subnet.default_target}, which doctor cannot follow"
                 if subnet.default_target else
                 f"route table {subnet.route_table_id or '(none)'} has no default route to a NAT or internet gateway")
        text = (f"subnet {subnet.subnet_id}: {route}, and VPC {subnet.vpc_id} has no interface endpoint with "
                f"private DNS for {', '.join(missing)}")
        if without_dns:
            text += f" ({', '.join(without_dns)} without private DNS)"
        (unsure if subnet.default_target else problems).append(text)
    if problems or unsure:
        commands = "; ".join(create_endpoint_command(region, vpc, service, ids, node_group_ids)
                             for (vpc, service), ids in sorted(lacking.items()))
        return Finding("node-network", PROBLEM if problems else UNKNOWN,
                       "; ".join(problems + unsure) + f": the agents cannot reach {spoken(services)}, so no agent "
                       "enrolls and every login node is kept out",
                       f"{commands} (or a default route 0.0.0.0/0 to a NAT gateway)", group)
    return Finding("node-network", OK, f"subnets {', '.join(s.subnet_id for s in subnets)} reach "
                   f"{spoken(services)} ({' and '.join(sorted(ways))})", subject=group)


# ---------------------------------------------------------------------------- 4. verifier path


def _covers(permission: Mapping[str, Any], port: int) -> bool:
    protocol = str(permission.get("IpProtocol"))
    if protocol == "-1":
        return True
    if protocol not in ("tcp", "6"):
        return False
    return int(permission.get("FromPort", -1)) <= port <= int(permission.get("ToPort", -1))


def admits(permissions: Sequence[Mapping[str, Any]], port: int, group_ids: Iterable[str], cidrs: Iterable[str]) -> bool:
    """Do these security group rules admit TCP ``port`` from (or to) one of ``group_ids``, or from a CIDR
    range that contains every one of ``cidrs``?"""
    groups, networks = set(group_ids), [ipaddress.ip_network(c) for c in cidrs]
    for permission in permissions:
        if not _covers(permission, port):
            continue
        if groups & {pair.get("GroupId") for pair in permission.get("UserIdGroupPairs", [])}:
            return True
        ranges = [ipaddress.ip_network(r["CidrIp"]) for r in permission.get("IpRanges", []) if r.get("CidrIp")]
        if networks and all(any(n.subnet_of(r) for r in ranges) for n in networks):
            return True
    return False


@dataclass(frozen=True)
class VerifierFacts:
    ssh_port: int
    cluster_groups: Sequence[Mapping[str, Any]]  # DescribeSecurityGroups items of the login nodes' groups
    verifier_groups: Sequence[Mapping[str, Any]]  # ... of the verifier's groups
    verifier_subnets: Mapping[str, Mapping[str, Any]]  # subnet id -> DescribeSubnets item ({} when not found)
    cluster_subnet_cidrs: Sequence[str]
    target_group_vpc: str


def decide_verifier(facts: VerifierFacts) -> Finding:
    port = facts.ssh_port
    verifier_ids = [g["GroupId"] for g in facts.verifier_groups]
    verifier_cidrs = [s["CidrBlock"] for s in facts.verifier_subnets.values() if s.get("CidrBlock")]
    problems, fixes = [], []
    missing = sorted(subnet for subnet, found in facts.verifier_subnets.items() if not found)
    elsewhere = sorted(subnet for subnet, found in facts.verifier_subnets.items()
                       if found and found.get("VpcId") != facts.target_group_vpc)
    if missing:
        problems.append(f"verifier subnets {', '.join(missing)} do not exist")
    if elsewhere:
        problems.append(f"verifier subnets {', '.join(elsewhere)} are not in the target group's VPC {facts.target_group_vpc}")
    if missing or elsewhere:
        fixes.append(f"set VerifierSubnetIds to subnets of {facts.target_group_vpc}")
    if not any(admits(g.get("IpPermissions", []), port, verifier_ids, verifier_cidrs) for g in facts.cluster_groups):
        cluster_ids = [g["GroupId"] for g in facts.cluster_groups]
        problems.append(f"the cluster's security group {', '.join(cluster_ids)} does not admit TCP {port} from "
                        f"the verifier's {', '.join(verifier_ids)}: no login node can be verified, none takes traffic")
        fixes.append(f"aws ec2 authorize-security-group-ingress --group-id {cluster_ids[0] if cluster_ids else 'SG'} "
                     f"--protocol tcp --port {port} --source-group {verifier_ids[0] if verifier_ids else 'SG'}")
    elif not any(admits(g.get("IpPermissionsEgress", []), port, [g["GroupId"] for g in facts.cluster_groups],
                        facts.cluster_subnet_cidrs) for g in facts.verifier_groups):
        problems.append(f"the verifier's security group {', '.join(verifier_ids)} allows no TCP {port} out to the cluster")
        fixes.append(f"allow egress TCP {port} from {verifier_ids[0] if verifier_ids else 'it'} to the cluster's subnets")
    if problems:
        return Finding("verifier-path", PROBLEM, "; ".join(problems), "; ".join(fixes))
    return Finding("verifier-path", OK, f"the cluster's security group admits TCP {port} from the verifier's "
                   f"{', '.join(verifier_ids)}, in the target group's VPC {facts.target_group_vpc}")


# ---------------------------------------------------------------------------- 4b. load balancer path


@dataclass(frozen=True)
class ClientVpnEndpoint:
    """An AWS Client VPN endpoint in the NLB's VPC, as DescribeClientVpn* return it."""

    endpoint_id: str
    associated_subnet_cidrs: Sequence[str]  # its associated target networks (where it source-NATs users to)
    authorized_cidrs: Sequence[str]  # active authorization rules' destinations (any group)
    groups: Sequence[Mapping[str, Any]] = ()  # DescribeSecurityGroups items of its security groups


@dataclass(frozen=True)
class LoadBalancerFacts:
    ssh_port: int
    load_balancers: Sequence[Mapping[str, Any]]  # DescribeLoadBalancers items in front of the target group
    nlb_groups: Sequence[Mapping[str, Any]]  # DescribeSecurityGroups items of their security groups
    nlb_subnet_cidrs: Sequence[str]  # their subnets' CIDRs (where an NLB without a group connects from)
    cluster_groups: Sequence[Mapping[str, Any]]  # ... of the login nodes' groups
    cluster_subnet_cidrs: Sequence[str]
    client_vpn: Sequence[ClientVpnEndpoint] = ()  # the Client VPN endpoints in the NLB's VPC
    client_vpn_unread: str = ""  # why they could not be read ("" when they were)


def _client_vpn_problems(facts: LoadBalancerFacts, names: str, nlb_ids: Sequence[str]) -> tuple[list[str], list[str]]:
    """Users through Client VPN arrive from its associated subnets (it source-NATs them): the NLB's group
    must admit the SSH port from there, an authorization rule must cover the NLB's subnets, and the
    endpoint's own groups must let the connection out."""
    port, problems, fixes = facts.ssh_port, [], []
    for endpoint in facts.client_vpn:
        if not endpoint.associated_subnet_cidrs:
            continue  # not associated with a subnet: it carries no one yet
        if nlb_ids and not any(admits(g.get("IpPermissions", []), port, [], endpoint.associated_subnet_cidrs)
                               for g in facts.nlb_groups):
            problems.append(f"Client VPN {endpoint.endpoint_id}'s users arrive from {', '.join(endpoint.associated_subnet_cidrs)}, "
                            f"which {names}'s security group {', '.join(nlb_ids)} does not admit on TCP {port}")
            fixes.append(f"set LoadBalancerClientCidr to a range holding {', '.join(endpoint.associated_subnet_cidrs)}")
        targets = [ipaddress.ip_network(c) for c in facts.nlb_subnet_cidrs]
        authorized = [ipaddress.ip_network(c) for c in endpoint.authorized_cidrs]
        if targets and not all(any(t.subnet_of(a) for a in authorized) for t in targets):
            problems.append(f"no active authorization rule of Client VPN {endpoint.endpoint_id} covers {names}'s "
                            f"subnets {', '.join(facts.nlb_subnet_cidrs)}: its users cannot reach the load balancer")
            fixes.append(f"aws ec2 authorize-client-vpn-ingress --client-vpn-endpoint-id {endpoint.endpoint_id} "
                         f"--target-network-cidr {facts.nlb_subnet_cidrs[0]} --authorize-all-groups")
        if endpoint.groups and not any(admits(g.get("IpPermissionsEgress", []), port, nlb_ids, facts.nlb_subnet_cidrs)
                                       for g in endpoint.groups):
            problems.append(f"Client VPN {endpoint.endpoint_id}'s security group allows no TCP {port} out to {names}")
            fixes.append(f"allow egress TCP {port} from {endpoint.groups[0]['GroupId']} to the load balancer's subnets")
    return problems, fixes


def decide_load_balancer_path(facts: LoadBalancerFacts) -> Finding:
    """Users' connections and the health checks reach the login nodes from the NLB's security group
    (or, for an NLB without one, from its subnets): the nodes' group must admit the SSH port from it."""
    port = facts.ssh_port
    if not facts.load_balancers:
        return Finding("nlb-path", PROBLEM, "no load balancer forwards to the target group",
                       "add a TCP listener that forwards to it (or let the stack create the NLB)")
    names = ", ".join(lb.get("LoadBalancerName", lb.get("LoadBalancerArn", "?")) for lb in facts.load_balancers)
    nlb_ids = [g["GroupId"] for g in facts.nlb_groups]
    cluster_ids = [g["GroupId"] for g in facts.cluster_groups]
    source = f"security group {', '.join(nlb_ids)}" if nlb_ids else f"subnets {', '.join(facts.nlb_subnet_cidrs)}"
    if not any(admits(g.get("IpPermissions", []), port, nlb_ids, [] if nlb_ids else facts.nlb_subnet_cidrs)
               for g in facts.cluster_groups):
        fix = (f"aws ec2 authorize-security-group-ingress --group-id {cluster_ids[0] if cluster_ids else 'SG'} "
               f"--protocol tcp --port {port} " + (f"--source-group {nlb_ids[0]}" if nlb_ids
                                                  else f"--cidr {facts.nlb_subnet_cidrs[0] if facts.nlb_subnet_cidrs else 'CIDR'}"))
        return Finding("nlb-path", PROBLEM, f"the login nodes' security group {', '.join(cluster_ids) or '(none)'} does not "
                       f"admit TCP {port} from {names}'s {source}: health checks fail, so every target is unhealthy "
                       "and the NLB fails open", fix)
    if nlb_ids and not any(admits(g.get("IpPermissionsEgress", []), port, cluster_ids, facts.cluster_subnet_cidrs)
                           for g in facts.nlb_groups):
        return Finding("nlb-path", PROBLEM, f"{names}'s security group {', '.join(nlb_ids)} allows no TCP {port} out to "
                       "the login nodes", f"allow egress TCP {port} from {nlb_ids[0]} to the login nodes' subnets")
    problems, fixes = _client_vpn_problems(facts, names, nlb_ids)
    if problems:
        return Finding("nlb-path", PROBLEM, "; ".join(problems), "; ".join(fixes))
    note = "" if nlb_ids else " (the NLB has no security group: anything routed to it reaches its listener)"
    if facts.client_vpn_unread:
        note += f"; users' path not checked: {facts.client_vpn_unread}"
    elif facts.client_vpn:
        note += (f"; Client VPN {', '.join(e.endpoint_id for e in facts.client_vpn)} reaches it on TCP {port} "
                 "(its associated subnets admitted, an authorization rule covering its subnets)")
    else:
        note += "; no Client VPN endpoint in its VPC (a path through Site-to-Site VPN or Direct Connect is not seen from here)"
    return Finding("nlb-path", OK, f"the login nodes' security group admits TCP {port} from {names}'s {source}{note}")


# ---------------------------------------------------------------------------- 4c. network ACLs

# Where replies go: the connecting side's ephemeral port (Lambda and NLBs use 1024-65535; AWS's guidance
# for network ACLs). Each is checked: a rule for part of the range drops the rest.
EPHEMERAL_PORTS = (1024, 32768, 65535)
DEFAULT_ACL_RULE = 32767  # the "*" rule every network ACL ends with: deny


@dataclass(frozen=True)
class SubnetAcl:
    """A subnet and the network ACL associated with it (DescribeNetworkAcls)."""

    subnet_id: str
    cidr: str
    acl_id: str
    entries: Sequence[Mapping[str, Any]]  # the ACL's Entries


def acl_decides(entries: Sequence[Mapping[str, Any]], egress: bool, port: int, peer: str) -> tuple[bool, int | None]:
    """(allowed, the deciding rule number; None: the default deny) for TCP ``port`` to/from all of ``peer``.
    Rules are evaluated lowest number first and the first that matches decides; a deny that touches part of
    the peer's range drops that part, an allow decides only when it covers the whole range."""
    net = ipaddress.ip_network(peer)
    rules = sorted((e for e in entries if bool(e.get("Egress")) == egress and e.get("CidrBlock")),
                   key=lambda e: int(e.get("RuleNumber", 32767)))
    for entry in rules:
        protocol = str(entry.get("Protocol"))
        if protocol not in ("-1", "6", "tcp"):
            continue
        span = entry.get("PortRange") or {}
        if protocol != "-1" and not int(span.get("From", 0)) <= port <= int(span.get("To", 65535)):
            continue
        rule = ipaddress.ip_network(entry["CidrBlock"])
        if not rule.overlaps(net):
            continue
        if entry.get("RuleAction") == "deny":
            number = int(entry["RuleNumber"])
            return False, (None if number >= DEFAULT_ACL_RULE else number)
        if net.subnet_of(rule):
            return True, int(entry["RuleNumber"])
    return False, None


def _free_rule_number(entries: Sequence[Mapping[str, Any]], egress: bool, below: int | None) -> int:
    used = {int(e.get("RuleNumber", 0)) for e in entries if bool(e.get("Egress")) == egress}
    start = below - 1 if below else 100
    return next(n for n in [*range(start, 0, -1), *range(start + 1, 32767)] if n not in used)


def decide_network_acls(ssh_port: int, paths: Sequence[tuple[str, Sequence[SubnetAcl]]],
                        nodes: Sequence[SubnetAcl]) -> Finding:
    """``paths``: (what connects: "the verifier", "the load balancer", its subnets); ``nodes``: the login
    nodes' subnets. Each connection needs TCP ``ssh_port`` out of its subnet and into the nodes', and the
    replies back on ephemeral ports; security groups are stateful, network ACLs are not."""
    problems, fixes = [], []
    for label, sources in paths:
        for source in sources:
            for node in nodes:
                if source.subnet_id == node.subnet_id:
                    continue  # a network ACL does not filter traffic within its subnet
                legs = [(source, True, ssh_port, node, f"TCP {ssh_port} out of {label}'s subnet {source.subnet_id} "
                         f"to the login nodes' {node.cidr}"),
                        (node, False, ssh_port, source, f"TCP {ssh_port} into the login nodes' subnet {node.subnet_id} "
                         f"from {label}'s {source.cidr}")]
                legs += [(node, True, p, source, f"replies out of the login nodes' subnet {node.subnet_id} to "
                          f"{label}'s {source.cidr} on port {p}") for p in EPHEMERAL_PORTS]
                legs += [(source, False, p, node, f"replies into {label}'s subnet {source.subnet_id} from "
                          f"{node.cidr} on port {p}") for p in EPHEMERAL_PORTS]
                for subnet, egress, port, peer, what in legs:
                    allowed, rule = acl_decides(subnet.entries, egress, port, peer.cidr)
                    if allowed:
                        continue
                    by = f"rule {rule} denies it" if rule is not None else "no rule allows it"
                    problems.append(f"network ACL {subnet.acl_id} drops {what} ({by})")
                    span = f"From={ssh_port},To={ssh_port}" if port == ssh_port else "From=1024,To=65535"
                    fixes.append(f"aws ec2 create-network-acl-entry --network-acl-id {subnet.acl_id} "
                                 f"{'--egress' if egress else '--ingress'} --rule-number "
                                 f"{_free_rule_number(subnet.entries, egress, rule)} --protocol tcp --port-range {span} "
                                 f"--cidr-block {peer.cidr} --rule-action allow")
                    break  # the first leg dropped is enough to act on for this pair of subnets
    if problems:
        return Finding("network-acl", PROBLEM, "; ".join(dict.fromkeys(problems)) + ": the login nodes cannot be "
                       "verified or reached through the load balancer", "; ".join(dict.fromkeys(fixes)))
    checked = sorted({s.acl_id for _, sources in paths for s in sources} | {n.acl_id for n in nodes})
    return Finding("network-acl", OK, f"network ACLs {', '.join(checked) or '(none)'} pass TCP {ssh_port} from "
                   f"{' and '.join(label for label, _ in paths)} to the login nodes, and the replies")


# ---------------------------------------------------------------------------- 5. agent reports


def _parse_time(text: str | None) -> dt.datetime | None:
    if not text:
        return None
    try:
        parsed = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.timezone.utc)


def _age(now: dt.datetime, then: dt.datetime) -> str:
    minutes = int((now - then).total_seconds() // 60)
    return f"{minutes} min" if minutes < 120 else f"{minutes // 60} h" if minutes < 2880 else f"{minutes // 1440} days"


@dataclass(frozen=True)
class EnrollmentFacts:
    """What the stack knows of one node's agent key: its enrollment, an operator's pending approval, and
    AWS's launch time (enrollment without approval is open only within the window after launch)."""

    status: str | None  # enrolled | contested | None (no key enrolled)
    launched: dt.datetime | None
    approval: str | None = None  # the fingerprint a pending approval names


def approve_command(stack_name: str | None, instance_id: str) -> str:
    from hpops_core.node_channel.contract import READ_AGENT_FINGERPRINT

    return (f"read its agent's key fingerprint on the node (Session Manager, as root: {READ_AGENT_FINGERPRINT}), then "
            f"hpops node approve-enrollment --stack-name {stack_name or 'S'} --node {instance_id} --fingerprint SHA256:...")


def _enrollment_said(instance_id: str, facts: EnrollmentFacts | None, now: dt.datetime, window: dt.timedelta,
                     stack_name: str | None) -> tuple[str, str] | None:
    """(what is wrong, its fix) when the node's agent cannot speak for it; None when enrollment is not why."""
    if facts is None or facts.status == "enrolled":
        return None
    if facts.status == "contested":
        return (f"{instance_id} is contested (a second key claimed it inside the enrollment window): kept out until "
                "an operator re-enrolls it", approve_command(stack_name, instance_id))
    if facts.approval:
        return (f"{instance_id}'s agent has not enrolled yet; an approval for {facts.approval} waits for it",
                "it enrolls at its next attempt (within 5 minutes); if not, the key on the node is another: "
                + approve_command(stack_name, instance_id))
    minutes = int(window.total_seconds() // 60)
    if facts.launched is not None and now - facts.launched > window:
        return (f"{instance_id} was launched {_age(now, facts.launched)} ago, outside the {minutes}-minute enrollment "
                "window, and no approval names its agent's key: it cannot enroll, so it is kept out",
                f"hpops adopt --stack-name {stack_name or 'S'}, or {approve_command(stack_name, instance_id)}")
    return None


def decide_enrollment_proof(how: Mapping[str, str], contested: Sequence[str], documents_seen: bool,
                            stack_name: str | None) -> Finding:
    """``how``: instance id -> how its agent's key was enrolled (window, document, approval); ``contested``:
    instance ids whose enrollment two keys claimed; ``documents_seen``: an agent of the cluster enrolled
    with a verified instance identity document (so the nodes' IMDS serves them)."""
    stack = stack_name or "S"
    if contested:
        return Finding("enrollment", PROBLEM, f"{', '.join(sorted(contested))} contested: two keys claimed "
                       "it; its reports and secrets stop until settled",
                       f"hpops adopt --stack-name {stack} (reads each key as root on its node and approves it)")
    verified = sum(1 for value in how.values() if value == "document")
    counts = f"{len(how)} agent key(s) enrolled, {verified} with a verified instance identity document"
    if not documents_seen:
        return Finding("enrollment", NOTE, f"{counts}: no agent has sent one, so this cluster's IMDS does not serve "
                       "them (UNCONFIRMED on HyperPod) or its agents predate them; a new node's key is trusted as the "
                       "first presented inside its enrollment window, as before documents",
                       "accept it, or narrow the race: HostIdentityMode=certificate (no shared private key to win) "
                       "and ImdsLockdown=on (docs/security.md)")
    return Finding("enrollment", OK, f"{counts}; the nodes' IMDS serves them")


def decide_reports(group: str, running: Sequence[str], reports: Mapping[str, Mapping[str, Any]],
                   published_version: str | None, agent_version: str, now: dt.datetime,
                   max_age: dt.timedelta, stack_name: str | None,
                   enrollments: Mapping[str, EnrollmentFacts] | None = None,
                   window: dt.timedelta = dt.timedelta(minutes=60)) -> Finding:
    """``running``: the login group's Running instance ids; ``reports``: instance id -> latest report
    (report_store's JSON with receivedAt); ``published_version``: the host identity the stack published;
    ``enrollments``: instance id -> what the stack knows of its agent's key (a silent node's reason)."""
    if not running:
        return Finding("agent-reports", PROBLEM, "the login group has no Running node", subject=group)
    silent, late, behind, old = [], [], {}, {}
    problems, fixes = [], []
    for instance in sorted(running):
        report = reports.get(instance)
        received = _parse_time((report or {}).get("receivedAt"))
        if report is None or received is None or now - received > max_age:
            said = _enrollment_said(instance, (enrollments or {}).get(instance), now, window, stack_name)
            if said:
                problems.append(said[0])
                fixes.append(said[1])
            elif report is None or received is None:
                silent.append(instance)
            else:
                late.append(f"{instance} last reported {_age(now, received)} ago")
            continue
        identity = report.get("hostIdentity") or {}
        if published_version and identity.get("version") != published_version:
            said = f" ({identity['result']}: {identity.get('reason')})" if identity.get("result") in ("failed", "waiting") else ""
            behind.setdefault(f"{identity.get('version') or '(none)'}{said}", []).append(instance)
        if report.get("agentVersion") != agent_version:
            old.setdefault(str(report.get("agentVersion")), []).append(instance)
    if silent:
        problems.append(f"{', '.join(silent)} never reported")
    problems += late
    if silent or late:
        fixes.append("a node that does not report lacks the agent (lifecycle-script; for a node already running: "
                     f"hpops adopt --stack-name {stack_name or 'S'}), NodeAgentPolicy or a network path (the checks "
                     "above); on the node: journalctl -u hpops-node-agent")
    for version, instances in behind.items():
        problems.append(f"{', '.join(instances)} at host identity {version}, the stack published {published_version}")
    if behind:
        fixes.append(f"hpops repair --stack-name {stack_name or 'S'} (a sync publishes it and waits for the agents)")
    for version, instances in old.items():
        problems.append(f"{', '.join(instances)} run agent {version}, this hpops ships {agent_version}")
    if old:
        fixes.append(f"hpops lifecycle --stack-name {stack_name or 'S'}, sync the bundle to the lifecycle prefix, "
                     "then UpdateClusterSoftware on the login group")
    if problems:
        return Finding("agent-reports", PROBLEM, "; ".join(problems), "; ".join(fixes), group)
    return Finding("agent-reports", OK, f"{len(running)} Running login node{'s' if len(running) > 1 else ''} "
                   f"reported within {int(max_age.total_seconds() // 60)} min, agent {agent_version}"
                   + (f", host identity {published_version}" if published_version else ""), subject=group)


# ---------------------------------------------------------------------------- 6. CloudTrail


def _field_matches(selector: Mapping[str, Any], event: Mapping[str, str]) -> bool:
    value = event.get(selector.get("Field", ""))
    if value is None:  # a field a management event does not have (resources.type…): not this event
        return False
    positive = {"Equals": value.__eq__, "StartsWith": value.startswith, "EndsWith": value.endswith}
    negative = {"NotEquals": value.__eq__, "NotStartsWith": value.startswith, "NotEndsWith": value.endswith}
    for name, test in positive.items():
        if name in selector and not any(test(v) for v in selector[name]):
            return False
    for name, test in negative.items():
        if name in selector and any(test(v) for v in selector[name]):
            return False
    return True


def logs_start_session(event_selectors: Sequence[Mapping[str, Any]],
                       advanced_selectors: Sequence[Mapping[str, Any]]) -> bool:
    """Would a trail with these selectors log Session Manager's StartSession (a write management event)?
    A trail with neither kind of selector logs all management events (CloudTrail's default)."""
    if advanced_selectors:
        return any(all(_field_matches(f, START_SESSION_EVENT) for f in s.get("FieldSelectors", []))
                   for s in advanced_selectors)
    if not event_selectors:
        return True
    return any(s.get("IncludeManagementEvents", True) and s.get("ReadWriteType", "All") in ("All", "WriteOnly")
               and "ssm.amazonaws.com" not in s.get("ExcludeManagementEventSources", []) for s in event_selectors)


@dataclass(frozen=True)
class TrailFacts:
    name: str
    home_region: str
    multi_region: bool
    logging: bool
    event_selectors: Sequence[Mapping[str, Any]] = ()
    advanced_selectors: Sequence[Mapping[str, Any]] = ()
    unreadable: str = ""  # why its status or selectors could not be read (an organization's trail, say)


def decide_trail(region: str, trails: Sequence[TrailFacts]) -> Finding:
    here = [t for t in trails if t.multi_region or t.home_region == region]
    good = [t for t in here if not t.unreadable and t.logging
            and logs_start_session(t.event_selectors, t.advanced_selectors)]
    if good:
        return Finding("cloudtrail", OK, f"trail {good[0].name} logs management events (StartSession) in {region}")
    unreadable = [t for t in here if t.unreadable]
    if unreadable:
        return Finding("cloudtrail", UNKNOWN, "; ".join(f"trail {t.name}: {t.unreadable}" for t in unreadable)
                       + f"; no other trail logs StartSession in {region}",
                       "confirm that trail logs write management events, or allow cloudtrail:GetTrailStatus and "
                       "cloudtrail:GetEventSelectors on it")
    if not here:
        why = f"no CloudTrail trail covers {region}"
    else:
        why = "; ".join(f"trail {t.name} " + ("is not logging" if not t.logging else
                                              "does not log write management events from ssm.amazonaws.com")
                        for t in here)
    return Finding("cloudtrail", PROBLEM, f"{why}: StartSession events never reach EventBridge, so session limits "
                   "act only on the periodic sweep",
                   "create a trail that logs management events (read/write or write-only) in this region, "
                   "or start logging on the existing one (aws cloudtrail start-logging --name TRAIL)")


# ---------------------------------------------------------------------------- 7. Run As


def decide_run_as(document: Mapping[str, Any] | None) -> Finding:
    """``document``: the account's SSM-SessionManagerRunShell content, or None when it was never saved.
    Run As is account-wide: it applies to every Session Manager session in the region, not only the cluster's."""
    inputs = (document or {}).get("inputs") or {}
    enabled = inputs.get("runAsEnabled")
    preferences = "Session Manager > Preferences > Linux shell profile"
    if enabled is True or str(enabled).lower() == "true":
        default = inputs.get("runAsDefaultUser") or ""
        if default:
            return Finding("run-as", PROBLEM, f"Session Manager Run As is on with default user {default}: "
                           f"{RUN_AS_SHARED} {default}, so they share one session limit (one person's shells count "
                           "against, and may end for, another's)",
                           f"{preferences}: clear the default user, and tag each principal SSMSessionRunAs=<posix user> "
                           "(aws iam tag-role --role-name ROLE --tags Key=SSMSessionRunAs,Value=USER, or a session tag "
                           "from your identity provider)")
        return Finding("run-as", OK, "Session Manager Run As is on with no default user: each principal runs as "
                       "its SSMSessionRunAs tag")
    return Finding("run-as", PROBLEM, RUN_AS_OFF + " (HyperPod sessions connect as root)",
                   f"{preferences}: enable Run As support (account-wide: every Session Manager session in the "
                   "region), with no default user, and tag each principal SSMSessionRunAs=<posix user>")


# ---------------------------------------------------------------------------- 8. cost allocation tag


def decide_cost_tag(tag_key: str, cluster: str, allocation_tags: Sequence[Mapping[str, Any]],
                    cluster_tags: Mapping[str, str]) -> Finding:
    problems, fixes = [], []
    if cluster_tags.get(tag_key) != cluster:
        problems.append(f"the cluster has no tag {tag_key}={cluster}")
        fixes.append(f"tag the cluster {tag_key}={cluster} (aws sagemaker add-tags)")
    status = next((t.get("Status") for t in allocation_tags if t.get("TagKey") == tag_key), None)
    if status != "Active":
        problems.append(f"cost allocation tag {tag_key} is {'not yet known to billing' if status is None else status}: "
                        "Budgets and Cost Explorer read $0 for the cluster")
        fixes.append(f"aws ce update-cost-allocation-tags-status --cost-allocation-tags-status TagKey={tag_key},Status=Active"
                     + (" (billing lists a tag up to 24 h after a tagged resource is first billed)" if status is None else ""))
    if problems:
        return Finding("cost-allocation-tag", PROBLEM, "; ".join(problems), "; ".join(fixes))
    return Finding("cost-allocation-tag", OK, f"cost allocation tag {tag_key} is active and the cluster carries it")


# ---------------------------------------------------------------------------- 9. Slurm usage


@dataclass(frozen=True)
class UsageFacts:
    status: str
    reason: str
    collected_at: str
    instance_id: str


def decide_usage(group: str, usage: UsageFacts | None, now: dt.datetime, max_age: dt.timedelta,
                 gpu_not_tracked: str) -> Finding:
    """``gpu_not_tracked``: the reason the controller's agent gives when slurmdbd records no GPUs."""
    if usage is None:
        return Finding("slurm-usage", PROBLEM, "the controller's agent has never reported Slurm usage: per-user "
                       "spend reads $0", "install the agent on the controller group too (its lifecycle script), with "
                       "NodeAgentPolicy on its role", group)
    collected = _parse_time(usage.collected_at)
    if collected is None or now - collected > max_age:
        return Finding("slurm-usage", PROBLEM, f"the controller's agent ({usage.instance_id}) last reported usage "
                       f"{_age(now, collected) + ' ago' if collected else 'at an unknown time'}",
                       "check the node: journalctl -u hpops-node-agent", group)
    if usage.status != "ok":
        return Finding("slurm-usage", PROBLEM, f"the controller reports {usage.status}: {usage.reason}",
                       "enable Slurm accounting (AccountingStorageType=accounting_storage/slurmdbd with slurmdbd "
                       "running) and make sacct work on the controller", group)
    if gpu_not_tracked and gpu_not_tracked in usage.reason:
        return Finding("slurm-usage", PROBLEM, f"the controller reports usage, but {usage.reason}",
                       "add gres/gpu to AccountingStorageTRES in slurm.conf and restart slurmctld", group)
    return Finding("slurm-usage", OK, f"the controller's agent ({usage.instance_id}) reports Slurm usage "
                   f"({_age(now, collected)} ago), with no warning that GPUs are not tracked", subject=group)


# ---------------------------------------------------------------------------- 10. shared execution role


def _listed(value: Any) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value or ())


def _wildcard(pattern: str, text: str, case: bool) -> bool:
    """IAM's * and ? (fnmatch's [...] escaped: IAM has no character classes)."""
    pattern = pattern.replace("[", "[[]")
    return fnmatch.fnmatchcase(text, pattern) if case else fnmatch.fnmatchcase(text.lower(), pattern.lower())


def _statement_covers(statement: Mapping[str, Any], action: str, resource: str) -> bool:
    if "NotAction" in statement:
        acts = not any(_wildcard(a, action, False) for a in _listed(statement["NotAction"]))
    else:
        acts = any(_wildcard(a, action, False) for a in _listed(statement.get("Action")))
    if "NotResource" in statement:
        on = not any(_wildcard(r, resource, True) for r in _listed(statement["NotResource"]))
    else:
        on = any(_wildcard(r, resource, True) for r in _listed(statement.get("Resource", "*")))
    return acts and on


def policy_allows(documents: Mapping[str, Mapping[str, Any]], action: str, resource: str) -> list[str]:
    """The policies (by name) whose Allow covers ``action`` on ``resource``; [] if none does or a Deny
    covers it. An Allow with a Condition counts: doctor cannot evaluate it, and it may hold."""
    allowing, denied = [], False
    for name, document in sorted(documents.items()):
        statements = document.get("Statement") or []
        for statement in [statements] if isinstance(statements, Mapping) else statements:
            if not _statement_covers(statement, action, resource):
                continue
            if statement.get("Effect") == "Deny" and not statement.get("Condition"):
                denied = True
            elif statement.get("Effect") == "Allow" and name not in allowing:
                allowing.append(name)
    return [] if denied else allowing


@dataclass(frozen=True)
class RoleGrants:
    """An execution role's policies as the operator can read them."""

    role: str
    documents: Mapping[str, Mapping[str, Any]]  # policy name -> document (inline ones named "<name> (inline)")
    unreadable: Sequence[str] = ()


@dataclass(frozen=True)
class Guarded:
    """What no user holding a node's role may read: the stack's secrets and the key that encrypts them
    (ARNs; before a deploy, stand-ins a wildcard grant would still match)."""

    secrets: Mapping[str, str]  # "the canonical host keys" -> secret ARN
    key_arn: str
    absent: Mapping[str, str] = field(default_factory=dict)  # a secret this stack does not have -> why


def decide_execution_role(roles: Mapping[str, str], node_groups: Sequence[str], role_parameter: str | None,
                          grants: Mapping[str, RoleGrants], guarded: Guarded) -> Finding:
    """``roles``: every instance group -> its ExecutionRole ARN; ``node_groups``: the groups that run the agent
    (login, controller); ``grants``: each of their roles' policies. Every user on a node holds its role, and
    groups often share one: what matters is what the role can do, not who shares it. It may do what
    NodeAgentPolicy gives (public desired state, calls the stack accepts only when signed by an enrolled
    agent); it must not read the stack's secrets."""
    agent_roles = sorted({role_name(roles[g]) for g in node_groups if g in roles} | ({role_parameter} if role_parameter else set()))
    groups_of: dict[str, list[str]] = {}
    for group, arn in sorted(roles.items()):
        groups_of.setdefault(role_name(arn), []).append(group)
    problems, fixes, unread = [], [], []
    for role in agent_roles:
        grant = grants.get(role)
        if grant is None:
            continue
        unread += [f"{role}: {name}" for name in grant.unreadable]
        decrypt = policy_allows(grant.documents, "kms:Decrypt", guarded.key_arn)
        for label, secret in sorted(guarded.secrets.items()):
            read = policy_allows(grant.documents, "secretsmanager:GetSecretValue", secret)
            if read and decrypt:
                users = ", ".join(groups_of.get(role, [])) or "its groups"
                problems.append(f"role {role} may read {label} ({', '.join(sorted(set(read + decrypt)))} allow "
                                f"secretsmanager:GetSecretValue and kms:Decrypt on them): every user on {users} can "
                                "take the role from IMDS and read them")
                fixes.append(f"narrow {', '.join(read)} on role {role} so secretsmanager:GetSecretValue does not cover "
                             f"{secret} (the agent never reads it: NodeChannel hands an enrolled agent what it needs)")
    if problems:
        return Finding("execution-role", PROBLEM, "; ".join(problems), "; ".join(dict.fromkeys(fixes)))
    if unread:
        return Finding("execution-role", UNKNOWN, f"could not read {', '.join(unread)}: whether the role reads the "
                       "stack's secrets is unknown", "allow iam:GetPolicy, iam:GetPolicyVersion and iam:GetRolePolicy "
                       "on them to the operator (hpops iam-policy)")
    shared = {r: g for r, g in groups_of.items() if r in agent_roles and any(x not in node_groups for x in g)}
    said = "; ".join(f"{role} is shared with {', '.join(x for x in g if x not in node_groups)}" for role, g in sorted(shared.items()))
    skipped = "; ".join(f"{label} not checked: {why}" for label, why in sorted(guarded.absent.items()))
    return Finding("execution-role", OK, f"role{'s' if len(agent_roles) > 1 else ''} {', '.join(agent_roles) or '(none)'} "
                   f"cannot read {' or '.join(sorted(guarded.secrets))}" + (f" ({said}: its users get only the public "
                   "desired state; the stack trusts the enrolled agent's key, not the role)" if said else "")
                   + (f" ({skipped})" if skipped else ""))


# ---------------------------------------------------------------------------- 11. VPC endpoints


@dataclass(frozen=True)
class EndpointFacts:
    endpoint_id: str
    service: str  # ssm, lambda, events, sagemaker.api
    security_groups: Sequence[Mapping[str, Any]]  # DescribeSecurityGroups items of the endpoint's groups
    policy: Mapping[str, Any] | None  # the endpoint policy (None: the default, full access)


def _policy_blocks(policy: Mapping[str, Any] | None) -> str:
    """Why an endpoint policy may refuse the agent's calls ('' for full access: the default policy)."""
    if not policy:
        return ""
    statements = policy.get("Statement") or []
    statements = [statements] if isinstance(statements, Mapping) else statements
    if any(s.get("Effect") == "Deny" for s in statements):
        return "has a Deny statement"
    full = any(s.get("Effect") == "Allow" and s.get("Principal") in ("*", {"AWS": "*"})
               and s.get("Action") in ("*", ["*"]) and s.get("Resource", "*") in ("*", ["*"])
               and not s.get("Condition") for s in statements)
    return "" if full else "is not full access (doctor does not evaluate custom endpoint policies)"


def decide_endpoints(group: str, node_group_ids: Sequence[str], node_cidrs: Sequence[str],
                     endpoints: Sequence[EndpointFacts]) -> Finding:
    """The interface endpoints the agents' calls may take (NODE_SERVICES in the nodes' VPC): each must admit
    HTTPS from the nodes and let their calls through."""
    if not endpoints:
        return Finding("node-endpoints", OK, f"no interface endpoint for {', '.join(NODE_SERVICES)} in the "
                       "nodes' VPC: the agents' calls take the NAT route (node-network)", subject=group)
    problems, fixes = [], []
    for endpoint in sorted(endpoints, key=lambda e: e.service):
        if not any(admits(g.get("IpPermissions", []), 443, node_group_ids, node_cidrs) for g in endpoint.security_groups):
            names = [g["GroupId"] for g in endpoint.security_groups]
            problems.append(f"{endpoint.service} endpoint {endpoint.endpoint_id}: its security group "
                            f"{', '.join(names) or '(none)'} does not admit TCP 443 from the nodes")
            fixes.append(f"aws ec2 authorize-security-group-ingress --group-id {names[0] if names else 'SG'} "
                         f"--protocol tcp --port 443 --source-group {node_group_ids[0] if node_group_ids else 'SG'}")
        why = _policy_blocks(endpoint.policy)
        if why:
            problems.append(f"{endpoint.service} endpoint {endpoint.endpoint_id}: its policy {why}")
            fixes.append(f"aws ec2 modify-vpc-endpoint --vpc-endpoint-id {endpoint.endpoint_id} --reset-policy")
    if problems:
        return Finding("node-endpoints", PROBLEM, "; ".join(problems) + ": the agents' calls fail, every login "
                       "node is kept out", "; ".join(fixes), group)
    return Finding("node-endpoints", OK, f"endpoints for {', '.join(sorted({e.service for e in endpoints}))} admit "
                   "HTTPS from the nodes, with full-access policies", subject=group)


# ---------------------------------------------------------------------------- 12. host identity published


def decide_host_identity(mode: str, published: Mapping[str, Any] | None, stack_name: str) -> Finding:
    """``mode``: the stack's HostIdentityMode; ``published``: the record `hpops host-keys` publishes (None: never)."""
    if mode == "off":
        return Finding("host-identity", OK, "HostIdentityMode off: login nodes take traffic without a host identity "
                       "check")
    command = (f"hpops host-keys ca-generate --stack-name {stack_name}" if mode == "certificate"
               else f"hpops host-keys generate --stack-name {stack_name}")
    if not published:
        return Finding("host-identity", PROBLEM, f"HostIdentityMode {mode}, but no host identity was ever published: "
                       "no login node passes verification, the target group stays empty and nobody can log in",
                       f"{command} (or `hpops host-keys adopt` to keep the nodes' current keys)")
    if published.get("mode") != mode:
        return Finding("host-identity", PROBLEM, f"HostIdentityMode {mode}, but the published host identity is "
                       f"{published.get('mode')}'s: every login node fails verification", command)
    return Finding("host-identity", OK, f"host identity published ({mode}, version {str(published.get('version'))[:8]})")


# ---------------------------------------------------------------------------- 13. KMS key policy


def decide_key_policy(key_id: str, policy: Mapping[str, Any], account: str) -> Finding:
    """The host identity key's policy must let the account's IAM policies grant its use (the template's
    statement): without it NodeAgentPolicy's kms:Decrypt means nothing and no agent reads the host keys."""
    statements = policy.get("Statement") or []
    statements = [statements] if isinstance(statements, Mapping) else statements
    root = {f"arn:aws:iam::{account}:root", account}

    def principals(statement: Mapping[str, Any]) -> set[str]:
        value = (statement.get("Principal") or {})
        value = value.get("AWS", []) if isinstance(value, Mapping) else value
        return set([value] if isinstance(value, str) else value)

    def actions(statement: Mapping[str, Any]) -> set[str]:
        value = statement.get("Action", [])
        return set([value] if isinstance(value, str) else value)

    denies = [s.get("Sid") or "(no Sid)" for s in statements if s.get("Effect") == "Deny"
              and actions(s) & {"kms:*", "kms:Decrypt", "*"}]
    delegated = any(s.get("Effect") == "Allow" and principals(s) & root and actions(s) & {"kms:*", "*"}
                    for s in statements)
    fix = (f"aws kms put-key-policy --key-id {key_id} --policy-name default --policy "
           f"'{{\"Version\":\"2012-10-17\",\"Statement\":[{{\"Effect\":\"Allow\",\"Principal\":{{\"AWS\":"
           f"\"arn:aws:iam::{account}:root\"}},\"Action\":\"kms:*\",\"Resource\":\"*\"}}]}}'")
    if denies:
        return Finding("kms-key-policy", PROBLEM, f"key {key_id}'s policy denies kms:Decrypt ({', '.join(denies)}): "
                       "no agent can read the canonical host keys", fix)
    if not delegated:
        return Finding("kms-key-policy", PROBLEM, f"key {key_id}'s policy does not let the account's IAM policies "
                       "grant its use: NodeAgentPolicy's kms:Decrypt is void, no agent can read the host keys", fix)
    return Finding("kms-key-policy", OK, f"key {key_id}'s policy lets IAM grant its use (the template's)")


# ---------------------------------------------------------------------------- 14. alert subscription


def decide_alert_subscription(topic_arn: str, alarm_email: str, subscriptions: Sequence[Mapping[str, Any]]) -> Finding:
    """``subscriptions``: ListSubscriptionsByTopic items of the stack's AlertTopic."""
    topic = topic_arn.rsplit(":", 1)[-1]
    confirmed = [s for s in subscriptions if s.get("SubscriptionArn", "").startswith("arn:")]
    pending = [s.get("Endpoint", "?") for s in subscriptions if s.get("SubscriptionArn") == "PendingConfirmation"]
    if alarm_email and alarm_email in pending:
        return Finding("alert-subscription", PROBLEM, f"{alarm_email} never confirmed its subscription to {topic}: "
                       "alarms and alerts reach nobody", f"aws sns subscribe --topic-arn {topic_arn} --protocol email "
                       f"--notification-endpoint {alarm_email} (sends a new confirmation link: open it)")
    if not confirmed:
        waiting = f" ({', '.join(pending)} pending confirmation)" if pending else ""
        return Finding("alert-subscription", PROBLEM, f"{topic} has no confirmed subscription{waiting}: alarms and "
                       "alerts reach nobody", f"aws sns subscribe --topic-arn {topic_arn} --protocol email "
                       "--notification-endpoint you@example.org (or set AlarmEmail), then confirm the e-mail")
    return Finding("alert-subscription", OK, f"{topic} has {len(confirmed)} confirmed subscription"
                   f"{'s' if len(confirmed) > 1 else ''}")


# ---------------------------------------------------------------------------- 15. AccountingStorageEnforce


def decide_accounting_enforce(group: str, holds_on: bool, agent: Mapping[str, Any] | None, fix: str) -> Finding:
    """``agent``: the controller agent's latest holds report (enforced: bool | None, enforceReason);
    ``fix``: the node agent's own words for the slurm.conf change."""
    if not holds_on:
        return Finding("accounting-enforce", OK, "UserBudgetAction is not hold: no Slurm limit to enforce",
                       subject=group)
    if agent is None:
        return Finding("accounting-enforce", UNKNOWN, "not checkable yet: the controller's agent has sent no holds "
                       "report, and AWS has no API that reads slurm.conf (the agent reads `scontrol show config`)",
                       "install the agent on the controller group (lifecycle-script, adopt); it reports within one poll",
                       group)
    if agent.get("enforced") is True:
        return Finding("accounting-enforce", OK, "the controller reports AccountingStorageEnforce includes limits: "
                       "holds apply", subject=group)
    if agent.get("enforced") is False:
        return Finding("accounting-enforce", PROBLEM, f"{agent.get('enforceReason') or 'limits not enforced'}: "
                       "a hold is recorded but Slurm still starts the held user's jobs", fix, group)
    return Finding("accounting-enforce", UNKNOWN, f"the controller cannot tell: {agent.get('enforceReason')}",
                   "on the controller: scontrol show config | grep AccountingStorageEnforce", group)


# ---------------------------------------------------------------------------- 16. IMDS exposure


@dataclass(frozen=True)
class RoleExposure:
    """What a process holding an instance group's execution role may call, as far as the operator can read."""

    role: str
    policies: Mapping[str, Sequence[str]]  # policy name -> its Allow actions ("*" = everything)
    unreadable: Sequence[str] = ()  # policies whose document the operator could not read


def imds_probes(node_reports: Mapping[str, Mapping[str, Any]], controller: Mapping[str, Any] | None) -> dict[str, str]:
    """Instance id -> the agent's last IMDS probe result: login nodes' in their node reports, the
    controller's in its holds report (kept only from the controller group's enrolled agent)."""
    probed = {i: (r.get("imds") or {}).get("nonRoot") for i, r in node_reports.items() if r.get("imds")}
    said = (controller or {}).get("imds") or {}
    if said.get("nonRoot") and controller.get("instanceId") and controller["instanceId"] not in probed:
        probed[controller["instanceId"]] = said["nonRoot"]
    return probed


def decide_imds_exposure(group: str, nodes: Sequence[str], reported: Mapping[str, str], lockdown: str,
                         exposure: RoleExposure, stack_name: str | None) -> Finding:
    """``nodes``: the group's Running instance ids; ``reported``: instance id -> the agent's last probe
    result (reachable | blocked | no-imds | unknown); nodes without an agent report are taken as reachable
    unless the stack's ImdsLockdown is on (then: applied by the installer, not verified)."""
    if not nodes:
        return Finding("imds-exposure", OK, "no Running node", subject=group)
    open_nodes: dict[str, list[str]] = {}
    unverified = []
    for instance in sorted(nodes):
        result = reported.get(instance)
        if result in ("blocked", "no-imds"):
            continue
        if result is None and lockdown == "on":
            unverified.append(instance)
        else:
            open_nodes.setdefault(result or "no agent report", []).append(instance)
    grants = "; ".join(f"{name}: {', '.join(sorted(actions)) or 'no Allow'}" for name, actions
                       in sorted(exposure.policies.items()))
    unread = f"; not readable by you: {', '.join(exposure.unreadable)}" if exposure.unreadable else ""
    if not open_nodes:
        said = f"; {len(unverified)} without an agent report rely on the installer's rules" if unverified else ""
        return Finding("imds-exposure", OK, f"no node leaves role {exposure.role} to non-root users{said}",
                       subject=group)
    count = sum(len(ids) for ids in open_nodes.values())
    shown = "; ".join(f"{said}: {', '.join(ids[:5])}{f' and {len(ids) - 5} more' if len(ids) > 5 else ''}"
                      for said, ids in sorted(open_nodes.items()))
    return Finding("imds-exposure", NOTE,
                   f"{count} of {len(nodes)} node(s) leave role {exposure.role} reachable to every "
                   f"user ({shown}); it allows {grants or 'nothing readable'}{unread}",
                   "accept it (the stack trusts only the enrolled agent's key, not the role), or set the stack's "
                   f"ImdsLockdown=on, run hpops lifecycle --stack-name {stack_name or 'S'} and re-install "
                   "(users' own aws calls then need credentials of their own)", group)
