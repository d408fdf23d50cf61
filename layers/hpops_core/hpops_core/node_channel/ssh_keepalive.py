"""sshd keepalives under the load balancer's idle timeout: the published document and the rule.

Standard library only (shipped to the nodes). The stack publishes the NLB listener's TCP idle
timeout (`ListenerIdleTimeoutSeconds`) in /hpops/<cluster>/node/ssh-keepalive as
{"format": SSH_KEEPALIVE_FORMAT, "listenerIdleTimeoutSeconds": int}; every login node's agent
derives sshd's ClientAliveInterval from it with `client_alive_interval`, so both sides use one rule.
"""

from __future__ import annotations

import json

from hpops_core.common.errors import HpopsError

SSH_KEEPALIVE_FORMAT = "hpops.node.ssh-keepalive.v1"
CLIENT_ALIVE_COUNT_MAX = 3
MAX_INTERVAL_SECONDS = 120
MIN_IDLE_TIMEOUT_SECONDS = 2  # the NLB's floor is 60; tests scale the timeout down to seconds
MAX_IDLE_TIMEOUT_SECONDS = 6000  # the NLB's ceiling (tcp.idle_timeout.seconds)


class BadKeepalive(HpopsError, ValueError):
    """The keepalive document or timeout is not one the agent may apply; nothing is changed."""


def client_alive_interval(idle_timeout_seconds: int) -> int:
    """Half the idle timeout, so an idle session carries a probe and its answer well before the
    load balancer forgets the flow even if one probe is late; at most 120 s, so a vanished client
    is dropped after CLIENT_ALIVE_COUNT_MAX unanswered probes (6 minutes) rather than hours."""
    if isinstance(idle_timeout_seconds, bool) or not isinstance(idle_timeout_seconds, int):
        raise BadKeepalive("idle timeout is not an integer")
    if not MIN_IDLE_TIMEOUT_SECONDS <= idle_timeout_seconds <= MAX_IDLE_TIMEOUT_SECONDS:
        raise BadKeepalive(f"idle timeout {idle_timeout_seconds} s is outside "
                           f"{MIN_IDLE_TIMEOUT_SECONDS}-{MAX_IDLE_TIMEOUT_SECONDS} s")
    return max(1, min(MAX_INTERVAL_SECONDS, idle_timeout_seconds // 2))


def parse_document(text: str) -> int:
    """The listener idle timeout a published document names; BadKeepalive otherwise."""
    try:
        document = json.loads(text)
    except (ValueError, TypeError) as error:
        raise BadKeepalive("not JSON") from error
    if not isinstance(document, dict) or document.get("format") != SSH_KEEPALIVE_FORMAT:
        raise BadKeepalive(f"format is not {SSH_KEEPALIVE_FORMAT}")
    timeout = document.get("listenerIdleTimeoutSeconds")
    client_alive_interval(timeout)  # the range check
    return timeout
