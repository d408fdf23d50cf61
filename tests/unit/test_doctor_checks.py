"""doctor_checks' decisions on the facts the twin does not produce: VPC endpoints instead of a NAT,
CloudTrail advanced selectors, CIDR-based security group rules, a verifier subnet in another VPC,
stale reports and old agents, an unset preferences document, a tag billing has never seen."""

from __future__ import annotations

import datetime as dt

import pytest

from hpops import doctor_checks as checks
from hpops.doctor_checks import OK, PROBLEM, UNKNOWN, ClientVpnEndpoint, Endpoint, LoadBalancerFacts, SubnetPath, TrailFacts, VerifierFacts

REGION = "us-east-1"
NOW = dt.datetime(2026, 11, 20, 12, 0, tzinfo=dt.timezone.utc)
PRIVATE = SubnetPath("subnet-a", "vpc-1", "rtb-1", None)


def _endpoints(*services: str, private_dns: bool = True, vpc: str = "vpc-1") -> list[Endpoint]:
    return [Endpoint(vpc, s, private_dns, f"vpce-{s}") for s in services]


def test_a_private_subnet_with_an_endpoint_for_each_service_the_agent_calls_is_ok():
    finding = checks.decide_network("login", REGION, [PRIVATE], _endpoints("ssm", "lambda", "events"))
    assert finding.status == OK and "interface endpoints" in finding.message
    assert "SSM, Lambda and EventBridge" in finding.message
    # An API-driven cluster's install.sh reads DescribeCluster: the SageMaker API endpoint is needed too.
    api = checks.decide_network("login", REGION, [PRIVATE], _endpoints("ssm", "lambda", "events"),
                                services=checks.NODE_SERVICES + (checks.SAGEMAKER_API,), node_group_ids=["sg-nodes"])
    assert api.status == PROBLEM and "no interface endpoint with private DNS for sagemaker.api" in api.message
    assert ("aws ec2 create-vpc-endpoint --vpc-id vpc-1 --vpc-endpoint-type Interface --service-name "
            "com.amazonaws.us-east-1.sagemaker.api --subnet-ids subnet-a --security-group-ids sg-nodes "
            "--private-dns-enabled") in api.fix


def test_a_missing_lambda_endpoint_or_one_without_private_dns_is_named_and_secrets_manager_is_not_asked_for():
    endpoints = _endpoints("ssm", "events") + _endpoints("lambda", private_dns=False)
    finding = checks.decide_network("login", REGION, [PRIVATE], endpoints)
    assert finding.status == PROBLEM
    assert "no interface endpoint with private DNS for lambda (lambda without private DNS)" in finding.message
    assert "com.amazonaws.us-east-1.lambda" in finding.fix and "secretsmanager" not in finding.line()
    # An endpoint in another VPC does not serve this subnet.
    other = checks.decide_network("login", REGION, [PRIVATE], _endpoints("ssm", "lambda", "events", vpc="vpc-2"))
    assert other.status == PROBLEM


def test_a_default_route_doctor_cannot_follow_is_unknown_not_ok():
    finding = checks.decide_network("login", REGION, [SubnetPath("subnet-a", "vpc-1", "rtb-1", "tgw-0abc")], [])
    assert finding.status == UNKNOWN and "tgw-0abc, which doctor cannot follow" in finding.message


def test_internet_and_nat_gateway_routes_are_ok():
    for target in ("nat-0abc", "igw-0abc"):
        assert checks.decide_network("login", REGION, [SubnetPath("s", "vpc-1", "rtb", target)], []).status == OK


def _group(group_id: str, ingress=(), egress=({"IpProtocol": "-1", "IpRanges": [{"CidrIp": "0.0.0.0/0"}]},)) -> dict:
    return {"GroupId": group_id, "IpPermissions": list(ingress), "IpPermissionsEgress": list(egress)}


def _verifier(cluster_ingress, verifier_subnet=None, **verifier_group) -> VerifierFacts:
    return VerifierFacts(
        ssh_port=2222, cluster_groups=[_group("sg-cluster", cluster_ingress)],
        verifier_groups=[_group("sg-verifier", **verifier_group)],
        verifier_subnets={"subnet-v": verifier_subnet or {"SubnetId": "subnet-v", "VpcId": "vpc-1", "CidrBlock": "10.1.9.0/24"}},
        cluster_subnet_cidrs=["10.1.0.0/24"], target_group_vpc="vpc-1")


@pytest.mark.parametrize("rule, admitted", [
    ({"IpProtocol": "tcp", "FromPort": 2222, "ToPort": 2222, "UserIdGroupPairs": [{"GroupId": "sg-verifier"}]}, True),
    ({"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, "UserIdGroupPairs": [{"GroupId": "sg-verifier"}]}, False),
    ({"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": "sg-verifier"}]}, True),
    ({"IpProtocol": "tcp", "FromPort": 0, "ToPort": 65535, "IpRanges": [{"CidrIp": "10.1.0.0/16"}]}, True),
    ({"IpProtocol": "tcp", "FromPort": 0, "ToPort": 65535, "IpRanges": [{"CidrIp": "10.1.0.0/24"}]}, False),
    ({"IpProtocol": "udp", "FromPort": 2222, "ToPort": 2222, "UserIdGroupPairs": [{"GroupId": "sg-verifier"}]}, False),
])
def test_the_cluster_group_must_admit_the_ssh_port_from_the_verifier(rule, admitted):
    finding = checks.decide_verifier(_verifier([rule]))
    assert (finding.status == OK) is admitted, finding.line()
    if not admitted:
        assert "--protocol tcp --port 2222 --source-group sg-verifier" in finding.fix


def test_verifier_subnets_in_another_vpc_or_missing_are_named():
    rule = {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": "sg-verifier"}]}
    elsewhere = checks.decide_verifier(_verifier([rule], {"SubnetId": "subnet-v", "VpcId": "vpc-2", "CidrBlock": "10.2.0.0/24"}))
    assert elsewhere.status == PROBLEM and "subnet-v are not in the target group's VPC vpc-1" in elsewhere.message
    missing = checks.decide_verifier(VerifierFacts(22, [_group("sg-cluster", [rule])], [_group("sg-verifier")],
                                                   {"subnet-gone": {}}, [], "vpc-1"))
    assert missing.status == PROBLEM and "subnet-gone do not exist" in missing.message


def test_a_verifier_group_without_egress_to_the_nodes_is_named():
    rule = {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": "sg-verifier"}]}
    finding = checks.decide_verifier(_verifier([rule], egress=[]))
    assert finding.status == PROBLEM and "allows no TCP 2222 out" in finding.message


def _report(minutes_ago: int, version: str = "v2", agent: str = "1.0.0") -> dict:
    return {"receivedAt": (NOW - dt.timedelta(minutes=minutes_ago)).strftime("%Y-%m-%dT%H:%M:%S.000Z"),
            "agentVersion": agent, "hostIdentity": {"mode": "keys", "result": "unchanged", "version": version}}


def test_reports_stale_behind_or_from_an_old_agent_are_each_named():
    reports = {"i-fresh": _report(3), "i-stale": _report(40), "i-behind": _report(3, version="v1"),
               "i-old": _report(3, agent="0.9.0")}
    finding = checks.decide_reports("login", list(reports) + ["i-silent"], reports, "v2", "1.0.0", NOW,
                                    dt.timedelta(minutes=25), "S")
    assert finding.status == PROBLEM
    assert finding.message == ("i-silent never reported; i-stale last reported 40 min ago; "
                               "i-behind at host identity v1, the stack published v2; i-old run agent 0.9.0, this hpops ships 1.0.0")
    assert "hpops repair --stack-name S" in finding.fix and "UpdateClusterSoftware" in finding.fix
    ok = checks.decide_reports("login", ["i-fresh"], reports, "v2", "1.0.0", NOW, dt.timedelta(minutes=25), "S")
    assert ok.status == OK


def test_a_silent_nodes_enrollment_state_is_named_with_its_fix():
    from hpops.doctor_checks import EnrollmentFacts

    launched_long_ago, launched_now = NOW - dt.timedelta(days=30), NOW - dt.timedelta(minutes=5)
    enrollments = {"i-old": EnrollmentFacts(None, launched_long_ago), "i-contested": EnrollmentFacts("contested", launched_now),
                   "i-pending": EnrollmentFacts(None, launched_long_ago, "SHA256:" + "a" * 43),
                   "i-new": EnrollmentFacts(None, launched_now), "i-enrolled": EnrollmentFacts("enrolled", launched_long_ago)}
    finding = checks.decide_reports("login", list(enrollments), {}, None, "1.0.0", NOW, dt.timedelta(minutes=25), "S",
                                    enrollments, dt.timedelta(minutes=60))
    assert finding.status == PROBLEM
    assert "i-old was launched 30 days ago, outside the 60-minute enrollment window, and no approval names" in finding.message
    assert "i-contested is contested" in finding.message
    assert "i-pending's agent has not enrolled yet; an approval for SHA256:aaa" in finding.message
    # Not an enrollment problem: the agent itself (or its path) is what to look at.
    assert "i-enrolled, i-new never reported" in finding.message
    assert "hpops adopt --stack-name S" in finding.fix
    assert "hpops node approve-enrollment --stack-name S --node i-contested --fingerprint SHA256:..." in finding.fix
    assert "sudo ssh-keygen -y -f /var/lib/hpops-node-agent/agent-key | ssh-keygen -lf -" in finding.fix


SSM_WRITES = {"Field": "eventCategory", "Equals": ["Management"]}


@pytest.mark.parametrize("advanced, logged", [
    ([{"FieldSelectors": [SSM_WRITES]}], True),
    ([{"FieldSelectors": [SSM_WRITES, {"Field": "readOnly", "Equals": ["true"]}]}], False),
    ([{"FieldSelectors": [SSM_WRITES, {"Field": "readOnly", "Equals": ["false"]}]}], True),
    ([{"FieldSelectors": [SSM_WRITES, {"Field": "eventSource", "NotEquals": ["ssm.amazonaws.com"]}]}], False),
    ([{"FieldSelectors": [SSM_WRITES, {"Field": "eventSource", "NotEquals": ["kms.amazonaws.com"]}]}], True),
    ([{"FieldSelectors": [{"Field": "eventCategory", "Equals": ["Data"]},
                          {"Field": "resources.type", "Equals": ["AWS::S3::Object"]}]}], False),
])
def test_advanced_event_selectors_are_evaluated_against_a_start_session_event(advanced, logged):
    assert checks.logs_start_session([], advanced) is logged


@pytest.mark.parametrize("selector, logged", [
    ({"ReadWriteType": "All", "IncludeManagementEvents": True}, True),
    ({"ReadWriteType": "WriteOnly", "IncludeManagementEvents": True}, True),
    ({"ReadWriteType": "ReadOnly", "IncludeManagementEvents": True}, False),
    ({"ReadWriteType": "All", "IncludeManagementEvents": False}, False),
])
def test_basic_event_selectors(selector, logged):
    assert checks.logs_start_session([selector], []) is logged


def test_a_trail_of_another_region_counts_only_when_multi_region():
    single = TrailFacts("eu-trail", "eu-west-1", False, True)
    assert checks.decide_trail(REGION, [single]).status == PROBLEM
    assert checks.decide_trail(REGION, [TrailFacts("org", "eu-west-1", True, True)]).status == OK


def test_preferences_never_saved_mean_run_as_off():
    finding = checks.decide_run_as(None)
    assert finding.status == PROBLEM and finding.message.startswith(checks.RUN_AS_OFF)
    assert "default user" not in finding.fix.replace("no default user", "")  # never advise the shared user
    assert checks.decide_run_as({"inputs": {"runAsEnabled": "true", "runAsDefaultUser": ""}}).status == OK


def test_run_as_with_one_default_user_for_everyone_is_a_problem():
    finding = checks.decide_run_as({"inputs": {"runAsEnabled": "true", "runAsDefaultUser": "ubuntu"}})
    assert finding.status == PROBLEM and f"{checks.RUN_AS_SHARED} ubuntu, so they share one session limit" in finding.message
    assert "clear the default user" in finding.fix and "SSMSessionRunAs" in finding.fix


def test_a_tag_billing_has_never_seen_and_an_untagged_cluster_are_both_named():
    finding = checks.decide_cost_tag("ClusterName", "ml", [], {})
    assert finding.status == PROBLEM
    assert finding.message.startswith("the cluster has no tag ClusterName=ml; cost allocation tag ClusterName is not yet known")
    assert "24 h" in finding.fix


def test_usage_that_stopped_arriving_is_named():
    usage = checks.UsageFacts("ok", "", (NOW - dt.timedelta(hours=3)).isoformat(), "i-ctl")
    finding = checks.decide_usage("controller-machine", usage, NOW, dt.timedelta(hours=1), "GPU-seconds are not tracked")
    assert finding.status == PROBLEM and "last reported usage 3 h ago" in finding.message


def test_exit_status_counts_problems_and_unknowns_not_skips():
    line = checks.Finding("run-as", OK, "on")
    assert checks.exit_status([line, checks.Finding("slurm-usage", checks.SKIPPED, "needs the stack")]) == 0
    # Could not tell: 2, as every command exits when it cannot tell; a problem found wins: 1.
    unknown = checks.Finding("cloudtrail", UNKNOWN, "could not tell")
    assert checks.exit_status([line, unknown]) == 2
    assert checks.exit_status([unknown, checks.Finding("run-as", PROBLEM, "off")]) == 1


def test_a_trail_doctor_may_not_read_is_unknown_unless_another_logs_start_session():
    hidden = TrailFacts("org-trail", REGION, True, False, unreadable="access denied to cloudtrail:GetTrailStatus")
    assert checks.decide_trail(REGION, [hidden]).status == UNKNOWN
    assert checks.decide_trail(REGION, [hidden, TrailFacts("own", REGION, False, True)]).status == OK


EXPOSURE = checks.RoleExposure("exec", {"NodeAgentPolicy": ["events:PutEvents", "ssm:GetParameters"]}, ("Vendor",))


def test_imds_exposure_names_reachable_and_silent_nodes_and_what_the_role_allows():
    finding = checks.decide_imds_exposure("login", ["i-1", "i-2", "i-3"], {"i-1": "reachable", "i-2": "blocked"},
                                          "off", EXPOSURE, "S")
    assert finding.status == checks.NOTE and finding.message.startswith("2 of 3 node(s)")
    assert "reachable: i-1" in finding.message and "no agent report: i-3" in finding.message
    assert "NodeAgentPolicy: events:PutEvents, ssm:GetParameters" in finding.message
    assert "not readable by you: Vendor" in finding.message and checks.exit_status([finding]) == 0


def test_imds_exposure_is_ok_when_every_node_is_blocked_or_the_lockdown_covers_the_silent_ones():
    blocked = checks.decide_imds_exposure("login", ["i-1"], {"i-1": "blocked"}, "off", EXPOSURE, "S")
    covered = checks.decide_imds_exposure("gpu", ["i-7"], {}, "on", EXPOSURE, "S")
    reachable_anyway = checks.decide_imds_exposure("login", ["i-1"], {"i-1": "reachable"}, "on", EXPOSURE, "S")
    assert blocked.status == OK and covered.status == OK and "rely on the installer" in covered.message
    assert reachable_anyway.status == checks.NOTE  # a node's own probe outweighs the stack's setting


def test_the_controllers_probe_from_its_holds_report_decides_the_controller_group_like_a_login_nodes():
    login = {"i-1": {"imds": {"nonRoot": "reachable", "lockdown": "off"}}, "i-2": {"sessions": {}}}
    holds = {"instanceId": "i-c", "reportedAt": "2026-11-26T12:00:00Z", "imds": {"nonRoot": "blocked", "lockdown": "off"}}
    probed = checks.imds_probes(login, holds)
    assert probed == {"i-1": "reachable", "i-c": "blocked"}
    assert checks.decide_imds_exposure("controller-machine", ["i-c"], probed, "off", EXPOSURE, "S").status == OK
    # No holds report yet, or one from an agent without a probe: the controller counts as reachable, as before.
    for silent in (None, {"instanceId": "i-c", "reportedAt": "2026-11-26T12:00:00Z"}):
        finding = checks.decide_imds_exposure("controller-machine", ["i-c"], checks.imds_probes(login, silent), "off",
                                              EXPOSURE, "S")
        assert finding.status == checks.NOTE and "no agent report: i-c" in finding.message
    reachable = dict(holds, imds={"nonRoot": "reachable", "lockdown": "off"})
    finding = checks.decide_imds_exposure("controller-machine", ["i-c"], checks.imds_probes(login, reachable), "off",
                                          EXPOSURE, "S")
    assert finding.status == checks.NOTE and "reachable: i-c" in finding.message


NLB = {"LoadBalancerName": "hpops-nlb", "SecurityGroups": ["sg-nlb"]}


def _nlb_path(cluster_ingress, nlb_groups=("sg-nlb",), balancers=(NLB,), nlb_egress=None) -> LoadBalancerFacts:
    groups = [_group(g) if nlb_egress is None else _group(g, egress=nlb_egress) for g in nlb_groups]
    return LoadBalancerFacts(ssh_port=22, load_balancers=list(balancers), nlb_groups=groups,
                             nlb_subnet_cidrs=["10.1.0.0/24", "10.1.1.0/24"],
                             cluster_groups=[_group("sg-cluster", cluster_ingress)], cluster_subnet_cidrs=["10.1.0.0/24"])


FROM_NLB = {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, "UserIdGroupPairs": [{"GroupId": "sg-nlb"}]}
FROM_VPC = {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, "IpRanges": [{"CidrIp": "10.1.0.0/16"}]}


def test_the_nodes_group_must_admit_ssh_from_the_nlbs_group():
    assert checks.decide_load_balancer_path(_nlb_path([FROM_NLB])).status == OK
    refused = checks.decide_load_balancer_path(_nlb_path([FROM_VPC]))  # an NLB with a group connects from it
    assert refused.status == PROBLEM and "--source-group sg-nlb" in refused.fix and "fails open" in refused.message


def test_an_nlb_without_a_group_needs_its_subnets_admitted_and_is_noted():
    ok = checks.decide_load_balancer_path(_nlb_path([FROM_VPC], nlb_groups=(), balancers=({"LoadBalancerName": "old"},)))
    assert ok.status == OK and "has no security group" in ok.message
    narrow = dict(FROM_VPC, IpRanges=[{"CidrIp": "10.1.0.0/24"}])  # one of its two subnets only
    assert checks.decide_load_balancer_path(_nlb_path([narrow], nlb_groups=(), balancers=({"LoadBalancerName": "old"},))).status == PROBLEM


def test_no_load_balancer_or_no_egress_is_a_problem():
    assert checks.decide_load_balancer_path(_nlb_path([FROM_NLB], balancers=())).status == PROBLEM
    assert checks.decide_load_balancer_path(_nlb_path([FROM_NLB], nlb_egress=[])).status == PROBLEM


def _nlb_ingress(*cidrs: str) -> dict:
    return _group("sg-nlb", [{"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, "IpRanges": [{"CidrIp": c} for c in cidrs]}])


def _through_vpn(nlb_group: dict, *endpoints: ClientVpnEndpoint, unread: str = "") -> LoadBalancerFacts:
    facts = _nlb_path([FROM_NLB])
    return LoadBalancerFacts(**(vars(facts) | {"nlb_groups": [nlb_group], "client_vpn": list(endpoints),
                                               "client_vpn_unread": unread}))


VPN = ClientVpnEndpoint("cvpn-endpoint-0123456789abcdef0", ["10.1.8.0/24", "10.1.9.0/24"], ["10.1.0.0/16"])


def test_client_vpn_users_reach_the_nlb_from_its_associated_subnets_through_an_authorization_rule():
    ok = checks.decide_load_balancer_path(_through_vpn(_nlb_ingress("10.0.0.0/8"), VPN))
    assert ok.status == OK and "Client VPN cvpn-endpoint-0123456789abcdef0 reaches it on TCP 22" in ok.message
    # The NLB's group admits only one of the two subnets Client VPN source-NATs its users into.
    narrow = checks.decide_load_balancer_path(_through_vpn(_nlb_ingress("10.1.8.0/24"), VPN))
    assert narrow.status == PROBLEM and "arrive from 10.1.8.0/24, 10.1.9.0/24" in narrow.message
    assert "LoadBalancerClientCidr" in narrow.fix
    # No authorization rule covers the NLB's subnets: users are dropped at the endpoint.
    unauthorized = ClientVpnEndpoint(VPN.endpoint_id, VPN.associated_subnet_cidrs, ["10.1.0.0/24"])
    refused = checks.decide_load_balancer_path(_through_vpn(_nlb_ingress("10.0.0.0/8"), unauthorized))
    assert refused.status == PROBLEM and "no active authorization rule" in refused.message
    assert "authorize-client-vpn-ingress --client-vpn-endpoint-id cvpn-endpoint-0123456789abcdef0" in refused.fix
    # The endpoint's own group lets nothing out to the NLB.
    closed = ClientVpnEndpoint(VPN.endpoint_id, VPN.associated_subnet_cidrs, VPN.authorized_cidrs,
                               [_group("sg-cvpn", egress=[])])
    assert "allows no TCP 22 out" in checks.decide_load_balancer_path(_through_vpn(_nlb_ingress("10.0.0.0/8"), closed)).message


def test_without_client_vpn_or_permission_to_read_it_the_path_from_users_is_said_unchecked():
    none = checks.decide_load_balancer_path(_through_vpn(_nlb_ingress("10.0.0.0/8")))
    assert none.status == OK and "no Client VPN endpoint in its VPC" in none.message
    denied = checks.decide_load_balancer_path(_through_vpn(_nlb_ingress("10.0.0.0/8"), unread="not allowed: ec2:DescribeClientVpnEndpoints"))
    assert denied.status == OK and "users' path not checked: not allowed" in denied.message
    unassociated = ClientVpnEndpoint("cvpn-endpoint-1", [], [])
    assert checks.decide_load_balancer_path(_through_vpn(_nlb_ingress("10.1.8.0/24"), unassociated)).status == OK


# ---------------------------------------------------------------------------- the first day's checks


SECRET = "arn:aws:secretsmanager:us-east-1:1:secret:HostIdentitySecret-abc"
KEY = "arn:aws:kms:us-east-1:1:key/k-1"
NODE_AGENT = {"Statement": [{"Effect": "Allow", "Action": ["ssm:GetParameters", "lambda:InvokeFunction", "events:PutEvents"],
                             "Resource": "*"}]}


def test_a_shared_execution_role_passes_unless_it_can_read_the_stacks_secrets():
    from hpops.doctor_checks import Guarded, RoleGrants, decide_execution_role

    roles = {"login": "arn:aws:iam::1:role/exec", "controller-machine": "arn:aws:iam::1:role/exec",
             "gpu": "arn:aws:iam::1:role/exec"}
    guarded = Guarded({"the canonical host keys": SECRET}, KEY)
    shared = decide_execution_role(roles, ["login", "controller-machine"], "exec",
                                   {"exec": RoleGrants("exec", {"NodeAgentPolicy": NODE_AGENT})}, guarded)
    assert shared.status == "OK" and "exec is shared with gpu" in shared.message
    readable = {"NodeAgentPolicy": NODE_AGENT, "SecretsManagerReadWrite": {"Statement": [
        {"Effect": "Allow", "Action": ["secretsmanager:*", "kms:Decrypt"], "Resource": "*"}]}}
    finding = decide_execution_role(roles, ["login", "controller-machine"], "exec",
                                    {"exec": RoleGrants("exec", readable)}, guarded)
    assert finding.status == "PROBLEM" and "role exec may read the canonical host keys" in finding.message
    assert "every user on controller-machine, gpu, login can take the role from IMDS" in finding.message
    assert f"narrow SecretsManagerReadWrite on role exec so secretsmanager:GetSecretValue does not cover {SECRET}" in finding.fix
    # The secret alone is not enough: without kms:Decrypt on the stack's key it cannot be read.
    no_key = {"Reads": {"Statement": [{"Effect": "Allow", "Action": "secretsmanager:GetSecretValue", "Resource": "*"}]}}
    assert decide_execution_role(roles, ["login"], "exec", {"exec": RoleGrants("exec", no_key)}, guarded).status == "OK"
    # A Deny wins, and grants on other secrets do not count.
    denied = {"R": {"Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"},
                                  {"Effect": "Deny", "Action": "secretsmanager:GetSecretValue", "Resource": SECRET}]}}
    assert decide_execution_role(roles, ["login"], "exec", {"exec": RoleGrants("exec", denied)}, guarded).status == "OK"
    other = {"R": {"Statement": [{"Effect": "Allow", "Action": ["secretsmanager:GetSecretValue", "kms:Decrypt"],
                                  "Resource": ["arn:aws:secretsmanager:us-east-1:1:secret:datasets/*", "*:key/*"]}]}}
    assert decide_execution_role(roles, ["login"], "exec", {"exec": RoleGrants("exec", other)}, guarded).status == "OK"
    unread = decide_execution_role(roles, ["login"], "exec", {"exec": RoleGrants("exec", {}, ("SiteManaged",))}, guarded)
    assert unread.status == "UNKNOWN" and "exec: SiteManaged" in unread.message
    # A keys-mode stack has no CA secret: the check says it looked at the keys only, and why.
    keys_mode = Guarded({"the canonical host keys": SECRET}, KEY, {"the host CA": "the stack is in keys mode"})
    finding = decide_execution_role(roles, ["login"], "exec", {"exec": RoleGrants("exec", {"NodeAgentPolicy": NODE_AGENT})},
                                    keys_mode)
    assert finding.status == "OK" and "cannot read the canonical host keys (" in finding.message
    assert "the host CA not checked: the stack is in keys mode" in finding.message


def _acl(*entries):
    return [{"RuleNumber": n, "Protocol": p, "RuleAction": a, "Egress": e, "CidrBlock": c,
             **({"PortRange": {"From": f, "To": t}} if f is not None else {})} for n, p, a, e, c, f, t in entries]


OPEN = _acl((100, "-1", "allow", False, "0.0.0.0/0", None, None), (100, "-1", "allow", True, "0.0.0.0/0", None, None))


def test_network_acls_dropping_ssh_or_its_replies_on_the_verifier_or_nlb_path_are_named_with_a_rule_to_add():
    from hpops.doctor_checks import SubnetAcl, decide_network_acls

    verifier, nlb = SubnetAcl("subnet-v", "10.0.1.0/24", "acl-v", OPEN), SubnetAcl("subnet-n", "10.0.2.0/24", "acl-n", OPEN)
    nodes = SubnetAcl("subnet-x", "10.0.3.0/24", "acl-x", OPEN)
    paths = [("the verifier", [verifier]), ("the load balancer", [nlb])]
    assert decide_network_acls(22, paths, [nodes]).status == OK
    # Rule 90 drops SSH from the verifier's subnet into the nodes' subnet.
    deny = SubnetAcl("subnet-x", "10.0.3.0/24", "acl-x", _acl((90, "6", "deny", False, "10.0.1.0/25", 22, 22)) + OPEN)
    finding = decide_network_acls(22, paths, [deny])
    assert finding.status == PROBLEM
    assert ("network ACL acl-x drops TCP 22 into the login nodes' subnet subnet-x from the verifier's 10.0.1.0/24 "
            "(rule 90 denies it)") in finding.message and "load balancer" not in finding.message.split(":")[0]
    assert ("aws ec2 create-network-acl-entry --network-acl-id acl-x --ingress --rule-number 89 --protocol tcp "
            "--port-range From=22,To=22 --cidr-block 10.0.1.0/24 --rule-action allow") in finding.fix
    # Replies: an ACL that lets only 32768-65535 back into the NLB's subnet drops port 1024.
    narrow = SubnetAcl("subnet-n", "10.0.2.0/24", "acl-n", _acl(
        (100, "-1", "allow", True, "0.0.0.0/0", None, None), (100, "6", "allow", False, "10.0.3.0/24", 32768, 65535),
        (110, "6", "allow", False, "0.0.0.0/0", 22, 22)))
    replies = decide_network_acls(22, [("the load balancer", [narrow])], [nodes])
    assert replies.status == PROBLEM and "drops replies into the load balancer's subnet subnet-n from 10.0.3.0/24 on port 1024 (no rule allows it)" in replies.message
    # Traffic within one subnet is not filtered by its ACL.
    assert decide_network_acls(22, [("the verifier", [SubnetAcl("subnet-x", "10.0.3.0/24", "acl-x", [])])],
                               [SubnetAcl("subnet-x", "10.0.3.0/24", "acl-x", [])]).status == OK


def test_host_identity_never_published_is_a_problem_with_the_command_for_the_mode():
    from hpops.doctor_checks import decide_host_identity

    keys = decide_host_identity("keys", None, "S")
    assert keys.status == "PROBLEM" and "target group stays empty" in keys.message
    assert keys.fix.startswith("hpops host-keys generate --stack-name S")
    assert decide_host_identity("certificate", None, "S").fix.startswith("hpops host-keys ca-generate --stack-name S")
    assert decide_host_identity("certificate", {"mode": "keys", "version": "v"}, "S").status == "PROBLEM"
    assert decide_host_identity("keys", {"mode": "keys", "version": "v1"}, "S").status == "OK"
    assert decide_host_identity("off", None, "S").status == "OK"


def test_key_policy_without_the_account_or_with_a_deny_is_a_problem():
    from hpops.doctor_checks import decide_key_policy

    root = {"Effect": "Allow", "Principal": {"AWS": "arn:aws:iam::111122223333:root"}, "Action": "kms:*", "Resource": "*"}
    assert decide_key_policy("k", {"Statement": [root]}, "111122223333").status == "OK"
    other = dict(root, Principal={"AWS": "arn:aws:iam::111122223333:role/admin"})
    assert decide_key_policy("k", {"Statement": [other]}, "111122223333").status == "PROBLEM"
    deny = {"Sid": "NoDecrypt", "Effect": "Deny", "Principal": "*", "Action": "kms:Decrypt", "Resource": "*"}
    finding = decide_key_policy("k", {"Statement": [root, deny]}, "111122223333")
    assert finding.status == "PROBLEM" and "NoDecrypt" in finding.message and "put-key-policy" in finding.fix


def test_alert_subscription_pending_or_missing_is_a_problem():
    from hpops.doctor_checks import decide_alert_subscription

    topic = "arn:aws:sns:us-east-1:1:alerts"
    pending = [{"SubscriptionArn": "PendingConfirmation", "Endpoint": "ops@example.org", "Protocol": "email"}]
    assert decide_alert_subscription(topic, "ops@example.org", pending).status == "PROBLEM"
    assert decide_alert_subscription(topic, "", []).status == "PROBLEM"
    confirmed = [{"SubscriptionArn": topic + ":abc", "Endpoint": "ops@example.org", "Protocol": "email"}]
    assert decide_alert_subscription(topic, "ops@example.org", confirmed).status == "OK"


def test_endpoints_that_refuse_https_or_carry_a_deny_policy_are_problems():
    from hpops.doctor_checks import EndpointFacts, decide_endpoints

    open_443 = {"GroupId": "sg-e", "IpPermissions": [{"IpProtocol": "tcp", "FromPort": 443, "ToPort": 443,
                                                       "UserIdGroupPairs": [{"GroupId": "sg-nodes"}]}]}
    closed = {"GroupId": "sg-e", "IpPermissions": []}
    good = EndpointFacts("vpce-1", "ssm", [open_443], None)
    assert decide_endpoints("login", ["sg-nodes"], ["10.0.0.0/24"], [good]).status == "OK"
    assert decide_endpoints("login", ["sg-nodes"], ["10.0.0.0/24"], []).status == "OK"
    refused = decide_endpoints("login", ["sg-nodes"], ["10.0.0.0/24"], [EndpointFacts("vpce-1", "ssm", [closed], None)])
    assert refused.status == "PROBLEM" and "--port 443 --source-group sg-nodes" in refused.fix
    deny = {"Statement": [{"Effect": "Deny", "Principal": "*", "Action": "ssm:*", "Resource": "*"}]}
    denied = decide_endpoints("login", ["sg-nodes"], [], [EndpointFacts("vpce-1", "ssm", [open_443], deny)])
    assert denied.status == "PROBLEM" and "--reset-policy" in denied.fix


def test_accounting_enforce_is_checked_only_through_the_controllers_report():
    from hpops.doctor_checks import decide_accounting_enforce

    assert decide_accounting_enforce("c", False, None, "fix").status == "OK"
    unknown = decide_accounting_enforce("c", True, None, "fix")
    assert unknown.status == "UNKNOWN" and unknown.message.startswith("not checkable yet")
    assert decide_accounting_enforce("c", True, {"enforced": True}, "fix").status == "OK"
    off = decide_accounting_enforce("c", True, {"enforced": False, "enforceReason": "AccountingStorageEnforce = associations"}, "fix")
    assert off.status == "PROBLEM" and off.fix == "fix"
