"""Every budget name the code can produce falls under a resource the IAM policy names.

A shortened name outside ``budget/hpops-<cluster>-u-*`` would make every ModifyBudget on it fail
with AccessDenied on a real account (the twin does not check IAM), so this test checks the
names against the ARNs in template.yaml, for the extremes of the cluster and user name rules.
"""

from fnmatch import fnmatchcase

import pytest

from hpops_core.budget_guard.budget_spec import budget_name_for, user_budget_name_for
from hpops_twin.template_model import TemplateModel

TEMPLATE = TemplateModel()
ACCOUNT = "123456789012"

CLUSTERS = ["a", "ml-research", "x" * 63, "a" + "-" * 61 + "b", "A1" * 31 + "z"]
USERS = ["u", "alice", "bob-2", "_svc", "u" * 32, "a" * 31 + "z", "b" * 32]


def budget_resource_patterns(cluster: str) -> list[str]:
    """The Resource ARNs of every statement granting a budgets: action, with ClusterName set."""
    patterns = []
    for function in TEMPLATE.of_type("AWS::Serverless::Function").values():
        for policy in function["Properties"].get("Policies", []):
            for statement in policy.get("Statement", []) if isinstance(policy, dict) else []:
                actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
                if not any(a.startswith("budgets:") for a in actions):
                    continue
                resources = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
                for resource in resources:
                    text = resource["Fn::Sub"] if isinstance(resource, dict) else resource
                    patterns.append(text.replace("${AWS::Partition}", "aws").replace("${AWS::AccountId}", ACCOUNT)
                                    .replace("${ClusterName}", cluster))
    return patterns


def test_the_policy_names_budget_resources():
    assert budget_resource_patterns("c"), "no budgets: statement found in template.yaml"


@pytest.mark.parametrize("cluster", CLUSTERS)
def test_every_budget_name_is_allowed_by_the_policy(cluster):
    patterns = budget_resource_patterns(cluster)
    names = [budget_name_for(cluster)] + [user_budget_name_for(cluster, user) for user in USERS]
    for name in names:
        arn = f"arn:aws:budgets::{ACCOUNT}:budget/{name}"
        assert len(name) <= 100, name
        assert any(fnmatchcase(arn, pattern) for pattern in patterns), f"{name} is outside {patterns}"
    assert len(set(names)) == len(names), "two users share a budget"

