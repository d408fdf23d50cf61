import json
from collections import Counter
from pathlib import Path

import pytest

EVENTS = Path(__file__).resolve().parents[1] / "events"


@pytest.fixture
def saved_event():
    def load(name: str) -> dict:
        return json.loads((EVENTS / name).read_text(encoding="utf-8"))

    return load


@pytest.fixture
def world():
    """A fresh twin: template.yaml provisioned in moto, 3 login + 8 gpu nodes, empty target group."""
    from hpops_twin.world import TwinWorld

    with TwinWorld() as twin:
        yield twin


@pytest.fixture
def synced_world(world):
    """The twin after one successful sync: the target group holds the 3 login nodes."""
    result = world.wait([world.run_schedule()])[0]
    assert result.status == "SUCCEEDED", result.cause
    assert world.target_ips() == world.login_truth()
    return world


def pytest_terminal_summary(terminalreporter):
    """What the twin's IAM enforcement saw in this run (hpops_twin/iam/enforce.py)."""
    import sys

    enforce = sys.modules.get("hpops_twin.iam.enforce")
    if enforce is None or not enforce.SUITE_EXERCISED:
        return
    triples = enforce.SUITE_EXERCISED
    principals = {principal for principal, _, _ in triples}
    terminalreporter.write_line(f"twin IAM: {len(triples)} distinct (principal, action, resource) triples allowed, "
                                f"{len(principals)} principals, {len(enforce.SUITE_DENIALS)} denials")
    # Which ones: the tests that take a permission away on purpose account for every one of a green run.
    refused = Counter(f"{d.principal} {d.action} {d.resource}" for d in enforce.SUITE_DENIALS)
    for line, count in sorted(refused.items()):
        terminalreporter.write_line(f"  denied {count}x: {line}")
    import os

    if os.environ.get("HPOPS_TWIN_IAM_REPORT"):  # a file to keep them in, e.g. to add up several runs
        with open(os.environ["HPOPS_TWIN_IAM_REPORT"], "w", encoding="utf-8") as handle:
            json.dump({"allowed": sorted(triples), "denials": [str(d) for d in enforce.SUITE_DENIALS]}, handle, indent=1)
