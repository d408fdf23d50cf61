"""Read template.yaml and resolve the intrinsic functions the twin needs.

The twin never repeats wiring: function handlers, environment, state machine definitions,
substitutions, event patterns and schedules all come from here.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
TEMPLATE_PATH = REPO_ROOT / "template.yaml"

_SHORT_TAGS = {
    "Ref": "Ref", "GetAtt": "Fn::GetAtt", "Sub": "Fn::Sub", "If": "Fn::If", "Equals": "Fn::Equals",
    "Not": "Fn::Not", "And": "Fn::And", "Or": "Fn::Or", "Split": "Fn::Split", "Select": "Fn::Select",
    "Join": "Fn::Join", "Condition": "Condition", "FindInMap": "Fn::FindInMap", "ImportValue": "Fn::ImportValue",
    "Base64": "Fn::Base64", "GetAZs": "Fn::GetAZs",
}


class _CfnLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # libyaml's parser when PyYAML has it: 10x faster
    pass


def _construct_tag(loader: yaml.Loader, tag_suffix: str, node: yaml.Node) -> dict:
    name = _SHORT_TAGS[tag_suffix]
    if isinstance(node, yaml.ScalarNode):
        value: Any = loader.construct_scalar(node)
        if name == "Fn::GetAtt":
            value = value.split(".", 1)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)
    return {name: value}


_CfnLoader.add_multi_constructor("!", _construct_tag)


_PARSED: dict[tuple[str, int, int], dict] = {}  # (path, mtime, size) -> the parsed template


def load_template(path: Path = TEMPLATE_PATH) -> dict:
    """The template as data, parsed once per process and version of the file (every twin and many
    tests read it); each caller gets its own copy, as callers change theirs (a parameter's default)."""
    stat = Path(path).stat()
    key = (str(path), stat.st_mtime_ns, stat.st_size)
    if key not in _PARSED:
        with open(path, encoding="utf-8") as handle:
            _PARSED[key] = yaml.load(handle, Loader=_CfnLoader)  # noqa: S506 - SafeLoader subclass
    return copy.deepcopy(_PARSED[key])


@dataclass
class Resolver:
    """Resolves Ref / GetAtt / Sub / If / conditions against parameters and twin physical ids."""

    template: dict
    parameters: dict[str, Any]
    region: str
    account_id: str
    stack_name: str
    physical_ids: dict[str, str] = field(default_factory=dict)  # logical id -> Ref value
    attributes: dict[tuple[str, str], str] = field(default_factory=dict)  # (logical id, attr) -> value

    def pseudo(self, name: str) -> Any:
        return {
            "AWS::Region": self.region,
            "AWS::AccountId": self.account_id,
            "AWS::StackName": self.stack_name,
            "AWS::Partition": "aws",
            "AWS::URLSuffix": "amazonaws.com",
            "AWS::NoValue": None,
        }[name]

    def ref(self, name: str) -> Any:
        if name.startswith("AWS::"):
            return self.pseudo(name)
        if name in self.parameters:
            return self.parameters[name]
        if name in self.physical_ids:
            return self.physical_ids[name]
        raise KeyError(f"twin cannot resolve Ref {name} (not provisioned yet?)")

    def condition(self, name: str) -> bool:
        return bool(self.resolve(self.template.get("Conditions", {})[name]))

    def _no_value(self, value: Any) -> bool:
        """`!Ref AWS::NoValue`, or an `!If` that picks it: in a list, CloudFormation drops the item."""
        if value == {"Ref": "AWS::NoValue"}:
            return True
        if isinstance(value, dict) and list(value) == ["Fn::If"]:
            condition, yes, no = value["Fn::If"]
            return self._no_value(yes if self.condition(condition) else no)
        return False

    def resolve(self, value: Any) -> Any:
        if isinstance(value, list):
            return [self.resolve(v) for v in value if not self._no_value(v)]
        if not isinstance(value, dict):
            return value
        if len(value) == 1:
            (key, arg), = value.items()
            handler = getattr(self, "_fn_" + key.replace("Fn::", "").replace("::", "_"), None)
            if handler is not None:
                return handler(arg)
        return {k: self.resolve(v) for k, v in value.items()}

    def _fn_Ref(self, arg: str) -> Any:
        return self.ref(arg)

    def _fn_GetAtt(self, arg: list[str]) -> Any:
        key = (arg[0], arg[1])
        if key not in self.attributes:
            raise KeyError(f"twin cannot resolve GetAtt {arg[0]}.{arg[1]}")
        return self.attributes[key]

    def _fn_Sub(self, arg: Any) -> str:
        text, variables = (arg, {}) if isinstance(arg, str) else (arg[0], self.resolve(arg[1]))

        def substitute(match: re.Match) -> str:
            name = match.group(1)
            if name in variables:
                return str(variables[name])
            if "." in name and not name.startswith("AWS::"):
                return str(self._fn_GetAtt(name.split(".", 1)))
            return str(self.ref(name))

        return re.sub(r"\$\{([^}!]+)\}", substitute, text)

    def _fn_If(self, arg: list) -> Any:
        return self.resolve(arg[1] if self.condition(arg[0]) else arg[2])

    def _fn_Equals(self, arg: list) -> bool:
        left, right = self.resolve(arg)
        return str(left) == str(right)

    def _fn_Not(self, arg: list) -> bool:
        return not self.resolve(arg[0])

    def _fn_And(self, arg: list) -> bool:
        return all(self.resolve(arg))

    def _fn_Or(self, arg: list) -> bool:
        return any(self.resolve(arg))

    def _fn_Condition(self, arg: str) -> bool:
        return self.condition(arg)

    def _fn_Split(self, arg: list) -> list[str]:
        return str(self.resolve(arg[1])).split(arg[0])

    def _fn_Select(self, arg: list) -> Any:
        return self.resolve(arg[1])[int(self.resolve(arg[0]))]

    def _fn_Join(self, arg: list) -> str:
        return arg[0].join(str(v) for v in self.resolve(arg[1]))


@dataclass(frozen=True)
class FunctionSpec:
    logical_id: str
    code_uri: Path
    handler: str  # "module.function"
    properties: dict

    @property
    def events(self) -> tuple[EventSource, ...]:
        return tuple(EventSource(name=name, kind=event["Type"], properties=event.get("Properties", {}))
                     for name, event in self.properties.get("Events", {}).items())


@dataclass(frozen=True)
class EventSource:
    """An EventBridge rule or schedule attached to a state machine or function in template.yaml."""

    name: str
    kind: str  # "EventBridgeRule" | "Schedule"
    properties: dict


@dataclass(frozen=True)
class StateMachineSpec:
    logical_id: str
    definition_path: Path
    substitutions: dict
    events: tuple[EventSource, ...]
    properties: dict


class TemplateModel:
    def __init__(self, path: Path = TEMPLATE_PATH):
        self.path = path
        self.raw = load_template(path)
        self.resources: dict[str, dict] = self.raw["Resources"]
        self.globals = self.raw.get("Globals", {})

    def parameter_defaults(self) -> dict[str, Any]:
        return {k: v.get("Default") for k, v in self.raw.get("Parameters", {}).items() if "Default" in v}

    def of_type(self, resource_type: str) -> dict[str, dict]:
        return {k: v for k, v in self.resources.items() if v["Type"] == resource_type}

    def functions(self) -> dict[str, FunctionSpec]:
        specs = {}
        for logical_id, resource in self.of_type("AWS::Serverless::Function").items():
            props = resource["Properties"]
            specs[logical_id] = FunctionSpec(
                logical_id=logical_id,
                code_uri=(self.path.parent / props["CodeUri"]).resolve(),
                handler=props["Handler"],
                properties=props,
            )
        return specs

    def function_environment(self, logical_id: str) -> dict:
        """Globals environment merged with the function's own (unresolved intrinsics)."""
        merged = dict(self.globals.get("Function", {}).get("Environment", {}).get("Variables", {}))
        own = self.resources[logical_id]["Properties"].get("Environment", {}).get("Variables", {})
        merged.update(own)
        return merged

    def state_machines(self) -> dict[str, StateMachineSpec]:
        specs = {}
        for logical_id, resource in self.of_type("AWS::Serverless::StateMachine").items():
            props = resource["Properties"]
            events = tuple(
                EventSource(name=name, kind=event["Type"], properties=event.get("Properties", {}))
                for name, event in props.get("Events", {}).items()
            )
            specs[logical_id] = StateMachineSpec(
                logical_id=logical_id,
                definition_path=(self.path.parent / props["DefinitionUri"]).resolve(),
                substitutions=props.get("DefinitionSubstitutions", {}),
                events=events,
                properties=props,
            )
        return specs
