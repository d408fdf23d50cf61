"""Every budget the code writes or deletes falls under a resource the IAM policy names for that action.

A name outside the ARNs in template.yaml would make ModifyBudget (create, update, delete) fail with
AccessDenied on a real account (the twin does not check IAM), so this test checks the names against
the policy, for the extremes of the cluster name rule. The old per-user budgets that EnsureBudgets
deletes are named hpops-<cluster>-u-<user>.
"""

from fnmatch import fnmatchcase

import pytest

from hpops_core.budget_guard.budget_spec import budget_name_for, user_budget_prefix
from hpops_twin.template_model import TemplateModel

TEMPLATE = TemplateModel()
ACCOUNT = "123456789012"

CLUSTERS = ["a", "ml-research", "x" * 63, "a" + "-" * 61 + "b", "A1" * 31 + "z"]


def budget_resource_patterns(cluster: str, action: str) -> list[str]:
    """The Resource ARNs of every statement granting ``action``, with ClusterName set."""
    patterns = []
    for function in TEMPLATE.of_type("AWS::Serverless::Function").values():
        for policy in function["Properties"].get("Policies", []):
            for statement in policy.get("Statement", []) if isinstance(policy, dict) else []:
                actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
                if action not in actions:
                    continue
                resources = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
                for resource in resources:
                    text = resource["Fn::Sub"] if isinstance(resource, dict) else resource
                    patterns.append(text.replace("${AWS::Partition}", "aws").replace("${AWS::AccountId}", ACCOUNT)
                                    .replace("${ClusterName}", cluster))
    return patterns


def allowed(patterns: list[str], name: str) -> bool:
    return any(fnmatchcase(f"arn:aws:budgets::{ACCOUNT}:budget/{name}", pattern) for pattern in patterns)


@pytest.mark.parametrize("cluster", CLUSTERS)
def test_the_cluster_budget_and_old_user_budgets_may_be_modified(cluster):
    modify = budget_resource_patterns(cluster, "budgets:ModifyBudget")
    assert modify, "no budgets:ModifyBudget statement in template.yaml"
    assert allowed(modify, budget_name_for(cluster))
    assert allowed(modify, user_budget_prefix(cluster) + "alice")
    # Nobody else's budget: another cluster's, or one a person made by hand.
    assert not allowed(modify, "team-budget") and not allowed(modify, budget_name_for("other-lab"))


@pytest.mark.parametrize("cluster", CLUSTERS)
def test_listing_budgets_to_find_old_user_budgets_is_allowed(cluster):
    view = budget_resource_patterns(cluster, "budgets:ViewBudget")
    assert allowed(view, budget_name_for(cluster)) and allowed(view, "any-budget-in-the-account")
