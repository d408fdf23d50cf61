"""Login-node slots: port 2200+N on the NLB forwards to one login node alone, so users can return to it.

Each slot has its own single-target target group (template.yaml, LoginNodeSlots). The slot's
registered target IS the assignment: no other state to drift. `plan_slots` (pure) keeps a node in
its slot for as long as it stays eligible (a login node registered in the main target group), frees
the slot of a node that left, and gives every eligible node without a slot the lowest free one: a
replacement takes a free slot, and the old node's slot stops answering for it. Nodes beyond the
number of slots get none (the reason says so). The map is published for the agents
(/hpops/<cluster>/node/login-slots), which tell users at login which slot they are on.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from hpops_core.common.clients import client, transient_errors_named
from hpops_core.login_sync import target_group
from hpops_core.node_channel.login_slots import LOGIN_SLOTS_FORMAT, SLOT_PORT_BASE
DRAINING = "draining"  # a deregistered target: it no longer holds its slot


@dataclass(frozen=True)
class SlotPlan:
    register: dict[int, str] = field(default_factory=dict)  # slot -> ip
    deregister: dict[int, tuple[str, ...]] = field(default_factory=dict)  # slot -> ips
    assignment: dict[str, int] = field(default_factory=dict)  # ip -> slot, after the plan
    reasons: tuple[str, ...] = ()

    @property
    def has_changes(self) -> bool:
        return bool(self.register or self.deregister)


def plan_slots(current: Mapping[int, Sequence[str]], eligible: Iterable[str]) -> SlotPlan:
    """`current`: slot -> IPs registered (not draining) in its target group; `eligible`: the IPs that
    may have a slot. A slot holding two IPs (edited by hand) keeps the lowest eligible one."""
    wanted = sorted(set(eligible))
    register: dict[int, str] = {}
    deregister: dict[int, tuple[str, ...]] = {}
    assignment: dict[str, int] = {}
    reasons: list[str] = []
    for slot in sorted(current):
        ips = sorted(current[slot])
        keep = next((ip for ip in ips if ip in wanted and ip not in assignment), None)
        if keep is not None:
            assignment[keep] = slot
        gone = tuple(ip for ip in ips if ip != keep)
        if gone:
            deregister[slot] = gone
            reasons.append(f"slot {slot}: {', '.join(gone)} left (not a registered login node, or held twice)")
    free = [slot for slot in sorted(current) if slot not in assignment.values()]
    for ip in wanted:
        if ip in assignment:
            continue
        if not free:
            reasons.append(f"{ip}: no free slot (all {len(current)} taken)")
            continue
        slot = free.pop(0)
        register[slot], assignment[ip] = ip, slot
        reasons.append(f"slot {slot} (port {SLOT_PORT_BASE + slot}): {ip}")
    return SlotPlan(register, deregister, assignment, tuple(reasons))


def slot_document(assignment: Mapping[str, int], host: str) -> str:
    """What the agents read: each node finds its own IP."""
    return json.dumps({"format": LOGIN_SLOTS_FORMAT, "host": host, "portBase": SLOT_PORT_BASE,
                       "slots": {ip: slot for ip, slot in sorted(assignment.items())}}, sort_keys=True)


def reconcile_slots(slot_arns: Sequence[str], eligible: Iterable[str], ssh_port: int, vpc_id: str,
                    parameter: str, host: str) -> SlotPlan:
    """Read every slot's target group, apply the plan (register first), publish the map if it changed."""
    current = {number: [t.ip for t in target_group.describe_targets(arn) if t.port == ssh_port and t.state != DRAINING]
               for number, arn in enumerate(slot_arns, start=1)}
    plan = plan_slots(current, eligible)
    if not plan.has_changes:
        return plan
    cidrs = target_group.vpc_cidrs(slot_arns[0], vpc_id)
    for slot, ip in plan.register.items():
        target_group.register_ips(slot_arns[slot - 1], [ip], ssh_port, cidrs)
    for slot, ips in plan.deregister.items():
        target_group.deregister_ips(slot_arns[slot - 1], list(ips), ssh_port, cidrs)
    with transient_errors_named("ssm:PutParameter"):
        client("ssm").put_parameter(Name=parameter, Value=slot_document(plan.assignment, host), Type="String",
                                    Overwrite=True)
    return plan
