"""docs/troubleshooting.md names every alarm template.yaml defines and every error the code can raise."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import yaml

import hpops_core
from hpops_core.common.errors import HpopsError

REPO_ROOT = Path(__file__).resolve().parents[2]
PAGE = (REPO_ROOT / "docs" / "troubleshooting.md").read_text(encoding="utf-8")


class _CloudFormationLoader(yaml.SafeLoader):
    """template.yaml's short-form intrinsics (!Ref, !Sub, ...) read as plain values."""


_CloudFormationLoader.add_multi_constructor("!", lambda loader, suffix, node: None)


def named_in_page() -> set[str]:
    return set(re.findall(r"`(\w+)`", PAGE))


def test_every_alarm_of_the_template_is_explained():
    template = yaml.load((REPO_ROOT / "template.yaml").read_text(encoding="utf-8"), Loader=_CloudFormationLoader)
    alarms = {name for name, resource in template["Resources"].items()
              if resource.get("Type") == "AWS::CloudWatch::Alarm"}
    assert alarms, "template.yaml defines alarms"
    assert not alarms - named_in_page(), f"alarms missing from docs/troubleshooting.md: {sorted(alarms - named_in_page())}"


def test_every_named_error_is_explained():
    errors = set()
    for module in pkgutil.walk_packages(hpops_core.__path__, "hpops_core."):
        loaded = importlib.import_module(module.name)
        errors |= {name for name, cls in inspect.getmembers(loaded, inspect.isclass)
                   if issubclass(cls, HpopsError) and cls is not HpopsError and cls.__module__ == loaded.__name__}
    assert "LoginGroupError" in errors  # the walk reaches the shared errors
    missing = errors - named_in_page()
    assert not missing, f"errors missing from docs/troubleshooting.md: {sorted(missing)}"
