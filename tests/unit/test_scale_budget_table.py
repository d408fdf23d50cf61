"""docs/performance.md's table of the budget paths at 200 / 2,000 / 10,000 users is what `make bench`
measured (docs/bench.json, key scaleBudget: twin/hpops_twin/scale_budget_bench.py), and every size
met its targets."""

from __future__ import annotations

import json
from pathlib import Path

from hpops_twin.scale_budget_bench import KEY, SIZES

ROOT = Path(__file__).resolve().parents[2]
HEADER = "| users (all crossing) |"


def rows() -> list[list[str]]:
    lines = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(HEADER))
    found = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        found.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return found


def kb(count: int) -> str:
    return f"{count / 1024:,.0f}"


def test_the_scale_table_is_the_benchs_and_every_size_met_its_targets():
    bench = json.loads((ROOT / "docs" / "bench.json").read_text(encoding="utf-8"))
    measured = bench[KEY]
    assert [r["users"] for r in measured] == [n for n in SIZES if n in {r["users"] for r in measured}]
    expected = [[f"{r['users']:,}", f"{r['active_per_hour']:,}", f"{r['alerts_sent']:,} of {r['alerts_expected']:,}",
                 f"{r['held']:,} / {r['released']:,}", f"{r['check_calls']:,}",
                 f"{r['check_peak_mb']} of {r['check_memory_mb']}", kb(r["check_output_bytes"]),
                 f"{r['send_pages']} ({r['send_calls']:,} calls)", kb(r["holds_answer_bytes"]),
                 kb(r["largest_item_bytes"]), f"{r['marker_bytes']} B", str(r["usage_windows_read"]),
                 f"{r['steady_calls']} calls, {r['steady_peak_mb']} MB"]
                for r in measured]
    assert rows() == expected
    scale_targets = {text: ok for text, ok in bench["targets"].items() if text.startswith("scale budget, ")}
    assert len(scale_targets) == 7 * len(measured) and all(scale_targets.values())
