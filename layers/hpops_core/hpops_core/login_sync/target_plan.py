"""Where the decision is made: which IPs to register, which to deregister, and why.

Pure: no AWS, no clock. Input is what the adapters observed (login nodes, target health),
output is a TargetPlan with one human-readable reason per change. Tests need no AWS at all.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hpops_core.cluster.login_group import LoginNode
from hpops_core.login_sync.admission import FLOOR as ADMISSION_FLOOR

# DescribeTargetHealth lists registered targets and those still draining after a deregistration.
# A draining target is on its way out: if its IP is wanted again it must be re-registered.
LEAVING_STATES = frozenset({"draining"})

# Cluster states in which an empty login listing is believable and draining every target is right,
# with what a deregistration then tells the operator. "NotFound": SageMaker no longer knows the cluster.
CLUSTER_GONE_REASONS = {"Deleting": "cluster {cluster} is being deleted", "NotFound": "cluster {cluster} no longer exists"}
CLUSTER_GONE_STATES = frozenset(CLUSTER_GONE_REASONS)


@dataclass(frozen=True)
class Target:
    ip: str
    port: int
    state: str


@dataclass(frozen=True)
class TargetPlan:
    register: tuple[str, ...]
    deregister: tuple[str, ...]
    keep: tuple[str, ...]
    reasons: tuple[str, ...]
    guard: str | None = None
    other_ports: tuple[str, ...] = field(default=())
    # Running login nodes kept out of rotation by load-aware admission: not registered, slot kept.
    held_out: tuple[str, ...] = field(default=())

    @property
    def has_changes(self) -> bool:
        return bool(self.register or self.deregister)

    @property
    def summary(self) -> str:
        if self.guard:
            return f"refused: {self.guard}"
        if not self.has_changes:
            return f"in sync ({len(self.keep)} targets)"
        return f"register {len(self.register)}, deregister {len(self.deregister)}, keep {len(self.keep)}"

    def to_state(self) -> dict[str, Any]:
        return {
            "register": list(self.register),
            "deregister": list(self.deregister),
            "keep": list(self.keep),
            "reasons": list(self.reasons),
            "guard": self.guard,
            "hasChanges": self.has_changes,
            "summary": self.summary,
            "heldOut": list(self.held_out),
        }


def plan_targets(
    nodes: Iterable[LoginNode],
    targets: Iterable[Target],
    ssh_port: int,
    cluster_status: str | None,
    cluster: str = "the cluster",
    held_out: Mapping[str, str] | None = None,
) -> TargetPlan:
    """Make the target group's SSH-port targets equal the IPs of Running login nodes.

    `cluster_status` is only needed (and only looked up) when no login node is Running: an empty
    listing while the cluster is live is far more likely an outage or a misconfiguration than a
    login tier that really went away, so we refuse to cut every user off and raise the alarm.
    `cluster` names the cluster in the reasons. `held_out` (ip -> why, oldest first): Running nodes
    load-aware admission took out of rotation for new connections; kept out only while at least
    min(2, Running nodes) stay registered.
    """
    nodes = sorted(nodes, key=lambda n: n.instance_id)
    targets = list(targets)
    reasons: list[str] = []

    desired: dict[str, str] = {}
    for node in nodes:
        if node.serving:
            desired[node.ip] = node.instance_id  # type: ignore[index]
        else:
            reasons.append(f"skip {node.instance_id}: status {node.status}" + ("" if node.ip else ", no IP yet"))

    ours = [t for t in targets if t.port == ssh_port]
    other_ports = tuple(sorted(f"{t.ip}:{t.port}" for t in targets if t.port != ssh_port))
    registered = {t.ip: t for t in ours if t.state not in LEAVING_STATES}
    leaving = {t.ip for t in ours if t.state in LEAVING_STATES}

    if not desired and registered and cluster_status not in CLUSTER_GONE_STATES:
        guard = (
            f"no Running login node listed while the cluster is {cluster_status or 'unknown'}; "
            f"keeping all {len(registered)} targets"
        )
        return TargetPlan((), (), tuple(sorted(registered)), tuple(reasons), guard, other_ports)

    register, deregister, keep, out = [], [], [], []
    room = len(desired) - min(ADMISSION_FLOOR, len(desired))
    for ip, why in (held_out or {}).items():
        if ip not in desired:
            continue
        if len(out) >= room:
            reasons.append(f"keep {ip} in rotation despite load-aware admission ({why}): "
                           f"fewer than {min(ADMISSION_FLOOR, len(desired))} nodes would take new connections")
            continue
        out.append(ip)
        if ip in registered:
            deregister.append(ip)
            reasons.append(f"deregister {ip}: {desired[ip]} leaves rotation for new connections, its sessions stay ({why})")
        else:
            reasons.append(f"leave {ip} out of rotation: {desired[ip]} is out for new connections ({why})")
    for ip, instance_id in sorted(desired.items()):
        if ip in out:
            continue
        if ip in registered:
            keep.append(ip)
        elif ip in leaving:
            register.append(ip)
            reasons.append(f"register {ip}: {instance_id} is Running and its target is draining")
        else:
            register.append(ip)
            reasons.append(f"register {ip}: {instance_id} is Running and not in the target group")
    why_gone = CLUSTER_GONE_REASONS.get(cluster_status or "", "no Running login node has this IP").format(cluster=cluster)
    for ip in sorted(registered):
        if ip not in desired:
            deregister.append(ip)
            reasons.append(f"deregister {ip}: {why_gone}")
    for target in other_ports:
        reasons.append(f"leave {target}: not the SSH port {ssh_port}")
    return TargetPlan(tuple(register), tuple(sorted(deregister)), tuple(keep), tuple(reasons), None, other_ports,
                      tuple(sorted(out)))


def availability_zone_for(ip: str, vpc_cidrs: Iterable[str]) -> str | None:
    """The AvailabilityZone to name an IP target with: "all" outside the target group's VPC, else None.

    ELBv2 requires AvailabilityZone=all for an IP target outside the target group's VPC (a node in a
    peered VPC), for RegisterTargets and DeregisterTargets alike; inside it, AWS detects the zone
    and we leave the field out. `vpc_cidrs` are the VPC's IPv4 blocks, so only IPv4 is judged.
    """
    address = ipaddress.ip_address(ip)
    if address.version != 4:
        return None
    inside = any(address in ipaddress.ip_network(cidr) for cidr in vpc_cidrs)
    return None if inside else "all"


def still_to_apply(
    register: Iterable[str], deregister: Iterable[str], targets: Iterable[Target], ssh_port: int
) -> tuple[list[str], list[str]]:
    """What a retried apply still has to send, given the target group as it is now.

    A retry follows an attempt that may have got halfway (a Lambda timed out between its two
    calls); re-sending what already took effect changes nothing in ELB but is a second side effect.
    A target that is draining has already been deregistered.
    """
    registered = {t.ip for t in targets if t.port == ssh_port and t.state not in LEAVING_STATES}
    return [ip for ip in register if ip not in registered], [ip for ip in deregister if ip in registered]
