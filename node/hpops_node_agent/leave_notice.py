"""Tell this node's users that it leaves rotation: the notice written once to each session's terminal.

The stack publishes which login nodes leave rotation (/hpops/<cluster>/node/leave-notices,
hpops_core.node_channel.leave_notices); the agent pulls it with its desired state and, while its
own instance id is named, writes the message to every interactive session's terminal it has not
told yet (a user who logs in later is told too), like wall(1) but only to sessions' terminals.

A terminal is written only when everything agrees: it is the controlling tty of a session leader
that sshd or the Session Manager worker started (ssh_sessions.session_terminals), the device opened
(O_NOFOLLOW, O_NOCTTY, O_NONBLOCK) is a Unix98 pty slave whose device number is that tty's, and it
belongs to the session's user. A terminal that does not drain is skipped, never waited on. Inside
the unit's sandbox (PrivateDevices=yes) /dev/pts is still the host's: systemd bind-mounts it and its
device policy allows the pts character devices.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple

from hpops_core.node_channel import leave_notices

from . import ssh_sessions

PTS_MAJORS = range(136, 144)  # Unix98 pty slaves (Documentation/admin-guide/devices.txt)
MAX_TOLD = 500  # terminals remembered per notice; more sessions than a node report lists


def pts_path(dev: Path, tty_nr: int) -> Optional[Path]:
    """/dev/pts/N for a controlling tty number from /proc/PID/stat; None for anything but a pty slave."""
    major, minor = os.major(tty_nr), os.minor(tty_nr)
    if major not in PTS_MAJORS:
        return None
    return dev / "pts" / str((major - PTS_MAJORS[0]) * 256 + minor)


def write_terminal(dev: Path, terminal: ssh_sessions.SessionTerminal, text: bytes) -> str:
    """"told", or why this terminal was not written."""
    path = pts_path(dev, terminal.tty_nr)
    if path is None:
        return "not a pty"
    try:
        fd = os.open(str(path), os.O_WRONLY | os.O_NOCTTY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as error:
        return "cannot open: {}".format(errno.errorcode.get(error.errno, error.errno))
    try:
        info = os.fstat(fd)
        if not stat.S_ISCHR(info.st_mode) or info.st_rdev != terminal.tty_nr:
            return "another device"
        if info.st_uid != terminal.uid:
            return "not the user's terminal"
        written = 0
        while written < len(text):
            try:
                written += os.write(fd, text[written:])
            except BlockingIOError:
                return "terminal not draining"
        return "told"
    except OSError as error:
        return "cannot write: {}".format(errno.errorcode.get(error.errno, error.errno))
    finally:
        os.close(fd)


def tell(notice: dict, terminals: Iterable[ssh_sessions.SessionTerminal], told: Iterable[str],
         dev: Path = Path("/dev")) -> Tuple[List[str], Dict[str, str]]:
    """Write the notice to each terminal not told yet: (keys now told, {user@tty key: outcome} of this pass)."""
    text = leave_notices.message(notice).encode("ascii")
    done = list(told)
    outcomes: Dict[str, str] = {}
    for terminal in terminals:
        if terminal.key in done:
            continue
        outcome = write_terminal(dev, terminal, text)
        outcomes["{}@{}".format(terminal.user, terminal.key)] = outcome
        if outcome == "told":
            done.append(terminal.key)
    return done[-MAX_TOLD:], outcomes


def converge(parameter_value: Optional[str], instance_id: str, state: dict, proc: Path, dev: Path,
             listener_pids: Optional[Iterable[int]] = None) -> Tuple[Dict[str, object], dict]:
    """One tick: (a section for the log, the new state {"key", "told"})."""
    if parameter_value is None:
        return {"result": "unchanged", "reason": "no leave notices published"}, {}
    try:
        notice = leave_notices.notice_for(parameter_value, instance_id)
    except leave_notices.BadLeaveNotices as error:
        return {"result": "failed", "reason": "leave notices refused: {}".format(error)}, state
    if notice is None:
        return {"result": "unchanged", "reason": "this node is in rotation"}, {}
    key = leave_notices.notice_key(notice)
    told = state.get("told") if state.get("key") == key and isinstance(state.get("told"), list) else []
    try:
        terminals = ssh_sessions.session_terminals(proc, listener_pids)
    except OSError as error:
        return {"result": "failed", "reason": "cannot list sessions: {}".format(error.strerror)}, state
    told, outcomes = tell(notice, terminals, told, dev)
    result = "changed" if any(o == "told" for o in outcomes.values()) else "unchanged"
    failed = {k: o for k, o in outcomes.items() if o != "told"}
    reason = "leaving ({}): {} terminal(s) told".format(notice["why"], len(told))
    if failed:
        reason += "; not told: " + ", ".join("{} {}".format(k, o) for k, o in sorted(failed.items())[:5])
    return {"result": result, "reason": reason}, {"key": key, "told": told}
