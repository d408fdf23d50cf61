"""`make bench`'s suite section reads the last `make test`'s record and never runs the suite itself."""

from __future__ import annotations

import json

from hpops_twin import suite_bench

RECORD = {
    "wall_seconds": 950.4, "test_seconds": 1777.8,
    "directories": {"tests/twin": {"tests": 230, "seconds": 1019.0, "share": 0.573},
                    "tests/unit": {"tests": 1895, "seconds": 171.9, "share": 0.097}},
    "processes": [{"worker": "gw0", "cpu_seconds": 650.3, "child_cpu_seconds": 92.2, "peak_rss_mb": 1484},
                  {"worker": "gw1", "cpu_seconds": 410.6, "child_cpu_seconds": 182.0, "peak_rss_mb": 2100}],
    "slowest": [{"test": f"tests/twin/test_x.py::test_{n}", "phase": "call", "seconds": 90.0 - n} for n in range(20)],
}


def test_the_record_is_reported_against_the_budget(tmp_path, capsys):
    path = tmp_path / "suite-times.json"
    path.write_text(json.dumps(RECORD), encoding="utf-8")

    summary, verdicts = suite_bench.suite_section(path)

    printed = capsys.readouterr().out
    assert summary["tests"] == 2125 and summary["peak_rss_mb"] == 2100
    assert [p["test"] for p in summary["slowest"]] == [f"tests/twin/test_x.py::test_{n}" for n in range(10)]
    assert "tests/twin        230    1019.0   57.3%" in printed and "90.0 s call" in printed
    wall, memory = verdicts
    assert verdicts[wall] is True, "950 s is under 20 minutes"
    assert verdicts[memory] is False, "gw1 peaked at 2,100 MB, over 2 GB"


def test_without_a_record_it_says_so_and_sets_no_target(tmp_path, capsys):
    assert suite_bench.suite_section(tmp_path / "absent.json") == (None, {})
    assert "no record at" in capsys.readouterr().out


def test_merge_replaces_only_the_suite_key_and_its_targets(tmp_path):
    record, bench = tmp_path / "suite-times.json", tmp_path / "bench.json"
    record.write_text(json.dumps(RECORD), encoding="utf-8")
    bench.write_text(json.dumps({"demo": {"cpu_seconds": 50}, "suite": {"old": True},
                                 "targets": {"demo: exits 0": True, "suite: an old wording": True}}), encoding="utf-8")

    assert suite_bench.main([str(record), "--merge", str(bench)]) == 1  # the memory target is missed

    merged = json.loads(bench.read_text(encoding="utf-8"))
    assert merged["demo"] == {"cpu_seconds": 50} and merged["suite"]["wall_seconds"] == 950.4
    assert set(merged["targets"]) == {"demo: exits 0", *suite_bench.suite_section(record)[1]}
