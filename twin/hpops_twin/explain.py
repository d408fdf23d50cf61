"""Why an event did or did not start anything in the twin, in a line or two (for `hpops twin send`).

The rules are the twin's router (world.rules and world.function_rules, provisioned from
template.yaml); matching is moto's EventBridge matcher, one pattern field at a time, so "the first
field that differs" means exactly what EventBridge compares.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from typing import Any

from moto.events.models import EventPattern

# HyperPod's Session Manager target for a cluster node: sagemaker-cluster:<cluster id>_<group>-<instance id>
SESSION_TARGET = re.compile(r"sagemaker-cluster:([^_]+)_(.+)-(i-[0-9a-zA-Z]+)")


@dataclass(frozen=True)
class Route:
    """One EventBridge rule of the template and what it starts or invokes."""

    logical_id: str  # as SAM names the rule: <resource logical id><event name>
    source_name: str  # the event name under the resource's Events
    target: str  # the state machine's or function's logical id
    kind: str  # "state machine" | "function"
    bus: str
    pattern: dict

    def describe(self) -> str:
        on_bus = "" if self.bus == "default" else f" (bus {self.bus})"
        return f"rule {self.logical_id}{on_bus} -> {self.kind} {self.target}"


def routes(world: Any) -> list[Route]:
    """Every event rule of the stack, state machines' first, in template order."""
    found = [Route(r["logical_id"], name, r["target"], "state machine", "default", r["pattern"])
             for name, r in world.rules.items() if r["kind"] == "EventBridgeRule"]
    found += [Route(r["logical_id"], name, r["target"], "function", r["bus"], r["pattern"])
              for name, r in world.function_rules.items()]
    return found


def matches(pattern: dict, event: dict) -> bool:
    return EventPattern.load(json.dumps(pattern)).matches_event(event)


# ---------------------------------------------------------------------------- the nearest rule
@dataclass(frozen=True)
class Field:
    """One field of a pattern: its path and what it accepts (EventBridge's list of matchers)."""

    path: tuple[str, ...]
    accepts: list

    def alone(self) -> dict:
        """A pattern with only this field, so moto's matcher judges it by itself."""
        pattern: Any = self.accepts
        for key in reversed(self.path):
            pattern = {key: pattern}
        return pattern

    @property
    def name(self) -> str:
        return ".".join(self.path)


def fields(pattern: dict, path: tuple[str, ...] = ()) -> list[Field]:
    found = []
    for key, value in pattern.items():
        if isinstance(value, dict):
            found += fields(value, path + (key,))
        else:
            found.append(Field(path + (key,), value))
    return found


_ABSENT = object()


def value_at(event: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(event, dict) or key not in event:
            return _ABSENT
        event = event[key]
    return event


def _wanted(accepts: list) -> str:
    literals = [a for a in accepts if not isinstance(a, dict)]
    if literals and len(literals) == len(accepts):
        return f"= {literals[0]}" if len(literals) == 1 else "one of " + ", ".join(map(str, literals))
    words = []
    for matcher in accepts:
        if not isinstance(matcher, dict):
            words.append(f"= {matcher}")
        elif "prefix" in matcher:
            words.append(f"starting with {matcher['prefix']}")
        elif "suffix" in matcher:
            words.append(f"ending with {matcher['suffix']}")
        elif "exists" in matcher:
            words.append("present" if matcher["exists"] else "absent")
        elif "anything-but" in matcher:
            words.append(f"anything but {json.dumps(matcher['anything-but'])}")
        else:
            words.append(json.dumps(matcher))
    return " or ".join(words)


def _has(value: Any, name: str) -> str:
    if value is _ABSENT:
        return f"the event has no {name}"
    text = value if isinstance(value, str) else json.dumps(value)
    return f"the event has {text[:100] + '...' if len(text) > 100 else text}"


@dataclass(frozen=True)
class Nearest:
    route: Route
    differs: Field
    value: Any  # the event's value there (or _ABSENT)
    options: str | None  # twin send options that would make the rule match

    def describe(self) -> str:
        line = (f"nearest rule {self.route.logical_id} wants {self.differs.name} {_wanted(self.differs.accepts)}; "
                f"{_has(self.value, self.differs.name)}")
        return line + (f" ({self.options} would make it match)" if self.options else "")


def nearest_rule(event: dict, world: Any) -> Nearest | None:
    """The rule whose pattern fields the event satisfies most (by share, then template order), with
    its first differing field; None when the event satisfies no field of any rule."""
    best, best_score = None, (0.0, 0)
    for route in routes(world):
        judged = [(f, matches(f.alone(), event)) for f in fields(route.pattern)]
        satisfied = sum(ok for _, ok in judged)
        score = (satisfied / len(judged), satisfied)
        if satisfied and score > best_score:
            differs = next(f for f, ok in judged if not ok)
            best, best_score = (route, differs), score
    if best is None:
        return None
    route, differs = best
    value = value_at(event, differs.path)
    return Nearest(route, differs, value, _options_that_match(route, differs, value, event, world))


# Twin send options and the stack parameter each becomes (TwinWorld passes them on).
def _option_candidates(differs: Field, value: Any, world: Any) -> list[dict[str, str]]:
    """Option settings suggested by the event's value where the rule wants the twin's own identity."""
    if not isinstance(value, str):
        return []
    candidates = []
    if world.cluster_name in differs.accepts:
        candidates.append({"--cluster": value})
    session = SESSION_TARGET.fullmatch(value)
    if session:
        wanted = {"--cluster-id": session[1], "--login-group": session[2]}
        have = {"--cluster-id": world.cluster_id, "--login-group": world.login_group}
        candidates.append({k: v for k, v in wanted.items() if v != have[k]})
    return [c for c in candidates if c]


def _options_that_match(route: Route, differs: Field, value: Any, event: dict, world: Any) -> str | None:
    """Options that would make the whole rule match, checked by resolving the rule's pattern from
    template.yaml again with those stack parameters (so a suggestion is never a guess)."""
    for options in _option_candidates(differs, value, world):
        parameters = dict(world.resolver.parameters)
        if "--cluster" in options:
            parameters["ClusterName"] = options["--cluster"]
        if "--cluster-id" in options:
            parameters["ClusterArn"] = f"{str(parameters['ClusterArn']).rsplit('/', 1)[0]}/{options['--cluster-id']}"
        if "--login-group" in options:
            parameters["LoginGroupName"] = options["--login-group"]
        if not _allowed(parameters, world):
            continue
        resolver = dataclasses.replace(world.resolver, parameters=parameters)
        pattern = resolver.resolve(_template_pattern(route, world))
        if matches(pattern, event):
            return " ".join(f"{name} {setting}" for name, setting in options.items())
    return None


def _allowed(parameters: dict, world: Any) -> bool:
    declared = world.template.raw["Parameters"]
    for name in ("ClusterName", "ClusterArn", "LoginGroupName"):
        allowed = declared[name].get("AllowedPattern")
        if allowed and not re.fullmatch(allowed, str(parameters[name])):
            return False
    return True


def _template_pattern(route: Route, world: Any) -> Any:
    owners = world.template.state_machines() if route.kind == "state machine" else world.template.functions()
    source = next(s for s in owners[route.target].events if s.name == route.source_name)
    return source.properties["Pattern"]


# ---------------------------------------------------------------------------- what an execution did
def first_line(text: str | None) -> str:
    """The first line of an error's cause; of its errorMessage when the cause is a Lambda error's JSON."""
    try:
        text = json.loads(text or "").get("errorMessage") or text
    except (ValueError, AttributeError):
        pass
    lines = str(text or "").strip().splitlines()
    return lines[0] if lines else ""


def did(output: dict | None) -> str:
    """One line from a state machine's output: its plan (sync), its budgets and projection (budget
    guard) or its enforcement report (session limits). Empty for an output of another shape."""
    output = output or {}
    if isinstance(output.get("plan"), dict):
        dry = " (dry run)" if (output.get("request") or {}).get("dryRun") else ""
        return f"{output['plan'].get('summary', '')}{dry}"
    if "budgets" in output or "projection" in output:
        # Budgets it created or changed show under what changed (read from the Budgets API).
        parts = [w["warning"] for w in (output.get("budgets") or {}).get("warnings", [])]
        projection = output.get("projection") or {}
        if projection.get("alert"):
            parts.append(f"projected {projection['alert'].get('percentOfLimit')}% of the limit: alert")
        elif projection.get("reason"):
            parts.append(projection["reason"].split("; ")[0])
        return "; ".join(parts)
    report = ((output.get("enforcement") or {}).get("report")) or {}
    if report:
        over = ", ".join(u["user"] for u in report.get("usersOverLimit", []))
        verb = "would end" if report.get("dryRun") else "ended"
        text = (f"{report.get('loginSessionsListed', 0)} login sessions listed, "
                f"{report.get('usersOverLimitCount', 0)} users over the limit{f' ({over})' if over else ''}, "
                f"{verb} {report.get('plannedCount' if report.get('dryRun') else 'endedCount', 0)}")
        if report.get("failedCount"):
            text += f", {report['failedCount']} failed to end"
        return text
    return ""
