"""Running one `make bench` section alone: print its verdicts and, with `--merge FILE`, replace only its
keys (and its targets) in that bench JSON file (docs/bench.json by default)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hpops_twin.template_model import REPO_ROOT


def run_alone(argv: list[str], verdicts: Mapping[str, bool], keys: Mapping[str, Any],
              stale_target: Callable[[str], bool] | None = None) -> int:
    """`keys`: what the section writes under each of its keys; `stale_target`: the section's earlier
    target texts to drop (default: those it reports again)."""
    for text, ok in verdicts.items():
        print(f"{'ok  ' if ok else 'MISS'} {text}", flush=True)
    if argv[:1] == ["--merge"]:
        path = Path(argv[1]) if len(argv) > 1 else REPO_ROOT / "docs" / "bench.json"
        data = json.loads(path.read_text(encoding="utf-8"))
        data.update(keys)
        stale = stale_target or (lambda text: text in verdicts)
        data["targets"] = {k: v for k, v in data.get("targets", {}).items() if not stale(k)} | dict(verdicts)
        path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return 0 if all(verdicts.values()) else 1
