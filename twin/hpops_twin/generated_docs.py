"""Pages of docs/ generated from template.yaml, so they cannot drift from it (tests/unit/test_generated_docs.py
regenerates each and fails when docs/ differs):

    python -m hpops_twin.generated_docs parameters > docs/parameters.md
    python -m hpops_twin.generated_docs deployer-role > docs/deployer-role.json
    python -m hpops_twin.generated_docs deployer-policy > docs/deployer-policy.json

(`make docs` writes them; deployer_iam.py says what the deployer's pages hold.)
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Any

from hpops_twin.template_model import TemplateModel

PARAMETERS_INTRO = """# Stack parameters

Every parameter of `template.yaml`, in the groups the CloudFormation console shows
(`AWS::CloudFormation::Interface`), with its default, when to change it (its `Description`) and what
`sam deploy` with a new value does (replaced resources, a new DNS name, what reaches the nodes and when).
Generated: `make docs` (tests/unit/test_generated_docs.py fails when this page and template.yaml differ).
Set them in `samconfig.toml`'s `parameter_overrides`, then `sam deploy`.
"""


def _cell(text: Any) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _default(parameter: Mapping[str, Any]) -> str:
    if "Default" not in parameter:
        return "required"
    value = str(parameter["Default"])
    return f"`{_cell(value)}`" if value else "(empty)"


def parameters_markdown(raw: Mapping[str, Any]) -> str:
    """The parameter table page: one section per parameter group, one row per parameter."""
    parameters = raw["Parameters"]
    groups = raw.get("Metadata", {}).get("AWS::CloudFormation::Interface", {}).get("ParameterGroups", [])
    grouped = [name for group in groups for name in group["Parameters"]]
    missing = [name for name in parameters if name not in grouped]
    unknown = [name for name in grouped if name not in parameters]
    if missing or unknown or len(grouped) != len(set(grouped)):
        raise ValueError(f"template.yaml's ParameterGroups must name each parameter once: missing {missing}, "
                         f"unknown {unknown}")
    lines = [PARAMETERS_INTRO]
    for group in groups:
        lines += [f"## {group['Label']['default']}", "",
                  "| Parameter | Default | When to change it | What an update does |", "|---|---|---|---|"]
        for name in group["Parameters"]:
            parameter = parameters[name]
            allowed = parameter.get("AllowedValues")
            text = _cell(parameter.get("Description", ""))
            if allowed and len(allowed) <= 6:
                text += f" (one of {', '.join(f'`{a}`' for a in allowed)})"
            lines.append(f"| `{name}` | {_default(parameter)} | {text} | {_cell(update_effect(raw, name))} |")
        lines.append("")
    return "\n".join(lines)


ENVIRONMENT_ONLY = "In place: the functions read it at their next run; nothing is replaced, nothing on the nodes changes."


def update_effect(raw: Mapping[str, Any], name: str) -> str:
    """What `sam deploy` with a new value of ``name`` does: template.yaml's Metadata hpops::ParameterUpdates,
    else (a parameter only the functions' environment reads) in place. Raises for any other parameter
    without an entry, so a new one cannot be added without saying."""
    said = raw.get("Metadata", {}).get("hpops::ParameterUpdates", {})
    if name in said:
        return said[name]
    places = _references(raw, name)
    if places and all("Environment" in path for path in places):
        return ENVIRONMENT_ONLY
    raise ValueError(f"template.yaml's Metadata hpops::ParameterUpdates must say what an update of {name} does "
                     f"(it is read in {sorted({'/'.join(p[:3]) for p in places})})")


def _references(raw: Mapping[str, Any], name: str) -> list[tuple[str, ...]]:
    """Where the template reads parameter ``name`` (Ref or ${name} in a Sub): each as its key path."""
    import re

    found: list[tuple[str, ...]] = []

    def walk(node: Any, path: tuple[str, ...]) -> None:
        if isinstance(node, Mapping):
            for key, value in node.items():
                if key == "Ref" and value == name:
                    found.append(path)
                elif key == "Fn::Sub":
                    text = value if isinstance(value, str) else value[0]
                    if re.search(r"\$\{" + re.escape(name) + r"\}", text):
                        found.append(path)
                    if not isinstance(value, str):
                        walk(value[1], path + (key,))
                else:
                    walk(value, path + (str(key),))
        elif isinstance(node, list):
            for item in node:
                walk(item, path)

    for section in ("Globals", "Conditions", "Resources", "Outputs"):
        walk(raw.get(section, {}), (section,))
    return found


def deployer_policy_json(raw: Mapping[str, Any]) -> str:
    """The deployer's policy for the default stack name (any account and region)."""
    from hpops_twin.deployer_iam import DEFAULT_NAMES, deployer_policy

    return json.dumps(deployer_policy(DEFAULT_NAMES), indent=2) + "\n"


def deployer_role_json(raw: Mapping[str, Any]) -> str:
    """The template that makes the CloudFormation service role and the deployer's policy."""
    from hpops_twin.deployer_iam import role_template

    return json.dumps(role_template(raw), indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    pages = {"parameters": lambda: parameters_markdown(TemplateModel().raw),
             "deployer-policy": lambda: deployer_policy_json(TemplateModel().raw),
             "deployer-role": lambda: deployer_role_json(TemplateModel().raw)}
    if len(argv) != 1 or argv[0] not in pages:
        print(f"usage: python -m hpops_twin.generated_docs {{{'|'.join(pages)}}}", file=sys.stderr)
        return 2
    sys.stdout.write(pages[argv[0]]())
    return 0


if __name__ == "__main__":
    sys.exit(main())
