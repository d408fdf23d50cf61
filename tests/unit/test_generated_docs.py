"""docs/ pages generated from template.yaml are what the generator writes now (`make docs` rewrites them)."""

from pathlib import Path

import pytest

from hpops_twin.generated_docs import parameters_markdown
from hpops_twin.template_model import TemplateModel

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_the_parameter_table_is_generated_from_template_yaml():
    raw = TemplateModel().raw
    page = (DOCS / "parameters.md").read_text(encoding="utf-8")
    assert page == parameters_markdown(raw), "docs/parameters.md differs from template.yaml: run `make docs`"
    for name, parameter in raw["Parameters"].items():
        assert f"| `{name}` |" in page
    assert "| `SessionLimitsDryRun` | `true` |" in page, "a new stack starts session limits in dry run"


def test_every_parameter_says_what_an_update_does_and_a_new_one_must_say_it_unless_only_functions_read_it():
    from hpops_twin.generated_docs import ENVIRONMENT_ONLY, update_effect

    raw = TemplateModel().raw
    said = raw["Metadata"]["hpops::ParameterUpdates"]
    assert set(said) <= set(raw["Parameters"]), "an update note for a parameter the template does not have"
    assert "new DNS name" in update_effect(raw, "VpcId") and "Replaces the target groups" in update_effect(raw, "SshPort")
    assert update_effect(raw, "EnrollmentWindowMinutes") == ENVIRONMENT_ONLY  # read only by a function's environment
    raw["Parameters"]["NlbScheme"] = {"Type": "String", "Default": "internal"}
    raw["Resources"]["LoginLoadBalancer"]["Properties"]["Scheme"] = {"Ref": "NlbScheme"}
    with pytest.raises(ValueError, match="must say what an update of NlbScheme does"):
        update_effect(raw, "NlbScheme")


def test_a_parameter_outside_every_group_is_refused():
    raw = TemplateModel().raw
    raw["Parameters"]["Forgotten"] = {"Type": "String", "Default": ""}
    with pytest.raises(ValueError, match=r"missing \['Forgotten'\]"):
        parameters_markdown(raw)


def test_the_deployers_policy_is_generated_from_the_expanded_template():
    import json

    from hpops_twin.generated_docs import deployer_policy, deployer_policy_json, expanded_resource_types

    raw = TemplateModel().raw
    page = (DOCS / "deployer-policy.json").read_text(encoding="utf-8")
    assert page == deployer_policy_json(raw), "docs/deployer-policy.json differs from template.yaml: run `make docs`"
    document, unknown = deployer_policy(raw)
    actions = {a for s in document["Statement"] for a in s["Action"]}
    # What the stack creates is creatable: one create action per kind of resource the transform makes.
    types = expanded_resource_types(raw)
    assert {"AWS::Lambda::Function", "AWS::StepFunctions::StateMachine", "AWS::IAM::Role", "AWS::KMS::Key"} <= set(types)
    assert {"lambda:CreateFunction", "states:CreateStateMachine", "iam:CreateRole", "iam:PassRole", "kms:CreateKey",
            "cloudformation:CreateChangeSet", "cloudformation:ExecuteChangeSet"} <= actions
    assert not set(unknown) & actions
    assert json.loads(page) == document
