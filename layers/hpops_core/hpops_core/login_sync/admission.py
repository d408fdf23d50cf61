"""Load-aware admission: which login nodes take new connections, and why. PURE: no AWS, no clock.

An NLB has no least-connections mode; it can only be steered by registering and deregistering
targets. So a login node whose load stays well above the tier's mean leaves the target group for
*new* connections: its users keep working (connection termination stays off, so established flows
keep going), its slot port (LoginNodeSlots) still reaches it, and it comes back once it has cooled.
LoginNodeSync makes the change (admission only writes its record and starts a sync).

The rules, every move with its reason:
- A node's load is its pressure (PSI avg60, the larger of CPU and memory "some", percent) and its
  sessions, from its latest report when that is fresh (REPORT_MAX_AGE_SECONDS).
- The tier is every node in rotation or out of it with a fresh report; its pressure mean is used only
  when every one of them reports PSI (a kernel without it must not look idle).
- Hot: pressure at least the mean + the pressure margin (and at least MIN_HOT_PRESSURE), or sessions
  at least the mean x (1 + the session margin) and MIN_SESSION_EXCESS above it.
- Leave: hot without a break for `sustain_seconds`; one node per run; never below the floor:
  min(FLOOR, eligible) healthy nodes stay in rotation.
- Return (hysteresis): below half of both margins after `min_out_seconds` in the out state; at once
  when its report is stale or missing (never kept out on missing data), or to restore the floor,
  coolest first; and, hot or not, before the target group's deregistration delay ends
  (`max_out_seconds`): its users' connections must never depend on the load balancer keeping a
  deregistered target's flows (it may leave again after the sustain time).
- Imbalance (alarmed): the busiest node in rotation holds more sessions than the flow hash would
  put there by chance (mean + IMBALANCE_SIGMAS standard deviations of a uniform spread), without a
  break for `imbalance_sustain_seconds`.
"""

from __future__ import annotations

import math
from datetime import datetime
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hpops_core.node_channel import contract

# Agents report on change and at least every heartbeat: two heartbeats and a poll without one is stale.
REPORT_MAX_AGE_SECONDS = 2 * contract.DEFAULT_HEARTBEAT_SECONDS + contract.DEFAULT_POLL_SECONDS
FLOOR = 2  # never fewer nodes in rotation than this (or all of them, if fewer)
MIN_HOT_PRESSURE = 20.0  # percent: below it no node is hot by pressure, whatever the mean
# A node must be able to stay out at least this long for leaving rotation to be worth a sync each way.
MIN_OUT_WINDOW_SECONDS = 600
MIN_SESSION_EXCESS = 5  # sessions above the mean before sessions alone make a node hot
IMBALANCE_SIGMAS = 4.0
MODES = ("dry-run", "on")
# Target health states in which a target takes new connections ("unavailable": health checks are off).
TAKING_CONNECTIONS = ("healthy", "initial", "unavailable")


@dataclass(frozen=True)
class AdmissionPolicy:
    pressure_margin: float = 20.0  # percentage points above the tier's mean pressure
    session_margin: float = 0.5  # fraction above the tier's mean sessions
    sustain_seconds: int = 600
    min_out_seconds: int = 900
    imbalance_sustain_seconds: int = 1800
    # A node out of rotation is a deregistered target: it must be back before the target group's
    # deregistration delay ends (after it, the load balancer may end its users' connections). None: no bound.
    max_out_seconds: int | None = None


@dataclass(frozen=True)
class NodeLoad:
    """One eligible login node as the admission function observed it."""

    instance_id: str
    ip: str
    fresh: bool  # a report recent enough to judge by
    sessions: int | None = None
    pressure: float | None = None  # None without PSI or without a fresh report
    in_rotation: bool = True  # registered in the login target group, not draining
    healthy: bool = True  # its target takes connections (healthy or initial)


@dataclass(frozen=True)
class OutOfRotation:
    ip: str
    since: int
    reason: str


@dataclass(frozen=True)
class AdmissionState:
    """What the admission record keeps between runs (admission_store.py)."""

    out: Mapping[str, OutOfRotation] = field(default_factory=dict)  # instance id -> why it is out
    hot_since: Mapping[str, int] = field(default_factory=dict)  # instance id -> first run it was hot
    imbalance_since: int | None = None
    mode: str = "dry-run"  # the mode of the run that wrote it: only "on" is applied by the sync
    decided_at: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"out": {i: {"ip": o.ip, "since": o.since, "reason": o.reason} for i, o in sorted(self.out.items())},
                "hotSince": dict(sorted(self.hot_since.items())), "imbalanceSince": self.imbalance_since,
                "mode": self.mode, "decidedAt": self.decided_at}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> AdmissionState:
        if not data:
            return cls()
        out = {i: OutOfRotation(str(o["ip"]), int(o["since"]), str(o["reason"])) for i, o in (data.get("out") or {}).items()}
        return cls(out, {i: int(t) for i, t in (data.get("hotSince") or {}).items()},
                   data.get("imbalanceSince"), str(data.get("mode") or "dry-run"), int(data.get("decidedAt") or 0))

    @property
    def out_ips(self) -> frozenset[str]:
        return frozenset(o.ip for o in self.out.values())


@dataclass(frozen=True)
class Move:
    instance_id: str
    ip: str
    action: str  # "leave" | "return"
    reason: str


@dataclass(frozen=True)
class AdmissionDecision:
    state: AdmissionState
    moves: tuple[Move, ...]
    reasons: tuple[str, ...]  # why nothing else moved
    imbalance: str | None = None  # set while a sustained imbalance lasts (the alarm's metric)
    figures: Mapping[str, Any] = field(default_factory=dict)

    @property
    def summary(self) -> str:
        if not self.moves:
            return f"no move; {len(self.state.out)} node(s) out of rotation"
        return "; ".join(f"{m.action} {m.instance_id}" for m in self.moves)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


@dataclass(frozen=True)
class _Tier:
    pressure_mean: float | None
    session_mean: float | None
    note: str


def _tier(nodes: Iterable[NodeLoad]) -> _Tier:
    fresh = [n for n in nodes if n.fresh]
    without_psi = sorted(n.instance_id for n in fresh if n.pressure is None)
    pressure = None if without_psi else _mean([float(n.pressure) for n in fresh])  # type: ignore[arg-type]
    sessions = _mean([float(n.sessions or 0) for n in fresh])
    note = f"pressure not compared: {', '.join(without_psi)} report(s) no PSI" if without_psi and fresh else ""
    return _Tier(pressure, sessions, note)


def _hot(node: NodeLoad, tier: _Tier, policy: AdmissionPolicy, scale: float = 1.0) -> str | None:
    """Why the node is above the tier by the margins (scaled: 0.5 for the way back), or None."""
    if not node.fresh:
        return None
    if tier.pressure_mean is not None and node.pressure is not None:
        bar = tier.pressure_mean + policy.pressure_margin * scale
        if node.pressure >= bar and node.pressure >= MIN_HOT_PRESSURE * scale:
            return f"pressure {node.pressure:.0f}% against the tier's mean {tier.pressure_mean:.0f}% (bar {bar:.0f}%)"
    if tier.session_mean is not None and node.sessions is not None:
        bar = max(tier.session_mean * (1 + policy.session_margin * scale), tier.session_mean + MIN_SESSION_EXCESS * scale)
        if node.sessions >= bar:
            return f"{node.sessions} sessions against the tier's mean {tier.session_mean:.1f} (bar {bar:.1f})"
    return None


def _excess(node: NodeLoad, tier: _Tier) -> tuple[float, float]:
    pressure = (node.pressure or 0.0) - (tier.pressure_mean or 0.0) if tier.pressure_mean is not None else 0.0
    return pressure, (node.sessions or 0) - (tier.session_mean or 0.0)


def imbalance_now(nodes: Iterable[NodeLoad], out: Mapping[str, OutOfRotation]) -> str | None:
    """Does the busiest node in rotation hold more sessions than a uniform spread would by chance?"""
    counted = [n for n in nodes if n.fresh and n.in_rotation and n.instance_id not in out and n.sessions is not None]
    if len(counted) < 2:
        return None
    total = sum(n.sessions or 0 for n in counted)
    share = 1 / len(counted)
    mean, sd = total * share, math.sqrt(total * share * (1 - share))
    busiest = max(counted, key=lambda n: (n.sessions or 0, n.instance_id))
    bar = mean + IMBALANCE_SIGMAS * sd
    if total and (busiest.sessions or 0) > bar:
        return (f"{busiest.instance_id} holds {busiest.sessions} of {total} sessions on {len(counted)} nodes in rotation "
                f"(a uniform spread puts at most {bar:.1f} there but for a one-in-10,000 chance)")
    return None


@dataclass
class _Run:
    """One decision in progress: the nodes, the tier, what is out, and what has been said."""

    nodes: list[NodeLoad]
    tier: _Tier
    out: dict[str, OutOfRotation]
    floor: int
    moves: list[Move] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)

    def give_back(self, instance_id: str, why: str) -> None:
        self.moves.append(Move(instance_id, self.out.pop(instance_id).ip, "return", why))

    def serving(self) -> int:
        """Nodes that take new connections once this run's moves are applied (a returning node does)."""
        return sum(1 for n in self.nodes if n.instance_id not in self.out and (n.healthy or not n.in_rotation))


def _returns(run: _Run, by_id: Mapping[str, NodeLoad], policy: AdmissionPolicy, now: int) -> None:
    for instance_id in sorted(run.out):
        node, since = by_id[instance_id], run.out[instance_id].since
        if not node.fresh:
            run.give_back(instance_id, "no fresh load report: back in rotation (never kept out on missing data)")
        elif policy.max_out_seconds is not None and now - since >= policy.max_out_seconds:
            run.give_back(instance_id, f"out {(now - since) // 60} min: back before the target group's deregistration "
                                       "delay ends, so its users' connections never depend on a deregistered target")
        elif now - since >= policy.min_out_seconds and _hot(node, run.tier, policy, scale=0.5) is None:
            run.give_back(instance_id, f"cooled after {(now - since) // 60} min out: below half the margins "
                                       f"({_load_text(node, run.tier)})")
        elif now - since >= policy.min_out_seconds:
            run.reasons.append(f"{instance_id} stays out: {_hot(node, run.tier, policy, scale=0.5)}")
        else:
            run.reasons.append(f"{instance_id} stays out: out for {(now - since) // 60} of at least "
                               f"{policy.min_out_seconds // 60} min")
    # A node that left the group or turned unhealthy may have taken the tier under the floor.
    for instance_id in sorted(run.out, key=lambda i: _excess(by_id[i], run.tier)):
        if run.serving() >= run.floor:
            break
        run.give_back(instance_id, f"floor: fewer than {run.floor} healthy node(s) would take new connections")


def _leaves(run: _Run, previous: AdmissionState, policy: AdmissionPolicy, now: int) -> dict[str, int]:
    """At most one node, the hottest of those hot for the sustain time, leaves; returns who is hot since when."""
    hot_since: dict[str, int] = {}
    candidates: list[tuple[tuple[float, float], NodeLoad, str]] = []
    for node in run.nodes:
        why = _hot(node, run.tier, policy)
        if why is None or node.instance_id in run.out or not node.in_rotation:
            continue
        since = hot_since[node.instance_id] = previous.hot_since.get(node.instance_id, now)
        if not node.healthy:
            run.reasons.append(f"{node.instance_id} is hot but unhealthy: it takes no connections anyway")
        elif now - since >= policy.sustain_seconds:
            candidates.append((_excess(node, run.tier), node, why))
        else:
            run.reasons.append(f"{node.instance_id} is hot ({why}) for {(now - since) // 60} of "
                               f"{policy.sustain_seconds // 60} min")
    if not candidates:
        return hot_since
    if policy.max_out_seconds is not None and policy.max_out_seconds < MIN_OUT_WINDOW_SECONDS:
        run.reasons.append(f"no node leaves rotation: the target group's deregistration delay leaves "
                           f"{max(policy.max_out_seconds, 0)} s out at most, too short to help (set it to 1800 s or more)")
        return hot_since
    _, node, why = max(candidates, key=lambda c: (c[0], c[1].instance_id))
    if run.serving() - 1 >= run.floor:
        run.moves.append(Move(node.instance_id, node.ip, "leave", f"{why}, for {(now - hot_since[node.instance_id]) // 60} min"))
        run.out[node.instance_id] = OutOfRotation(node.ip, now, why)
        hot_since.pop(node.instance_id)
    else:
        run.reasons.append(f"{node.instance_id} stays in rotation although hot ({why}): the floor keeps "
                           f"{run.floor} node(s) taking new connections")
    run.reasons.extend(f"{c[1].instance_id} is hot too; one node leaves per run" for c in candidates if c[1] is not node)
    return hot_since


def decide_admission(nodes: Iterable[NodeLoad], previous: AdmissionState, policy: AdmissionPolicy, now: int,
                     mode: str) -> AdmissionDecision:
    """The next admission state and the moves that lead to it. `nodes`: every login node registered in
    the target group (not draining) or out of rotation by the previous state."""
    nodes = sorted(nodes, key=lambda n: n.instance_id)
    by_id = {n.instance_id: n for n in nodes}
    tier = _tier(nodes)
    eligible = [n for n in nodes if n.in_rotation or n.instance_id in previous.out]
    run = _Run(nodes, tier, {i: o for i, o in previous.out.items() if i in by_id}, min(FLOOR, len(eligible)),
               reasons=[tier.note] if tier.note else [])
    run.reasons += [f"forget {i}: no longer a login node in rotation or reporting" for i in sorted(set(previous.out) - set(by_id))]
    _returns(run, by_id, policy, now)
    hot_since = _leaves(run, previous, policy, now)
    # A node really out of rotation takes no new connection: its sessions are the past, not a spread to alarm on.
    imbalance = imbalance_now(nodes, run.out if mode == "on" else {})
    imbalance_since = (previous.imbalance_since or now) if imbalance else None
    sustained = imbalance if imbalance_since is not None and now - imbalance_since >= policy.imbalance_sustain_seconds else None
    figures = {"pressureMean": None if tier.pressure_mean is None else round(tier.pressure_mean, 1),
               "sessionMean": None if tier.session_mean is None else round(tier.session_mean, 1),
               "eligible": len(eligible), "floor": run.floor, "inRotation": run.serving(), "out": sorted(run.out)}
    state = AdmissionState(run.out, hot_since, imbalance_since, mode, now)
    return AdmissionDecision(state, tuple(run.moves), tuple(run.reasons), sustained, figures)


def _load_text(node: NodeLoad, tier: _Tier) -> str:
    parts = []
    if node.pressure is not None and tier.pressure_mean is not None:
        parts.append(f"pressure {node.pressure:.0f}%, tier mean {tier.pressure_mean:.0f}%")
    parts.append(f"{node.sessions or 0} sessions, tier mean {tier.session_mean or 0:.1f}")
    return "; ".join(parts)


def max_out_for(deregistration_delay_seconds: int, run_every_seconds: int = 300) -> int:
    """How long a node may stay out: its return is decided by a run (every `run_every_seconds`) and
    applied by a sync, both well inside the target group's deregistration delay."""
    return deregistration_delay_seconds - 2 * run_every_seconds


def rotation_changed(previous: AdmissionState, decided: AdmissionState, max_age_seconds: int | None = None) -> bool:
    """Does the sync have something to apply? The out set changed, or the mode switched with nodes out,
    or the previous record was too old for the sync to apply (`max_age_seconds`) and nodes are out."""
    if previous.mode != decided.mode:
        return bool(previous.out or decided.out)
    if max_age_seconds is not None and decided.decided_at - previous.decided_at > max_age_seconds:
        return bool(previous.out or decided.out)
    return previous.out_ips != decided.out_ips


def held_out(state: AdmissionState, now: int, max_age_seconds: int) -> dict[str, OutOfRotation]:
    """What the sync keeps out of the target group: only a record written in mode "on" by a run that is
    recent (an admission function that stopped running must not keep nodes out). ip -> entry."""
    if state.mode != "on" or now - state.decided_at > max_age_seconds:
        return {}
    return {o.ip: o for o in state.out.values()}


def node_loads(reports: Mapping[str, Mapping[str, Any]], registered: Mapping[str, str], previous: AdmissionState,
               now: int, max_age_seconds: int) -> list[NodeLoad]:
    """The nodes admission judges, from the login nodes' stored reports (instance id -> report_store's
    report with its receivedAt) and the target group (ip -> health state, not draining): every node
    registered or out of rotation. A registered IP without a report is judged as not fresh (never moved
    for it)."""
    by_ip = {str(r.get("ip")): (i, r) for i, r in reports.items() if r.get("role", "login") == "login"}
    wanted = set(registered) | {o.ip for o in previous.out.values()}
    nodes = []
    for ip in sorted(wanted):
        instance_id, report = by_ip.get(ip, (None, None))
        if instance_id is None:
            instance_id = next((i for i, o in previous.out.items() if o.ip == ip), None)
            if instance_id is None:
                continue  # a registered IP whose node never reported: nothing to judge or move
        fresh = report is not None and now - _epoch(report.get("receivedAt")) <= max_age_seconds
        load = (report or {}).get("load") or {}
        sessions = (report or {}).get("sessions")
        pressure = max(load["cpuSome60"], load["memorySome60"]) if fresh and "cpuSome60" in load else None
        state = registered.get(ip)
        nodes.append(NodeLoad(instance_id, ip, fresh,
                              len((sessions or {}).get("list", [])) if fresh and sessions is not None else None,
                              pressure, in_rotation=state is not None,
                              healthy=state in (None, *TAKING_CONNECTIONS)))
    return nodes


def _epoch(received_at: Any) -> int:
    """RecordNodeReport's receivedAt (ISO 8601, Z) as epoch seconds; 0 (long ago) when unreadable."""
    try:
        return int(datetime.fromisoformat(str(received_at).replace("Z", "+00:00")).timestamp())
    except ValueError:
        return 0
