"""Every policy the project prints or documents fits where IAM puts it (a managed policy: 6,144 characters
without whitespace), measured with the longest names a stack can have (a 64-character stack name), and
none grants an IAM write, PassRole or StartSession on "*"."""

import json
from pathlib import Path

import pytest

from hpops.operator_permissions import policy_characters
from hpops_twin.deployer_iam import LONGEST
from hpops_twin.iam.evaluate import decide
from hpops_twin.iam.policy_sizes import MANAGED_POLICY_LIMIT, operator_policies
from hpops_twin.iam.principals import deployer_policies

DOCS = Path(__file__).resolve().parents[2] / "docs"


def documented_policies() -> dict[str, dict]:
    """Every policy the project prints or documents, for the longest-named stack: the operator's and the
    administrator's, the deployer's and the service role's (docs/deployer-role.json, filled as
    CloudFormation would fill it), and docs/deployer-policy.json as published."""
    deployer, service_role = deployer_policies(LONGEST)
    found = {f"docs/deployer-role.json {name}": document for name, document in (deployer | service_role).items()}
    found["docs/deployer-policy.json"] = json.loads((DOCS / "deployer-policy.json").read_text(encoding="utf-8"))
    return found | operator_policies()


# IAM actions that change who may do what (writes and tagging), and handing a role to a service.
IAM_WRITE_PREFIXES = ("Add", "Attach", "Create", "Delete", "Detach", "Pass", "Put", "Remove", "Set", "Tag", "Untag",
                      "Update", "Upload")
POLICIES = documented_policies()


def _statements(document):
    statements = document["Statement"]
    return statements if isinstance(statements, list) else [statements]


def _listed(value):
    return value if isinstance(value, list) else [value]


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_each_policy_fits_a_managed_policy_with_the_longest_names(name):
    assert policy_characters(POLICIES[name]) <= MANAGED_POLICY_LIMIT


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_no_policy_grants_an_iam_write_passrole_or_start_session_on_star(name):
    for statement in _statements(POLICIES[name]):
        assert "NotAction" not in statement and "NotResource" not in statement, statement
        if "*" not in _listed(statement["Resource"]) or statement["Effect"] != "Allow":
            continue
        for action in _listed(statement["Action"]):
            service, _, verb = action.partition(":")
            assert "*" not in action, f"{name}: {action} on *"
            assert not (service == "iam" and verb.startswith(IAM_WRITE_PREFIXES)), f"{name}: {action} on *"
            assert action != "ssm:StartSession", f"{name}: {action} on *"


def test_the_operator_only_reads_and_the_administrator_writes_approvals_never_enrollments():
    operator = POLICIES["hpops iam-policy --role operator"]
    administrator = POLICIES["hpops iam-policy --role administrator"]
    table = next(r for s in _statements(administrator) for r in _listed(s["Resource"]) if ":table/" in r)
    cluster = "c" * 63
    put = "dynamodb:PutItem"
    for key, allowed in ((f"approval#{cluster}", True), (f"enroll#{cluster}", False), (f"cluster#{cluster}", False)):
        context = {"dynamodb:leadingkeys": (key,)}
        assert decide({"admin": administrator}, put, table, context).allowed is allowed, key
        assert not decide({"operator": operator}, put, table, context).allowed
    writes = {a for s in _statements(operator) for a in _listed(s["Action"])
              if a.split(":")[1].startswith(("Put", "Update", "Delete", "Start", "Subscribe", "Terminate", "Resume"))}
    assert writes == set()


def test_sessions_start_only_with_adopts_document_on_the_cluster_and_end_only_the_callers_own():
    administrator = {"admin": POLICIES["hpops iam-policy --role administrator"]}
    region, account = "ap-southeast-2", "123456789012"
    cluster = f"arn:aws:sagemaker:{region}:{account}:cluster/a1b2c3d4e5f6"
    context = {"aws:username": ("ops-jane",), "aws:userid": ("AIDAEXAMPLE",)}

    def allowed(action, resource, **extra):
        return decide(administrator, action, resource, context | extra).allowed

    document = f"arn:aws:ssm:{region}::document/AWS-StartNonInteractiveCommand"
    assert allowed("ssm:StartSession", document) and allowed("ssm:StartSession", cluster)
    assert not allowed("ssm:StartSession", f"arn:aws:ssm:{region}::document/AWS-StartPortForwardingSession")
    assert not allowed("ssm:StartSession", f"arn:aws:ssm:{region}:{account}:document/SSM-SessionManagerRunShell")
    assert not allowed("ssm:StartSession", f"arn:aws:sagemaker:{region}:{account}:cluster/otherclust01")
    assert not allowed("ssm:StartSession", f"arn:aws:ec2:{region}:{account}:instance/i-0123456789abcdef0")
    for action in ("ssm:TerminateSession", "ssm:ResumeSession"):
        assert allowed(action, f"arn:aws:ssm:{region}:{account}:session/ops-jane-0a1b2c3d4e5f67890")
        assert not allowed(action, f"arn:aws:ssm:{region}:{account}:session/alice-0a1b2c3d4e5f67890")
    # An assumed role's caller has no aws:username: only its aws:userid form applies.
    role = {"aws:userid": ("AROAEXAMPLE:ops-jane",)}
    assert not decide(administrator, "ssm:TerminateSession",
                      f"arn:aws:ssm:{region}:{account}:session/ops-jane-0a1b2c3d4e5f67890", role).allowed
    assert decide(administrator, "ssm:TerminateSession",
                  f"arn:aws:ssm:{region}:{account}:session/AROAEXAMPLE:ops-jane-0a1b", role).allowed


def test_kms_is_used_only_through_secrets_manager():
    administrator = {"admin": POLICIES["hpops iam-policy --role administrator"]}
    key = next(r for s in _statements(administrator["admin"]) for r in _listed(s["Resource"]) if ":key/" in r)
    via = {"kms:viaservice": ("secretsmanager.ap-southeast-2.amazonaws.com",)}
    assert decide(administrator, "kms:GenerateDataKey", key, via).allowed
    assert not decide(administrator, "kms:GenerateDataKey", key, {}).allowed
    assert not decide(administrator, "kms:GenerateDataKey", key,
                      {"kms:viaservice": ("s3.ap-southeast-2.amazonaws.com",)}).allowed


def test_the_sizes_docs_deployer_iam_states_are_the_measured_ones():
    import re
    page = (DOCS / "deployer-iam.md").read_text(encoding="utf-8")
    rows = {line.split("|")[1].strip(): [int(n.replace(",", "")) for n in re.findall(r"\d[\d,]*", line.split("|")[4])]
            for line in page.splitlines() if line.startswith("| ") and line.split("|")[4].strip()[:1].isdigit()}
    measured = {name: policy_characters(document) for name, document in POLICIES.items()}
    assert rows == {
        "`DeployerPolicy`": [measured["docs/deployer-role.json DeployerPolicy"]],
        "`ServiceRolePolicy1` to `3`": [measured[f"docs/deployer-role.json ServiceRolePolicy{n}"] for n in (1, 2, 3)],
        "the operator's": [measured["hpops iam-policy --role operator"]],
        "the administrator's": [measured["hpops iam-policy --role administrator"]]}
