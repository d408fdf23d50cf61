"""Optional IMDS lockdown: only root (and an allowed group) reach the instance metadata service.

Every process on a HyperPod node can take the node's IAM role credentials from IMDS (169.254.169.254,
and fd00:ec2::254 where the instance has IPv6). A site that can accept it may close that to ordinary
users, as AWS ParallelCluster does on its head node (`HeadNode/Imds/Secured`): iptables owner-match
rules in a chain of their own, jumped to from OUTPUT for the IMDS address only:

    -N HPOPS_IMDS
    -A HPOPS_IMDS -m owner --uid-owner 0 -j ACCEPT
    -A HPOPS_IMDS -m owner --gid-owner <allowed group> -j ACCEPT     (one per allowed group)
    -A HPOPS_IMDS -p tcp -j REJECT --reject-with tcp-reset          (a user's SDK fails at once, no hang)
    -A HPOPS_IMDS -j REJECT
    -I OUTPUT 1 -d 169.254.169.254/32 -j HPOPS_IMDS

Safety, because nothing here may stop a node from being provisioned or lock root out of IMDS:
the chain is built completely and read back (root's ACCEPT first) before OUTPUT jumps to it; any
failure removes the jump and the chain again (open, as without the option) and is reported, never
raised to the installer. Applying twice gives the same rules. Root keeps IMDS (the agent, HyperPod's
own root services, the lifecycle scripts); a user process loses the role's credentials, which is
the point and the cost: users' `aws s3 cp` needs credentials of their own.

``probe`` answers the question the stack asks every node: can a non-root process reach IMDS? It
connects as ``nobody`` from a child process (the agent runs as root), so it measures the node as a
user finds it, whatever set the rules.

Standard library only (shipped to the nodes).
"""

from __future__ import annotations

import grp
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

from hpops_core.common import validation
from hpops_core.node_channel import contract

CHAIN = "HPOPS_IMDS"
IMDS_V4 = "169.254.169.254"
IMDS_V6 = "fd00:ec2::254"
IMDS_PORT = 80
# (tool, address/prefix): IPv4 always; IPv6 where ip6tables exists (the endpoint exists only on
# instances with IPv6, and the rule costs nothing where it does not).
FAMILIES = (("iptables", IMDS_V4 + "/32"), ("ip6tables", IMDS_V6 + "/128"))
NOBODY = 65534

# What ``probe`` answers: reachable (a non-root process opened a connection to IMDS: the role is the
# users' too), blocked (refused for non-root: the lockdown, or a site's own rules), no-imds (not even
# root reached it: not on EC2, or IMDS switched off), unknown (the probe itself could not run).
REACHABLE, BLOCKED, NO_IMDS, UNKNOWN = contract.IMDS_PROBE_RESULTS

Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]


class ImdsGuardError(ValueError):
    """The lockdown's configuration is not one the agent accepts (an allowed group name)."""


@dataclass(frozen=True)
class LockdownResult:
    applied: bool
    reason: str  # what was done, or why not (one line, no secrets: rules and group names only)


def chain_rules(allowed_gids: Sequence[int]) -> List[List[str]]:
    """The chain's rules in order (arguments after the tool name); root's ACCEPT always first."""
    rules = [["-A", CHAIN, "-m", "owner", "--uid-owner", "0", "-j", "ACCEPT"]]
    for gid in allowed_gids:
        rules.append(["-A", CHAIN, "-m", "owner", "--gid-owner", str(gid), "-j", "ACCEPT"])
    rules.append(["-A", CHAIN, "-p", "tcp", "-j", "REJECT", "--reject-with", "tcp-reset"])
    rules.append(["-A", CHAIN, "-j", "REJECT"])
    return rules


def jump_rule(destination: str) -> List[str]:
    return ["OUTPUT", "-d", destination, "-j", CHAIN]


def resolve_groups(names: Sequence[str], lookup: Callable[[str], int] = lambda name: grp.getgrnam(name).gr_gid
                   ) -> Tuple[int, ...]:
    """Group names -> gids; an invalid or unknown name is an ImdsGuardError (nothing is applied)."""
    gids = []
    for name in names:
        if not validation.is_posix_user(name):
            raise ImdsGuardError("IMDS allowed group {!r} is not a valid group name".format(name))
        try:
            gids.append(lookup(name))
        except KeyError:
            raise ImdsGuardError("IMDS allowed group {} does not exist on this node".format(name)) from None
    return tuple(sorted(set(gids)))


def _run(command: Sequence[str]) -> "subprocess.CompletedProcess[str]":
    return subprocess.run(list(command), capture_output=True, text=True, timeout=30)


def _chain_is_safe(listed: str, allowed_gids: Sequence[int]) -> bool:
    """The chain as `-S` prints it starts with root's ACCEPT and holds every allowed group's."""
    lines = [line.split() for line in listed.splitlines() if line.startswith("-A " + CHAIN + " ")]
    if not lines or "--uid-owner" not in lines[0] or lines[0][lines[0].index("--uid-owner") + 1] != "0" \
            or lines[0][-1] != "ACCEPT":
        return False
    granted = {line[line.index("--gid-owner") + 1] for line in lines if "--gid-owner" in line and line[-1] == "ACCEPT"}
    return all(str(gid) in granted for gid in allowed_gids)


def _remove(tool: str, destination: str, run: Runner) -> None:
    # -D until it fails: a jump added twice by hand goes too.
    for _ in range(10):
        if run([tool, "-w", "-D"] + jump_rule(destination)).returncode != 0:
            break
    run([tool, "-w", "-F", CHAIN])
    run([tool, "-w", "-X", CHAIN])


def _apply_family(tool: str, destination: str, allowed_gids: Sequence[int], run: Runner) -> Optional[str]:
    """None when the family is locked down; else why not (and the family is left open)."""
    if run([tool, "-w", "-N", CHAIN]).returncode != 0:  # exists already: refill it
        flushed = run([tool, "-w", "-F", CHAIN])
        if flushed.returncode != 0:
            return "{} cannot create or flush chain {}: {}".format(tool, CHAIN, _tail(flushed))
    for rule in chain_rules(allowed_gids):
        done = run([tool, "-w"] + rule)
        if done.returncode != 0:
            _remove(tool, destination, run)
            return "{} refused {}: {}".format(tool, " ".join(rule), _tail(done))
    listed = run([tool, "-w", "-S", CHAIN])
    if listed.returncode != 0 or not _chain_is_safe(listed.stdout, allowed_gids):
        _remove(tool, destination, run)
        return "{} chain {} did not read back as built (root's ACCEPT first); left open".format(tool, CHAIN)
    if run([tool, "-w", "-C"] + jump_rule(destination)).returncode != 0:
        jumped = run([tool, "-w", "-I"] + jump_rule(destination)[:1] + ["1"] + jump_rule(destination)[1:])
        if jumped.returncode != 0:
            _remove(tool, destination, run)
            return "{} cannot add the OUTPUT jump: {}".format(tool, _tail(jumped))
    return None


def _tail(done: "subprocess.CompletedProcess[str]") -> str:
    text = (done.stderr or done.stdout or "").strip().splitlines()
    return text[-1][:200] if text else "exit {}".format(done.returncode)


def _has(tool: str, run: Runner) -> bool:
    try:
        return run([tool, "--version"]).returncode == 0
    except OSError:
        return False


def apply_lockdown(allowed_groups: Sequence[str], run: Runner = _run,
                   lookup: Optional[Callable[[str], int]] = None) -> LockdownResult:
    """Install the rules for IPv4 (required) and IPv6 (where ip6tables exists). Never raises."""
    try:
        gids = resolve_groups(allowed_groups, lookup) if lookup else resolve_groups(allowed_groups)
    except ImdsGuardError as error:
        return LockdownResult(False, "{}; IMDS left open".format(error))
    if not _has("iptables", run):
        return LockdownResult(False, "iptables not found; IMDS left open")
    done = []
    for tool, destination in FAMILIES:
        if tool != "iptables" and not _has(tool, run):
            continue
        try:
            problem = _apply_family(tool, destination, gids, run)
        except (OSError, subprocess.SubprocessError) as error:
            problem = "{} failed: {}".format(tool, error)
        if problem:
            if tool == "iptables":
                return LockdownResult(False, problem)
            done.append("{} not locked ({})".format(IMDS_V6, problem))
            continue
        done.append("{} root{} only".format(destination.split("/")[0],
                                           " and gid " + ",".join(map(str, gids)) if gids else ""))
    return LockdownResult(True, "; ".join(done))


def remove_lockdown(run: Runner = _run) -> LockdownResult:
    """Take the rules out again (the option switched off). Never raises."""
    for tool, destination in FAMILIES:
        if _has(tool, run):
            try:
                _remove(tool, destination, run)
            except (OSError, subprocess.SubprocessError):
                pass
    return LockdownResult(False, "IMDS lockdown removed")


# The child's whole program: connect, exit 0 on success, 3 refused/reset, 4 timed out or unreachable.
_PROBE = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close()
except (ConnectionRefusedError, ConnectionResetError, PermissionError):
    sys.exit(3)
except OSError:
    sys.exit(4)
"""


def _connect(address: str, port: int, timeout: float, as_user: Optional[int]) -> int:
    extra = {"user": as_user, "group": as_user, "extra_groups": []} if as_user is not None else {}
    done = subprocess.run([sys.executable, "-I", "-c", _PROBE, address, str(port), str(timeout)],
                          capture_output=True, timeout=timeout + 10, cwd="/", **extra)
    return done.returncode


def probe(address: str = IMDS_V4, port: int = IMDS_PORT, timeout: float = 2.0,
          connect: Callable[[str, int, float, Optional[int]], int] = _connect) -> Tuple[str, str]:
    """(result, reason): can a non-root process (``nobody``) open a connection to IMDS?"""
    if os.geteuid() != 0 and connect is _connect:
        return UNKNOWN, "the agent is not root, so it cannot test as another user"
    try:
        as_user = connect(address, port, timeout, NOBODY)
        if as_user == 0:
            return REACHABLE, "a non-root process connected to {}:{}".format(address, port)
        as_root = connect(address, port, timeout, None)
    except (OSError, subprocess.SubprocessError) as error:
        return UNKNOWN, "probe failed: {}".format(type(error).__name__)
    # Only the child's own answers count: any other exit (it could not start) proves nothing.
    if as_user not in (3, 4) or as_root not in (0, 3, 4):
        return UNKNOWN, "probe did not run (exit {}, {})".format(as_user, as_root)
    if as_root == 0:
        return BLOCKED, "root reaches {} and non-root processes do not".format(address)
    return NO_IMDS, "not even root reaches {}:{}".format(address, port)
