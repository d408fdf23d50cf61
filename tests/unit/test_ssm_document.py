"""The stack's SSM documents run exactly the node scripts in the repository."""

import re

import pytest

from hpops_twin.ssm_document import DOCUMENTS, HOST_IDENTITY, LOGIN_LIMITS, current_block, extract_script, render_resource
from hpops_twin.template_model import TEMPLATE_PATH, TemplateModel


@pytest.mark.parametrize("spec", DOCUMENTS, ids=lambda s: s.logical_id)
def test_template_document_is_generated_from_the_node_script(spec):
    assert current_block(TEMPLATE_PATH.read_text(), spec) == render_resource(spec.script_path.read_text(), spec), "run `make ssm-document`"


@pytest.mark.parametrize("spec", DOCUMENTS, ids=lambda s: s.logical_id)
def test_the_script_a_node_runs_is_the_file_in_the_repository(spec):
    content = TemplateModel().resources[spec.logical_id]["Properties"]["Content"]
    assert extract_script(content) == spec.script_path.read_text()


@pytest.mark.parametrize("spec", DOCUMENTS, ids=lambda s: s.logical_id)
def test_document_parameters_are_pattern_checked(spec):
    content = TemplateModel().resources[spec.logical_id]["Properties"]["Content"]
    assert all("allowedPattern" in p for p in content["parameters"].values())
    command = content["mainSteps"][0]["inputs"]["runCommand"][0]
    assert command.rstrip().endswith(spec.command)


def test_host_identity_parameters_are_public():
    content = TemplateModel().resources[HOST_IDENTITY.logical_id]["Properties"]["Content"]
    # Mode picks the action, Source names where the node fetches its bundle: names only, never keys.
    assert set(content["parameters"]) == {"Mode", "Source", "Region"}, "no key material ever travels as a parameter"
    command = content["mainSteps"][0]["inputs"]["runCommand"][0]
    assert "python3 \"$script\" --mode keys --secret-id '{{ Source }}' --region '{{ Region }}' ;;" in command
    assert "--mode certificate --certificate-parameter '{{ Source }}' --region '{{ Region }}' ;;" in command


def test_login_limits_parameter_admits_limits_json_and_nothing_shell_can_interpret():
    content = TemplateModel().resources[LOGIN_LIMITS.logical_id]["Properties"]["Content"]
    assert set(content["parameters"]) == {"LimitsJson"}
    pattern = re.compile(content["parameters"]["LimitsJson"]["allowedPattern"])
    assert pattern.match('{"default":2,"exempt":["ops-1"],"overrides":{"alice":4,"intern_2":0}}')
    for bad in ("{\"default\":2}'; rm -rf /", '{"default":"$(id)"}', '{"default":`id`}', '{"a":"\\u0027"}', ""):
        assert not pattern.match(bad), bad
