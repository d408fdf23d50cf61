"""docs/performance.md's table of the budget paths at 200 / 2,000 / 10,000 users is what `make bench`
measured (docs/bench.json, key scale_budget: twin/hpops_twin/scale_budget_bench.py), and every size
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
                 f"{r['steady_calls']} calls, {r['steady_peak_mb']} MB",
                 f"{r['steady_read_units']:g} / {r['steady_write_units']:g} (${r['steady_monthly_usd']})"]
                for r in measured]
    assert rows() == expected
    scale_targets = {text: ok for text, ok in bench["targets"].items() if text.startswith("scale budget, ")}
    assert len(scale_targets) == 8 * len(measured) and all(scale_targets.values())


def test_what_per_user_spend_adds_to_the_month_is_the_benchs():
    """The monthly cost quoted for an ordinary hour's check at 2,000 users, and per user, are the bench's
    DynamoDB units of that hour priced at the hourly default (cost_model.budget_sweep_cost)."""
    import re

    bench = json.loads((ROOT / "docs" / "bench.json").read_text(encoding="utf-8"))
    row = next(r for r in bench[KEY] if r["users"] == 2_000)
    text = " ".join((ROOT / "docs" / "performance.md").read_text(encoding="utf-8").split())
    month, per_user = re.search(r"\*\*\$([\d.]+) a month at 2,000 users\*\* \(the estimate was \$0\.11\), "
                                r"\$([\d.]+) a user", text).groups()
    assert float(month) == round(row["steady_monthly_usd"], 2)
    assert float(per_user) == round(row["steady_monthly_usd"] / 2_000, 5)
