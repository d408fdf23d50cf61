"""`make bench`, the session-limit bound: from the login that crosses a user's cluster-wide limit
to that session ended, in agent polls and in seconds at the defaults.

Measured by driving the twin on a simulated clock: the login nodes' real agents poll every
pollSeconds (the agent's default), the SessionSweep runs every SessionSweepSchedule (template.yaml's
default), each at its time, in order; after each poll the SessionLimits executions that the node
reports started run to the end (on AWS they take seconds, well inside one poll), and the clock stops
at the poll whose agent ends the session. The user holds 2 SSH sessions on two login nodes under
the default limit of 2 and opens a third.

* worst: the login comes just after the holding node polled, and just after a sweep;
* typical: it comes half a poll after a poll, half a sweep interval after a sweep;
* "sweep only": the same stack without CheckReportedSessions' rule, as it was before a node's
  report started a check: the SSH login waited for the next sweep.

A Session Manager shell that crosses the limit is ended by its own StartSession event's execution,
before any poll (CloudTrail's delivery to EventBridge, seconds to minutes, is not simulated).
Seconds are simulated time; `execution_seconds` is this machine's wall clock for the executions.
`python -m hpops_twin.session_bound_bench [--merge docs/bench.json]` runs this section alone and
can update only its key of a bench JSON file.
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

from hpops_core.node_channel import contract
from hpops_node_agent.agent import JITTER
from hpops_twin.cost_model import HOURS_PER_MONTH, per_month
from hpops_twin.ssh_logins import SshLogins
from hpops_twin.bench_section import run_alone
from hpops_twin.template_model import TemplateModel
from hpops_twin.world import ENFORCING, TwinWorld

KEY = "session_limit_bound"
REPORT_CHECK_RULE = "SessionsChanged"  # CheckReportedSessionsFunction's event in template.yaml
CHECK_FUNCTION = "CheckReportedSessionsFunction"
LOGIN_NODES = 3
MAX_SIMULATED_SECONDS = 3600
SWEEP_AFTER_POLL = 0.001  # worst case: the sweep runs just after a poll, the login just after both


@dataclass
class BoundRow:
    scenario: str
    path: str  # "ssh" | "ssm": how the crossing session came in
    case: str  # "worst" | "typical"
    checks: str  # "node report and sweep" | "sweep only"
    polls: int  # the holding node's agent polls after the login, the one that ended it included
    sweeps: int  # SessionSweep runs in between
    seconds: float  # simulated, at the default poll and sweep schedule
    executions: int  # SessionLimits executions started from the login to the end
    transitions: int  # their state transitions
    check_invocations: int  # CheckReportedSessions invocations in the meantime
    execution_seconds: float  # wall clock on this machine, for the executions alone


def defaults(template: TemplateModel | None = None) -> tuple[float, float]:
    """(agent poll seconds, sweep seconds) at the defaults: the agent's pollSeconds default and
    template.yaml's SessionSweepSchedule."""
    schedule = (template or TemplateModel()).parameter_defaults()["SessionSweepSchedule"]
    return float(contract.DEFAULT_POLL_SECONDS), HOURS_PER_MONTH * 3600 / per_month(schedule)


class SimulatedClock:
    """Polls at k x poll and sweeps at m x sweep + sweep_phase (seconds), run one at a time in
    time order from `start`, until `done()`; SessionLimits executions are waited for as they start."""

    def __init__(self, world: TwinWorld, poll: float, sweep: float, sweep_phase: float):
        self.world, self.poll, self.sweep, self.sweep_phase = world, poll, sweep, sweep_phase
        self.sfn = world.aws.client("stepfunctions")
        self.seen: set[str] = {e["executionArn"] for e in self._executions()}
        self.transitions = 0
        self.execution_seconds = 0.0

    def _executions(self) -> list[dict]:
        pages = self.sfn.get_paginator("list_executions").paginate(stateMachineArn=self.world.sessions.state_machine_arn())
        return [e for page in pages for e in page["executions"]]

    def settle(self) -> list[Any]:
        """Wait for every SessionLimits execution not yet seen (the ones node reports or a sweep started)."""
        began = time.perf_counter()
        new = [e["executionArn"] for e in self._executions() if e["executionArn"] not in self.seen]
        results = self.world.wait(new, timeout=300)
        failed = [(r.name, r.error, r.cause) for r in results if r.status != "SUCCEEDED"]
        if failed:
            raise RuntimeError(f"session limit bound: executions failed: {failed}")
        self.seen |= set(new)
        self.transitions += sum(self.world.state_transitions(arn) for arn in new)
        self.execution_seconds += time.perf_counter() - began
        return results

    def run(self, start: float, done: Callable[[], bool], sweeps: bool = True) -> tuple[int, int, float]:
        """(polls, sweeps, simulated seconds from `start` to the tick after which `done()`)."""
        polls = sweeps_run = 0
        next_poll = (int(start // self.poll) + 1) * self.poll
        next_sweep = (int((start - self.sweep_phase) // self.sweep) + 1) * self.sweep + self.sweep_phase
        while True:
            if next_poll <= next_sweep or not sweeps:
                now, next_poll = next_poll, next_poll + self.poll
                self.world.agents_poll()
                polls += 1
            else:
                now, next_sweep = next_sweep, next_sweep + self.sweep
                self.world.sessions.sweep()
                sweeps_run += 1
            self.settle()
            if done():
                return polls, sweeps_run, round(now - start, 1)
            if now - start > MAX_SIMULATED_SECONDS:
                raise RuntimeError("session limit bound: the session was not ended within an hour of simulated time")


def _login_nodes(world: TwinWorld) -> list[str]:
    return sorted(n.instance_id for n in world.sim.nodes(world.cluster_name, world.login_group) if n.status == "Running")


def _holding_two(world: TwinWorld, logins: SshLogins, clock: SimulatedClock, user: str) -> list[str]:
    """`user` at the limit: one SSH session on each of two login nodes, reported and checked."""
    first, second = _login_nodes(world)[:2]
    began = time.time() - 600
    logins.open(user, first, began)
    logins.open(user, second, began + 1)
    world.agents_poll()
    clock.settle()
    return [first, second]


def measure_ssh(world: TwinWorld, logins: SshLogins, user: str, case: str, checks: str) -> BoundRow:
    poll, sweep = defaults(world.template)
    phase = SWEEP_AFTER_POLL if case == "worst" else sweep / 2
    clock = SimulatedClock(world, poll, sweep, phase)
    first, _ = _holding_two(world, logins, clock, user)
    checks_before = sum(1 for i in world.dispatcher.invocations if i.function.endswith(CHECK_FUNCTION))
    seen_before, transitions_before, wall_before = len(clock.seen), clock.transitions, clock.execution_seconds
    start = 2 * SWEEP_AFTER_POLL if case == "worst" else sweep + poll / 2  # just after a sweep / mid-way
    crossing = logins.open(user, first, time.time())
    polls, sweeps, seconds = clock.run(start, lambda: not crossing.connected)
    checked = sum(1 for i in world.dispatcher.invocations if i.function.endswith(CHECK_FUNCTION)) - checks_before
    return BoundRow(f"SSH login over the limit, {case} case ({checks})", "ssh", case, checks, polls, sweeps, seconds,
                    len(clock.seen) - seen_before, clock.transitions - transitions_before, checked,
                    round(clock.execution_seconds - wall_before, 2))


def measure_ssm(world: TwinWorld, logins: SshLogins, user: str) -> BoundRow:
    poll, sweep = defaults(world.template)
    clock = SimulatedClock(world, poll, sweep, SWEEP_AFTER_POLL)
    first, _ = _holding_two(world, logins, clock, user)
    shell = world.sessions.start_session(user, instance_id=first)
    began = time.perf_counter()
    [result] = world.wait(world.publish([shell.event]), timeout=300)
    wall = time.perf_counter() - began
    if result.status != "SUCCEEDED" or world.sessions.store.status(shell.session_id) == "Connected":
        raise RuntimeError(f"session limit bound: the shell over the limit was not ended ({result.error})")
    clock.seen.add(result.arn)
    return BoundRow("Session Manager shell over the limit (its StartSession event)", "ssm", "worst",
                    "StartSession event", 0, 0, 0.0, 1, world.state_transitions(result.arn), 0, round(wall, 2))


def bound_rows() -> list[BoundRow]:
    rows = []
    with TwinWorld(login_count=LOGIN_NODES, parameters=ENFORCING) as world, SshLogins(world).installed() as logins:
        rows.append(measure_ssh(world, logins, "alice", "worst", "node report and sweep"))
        rows.append(measure_ssh(world, logins, "bob", "typical", "node report and sweep"))
        rows.append(measure_ssm(world, logins, "carol"))
    with TwinWorld(login_count=LOGIN_NODES, parameters=ENFORCING) as world, SshLogins(world).installed() as logins:
        world.function_rules.pop(REPORT_CHECK_RULE)  # the stack before node reports started checks
        rows.append(measure_ssh(world, logins, "alice", "worst", "sweep only"))
        rows.append(measure_ssh(world, logins, "bob", "typical", "sweep only"))
    return rows


def bound_record(rows: list[BoundRow]) -> dict[str, Any]:
    """What docs/bench.json keeps under KEY: the rows and the clocks they were measured on."""
    poll, sweep = defaults()
    by = {(r.path, r.case, r.checks): r for r in rows}
    return {"rows": [asdict(r) for r in rows], "login_nodes": LOGIN_NODES, "poll_seconds": poll, "poll_jitter": JITTER, "sweep_seconds": sweep,
            "ssh_worst_polls": by[("ssh", "worst", "node report and sweep")].polls,
            "ssh_worst_seconds": by[("ssh", "worst", "node report and sweep")].seconds,
            "ssh_typical_seconds": by[("ssh", "typical", "node report and sweep")].seconds,
            "ssh_worst_polls_sweep_only": by[("ssh", "worst", "sweep only")].polls,
            "ssh_worst_seconds_sweep_only": by[("ssh", "worst", "sweep only")].seconds,
            "transitions_per_crossing": by[("ssh", "worst", "node report and sweep")].transitions,
            "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def render(rows: list[BoundRow]) -> str:
    header = (f"{'session-limit bound (login -> session ended)':<62} {'polls':>5} {'sweeps':>6} {'sim s':>6} "
              f"{'execs':>5} {'transitions':>11} {'checks':>6} {'exec s':>6}")
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(f"{r.scenario:<62} {r.polls:>5} {r.sweeps:>6} {r.seconds:>6.0f} {r.executions:>5} "
                     f"{r.transitions:>11} {r.check_invocations:>6} {r.execution_seconds:6.2f}")
    poll, sweep = defaults()
    lines.append(f"(simulated seconds at the defaults: agent polls every {poll:.0f} s, up to {JITTER:.0%} later with "
                 f"jitter; SessionSweep every {sweep:.0f} s)")
    return "\n".join(lines)


def session_bound_section() -> tuple[list[BoundRow], dict[str, bool]]:
    rows = bound_rows()
    print()
    print(render(rows), flush=True)
    record = bound_record(rows)
    ssm = next(r for r in rows if r.path == "ssm")
    verdicts = {
        "session limits: an SSH login over the limit ends within 2 agent polls, no sweep waited for":
            record["ssh_worst_polls"] <= 2 and all(r.sweeps == 0 for r in rows if r.checks == "node report and sweep"),
        "session limits: a Session Manager shell over the limit ends with its own event, before any poll": ssm.polls == 0,
    }
    return rows, verdicts


def main(argv: list[str]) -> int:
    """Run this section alone; `--merge FILE` also replaces only its key in that bench JSON file."""
    rows, verdicts = session_bound_section()
    return run_alone(argv, verdicts, {KEY: bound_record(rows)})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
