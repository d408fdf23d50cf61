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


def test_the_deployers_pages_are_generated_from_the_expanded_template():
    import json

    from hpops_twin.deployer_iam import TEMPLATE_NAMES, deployer_policy, expanded_resource_types, service_role_actions
    from hpops_twin.generated_docs import deployer_policy_json, deployer_role_json

    raw = TemplateModel().raw
    assert (DOCS / "deployer-policy.json").read_text(encoding="utf-8") == deployer_policy_json(raw), \
        "docs/deployer-policy.json differs from template.yaml: run `make docs`"
    page = (DOCS / "deployer-role.json").read_text(encoding="utf-8")
    assert page == deployer_role_json(raw), "docs/deployer-role.json differs from template.yaml: run `make docs`"
    role = json.loads(page)["Resources"]
    service_role = {a for name, r in role.items() if name.startswith("ServiceRolePolicy")
                    for s in r["Properties"]["PolicyDocument"]["Statement"]
                    for a in (s["Action"] if isinstance(s["Action"], list) else [s["Action"]])}
    # What the stack creates is creatable: one create action per kind of resource the transform makes.
    types = expanded_resource_types(raw)
    assert {"AWS::Lambda::Function", "AWS::StepFunctions::StateMachine", "AWS::IAM::Role", "AWS::KMS::Key"} <= set(types)
    assert {"lambda:CreateFunction", "states:CreateStateMachine", "iam:CreateRole", "iam:PassRole", "kms:CreateKey",
            "lambda:DeleteFunction", "iam:DeleteRole"} <= service_role
    actions, left_out = service_role_actions(raw)
    assert set(actions) >= service_role and not {entry.split(":")[0] + ":" + entry.split(":")[1] for entry in left_out} \
        & service_role
    # The deployer: sam's own calls, and the service role handed to CloudFormation only.
    deployer = {a for s in deployer_policy(TEMPLATE_NAMES)["Statement"]
                for a in (s["Action"] if isinstance(s["Action"], list) else [s["Action"]])}
    assert {"cloudformation:CreateChangeSet", "cloudformation:ExecuteChangeSet", "cloudformation:DeleteStack",
            "iam:PassRole", "s3:PutObject"} == deployer & {"cloudformation:CreateChangeSet",
                                                            "cloudformation:ExecuteChangeSet", "cloudformation:DeleteStack",
                                                            "iam:PassRole", "s3:PutObject"}
    assert {a.split(":")[0] for a in deployer} == {"cloudformation", "s3", "iam"}
