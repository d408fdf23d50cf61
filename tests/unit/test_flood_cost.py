"""The flood's hourly cost that docs/security.md quotes is the one `make bench` measured (docs/bench.json
"flood"), priced again here from its measured rows with today's template and list prices."""

from __future__ import annotations

import json
import re

from hpops_twin.cost_model import REPO_ROOT
from hpops_twin.flood_bench import FloodRow, hourly_cost

BENCH = json.loads((REPO_ROOT / "docs" / "bench.json").read_text(encoding="utf-8"))
SECURITY = (REPO_ROOT / "docs" / "security.md").read_text(encoding="utf-8")


def test_the_recorded_hour_is_the_cost_model_of_the_measured_refusals():
    flood = BENCH["flood"]
    rows = [FloodRow(**row) for row in flood["rows"]]
    assert json.loads(json.dumps(hourly_cost(rows))) == flood["hour"], \
        "docs/bench.json's flood is stale: python -m hpops_twin.flood_bench --merge"
    assert {row.error for row in rows} == {"EnrollmentConflictError", "NodeProofKeyMismatchError",
                                          "MalformedNodeChannelRequest"}
    assert flood["hour"]["tracing"] == "PassThrough"


def test_docs_security_quotes_the_measured_hour():
    hour = BENCH["flood"]["hour"]
    paragraph = SECURITY[SECURITY.index("**A flood, and what it costs.**"):].split("\n\n")[0]
    quoted = re.search(r"at most \*\*\$([0-9.]+) an hour\*\*", paragraph)
    assert quoted and float(quoted.group(1)) == hour["usd_per_hour"]
    assert f"${hour['worst_usd_per_hour']:.2f} an hour" in paragraph
    assert f"{hour['calls_per_hour']:,}" in paragraph and f"{hour['concurrency']} " in paragraph
    assert "Estimated" not in paragraph and "not measured" not in paragraph
