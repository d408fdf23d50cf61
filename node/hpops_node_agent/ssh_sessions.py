"""A login node's interactive sessions as the node sees them, and ending exactly one (hpops).

Standard library only, Linux /proc. What counts as a session (tested against OpenSSH 9.2 on
loopback; Ubuntu 22.04's 8.9 uses the same process titles):

* **SSH:** every authenticated connection has a root-owned monitor titled ``sshd: USER [priv]``
  (``sshd-session: USER [priv]`` from OpenSSH 9.8) with a child running as USER titled
  ``sshd: USER@pts/N`` (a tty), ``sshd: USER@notty`` (a command) or ``sshd: USER`` (``ssh -N``:
  no channel at all). utmp, and so pam_limits ``maxlogins``, sees only the first kind; this
  listing sees all three. A monitor whose only child is ``[net]`` is still authenticating: not a
  session.
* **Channels:** one connection can carry many shells, commands and subsystems (OpenSSH
  ControlMaster: one monitor, one user child titled ``sshd: USER@pts/0,pts/1,...``). Each such
  channel is a child of the user child that sshd made a session leader (``setsid``). A connection
  with two or more channels is listed as one session per channel, so multiplexing counts what
  the user opened; with none or one, as one session (the connection). Channels without a process
  of their own (``internal-sftp``) count only as part of their connection.
* **Session Manager:** ``/usr/bin/ssm-session-worker <session-id>`` (root) runs the shell as the
  run-as user; the shell's owner is the session's user (root when Run As is off: never limited).

A session's **handle** is ``<boot id, 8 hex>:<pid>:<start time in clock ticks>``, the pid being
the connection's monitor, or for one channel of a multiplexed connection that channel's process. PID
plus start time survives PID reuse (PIDs wrap; several sessions start in one tick), and the boot
id makes a handle from before a reboot name nothing. A handle names a process on this node and
nothing more: it is no credential, so a report carrying it lets nobody take a session over.

Ending one (:func:`end_session`) re-checks everything the handle and the stack's instruction
claim (same boot, same start time, root-owned monitor titled with *that user's* name), then sends
SIGTERM through a pidfd so the check and the signal concern the same process. SIGTERM (never
SIGKILL: a killed monitor leaves the user's child connected) closes the connection; then the
session's leftovers (same audit session id and login uid, owned by the user) get SIGTERM, and
SIGKILL after a grace period. A monitor handle whose connection now carries two or more channels
is not signalled (that would end channels nobody asked to end): the next listing names each.
One channel of a multiplexed connection ends alone: SIGHUP to the channel's process through its
pidfd (as a hangup of its terminal would; an interactive shell ignores SIGTERM), SIGKILL if it
outlives the grace period, then its leftovers, owned by the user: its process tree and POSIX
session as they were before the signal, and processes carrying its terminal in SSH_TTY (a
``setsid nohup`` from its shell leaves the tree at once); sshd closes that channel and the
connection's other channels keep working. Processes of the connection that no channel holds any
more and that cannot be tied to one (a command channel's ``setsid`` child) are named in the
result: they end when the connection does. Anything that does not
match is refused, never signalled: ending the wrong user's session is worse than not limiting.
"""

from __future__ import annotations

import os
import pwd
import re
import select
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Tuple

from hpops_core.common import validation

SSM_WORKER = "/usr/bin/ssm-session-worker"
_MONITOR = re.compile(r"\A(sshd|sshd-session): (?P<user>\S+) \[priv\]\Z")
# What follows ``sshd: USER`` in the user child's title: nothing (no channel) or "@" and its ttys.
_CHILD_TTYS = re.compile(r"\A(?:@(?P<ttys>notty|[a-z]+/?[0-9]+(?:,[a-z]+/?[0-9]+)*))?\Z")
HANDLE_RE = re.compile(r"\A[0-9a-f]{8}:[1-9][0-9]{0,9}:[0-9]{1,20}\Z")
SSM_SESSION_ID = re.compile(r"\A[A-Za-z0-9._@+=-]{1,96}\Z")
UNSET_AUDIT_ID = 4294967295  # (u32)-1: no audit session / login uid


@dataclass(frozen=True)
class NodeSession:
    handle: str
    user: str
    path: str  # "ssh" | "ssm"
    tty: bool
    started_at: float  # epoch seconds (boot time + start ticks)
    ssm_session_id: Optional[str] = None  # Session Manager only: the id DescribeSessions lists

    def to_report(self) -> Dict[str, object]:
        entry: Dict[str, object] = {"handle": self.handle, "user": self.user, "path": self.path, "tty": self.tty,
                                    "startedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started_at))}
        if self.ssm_session_id:
            entry["sessionId"] = self.ssm_session_id
        return entry


@dataclass(frozen=True)
class _Proc:
    pid: int
    ppid: int
    uid: int
    start_ticks: int
    state: str
    title: str
    exe: str
    sid: int = 0  # POSIX session id (setsid)
    tty_nr: int = 0  # controlling terminal, 0 for none


def _read(path: Path) -> Optional[bytes]:
    try:
        return path.read_bytes()
    except OSError:  # the process ended while we looked
        return None


def _title(raw: bytes) -> str:
    # sshd rewrites its argv in place: the title, then NULs (or spaces) up to the old length.
    return raw.replace(b"\0", b" ").decode("utf-8", "replace").strip()


def _stat_fields(raw: bytes) -> List[str]:
    # comm may hold spaces and parentheses: the fields start after the last ")".
    return raw[raw.rfind(b")") + 2:].decode("ascii", "replace").split()


def read_proc(proc: Path, pid: int) -> Optional[_Proc]:
    base = proc / str(pid)
    stat, status, cmdline = _read(base / "stat"), _read(base / "status"), _read(base / "cmdline")
    if stat is None or status is None or cmdline is None:
        return None
    fields = _stat_fields(stat)
    uid = next((int(line.split()[1]) for line in status.decode("utf-8", "replace").splitlines()
                if line.startswith("Uid:")), -1)
    try:
        exe = os.readlink(str(base / "exe"))
    except OSError:
        exe = ""
    if len(fields) < 20:
        return None
    return _Proc(pid, int(fields[1]), uid, int(fields[19]), fields[0], _title(cmdline), exe, int(fields[3]),
                 int(fields[4]))


def boot_id(proc: Path = Path("/proc")) -> str:
    return (proc / "sys/kernel/random/boot_id").read_text().strip().replace("-", "")[:8]


def _boot_time(proc: Path) -> float:
    for line in (proc / "stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    raise OSError("no btime in /proc/stat")


def _processes(proc: Path) -> List[_Proc]:
    found = []
    for entry in os.listdir(str(proc)):
        if entry.isdigit():
            info = read_proc(proc, int(entry))
            if info is not None:
                found.append(info)
    return found


def _user_of(uid: int) -> Optional[str]:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


def list_sessions(proc: Path = Path("/proc"), listener_pids: Optional[Iterable[int]] = None) -> List[NodeSession]:
    """Every interactive session on this node, oldest first. ``listener_pids`` limits SSH sessions
    to those accepted by these sshd listeners (tests run several "nodes" on one host)."""
    boot, btime, ticks = boot_id(proc), _boot_time(proc), os.sysconf("SC_CLK_TCK")
    processes = _processes(proc)
    children: Dict[int, List[_Proc]] = {}
    for p in processes:
        children.setdefault(p.ppid, []).append(p)
    listeners = None if listener_pids is None else set(listener_pids)
    sessions = []
    for p in processes:
        if p.uid != 0 or p.state == "Z":
            continue
        monitor = _MONITOR.match(p.title)
        if monitor and (listeners is None or p.ppid in listeners):
            sessions.extend(_ssh_sessions(p, monitor.group("user"), children, boot, btime, ticks))
        elif p.exe == SSM_WORKER:
            session = _ssm_session(p, children.get(p.pid, []), boot, btime, ticks)
            if session is not None:
                sessions.append(session)
    sessions.sort(key=lambda s: (s.started_at, s.handle))
    return sessions


@dataclass(frozen=True)
class SessionTerminal:
    """The terminal of one interactive session: the controlling tty (``tty_nr``) of a session leader
    that sshd or the Session Manager worker started for ``user``."""

    user: str
    uid: int
    tty_nr: int
    pid: int
    start_ticks: int

    @property
    def key(self) -> str:
        return "{}:{}:{}".format(self.tty_nr, self.pid, self.start_ticks)


def session_terminals(proc: Path = Path("/proc"), listener_pids: Optional[Iterable[int]] = None) -> List[SessionTerminal]:
    """The terminals of this node's interactive sessions, one per tty: the same sessions list_sessions
    counts (a monitor proven by its user child, each channel of a multiplexed connection, a Session
    Manager shell run as a user), and of those only the channels that have a terminal."""
    processes = _processes(proc)
    children: Dict[int, List[_Proc]] = {}
    for p in processes:
        children.setdefault(p.ppid, []).append(p)
    listeners = None if listener_pids is None else set(listener_pids)
    found: Dict[int, SessionTerminal] = {}
    for p in processes:
        if p.uid != 0 or p.state == "Z":
            continue
        monitor = _MONITOR.match(p.title)
        leaders: List[Tuple[str, _Proc]] = []
        if monitor and (listeners is None or p.ppid in listeners) and validation.is_posix_user(monitor.group("user")):
            user_child = _user_child(p, monitor.group("user"), children)
            if user_child is not None:
                leaders = [(monitor.group("user"), c) for c in _channels(user_child[0], children)]
        elif p.exe == SSM_WORKER:
            leaders = [(name, c) for c in children.get(p.pid, []) if c.uid != 0 and c.state != "Z"
                       for name in [_user_of(c.uid)] if name is not None and validation.is_posix_user(name)]
        for user, leader in leaders:
            if leader.tty_nr and leader.tty_nr not in found:
                found[leader.tty_nr] = SessionTerminal(user, leader.uid, leader.tty_nr, leader.pid, leader.start_ticks)
    return sorted(found.values(), key=lambda t: t.tty_nr)


def _child_ttys(title: str, user: str) -> Optional[str]:
    """The ttys in a user child's title (``sshd: USER@pts/0,pts/1``; "" for none), None if it is
    not ``user``'s user child. The name is matched whole, so ``alice`` never reads
    ``alice@example.edu``'s title, and the ``[net]`` child of a login in progress never matches."""
    for program in ("sshd: ", "sshd-session: "):
        if title.startswith(program + user):
            rest = _CHILD_TTYS.match(title[len(program) + len(user):])
            return None if rest is None else (rest.group("ttys") or "")
    return None


def _user_child(monitor: _Proc, user: str, children: Dict[int, List[_Proc]]) -> Optional[Tuple[_Proc, str]]:
    for child in children.get(monitor.pid, []):
        ttys = _child_ttys(child.title, user)
        # The user's own child (not the pre-auth [net] one) proves the login completed, and its
        # uid proves the name in the root-owned monitor's title is that account's.
        if ttys is not None and child.uid != 0 and child.state != "Z" and _user_of(child.uid) == user:
            return child, ttys
    return None


def _channels(user_child: _Proc, children: Dict[int, List[_Proc]]) -> List[_Proc]:
    """The connection's channels that have a process: the user child's children that sshd made
    session leaders (a shell, a command, an sftp-server), owned by the user."""
    return [p for p in children.get(user_child.pid, [])
            if p.uid == user_child.uid and p.sid == p.pid and p.state != "Z"]


def _ssh_sessions(monitor: _Proc, user: str, children: Dict[int, List[_Proc]], boot: str, btime: float,
                  ticks: int) -> List[NodeSession]:
    if not validation.is_posix_user(user):
        return []
    found = _user_child(monitor, user, children)
    if found is None:
        return []
    child, ttys = found
    channels = _channels(child, children)
    if len(channels) >= 2:  # multiplexed: each channel is a session the user opened
        return [NodeSession(f"{boot}:{c.pid}:{c.start_ticks}", user, "ssh", c.tty_nr != 0,
                            btime + c.start_ticks / ticks) for c in channels]
    return [NodeSession(f"{boot}:{monitor.pid}:{monitor.start_ticks}", user, "ssh",
                        ttys.startswith("pts/") or ",pts/" in ttys, btime + monitor.start_ticks / ticks)]


def _ssm_session(worker: _Proc, kids: List[_Proc], boot: str, btime: float, ticks: int) -> Optional[NodeSession]:
    parts = worker.title.split()
    if len(parts) < 2 or not SSM_SESSION_ID.match(parts[1]):
        return None
    for child in kids:
        user = _user_of(child.uid)
        if child.uid != 0 and user is not None and validation.is_posix_user(user):
            return NodeSession(f"{boot}:{worker.pid}:{worker.start_ticks}", user, "ssm", True,
                               btime + worker.start_ticks / ticks, parts[1])
    return None  # root's shell (Run As off on HyperPod) or no shell yet: never limited


@dataclass(frozen=True)
class EndResult:
    handle: str
    user: str
    result: str  # "ended" | "gone" | "refused" | "failed"
    reason: str

    def to_report(self) -> Dict[str, str]:
        return {"handle": self.handle, "user": self.user, "result": self.result, "reason": self.reason}


def _audit_ids(proc: Path, pid: int) -> Tuple[int, int]:
    session, login = _read(proc / str(pid) / "sessionid"), _read(proc / str(pid) / "loginuid")
    try:
        return int(session or b"-1"), int(login or b"-1")
    except ValueError:
        return -1, -1


def end_session(handle: str, user: str, proc: Path = Path("/proc"), grace_seconds: float = 5.0) -> EndResult:
    """End exactly the SSH session ``handle`` names, if it is still ``user``'s; refuse otherwise."""
    def done(result: str, reason: str) -> EndResult:
        return EndResult(handle if HANDLE_RE.match(handle or "") else "<invalid>", user if validation.is_posix_user(user)
                         else "<invalid>", result, reason)

    if not isinstance(handle, str) or not HANDLE_RE.match(handle) or not validation.is_posix_user(user):
        return done("refused", "not a session handle and user name")
    boot, pid_text, start_text = handle.split(":")
    pid, start = int(pid_text), int(start_text)
    if boot != boot_id(proc):
        return done("gone", "the handle is from an earlier boot")
    try:
        pidfd = os.pidfd_open(pid) if hasattr(os, "pidfd_open") else None  # Python 3.9+, Linux 5.3+
    except ProcessLookupError:
        return done("gone", f"pid {pid} no longer exists")
    try:
        # Checked after the pidfd is open: the signal below can only reach the process checked here.
        info = read_proc(proc, pid)
        if info is None or info.state == "Z":
            return done("gone", f"pid {pid} no longer exists")
        if info.start_ticks != start:
            return done("gone", f"pid {pid} is another process now (started at tick {info.start_ticks}, not {start})")
        try:
            uid = pwd.getpwnam(user).pw_uid
        except KeyError:
            return done("refused", f"no account {user} on this node")
        if info.uid == uid and info.uid != 0:
            return done(*_end_channel(info, user, uid, pidfd, proc, grace_seconds))
        monitor = _MONITOR.match(info.title)
        if info.uid != 0 or monitor is None:
            return done("refused", f"pid {pid} is not an sshd session monitor")
        if monitor.group("user") != user:
            return done("refused", f"pid {pid} is another user's session, not {user}'s")
        processes = _processes(proc)
        children: Dict[int, List[_Proc]] = {}
        for p in processes:
            children.setdefault(p.ppid, []).append(p)
        found = _user_child(info, user, children)
        channels = _channels(found[0], children) if found else []
        if len(channels) >= 2:
            # Listed as one session, it now carries several channels: ending the connection would end
            # channels nobody chose. The next listing names each one.
            return done("gone", f"pid {pid}'s connection now carries {len(channels)} channels, each a session")
        kids = [p for p in processes if p.ppid == pid and p.uid == uid]
        audit = _audit_ids(proc, kids[0].pid) if kids else (-1, -1)
        if not _send(pidfd, pid, signal.SIGTERM):
            return done("gone", f"pid {pid} ended before the signal")
        ended = _wait_exit(pidfd, proc, pid, grace_seconds)
        leftovers = _end_leftovers(proc, uid, audit, grace_seconds)
        if not ended:
            return done("failed", f"pid {pid} did not exit within {grace_seconds:g} s of SIGTERM")
        return done("ended", f"SIGTERM to the session monitor; {leftovers} leftover process(es) of that session ended")
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _end_channel(info: _Proc, user: str, uid: int, pidfd: Optional[int], proc: Path, grace: float
                 ) -> Tuple[str, str]:
    """End one channel of a multiplexed connection: ``info`` must be a session leader owned by
    ``user`` whose parent is that user's sshd child under a root monitor titled with ``user``."""
    pid = info.pid
    parent = read_proc(proc, info.ppid)
    grandparent = read_proc(proc, parent.ppid) if parent is not None else None
    monitor = _MONITOR.match(grandparent.title) if grandparent is not None else None
    if (info.sid != pid or parent is None or parent.uid != uid or _child_ttys(parent.title, user) is None
            or grandparent is None or grandparent.uid != 0 or monitor is None or monitor.group("user") != user):
        return "refused", f"pid {pid} is not a channel of {user}'s sshd connection"
    # What the channel started, taken before it ends (its orphans are reparented then): its process
    # tree, and what carries its terminal in SSH_TTY (a `setsid nohup` leaves the tree at once).
    audit = _audit_ids(proc, pid)
    tree = {(p.pid, p.start_ticks) for p in _descendants(proc, pid)}
    terminal = _ssh_tty(proc, pid) if info.tty_nr else None

    def started_by_channel(p: _Proc) -> bool:
        return p.uid == uid and ((p.pid, p.start_ticks) in tree or p.sid == pid or (
            terminal is not None and _audit_ids(proc, p.pid) == audit and _ssh_tty(proc, p.pid) == terminal))

    # SIGHUP, as a hangup of the channel's terminal: an interactive shell ignores SIGTERM.
    if not _send(pidfd, pid, signal.SIGHUP):
        return "gone", f"pid {pid} ended before the signal"
    ended = _wait_exit(pidfd, proc, pid, grace)
    if not ended:
        _send(pidfd, pid, signal.SIGKILL)  # a channel's process, never the monitor: sshd closes the channel
        ended = _wait_exit(pidfd, proc, pid, grace)
    leftovers = _end_members(proc, lambda p: p.pid != pid and started_by_channel(p), grace)
    if not ended:
        return "failed", f"channel pid {pid} did not exit after SIGHUP and SIGKILL"
    survivors = _untied(proc, uid, audit, parent.pid, info.start_ticks)
    return "ended", (f"SIGHUP to one channel of a multiplexed connection (its other channels keep working); "
                     f"{leftovers} leftover process(es) of that channel ended"
                     + (f"; still running in that connection, not tied to any channel (they end with it): pid(s) "
                        f"{','.join(map(str, survivors[:10]))}" if survivors else ""))


def _descendants(proc: Path, pid: int) -> List[_Proc]:
    children: Dict[int, List[_Proc]] = {}
    for p in _processes(proc):
        children.setdefault(p.ppid, []).append(p)
    found, queue = [], list(children.get(pid, []))
    while queue:
        p = queue.pop()
        found.append(p)
        queue.extend(children.get(p.pid, []))
    return found


def _ssh_tty(proc: Path, pid: int) -> Optional[bytes]:
    """SSH_TTY from a process's environment: sshd sets it for a channel with a terminal, and every
    process started from that channel inherits it."""
    for entry in (_read(proc / str(pid) / "environ") or b"").split(b"\0"):
        if entry.startswith(b"SSH_TTY="):
            return entry[len(b"SSH_TTY="):]
    return None


def _untied(proc: Path, uid: int, audit: Tuple[int, int], user_child: int, since_ticks: int) -> List[int]:
    """The user's live processes of this connection's audit session started since ``since_ticks`` that no
    open channel holds (not under the connection's sshd user child): what an ended channel may have left."""
    if audit[0] in (-1, UNSET_AUDIT_ID):
        return []
    under_connection = {p.pid for p in _descendants(proc, user_child)}
    return sorted(p.pid for p in _processes(proc)
                  if p.uid == uid and p.state != "Z" and p.pid not in under_connection and p.pid != user_child
                  and p.start_ticks >= since_ticks and _audit_ids(proc, p.pid) == audit)


def _send(pidfd: Optional[int], pid: int, signum: int) -> bool:
    """Signal through the pidfd (the process checked, never a reused pid); False if it is gone."""
    try:
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, signum)
        else:
            os.kill(pid, signum)
    except ProcessLookupError:
        return False
    return True


def _wait_exit(pidfd: Optional[int], proc: Path, pid: int, timeout: float) -> bool:
    if pidfd is not None:
        return bool(select.select([pidfd], [], [], timeout)[0])
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = read_proc(proc, pid)
        if info is None or info.state == "Z":
            return True
        time.sleep(0.05)
    return False


def _end_leftovers(proc: Path, uid: int, audit: Tuple[int, int], grace: float) -> int:
    """Processes the closed session left behind (a command still running, ``nohup``): same audit
    session and login uid, owned by the user. None when the session had no audit id."""
    session_id, login_uid = audit
    if session_id in (-1, UNSET_AUDIT_ID) or login_uid != uid:
        return 0
    return _end_members(proc, lambda p: p.uid == uid and _audit_ids(proc, p.pid) == audit, grace)


def _end_members(proc: Path, member: Callable[[_Proc], bool], grace: float) -> int:
    """SIGTERM every live process ``member`` picks, then SIGKILL those still there after ``grace``."""
    def members() -> List[int]:
        return [p.pid for p in _processes(proc) if p.state != "Z" and member(p)]

    found = members()
    for pid in found:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while members() and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in members():
        _signal(pid, signal.SIGKILL)
    return len(found)


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def parse_end_sessions(document: object) -> List[Tuple[str, str]]:
    """The stack's end-sessions document -> [(handle, user)]; ValueError naming what is wrong."""
    from hpops_core.node_channel import contract

    if not isinstance(document, dict) or document.get("format") != contract.END_SESSIONS_FORMAT:
        raise ValueError("end-sessions: not a %s document" % contract.END_SESSIONS_FORMAT)
    entries = document.get("sessions")
    if not isinstance(entries, list) or len(entries) > contract.MAX_END_SESSIONS:
        raise ValueError("end-sessions: sessions must be a list of at most %d" % contract.MAX_END_SESSIONS)
    wanted = []
    for entry in entries:
        if (not isinstance(entry, dict) or set(entry) != {"handle", "user"}
                or not isinstance(entry["handle"], str) or not contract.SESSION_HANDLE_RE.match(entry["handle"])
                or not validation.is_limited_user(entry["user"])):
            raise ValueError("end-sessions: every entry must be {handle, user} with a session handle and a user name")
        wanted.append((entry["handle"], entry["user"]))
    return wanted


def end_sessions(document: object, done: Iterable[str] = (), proc: Path = Path("/proc"),
                 grace_seconds: float = 5.0) -> List[EndResult]:
    """End each listed session not already handled (``done``: handles this agent acted on before)."""
    handled = set(done)
    return [end_session(handle, user, proc, grace_seconds)
            for handle, user in parse_end_sessions(document) if handle not in handled]


def report_section(end_parameter_value: Optional[str], acted: Dict[str, Dict[str, str]], proc: Path = Path("/proc"),
                   grace_seconds: float = 5.0) -> Tuple[Optional[Dict[str, object]], Dict[str, Dict[str, str]]]:
    """One agent tick: end what this node's end-sessions parameter lists (each handle once), then list
    the node's sessions. Returns the report's "sessions" section (None when /proc cannot be read)
    and the outcomes to keep: one per handle the current instruction still lists, so the reports
    keep saying what became of it until the stack drops it."""
    from hpops_core.node_channel import contract

    kept: Dict[str, Dict[str, str]] = {}
    if end_parameter_value is not None:
        import json

        try:
            document = json.loads(end_parameter_value)
            wanted = parse_end_sessions(document)
        except ValueError as error:
            wanted = []
            kept["-"] = {"handle": "", "user": "", "result": "refused", "reason": str(error)[:200]}
        for handle, user in wanted:
            earlier = acted.get(handle)
            # Once per handle, except after "failed" (the monitor outlived SIGTERM): that is tried again.
            kept[handle] = (earlier if earlier and earlier.get("result") != "failed"
                            else end_session(handle, user, proc, grace_seconds).to_report())
    kept.pop("-", None)  # a refused document is logged by the caller, not reported as a session
    try:
        listed = list_sessions(proc)
    except OSError:
        return None, kept
    section = reported_sessions(listed)
    section["ended"] = list(kept.values())[: contract.MAX_END_SESSIONS]
    return section, kept


def _entry_bytes(entry: Dict[str, object]) -> int:
    import json

    return len(json.dumps(entry, separators=(",", ":")).encode("utf-8")) + 1


def _turns(sessions: List[NodeSession]) -> List[NodeSession]:
    """One user's sessions in the order they are listed: newest, oldest, second newest, second oldest, ..."""
    ordered, low, high = [], 0, len(sessions) - 1
    while low <= high:
        ordered.append(sessions[high])
        high -= 1
        if low <= high:
            ordered.append(sessions[low])
            low += 1
    return ordered


def reported_sessions(listed: List[NodeSession]) -> Dict[str, object]:
    """The report's "list", "omitted" and "omittedByUser" (contract.py): every session while they
    fit, else the Session Manager shells and then each user's SSH sessions in turns (every user's
    newest, then every user's oldest, ...), the rest counted per user. Listed oldest first."""
    from hpops_core.node_channel import contract

    entries = [s.to_report() for s in listed]
    sizes = [_entry_bytes(e) for e in entries]
    if len(entries) <= contract.MAX_REPORTED_SESSIONS and sum(sizes) <= contract.REPORTED_SESSIONS_BYTES:
        return {"list": entries, "omitted": 0}
    index = {s.handle: i for i, s in enumerate(listed)}
    by_user: Dict[str, List[NodeSession]] = {}
    for session in listed:
        if session.path == "ssh":
            by_user.setdefault(session.user, []).append(session)
    queues = [_turns(sessions) for _, sessions in sorted(by_user.items())]
    candidates = [s for s in listed if s.path == "ssm"]
    depth = max((len(q) for q in queues), default=0)
    candidates += [q[turn] for turn in range(depth) for q in queues if turn < len(q)]
    chosen, used = set(), 0
    for session in candidates:
        size = sizes[index[session.handle]]
        if len(chosen) >= contract.MAX_REPORTED_SESSIONS or used + size > contract.REPORTED_SESSIONS_BYTES:
            break
        chosen.add(session.handle)
        used += size
    by_user_omitted: Dict[str, int] = {}
    for session in listed:
        if session.path == "ssh" and session.handle not in chosen:
            by_user_omitted[session.user] = by_user_omitted.get(session.user, 0) + 1
    counted = dict(sorted(by_user_omitted.items(), key=lambda item: (-item[1], item[0]))[: contract.MAX_OMITTED_USERS])
    return {"list": [e for s, e in zip(listed, entries) if s.handle in chosen],
            "omitted": len(listed) - len(chosen), "omittedByUser": dict(sorted(counted.items()))}
