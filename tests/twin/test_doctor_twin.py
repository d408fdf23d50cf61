"""`hpops doctor` on the twin: a working installation reads all OK; each condition broken one at a time
(doctor_twin.BREAKS, what an operator's account can lack) is caught by its check, with the line it prints,
and by no other check.
"""

from __future__ import annotations

import copy
import datetime as dt
import warnings

import pytest
from operator_policy import without_action

from hpops.doctor import DOCTOR_IAM_ACTIONS
from hpops.doctor_checks import CHECKS, NOTE, OK, PER_GROUP, PROBLEM, RUN_AS_OFF, UNKNOWN, exit_status
from hpops_twin.doctor_twin import BREAKS, DoctorAccount, doctor_world

# What each broken condition's line must say (a fragment of its message, and of its fix).
EXPECTED = {
    "install line appended after on_create.sh's final exit": (
        "after the script's exit on line", "--patch on_create.sh"),
    "bundle's install.sh not uploaded beside on_create.sh": (
        "hpops/install.sh is not beside it", "aws s3 sync dist/lifecycle/hpops s3://sagemaker-lifecycle-twin/scripts/hpops/"),
    "NodeAgentPolicy detached from the execution role": (
        "execution role hyperpod-exec does not have NodeAgentPolicy", "aws iam attach-role-policy --role-name hyperpod-exec"),
    "no NAT route and no VPC endpoints for the nodes' subnet": (
        "no interface endpoint with private DNS for ssm, lambda, events", "com.amazonaws.us-east-1.lambda"),
    "cluster security group does not admit SSH from the verifier": (
        "does not admit TCP 22 from the verifier's", "authorize-security-group-ingress"),
    "cluster security group does not admit SSH from the NLB's": (
        "health checks fail, so every target is unhealthy", "--port 22 --source-group sg-"),
    "Client VPN authorized only to its own subnet, not the NLB's": (
        "no active authorization rule of Client VPN cvpn-endpoint-0a1b2c3d4e5f60718 covers",
        "aws ec2 authorize-client-vpn-ingress --client-vpn-endpoint-id cvpn-endpoint-0a1b2c3d4e5f60718"),
    "a new login node whose agent was never installed": ("never reported", "journalctl -u hpops-node-agent"),
    "one role for every group, and it may read every secret": (
        "role hyperpod-exec may read the canonical host keys (site-secrets (inline) allow secretsmanager:GetSecretValue",
        "narrow site-secrets (inline) on role hyperpod-exec so secretsmanager:GetSecretValue does not cover"),
    "the nodes' network ACL denies SSH from the verifier's and NLB's subnet": (
        "drops TCP 22 into the login nodes' subnet", "aws ec2 create-network-acl-entry --network-acl-id acl-"),
    "Run As on with one default user for everyone": (
        "every principal without an SSMSessionRunAs tag runs as ubuntu, so they share one session limit",
        "clear the default user"),
    "interface endpoints whose security group refuses HTTPS": (
        "does not admit TCP 443 from the nodes", "--protocol tcp --port 443 --source-group"),
    "a fresh stack: no host identity ever published": (
        "no host identity was ever published: no login node passes verification, the target group stays empty",
        "hpops host-keys generate --stack-name hpops-twin"),
    "the key policy no longer lets IAM grant the key's use": (
        "does not let the account's IAM policies grant its use", "aws kms put-key-policy --key-id"),
    "the alarm e-mail never confirmed": (
        "hpc-oncall@example.edu never confirmed its subscription", "aws sns subscribe --topic-arn"),
    "holds on, AccountingStorageEnforce without limits": (
        "Slurm still starts the held user's jobs", "AccountingStorageEnforce=associations,limits"),
    "agents behind the published host identity": ("the stack published", "hpops repair --stack-name hpops-twin"),
    "the only trail stopped logging": ("trail management-events is not logging", "start-logging"),
    "Session Manager Run As off": (RUN_AS_OFF, "SSMSessionRunAs"),
    "cost allocation tag ClusterName inactive": (
        "cost allocation tag ClusterName is Inactive: Budgets and Cost Explorer read $0",
        "update-cost-allocation-tags-status"),
    "Slurm accounting disabled on the controller": ("the controller reports accounting not enabled", "slurmdbd"),
    "GPUs not in AccountingStorageTRES": ("AccountingStorageTRES lacks gres/gpu", "add gres/gpu to AccountingStorageTRES"),
}


@pytest.fixture(scope="module")
def account():
    with warnings.catch_warnings(), doctor_world() as world:
        warnings.filterwarnings("ignore", message="No application metrics to publish")
        yield DoctorAccount(world).prepare()


def test_a_working_installation_is_all_ok(account):
    findings = account.run()
    assert [f.line() for f in findings if f.status != OK and f.check != "imds-exposure"] == []
    assert [f.check for f in findings] == [c for c in CHECKS for _ in range(
        3 if c == "imds-exposure" else 2 if c in PER_GROUP else 1)]


def test_on_a_keys_mode_stack_the_execution_role_check_says_it_had_no_host_ca_to_guard(account):
    """Keys mode (the default) creates no CA secret: doctor checks the host keys' secret and says why not the CA."""
    finding = next(f for f in account.run() if f.check == "execution-role")
    assert finding.status == OK and "cannot read the canonical host keys" in finding.message, finding.line()
    assert "the host CA not checked: the stack is in keys mode, which creates no CA secret" in finding.message
    # The operator's policy names no CA secret either (the administrator's ca-generate has nothing to write).
    administrator = str(account.operator_policy("administrator"))
    assert "HostCertificateAuthoritySecret" not in administrator and "HostIdentitySecret" in administrator


def test_without_the_imds_lockdown_every_group_is_a_note_naming_its_nodes_and_what_the_role_allows(account):
    exposure = [f for f in account.run() if f.check == "imds-exposure"]
    assert {f.subject for f in exposure} == {"login", "gpu", "controller-machine"}
    assert all(f.status == NOTE and "ImdsLockdown=on" in f.fix for f in exposure)
    assert exit_status(exposure) == 0  # a fact to accept or act on, not a failure
    gpu = next(f for f in exposure if f.subject == "gpu")
    assert "8 of 8 node(s)" in gpu.message and "role hyperpod-compute-exec" in gpu.message
    assert "datasets (inline): s3:GetObject" in gpu.message and "NodeAgentPolicy" not in gpu.message  # its own role
    login = next(f for f in exposure if f.subject == "login")
    assert "NodeAgentPolicy: events:PutEvents" in login.message


def test_the_controllers_own_imds_probe_reaches_doctor_through_its_holds_report(account):
    from hpops_twin.holds_twin import attach, run_holds

    controller = account.controller

    def controller_exposure():
        return next(f for f in account.run() if f.check == "imds-exposure" and f.subject == "controller-machine")

    # The site closes IMDS to users on the controller; the agent (restarted) probes and reports it.
    controller.imds = "blocked"
    controller.restart()
    attach(controller, [])
    # Past any holds report another test of this module left (a restored break reports at now + 1 s).
    now = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=2)
    run_holds(controller, now)
    finding = controller_exposure()
    assert finding.status == OK and "no node leaves role" in finding.message, finding.line()

    # Opened again: the next report says so, and doctor names the controller as reachable.
    controller.imds = "reachable"
    controller.restart()
    attach(controller, [])
    run_holds(controller, now + dt.timedelta(seconds=1))
    finding = controller_exposure()
    assert finding.status == NOTE and f"reachable: {controller.instance_id}" in finding.message, finding.line()


def test_doctor_runs_as_the_operator_under_the_policy_hpops_iam_policy_prints(account):
    before = dict(account.world.iam.exercised)  # the module's other tests ran doctor on this world too
    account.run()
    assert account.denials == [] and account.world.iam.errors == []
    used = {action for (principal, action, resource), count in account.world.iam.exercised.items()
            if principal == "operator" and count > before.get((principal, action, resource), 0)}
    # The twin hands doctor the stack's names (no CloudFormation reads), and every object it asks for exists
    # (s3:ListBucket only turns a missing object's 403 into 404).
    assert used == set(DOCTOR_IAM_ACTIONS) - {"cloudformation:DescribeStacks", "cloudformation:DescribeStackResource",
                                              "s3:ListBucket"}


# A doctor action taken out of the operator policy -> the check that needs it (the others must stay OK).
WITHOUT = {
    "ec2:DescribeRouteTables": "node-network",
    "s3:GetObject": "lifecycle-script",
    "iam:ListAttachedRolePolicies": ("node-agent-policy", "execution-role", "imds-exposure"),
    "cloudtrail:DescribeTrails": "cloudtrail",
    "ce:ListCostAllocationTags": "cost-allocation-tag",
    "dynamodb:Query": ("agent-reports", "enrollment", "imds-exposure"),
    "ec2:DescribeNetworkAcls": "network-acl",
}


def test_without_the_client_vpn_reads_the_nlb_path_is_still_checked_and_says_what_it_could_not_see(account):
    findings = account.run(policy=without_action(copy.deepcopy(account.operator_policy()), "ec2:DescribeClientVpnEndpoints"))
    (path,) = [f for f in findings if f.check == "nlb-path"]
    assert path.status == OK and "users' path not checked: access denied to ec2:DescribeClientVpnEndpoints" in path.message
    (path,) = [f for f in account.run() if f.check == "nlb-path"]
    assert "Client VPN cvpn-endpoint-0a1b2c3d4e5f60718 reaches it on TCP 22" in path.message


@pytest.mark.parametrize("action", sorted(WITHOUT))
def test_without_one_action_its_check_is_unknown_naming_the_action_and_the_others_still_run(account, action):
    findings = account.run(policy=without_action(copy.deepcopy(account.operator_policy()), action))
    assert account.denials and {d.action for d in account.denials} == {action}
    unknown = [f for f in findings if f.status not in (OK, NOTE)]
    checks = WITHOUT[action] if isinstance(WITHOUT[action], tuple) else (WITHOUT[action],)
    assert {(f.check, f.status) for f in unknown} == {(c, UNKNOWN) for c in checks} and exit_status(findings) == 2
    for finding in unknown:
        assert f"could not tell: access denied to {action} (" in finding.line(), finding.line()
        assert f"User: operator is not authorized to perform: {action} on resource: " in finding.line()


def test_without_list_bucket_a_missing_bundle_file_reads_as_access_denied_as_on_s3(account):
    """S3 answers a missing object with 403 to a caller who may not list its bucket: why doctor needs
    s3:ListBucket (the twin models it: a missing object's read also needs s3:ListBucket)."""
    from hpops_twin.doctor_twin import bundle_not_uploaded

    with bundle_not_uploaded(account):
        findings = account.run(policy=without_action(copy.deepcopy(account.operator_policy()), "s3:ListBucket"))
    assert {d.action for d in account.denials} == {"s3:ListBucket"}
    (unknown, *others) = [f for f in findings if f.status not in (OK, NOTE)]
    assert unknown.line().startswith(f"UNKNOWN lifecycle-script[{account.world.login_group}]: could not tell: access "
                                     "denied to s3:GetObject, or to s3:ListBucket for a missing object"), unknown.line()
    assert {f.check for f in others} <= {"lifecycle-script"}


@pytest.mark.parametrize("check, condition", [(check, condition) for check, condition, _ in BREAKS])
def test_each_broken_condition_is_caught_by_its_check_alone(account, check, condition):
    breaking = next(b for c, name, b in BREAKS if name == condition)
    with breaking(account):
        findings = account.run()
    problems = [f for f in findings if f.status not in (OK, NOTE)]
    assert {f.check for f in problems} == {check}, [f.line() for f in problems]
    message, fix = EXPECTED[condition]
    line = problems[0].line()
    assert problems[0].status == PROBLEM and line.startswith(f"PROBLEM {check}")
    assert message in problems[0].message and fix in problems[0].fix, line
    # Restored: the next condition starts from a working installation.
    assert [f.line() for f in account.run() if f.status not in (OK, NOTE)] == [], "the break was not undone"


def test_every_condition_broken_has_the_finding_it_must_cause():
    """Each break above is its own case (caught alone, then undone); every one has its expected line,
    and no expected line is left without a break that causes it."""
    conditions = [condition for _, condition, _ in BREAKS]
    assert len(conditions) == len(set(conditions)) and set(conditions) == set(EXPECTED)



def test_doctor_on_a_fresh_stack_exits_non_zero_naming_the_unpublished_host_identity(account, capsys):
    """The stack as `sam deploy` leaves it, before `hpops host-keys generate`: the target group would stay
    empty, so doctor must not print all OK."""
    from hpops.doctor import print_doctor
    from hpops_twin.doctor_twin import host_identity_never_published

    with host_identity_never_published(account):
        status = print_doctor(account.target(), account.run(), as_json=False)
    lines = capsys.readouterr().out.splitlines()
    assert status == 1
    # NOTE lines (imds-exposure) are facts to accept, not failures
    assert [line.split(":")[0] for line in lines if not line.startswith(("OK ", "NOTE "))] == ["PROBLEM host-identity"]
