"""The stack's SSM document runs exactly the node script in the repository."""

from hpops_twin.ssm_document import SCRIPT_PATH, current_block, extract_script, render_resource
from hpops_twin.template_model import TEMPLATE_PATH, TemplateModel


def test_template_document_is_generated_from_the_node_script():
    assert current_block(TEMPLATE_PATH.read_text()) == render_resource(SCRIPT_PATH.read_text()), "run `make ssm-document`"


def test_the_script_a_node_runs_is_the_file_in_the_repository():
    content = TemplateModel().resources["HostIdentityDocument"]["Properties"]["Content"]
    assert extract_script(content) == SCRIPT_PATH.read_text()


def test_document_parameters_are_public_and_pattern_checked():
    content = TemplateModel().resources["HostIdentityDocument"]["Properties"]["Content"]
    assert set(content["parameters"]) == {"SecretId", "Region"}, "no key material ever travels as a parameter"
    assert all("allowedPattern" in p for p in content["parameters"].values())
    command = content["mainSteps"][0]["inputs"]["runCommand"][0]
    assert command.rstrip().endswith("python3 \"$script\" --secret-id '{{ SecretId }}' --region '{{ Region }}'")
