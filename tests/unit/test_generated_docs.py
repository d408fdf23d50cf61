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


def test_a_parameter_outside_every_group_is_refused():
    raw = TemplateModel().raw
    raw["Parameters"]["Forgotten"] = {"Type": "String", "Default": ""}
    with pytest.raises(ValueError, match=r"missing \['Forgotten'\]"):
        parameters_markdown(raw)
