"""The request every state machine carries in its state, whatever started it."""

from __future__ import annotations

from typing import Any

from hpops_core.common.errors import MalformedEventError


def request_state(cluster: str, mode: str, dry_run: bool, trigger: str, **feature_fields: Any) -> dict[str, Any]:
    """The fields each machine's ASL branches on (cluster, mode, dryRun, trigger), then the feature's own."""
    return {"cluster": cluster, "mode": mode, "dryRun": dry_run, "trigger": trigger, **feature_fields}


def step_field(event: Any, key: str, step: str, kind: type = dict, may_be_empty: bool = False) -> Any:
    """A field a state passes to the next step: present and of its kind (and not empty, unless it may
    be), or MalformedEventError naming the step and the field."""
    value = event.get(key) if isinstance(event, dict) else None
    if not isinstance(value, kind) or not (value or may_be_empty):
        raise MalformedEventError(f"{step} step input needs a{'' if may_be_empty else ' non-empty'} "
                                  f"{kind.__name__} '{key}'")
    return value
