import json
import os
import resource
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from real_tools import SHARED_RESOURCE_GROUPS

EVENTS = Path(__file__).resolve().parents[1] / "events"
SLOWEST_KEPT = 20  # as --durations=20 prints them; `make bench`'s suite section reads them from the file

def pytest_addoption(parser):
    # An option, not an environment variable: a pytest that a test runs inside the suite inherits the
    # suite's environment but not its arguments, so only the run `make test` starts writes the record.
    parser.addoption("--suite-times", metavar="PATH", default=None,
                     help="write what the run cost and where (tests/README.md) to PATH as JSON")


def pytest_configure(config):
    if hasattr(config, "workerinput"):
        config.pluginmanager.register(WorkerOutput(config), "hpops-worker-output")
        return
    record = SuiteRecord(config)
    config.pluginmanager.register(record, "hpops-suite-record")
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(WorkersDown(record), "hpops-workers-down")


def pytest_itemcollected(item):
    """Give every test with a shared-resource marker that resource's xdist group, and the tests of a
    module that share a module-scoped fixture (a world they only read) one group of their own, so the
    fixture is built once, on one worker, not once on each. Given as each test is collected: xdist's own
    pytest_collection_modifyitems turns the groups into the node ids it schedules by, and a group given
    in a hook of that name could come after it (then every test is spread over the workers)."""
    resources = [name for name in SHARED_RESOURCE_GROUPS if item.get_closest_marker(name)]
    if len(resources) > 1:
        raise pytest.UsageError(f"{item.nodeid} is marked {' and '.join(resources)}: one group runs it, "
                                "so it may use one shared resource (split it, or add a group for both)")
    chosen = item.get_closest_marker("xdist_group")
    if resources:
        group = SHARED_RESOURCE_GROUPS[resources[0]]
        if chosen is not None and (chosen.args[:1] or [chosen.kwargs.get("name")])[0] != group:
            raise pytest.UsageError(f"{item.nodeid}: marked {resources[0]}, so it runs in xdist group {group!r}, "
                                    "not in the one it names")
    elif chosen is None and _shares_a_module_fixture(item):
        group = item.nodeid.split("::", 1)[0]
    else:
        return
    item.add_marker(pytest.mark.xdist_group(group), append=False)


def _shares_a_module_fixture(item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    return info is not None and any(
        definitions[-1].scope in ("module", "package", "class") for definitions in info.name2fixturedefs.values())


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


# ---------------------------------------------------------------------- what a run cost, and where


def _directory(nodeid: str) -> str:
    parts = nodeid.split("::", 1)[0].split("/")
    return "/".join(parts[:2]) if len(parts) > 2 else parts[0]


def _usage(worker: str) -> dict:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"worker": worker, "cpu_seconds": round(own.ru_utime + own.ru_stime, 1),
            "child_cpu_seconds": round(children.ru_utime + children.ru_stime, 1),
            "peak_rss_mb": round(own.ru_maxrss / 1024)}  # Linux reports kilobytes


def _twin_iam_seen() -> tuple[list, list]:
    """What the twin's IAM enforcement of this process allowed and refused (hpops_twin/iam/enforce.py)."""
    enforce = sys.modules.get("hpops_twin.iam.enforce")
    if enforce is None:
        return [], []
    allowed = [[*triple, count] for triple, count in enforce.SUITE_EXERCISED.items()]
    denials = [[d.principal, d.action, d.resource, str(d)] for d in enforce.SUITE_DENIALS]
    return allowed, denials


class SuiteRecord:
    """What the run cost and where (each directory's seconds, each process's CPU and peak memory) and
    what the twin's IAM enforcement allowed and refused, added up over the xdist workers."""

    def __init__(self, config) -> None:
        self.config = config
        self.started = time.monotonic()
        self.seconds: Counter = Counter()  # tests/<directory> -> seconds of setup, call and teardown
        self.tests: Counter = Counter()  # tests/<directory> -> tests run
        self.workers: list[dict] = []  # one usage record per xdist worker, sent when it ends
        self.allowed: Counter = Counter()  # (principal, action, resource) -> requests, from the workers
        self.denials: list = []
        self.phases: list[tuple[float, str, str]] = []  # (seconds, test, setup/call/teardown): the slowest are kept

    def pytest_runtest_logreport(self, report):
        directory = _directory(report.nodeid)
        self.seconds[directory] += report.duration
        self.phases.append((report.duration, report.nodeid, report.when))
        if report.when == "call" or (report.when == "setup" and not report.passed):
            self.tests[directory] += 1

    def take_worker_output(self, output: dict) -> None:
        if "hpops_usage" in output:
            self.workers.append(output["hpops_usage"])
        for *triple, count in output.get("hpops_twin_iam", {}).get("allowed", []):
            self.allowed[tuple(triple)] += count
        self.denials.extend(output.get("hpops_twin_iam", {}).get("denials", []))

    def pytest_terminal_summary(self, terminalreporter):
        self.report_twin_iam(terminalreporter)
        self.report_suite_time(terminalreporter)

    def report_twin_iam(self, terminalreporter):
        allowed, denials = _twin_iam_seen()
        triples = Counter({tuple(triple): count for *triple, count in allowed}) + self.allowed
        denials = denials + self.denials
        if not triples:
            return
        principals = {principal for principal, _, _ in triples}
        terminalreporter.write_line(f"twin IAM: {len(triples)} distinct (principal, action, resource) triples allowed, "
                                    f"{len(principals)} principals, {len(denials)} denials")
        # Which ones: the tests that take a permission away on purpose account for every one of a green run.
        refused = Counter(f"{principal} {action} {resource_name}" for principal, action, resource_name, _ in denials)
        for line, count in sorted(refused.items()):
            terminalreporter.write_line(f"  denied {count}x: {line}")
        if os.environ.get("HPOPS_TWIN_IAM_REPORT"):  # a file to keep them in, e.g. to add up several runs
            with open(os.environ["HPOPS_TWIN_IAM_REPORT"], "w", encoding="utf-8") as handle:
                json.dump({"allowed": sorted(triples), "denials": [text for *_, text in denials]}, handle, indent=1)

    def report_suite_time(self, terminalreporter):
        """The suite's time budget (tests/README.md): wall time, each directory's share of the tests'
        seconds, each process's CPU and peak memory. Printed by every run, CI's included."""
        if not self.seconds:
            return
        wall = time.monotonic() - self.started
        processes = self.workers or [_usage("main")]
        total = sum(self.seconds.values())
        write = terminalreporter.write_line
        write(f"suite time: {wall:.0f} s wall, {total:.0f} s in tests, {len(processes)} process(es)")
        for directory, seconds in self.seconds.most_common():
            write(f"  {directory:<14} {self.tests[directory]:>5} tests {seconds:>8.1f} s {100 * seconds / total:>5.1f} %")
        for usage in sorted(processes, key=lambda u: u["worker"]):
            write(f"  {usage['worker']:<6} cpu {usage['cpu_seconds']:>7.1f} s (+{usage['child_cpu_seconds']:.1f} s "
                  f"in programs it ran), peak memory {usage['peak_rss_mb']} MB")
        path = self.config.getoption("suite_times")
        if path:  # `make test` keeps it in bench-results/suite-times.json
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(json.dumps({
                "wall_seconds": round(wall, 1), "test_seconds": round(total, 1),
                "directories": {d: {"tests": self.tests[d], "seconds": round(s, 1), "share": round(s / total, 3)}
                                for d, s in self.seconds.most_common()},
                "processes": processes,
                "slowest": [{"test": test, "phase": phase, "seconds": round(seconds, 1)}
                            for seconds, test, phase in sorted(self.phases, reverse=True)[:SLOWEST_KEPT]],
            }, indent=1) + "\n", encoding="utf-8")


class WorkerOutput:
    """In an xdist worker: its usage and the twin IAM record go to the controller when it ends."""

    def __init__(self, config) -> None:
        self.config = config

    def pytest_sessionfinish(self):
        allowed, denials = _twin_iam_seen()
        self.config.workeroutput["hpops_usage"] = _usage(self.config.workerinput["workerid"])
        self.config.workeroutput["hpops_twin_iam"] = {"allowed": allowed, "denials": denials}


class WorkersDown:
    """In the xdist controller: each worker's output, as it ends."""

    def __init__(self, record: SuiteRecord) -> None:
        self.record = record

    def pytest_testnodedown(self, node, error):
        self.record.take_worker_output(getattr(node, "workeroutput", None) or {})
