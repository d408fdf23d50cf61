"""`make demo`: the whole story in the twin, with a timeline and a final table.

Every step runs the real state machine and handlers. A step passes when, after all executions
have finished, the target group equals the Running login nodes (and the step's own expectation
holds); the demo exits non-zero otherwise.

Each line carries the seconds since the demo started (building the first twin included) and is
flushed at once, so a pipe or a CI log shows each step as it starts.
"""

from __future__ import annotations

import contextlib
import functools
import random
import re
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from hpops_twin.node_hosts import rotation_bundle
from hpops_twin.world import ExecutionResult, TwinWorld

# A pipe or CI log block-buffers print(): the timeline would arrive in lumps, or at the end.
say_now = functools.partial(print, flush=True)
SCREEN_WIDTH = 100
HEARTBEAT_SECONDS = 5.0  # a long step says where it is at this often
# A host key fingerprint and a secret version id, of which a terminal shows the first 8 characters
# (--json keeps them whole): enough to tell two apart on screen.
_FINGERPRINT = re.compile(r"\b(SHA256:[A-Za-z0-9+/]{8})[A-Za-z0-9+/]{12,}=*")
_UUID = re.compile(r"\b([0-9a-f]{8})-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")
# What a wrapped line's continuations sit under: a table row's step name, or the clock and the line's indent.
_TABLE_ROW = re.compile(r"( ?\d+ +\d+ +\d+ +\d+ +\d+ +\d+ +[\d.]+ +(?:ok \(drift\)|\S+) +)")
_INDENT = re.compile(r"(\[[ 0-9.]+s\] +| *)")


def on_screen(text: str, width: int = SCREEN_WIDTH) -> list[str]:
    """A demo line as a terminal shows it: fingerprints and version ids shortened, and wrapped at
    ``width`` under its own indent (after the clock)."""
    text = _UUID.sub(r"\1…", _FINGERPRINT.sub(r"\1…", text))
    if len(text) <= width:
        return [text]
    row = _TABLE_ROW.match(text)
    indent = " " * len(row.group(0)) if row else " " * (len(_INDENT.match(text).group(0)) + 2)
    return textwrap.wrap(text, width, subsequent_indent=indent, break_on_hyphens=False)


def fitted(out: Callable[[str], None]) -> Callable[[str], None]:
    """``out`` with every line made to fit the screen."""
    def say(text: str) -> None:
        for line in text.splitlines() or [""]:
            for part in on_screen(line):
                out(part)
    return say


@dataclass
class StepOutcome:
    number: int
    title: str
    executions_started: int
    executions: int
    synced: int
    coalesced: int
    failed: int
    extra_passes: int
    dry_runs: int
    targets: list[str]
    truth: list[str]
    converged: bool
    expectation: str
    expectation_met: bool
    seconds: float
    api_calls: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    drift_expected: bool = False
    notifications: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (self.converged or self.drift_expected) and self.expectation_met and self.failed == 0


def summarize(results: list[ExecutionResult]) -> dict[str, Any]:
    synced = coalesced = failed = extra = dry = 0
    failures, reasons = [], []
    for result in results:
        if result.status != "SUCCEEDED":
            failed += 1
            failures.append(f"{result.name[:8]}: {result.error}")
            continue
        if not result.arn.rsplit(":", 2)[-2].endswith("LoginNodeSyncStateMachine"):
            continue  # another state machine on the same event (e.g. BudgetGuard): not a sync
        output = result.output or {}
        lease = output.get("lease", {})
        for reason in output.get("plan", {}).get("reasons", []):
            if reason not in reasons:
                reasons.append(reason)
        if output.get("request", {}).get("dryRun"):
            dry += 1
        elif lease.get("acquired") is False:
            coalesced += 1
        else:
            synced += 1
            extra += max(0, int(lease.get("pass", 2)) - 2)
    return {"synced": synced, "coalesced": coalesced, "failed": failed, "extra_passes": extra, "dry_runs": dry,
            "failures": failures, "reasons": reasons}


class Demo:
    def __init__(self, world: TwinWorld, out: Callable[[str], None] = say_now, started: float | None = None):
        self.world = world
        self.out = out
        self.steps: list[StepOutcome] = []
        self.started = time.perf_counter() if started is None else started

    def say(self, text: str) -> None:
        self.out(f"[{time.perf_counter() - self.started:6.2f}s] {text}")

    def step(self, title: str, action: Callable[[], list[str]], expectation: str = "target group == Running login nodes",
             check: Callable[[], bool] = lambda: True, drift_expected: bool = False, targets: bool = True) -> StepOutcome:
        """``targets`` False: a step about something else (sessions, budgets), which shows the target group
        only if it changed."""
        number = len(self.steps) + 1
        world = self.world
        targets_before = world.target_ips()
        self.say(f"step {number}: {title}")
        world.counter.reset()
        begun = time.perf_counter()
        before = len(world.routes)
        invocations_before = len(world.dispatcher.invocations)
        with self.heartbeat(lambda: f"step {number} still at work"):
            executions = action()
        results = self.wait_saying_progress(executions)
        seconds = time.perf_counter() - begun
        summary = summarize(results)
        # Every pass's plan, not only the last one an execution ended with.
        for invocation in world.dispatcher.invocations[invocations_before:]:
            result = invocation.result if isinstance(invocation.result, dict) else {}
            lines = []
            if invocation.function.endswith("PlanTargetChangesFunction"):
                lines = [r for r in result.get("reasons", []) if not r.startswith("register ")] if world.resolver.parameters["HostIdentityMode"] != "off" else result.get("reasons", [])
                lines = lines + [f"leave notice: {r}" for r in result.get("leaveNotices", [])]
            elif invocation.function.endswith("VerifyNodeIdentityFunction") and result:
                lines = [f"verify {result['ip']}: {result['reason']}"]
            elif invocation.function.endswith("PublishHostIdentityFunction") and result.get("published"):
                lines = [f"publish desired host identity {result['version']} for the node agents"]
            elif invocation.function.endswith("RecordNodeReportFunction") and isinstance(invocation.event, dict):
                detail = invocation.event.get("detail") or {}
                identity = detail.get("hostIdentity") or {}
                lines = [f"node {detail.get('instanceId')} reports ({detail.get('trigger')}): host identity "
                         f"{identity.get('result')}" + (f", {identity.get('reason')}" if identity.get("reason") else "")]
            elif invocation.function.endswith("CheckNodeReportFunction") and result.get("finished"):
                lines = [f"{invocation.event.get('phase')} on {invocation.event['instanceId']}: {result['reason']}"]
            elif invocation.function.endswith("SignHostCertificatesFunction") and result:
                lines = [f"sign host certificates for {invocation.event['instanceId']}: {result['reason']}"]
            elif invocation.function.endswith("GateTargetChangesFunction"):
                lines = result.get("reasons", [])
            elif invocation.function.endswith("LoginAdmissionFunction"):
                verb = "" if result.get("mode") == "on" else "would "
                lines = [f"admission: {verb}{m['action']} rotation {m['instanceId']}: {m['reason']}"
                         for m in result.get("moves", [])]
            for line in lines:
                if line not in summary["reasons"]:
                    summary["reasons"].append(line)
        notifications = world.notifications()
        outcome = StepOutcome(
            number=number, title=title, executions_started=len(world.routes) - before, executions=len(results),
            synced=summary["synced"], coalesced=summary["coalesced"], failed=summary["failed"],
            extra_passes=summary["extra_passes"], dry_runs=summary["dry_runs"], targets=world.target_ips(), truth=world.login_truth(),
            converged=world.converged(), expectation=expectation, expectation_met=check(), seconds=seconds,
            api_calls=dict(world.counter.calls), failures=summary["failures"], reasons=summary["reasons"],
            drift_expected=drift_expected, notifications=[n["subject"] for n in notifications],
        )
        self.steps.append(outcome)
        verdict = "converged" if outcome.converged else ("drift, as expected" if drift_expected else "NOT CONVERGED")
        if outcome.executions:
            self.say(
                f"        {outcome.executions} execution(s): {outcome.synced} synced, {outcome.coalesced} coalesced, "
                f"{outcome.dry_runs} dry run, {outcome.failed} failed, {outcome.extra_passes} extra pass(es) in {seconds:.2f}s"
            )
        for reason in outcome.reasons:
            self.say(f"          {'(plan only) ' if outcome.dry_runs else ''}{reason}")
        for failure in outcome.failures:
            self.say(f"          failed: {failure}")
        for notification in notifications:
            self.say(f"        notification: {notification['subject']}")
        if targets or outcome.targets != targets_before or not outcome.converged:
            self.say(f"        target group: {', '.join(outcome.targets) or '(none)'} -> {verdict}")
        if not outcome.expectation_met:
            self.say(f"        EXPECTATION FAILED: {expectation}")
        return outcome

    @contextlib.contextmanager
    def heartbeat(self, doing: Callable[[], str], every: float = HEARTBEAT_SECONDS) -> Iterator[None]:
        """A line every ``every`` seconds while the block runs (``doing`` says what it is at), so that a
        step is never silent long, even on a busy machine."""
        finished = threading.Event()

        def beat() -> None:
            while not finished.wait(every):
                self.say(f"          ... {doing()}")

        beating = threading.Thread(target=beat, name="demo-heartbeat", daemon=True)
        beating.start()
        try:
            yield
        finally:
            finished.set()
            beating.join()

    def wait_saying_progress(self, executions: list[str]) -> list[ExecutionResult]:
        """The executions' results, saying how many have ended while they run."""
        results: list[ExecutionResult] = []
        with self.heartbeat(lambda: f"{len(results)} of {len(executions)} execution(s) ended"):
            for execution in executions:
                results += self.world.wait([execution], timeout=120)
        return results

    def run(self) -> list[StepOutcome]:
        world, sim = self.world, self.world.sim
        cluster, login = world.cluster_name, world.login_group
        self.say(f"cluster {cluster}: {len(sim.nodes(cluster, login))} login nodes, "
                 f"{len(sim.nodes(cluster, world.worker_group))} {world.worker_group} nodes; target group empty")

        self.step("initial sync (cluster InService event)", lambda: world.publish([sim.state_change_event(cluster)]),
                  "3 login nodes registered", lambda: len(world.target_ips()) == 3)

        victim = sorted(sim.nodes(cluster, login), key=lambda n: n.ip)[0]
        old_ip = victim.ip
        self.step(f"login node {victim.instance_id} ({old_ip}) fails; HyperPod starts a replacement",
                  lambda: world.publish(sim.replace_node(cluster, victim.instance_id)),
                  f"{old_ip} deregistered at once", lambda: old_ip not in world.target_ips())
        self.step("replacement node is provisioned (new IP)", lambda: world.publish(sim.finish_provisioning(cluster)),
                  f"new IP registered, {old_ip} gone", lambda: len(world.target_ips()) == 3 and old_ip not in world.target_ips())

        self.step("login group scaled to 4", lambda: world.publish(sim.scale_group(cluster, login, 4)))
        self.step("4th login node provisioned", lambda: world.publish(sim.finish_provisioning(cluster)),
                  "4 targets", lambda: len(world.target_ips()) == 4)

        lost = world.target_ips()[1]

        def deregister_by_hand() -> list[str]:
            world.deregister_by_hand(lost)
            return []

        # Nothing tells the automation about this: the drift stays until the sweep.
        self.step(f"someone deregisters {lost} by hand (no event)", deregister_by_hand,
                  "drift is visible: target group != truth", lambda: lost not in world.target_ips(), drift_expected=True)

        self.step("periodic sweep", lambda: [world.run_schedule("Sweep")], f"{lost} back", lambda: lost in world.target_ips())

        def burst() -> list[str]:
            victim = sorted(sim.nodes(cluster, login), key=lambda n: n.ip)[-1]
            events = sim.replace_node(cluster, victim.instance_id) + sim.finish_provisioning(cluster)
            events += [sim.state_change_event(cluster) for _ in range(4)]
            events += [sim.node_health_event(cluster, victim.instance_id, "Unhealthy", "Replace") for _ in range(4)]
            while len(events) < 20:
                events.append(random.choice(events))  # EventBridge may deliver duplicates
            return world.publish(events[:20])

        self.step("burst of 20 events (a replacement, duplicates, out of order)", burst,
                  "4 targets, every execution succeeded", lambda: len(world.target_ips()) == 4)
        self.step("manual repair, dry run (trusts no cached IP, changes nothing)", lambda: [world.start_repair(dry_run=True)])
        if world.resolver.parameters["HostIdentityMode"] == "keys":
            self.host_identity_steps()
        return self.steps

    def host_identity_steps(self) -> None:
        world, sim = self.world, self.world.sim
        cluster, login = world.cluster_name, world.login_group
        keyed = all(world.presented_fingerprints(n.instance_id) == world.canonical_fingerprints()
                    for n in sim.nodes(cluster, login) if n.ip in world.target_ips())
        self.say(f"host identity: every registered login node presents the canonical keys: {keyed}")
        world.wait(world.publish(sim.scale_group(cluster, login, 5)))
        broken = next(n for n in sim.nodes(cluster, login) if n.status == "Pending")
        world.hosts.stopped.add(broken.instance_id)
        self.step(f"5th login node {broken.instance_id}: its node agent is down",
                  lambda: world.publish(sim.finish_provisioning(cluster)),
                  "kept out of the target group, with a notification",
                  lambda: broken.ip not in world.target_ips() and len(world.target_ips()) == 4
                  and any("kept out" in (n["subject"] or "") for n in world.notification_log))
        world.hosts.stopped.discard(broken.instance_id)
        self.step("the agent is back (systemd restarts it); the periodic sweep waits for its report, verifies, registers",
                  lambda: [world.run_schedule("Sweep")], "5 targets, all with the canonical keys",
                  lambda: broken.ip in world.target_ips() and len(world.target_ips()) == 5)
        old = world.canonical_fingerprints()
        world.install_canonical_host_keys(rotation_bundle())
        self.say("        operator: `hpops host-keys rotate` wrote new canonical keys; a repair publishes them")
        self.step("host key rotation: repair publishes, every agent applies and reports, each node is re-verified",
                  lambda: [world.start_repair()], "5 targets, all presenting the new keys",
                  lambda: len(world.target_ips()) == 5 and world.canonical_fingerprints() != old
                  and all(world.presented_fingerprints(n.instance_id) == world.canonical_fingerprints()
                          for n in sim.nodes(cluster, login) if n.status == "Running"))

    def table(self) -> str:
        """One line per step; the step's whole name comes last, so no column cuts it."""
        header = f"{'#':>2}  {'exec':>4} {'sync':>4} {'coal':>4} {'fail':>4} {'tgts':>4}  {'sec':>5}  {'result':<10}  step"
        lines = [header, "-" * len(header)]
        for s in self.steps:
            result = ("ok" if s.converged else "ok (drift)") if s.ok else "FAILED"
            lines.append(
                f"{s.number:>2}  {s.executions:>4} {s.synced:>4} {s.coalesced:>4} {s.failed:>4} {len(s.targets):>4}  "
                f"{s.seconds:5.2f}  {result:<10}  {s.title}"
            )
        return "\n".join(lines)


def spread_line(world: TwinWorld, users: int = 200) -> str:
    """200 users behind one campus NAT, placed by the NLB model over the target group the sync keeps:
    with the former source_ip stickiness, and with the stack's setting."""
    from hpops_twin import nlb_model
    from hpops_twin.balance_bench import target_group_of

    targets, sticky = target_group_of(world)

    def spread(on: bool) -> str:
        return "/".join(str(n) for n in sorted(nlb_model.place_users("nat", users, targets, on, seed=7).values(), reverse=True))

    return (f"spread: {users} users behind one campus NAT over the {len(targets)} registered login nodes: "
            f"before (source_ip stickiness) {spread(True)}; now ({'source_ip' if sticky else 'no stickiness'}) {spread(sticky)}")

