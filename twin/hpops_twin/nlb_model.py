"""A model of how a Network Load Balancer picks a target for a new TCP connection.

What the NLB user guide documents ("How Elastic Load Balancing works",
"Routing algorithm"): for TCP, a flow hash over protocol, source IP and port, destination IP and port and
the TCP sequence number picks one of the target group's targets, and the connection stays there for
its life; with `stickiness.type=source_ip` every flow from one source IP goes to one target. AWS does
not publish the hash itself, so this one is a keyed BLAKE2b: each bench seed is a different key (a
different load balancer node's hash) and different client ports and sequence numbers. What the model
claims is only what the guide says: the placement is a uniform function of the 5-tuple (+ sequence
number), or of the source IP alone when sticky.

Access paths, as the NLB sees them (Client VPN administrator guide, "Rules and best practices"):
* `nat`: a campus behind NAT, every user arrives from one public IP, on its own source port;
* `client-vpn`: AWS Client VPN source-NATs each user to its network interface's IP in the associated
  subnet, so one source IP per associated subnet (two here);
* `routed`: Site-to-Site VPN or Direct Connect, every user's own IP.
"""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from dataclasses import dataclass

TCP = 6
SSH_PORT = 22
EPHEMERAL_PORTS = (32768, 60999)  # Linux's default ip_local_port_range, also what a NAT hands out
ACCESS_PATHS = {"nat": 1, "client-vpn": 2, "routed": None}  # source IPs; None = one per user


@dataclass(frozen=True)
class Flow:
    source_ip: str
    source_port: int
    destination_ip: str
    destination_port: int
    sequence: int


def _hash(key: bytes, *parts: object) -> int:
    digest = hashlib.blake2b("|".join(str(p) for p in parts).encode(), key=key, digest_size=8).digest()
    return int.from_bytes(digest, "big")


def choose_target(flow: Flow, targets: list[str], sticky_source_ip: bool, key: bytes) -> str:
    """The target of a new connection: the targets are taken in a fixed order (AWS's is its own)."""
    if not targets:
        raise ValueError("no target to choose from")
    ordered = sorted(targets)
    if sticky_source_ip:
        return ordered[_hash(key, flow.source_ip) % len(ordered)]
    return ordered[_hash(key, TCP, flow.source_ip, flow.source_port, flow.destination_ip,
                         flow.destination_port, flow.sequence) % len(ordered)]


def source_ips(path: str, users: int) -> list[str]:
    """Each user's source IP as the NLB sees it on that access path."""
    count = ACCESS_PATHS[path]
    if count is None:
        return [f"10.200.{u // 250}.{u % 250 + 1}" for u in range(users)]
    # Client VPN associates a user's connection with one of its subnets; users alternate over them.
    return [f"10.1.{u % count}.{200 + u % count}" for u in range(users)]


def place_users(path: str, users: int, targets: list[str], sticky_source_ip: bool, seed: int,
                nlb_ip: str = "10.1.0.10") -> Counter:
    """Sessions per target when each of `users` opens one SSH connection through the NLB."""
    rng = random.Random(seed)
    key = seed.to_bytes(8, "big")
    placed: Counter = Counter({t: 0 for t in targets})
    for ip in source_ips(path, users):
        flow = Flow(ip, rng.randint(*EPHEMERAL_PORTS), nlb_ip, SSH_PORT, rng.getrandbits(32))
        placed[choose_target(flow, targets, sticky_source_ip, key)] += 1
    return placed


def max_over_mean(placed: Counter) -> float:
    """The busiest node's sessions over the mean per node (1.0 = perfectly even)."""
    mean = sum(placed.values()) / len(placed)
    return max(placed.values()) / mean

