"""SSH logins on the twin's simulated login nodes.

The twin's nodes run the real node agent, but no sshd: this stands in for the process table the
agent's session listing reads (``hpops_node_agent.ssh_sessions.list_sessions``) and for the
signal that ends one (``end_session``). Everything between (the agent's report, the node-report
handler's origin check, the stack's cluster-wide decision, the end-sessions parameter, the agent
reading it) is the real code. tests/ssh runs the real listing and ending against real sshd.

An end is refused unless the handle names a live login of that very user on that node, as the
real ``end_session`` refuses it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

from hpops_node_agent import ssh_sessions

BOOT_ID = "5eed0b07"


@dataclass
class SimulatedLogin:
    instance_id: str
    handle: str
    user: str
    started_at: float
    tty: bool = True
    connected: bool = True


class SshLogins:
    def __init__(self, world: Any) -> None:
        self.world = world
        self.logins: list[SimulatedLogin] = []
        self._pids = itertools.count(4000)

    def open(self, user: str, instance_id: str, started_at: float, tty: bool = True) -> SimulatedLogin:
        """A user logs in to that node over SSH (``tty=False``: ``ssh -N`` or a remote command)."""
        pid = next(self._pids)
        login = SimulatedLogin(instance_id, f"{BOOT_ID}:{pid}:{int(started_at * 100)}", user, started_at, tty)
        self.logins.append(login)
        return login

    def connected(self) -> list[SimulatedLogin]:
        return [login for login in self.logins if login.connected]

    def _node_of(self, proc: Path) -> str | None:
        return next((i for i, root in self.world.hosts.roots.items() if Path(root) / "proc" == Path(proc)), None)

    def _list(self, proc: Path = Path("/proc"), listener_pids: Any = None) -> list[ssh_sessions.NodeSession]:
        node = self._node_of(proc)
        if node is None:
            raise FileNotFoundError(proc)
        return sorted((ssh_sessions.NodeSession(s.handle, s.user, "ssh", s.tty, s.started_at)
                       for s in self.connected() if s.instance_id == node), key=lambda s: (s.started_at, s.handle))

    def _end(self, handle: str, user: str, proc: Path = Path("/proc"), grace_seconds: float = 5.0
             ) -> ssh_sessions.EndResult:
        node = self._node_of(proc)
        login = next((s for s in self.logins if s.handle == handle and s.instance_id == node), None)
        if login is None or not login.connected:
            return ssh_sessions.EndResult(handle, user, "gone", "no such session on this node")
        if login.user != user:
            return ssh_sessions.EndResult(handle, user, "refused", "another user's session")
        login.connected = False
        return ssh_sessions.EndResult(handle, user, "ended", "SIGTERM to the session monitor")

    @contextmanager
    def installed(self) -> Iterator[SshLogins]:
        with mock.patch.object(ssh_sessions, "list_sessions", self._list), \
                mock.patch.object(ssh_sessions, "end_session", self._end):
            yield self
