"""The request every state machine carries in its state, whatever started it."""

from __future__ import annotations

from typing import Any


def request_state(cluster: str, mode: str, dry_run: bool, trigger: str, **feature_fields: Any) -> dict[str, Any]:
    """The fields each machine's ASL branches on (cluster, mode, dryRun, trigger), then the feature's own."""
    return {"cluster": cluster, "mode": mode, "dryRun": dry_run, "trigger": trigger, **feature_fields}
