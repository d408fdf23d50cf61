"""sshd keepalives under the load balancer's idle timeout (hpops).

An NLB forgets a TCP flow that is idle for its listener's idle timeout (350 s by default) and resets
it on the next packet; OpenSSH sends no keepalive by default, so an idle SSH session would die.
`apply` makes sshd probe every client every ClientAliveInterval seconds (derived from the timeout
by hpops_core.node_channel.ssh_keepalive) and drop one that missed ClientAliveCountMax probes.

Where the lines go (sshd keeps the FIRST value it reads for each keyword):
* sshd_config Includes sshd_config.d/*.conf before any Match and before any ClientAlive* line of its
  own (Debian and Ubuntu's default, Include on its first line): the drop-in DROP_IN_NAME there;
* otherwise: a managed block at the very top of sshd_config itself (never inside a Match).
A site that wants other values sets them in a drop-in that sorts before ours.

Like host_keys' transaction: files are written atomically, `sshd -t` must accept the result and the
reload must succeed, otherwise the previous files come back. Established sessions survive the
reload (SIGHUP semantics). Unchanged files mean no write and no reload.
"""

from __future__ import annotations

import fnmatch
import os
from typing import Any, Dict, List, Optional, Tuple

from hpops_core.node_channel.ssh_keepalive import CLIENT_ALIVE_COUNT_MAX, client_alive_interval

from . import host_keys

DROP_IN_NAME = "05-hpops-keepalive.conf"
BLOCK_BEGIN = "# BEGIN hpops keepalive (managed by hpops-node-agent; do not edit)"
BLOCK_END = "# END hpops keepalive"
SSHD_ETC = "/etc/ssh"  # where sshd resolves a relative Include


def render_lines(interval: int, count_max: int = CLIENT_ALIVE_COUNT_MAX) -> List[str]:
    return [f"ClientAliveInterval {interval}", f"ClientAliveCountMax {count_max}"]


def _under_root(root: str, path: str) -> str:
    return path if root == "/" or path.startswith(root.rstrip("/") + "/") else os.path.join(root, path.lstrip("/"))


def drop_in_directory(config_text: str, root: str) -> Optional[str]:
    """The directory whose drop-ins sshd reads before anything of its own sets keepalives, or None."""
    for line in config_text.splitlines():
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        keyword = words[0].lower()
        if keyword in ("match", "clientaliveinterval", "clientalivecountmax"):
            return None
        if keyword != "include":
            continue
        for pattern in words[1:]:
            pattern = pattern if pattern.startswith("/") else os.path.join(SSHD_ETC, pattern)
            directory, name_glob = os.path.split(pattern)
            if not any(c in directory for c in "*?[") and fnmatch.fnmatch(DROP_IN_NAME, name_glob):
                return _under_root(root, directory)
    return None


def without_block(config_text: str) -> str:
    lines, inside = [], False
    for line in config_text.splitlines(keepends=True):
        if line.strip() == BLOCK_BEGIN:
            inside = True
        elif inside and line.strip() == BLOCK_END:
            inside = False
        elif not inside:
            lines.append(line)
    return "".join(lines)


def plan(config_path: str, root: str, interval: int) -> Tuple[List[host_keys.PlannedFile], str]:
    """The files to write (only those that differ) and where the settings live."""
    with open(config_path, "r", encoding="utf-8") as handle:
        config = handle.read()
    mode = os.stat(config_path).st_mode & 0o7777
    body = render_lines(interval)
    directory = drop_in_directory(without_block(config), root)
    wanted: List[host_keys.PlannedFile] = []
    if directory is not None:
        text = "# Managed by hpops-node-agent: keepalives under the load balancer's idle timeout.\n"
        wanted.append(host_keys.PlannedFile(os.path.join(directory, DROP_IN_NAME), (text + "\n".join(body) + "\n").encode(), 0o644))
        wanted.append(host_keys.PlannedFile(config_path, without_block(config).encode(), mode))  # no stale block
        where = os.path.join(directory, DROP_IN_NAME)
    else:
        block = "\n".join([BLOCK_BEGIN, *body, BLOCK_END]) + "\n"
        wanted.append(host_keys.PlannedFile(config_path, (block + without_block(config)).encode(), mode))
        where = config_path
    return [f for f in wanted if not f.is_current()], where


def apply(root: str, idle_timeout_seconds: int, sshd_cmd: str, reload_cmd: Any,
          config_path: Optional[str] = None) -> Dict[str, Any]:
    """Converge sshd's keepalives; {"result": "changed"|"unchanged"|"failed", "reason", ...}.

    BadKeepalive (a ValueError) for a timeout out of range, before anything is touched."""
    interval = client_alive_interval(idle_timeout_seconds)
    layout = host_keys.NodeLayout(root, config_path)
    section = {"clientAliveInterval": interval, "clientAliveCountMax": CLIENT_ALIVE_COUNT_MAX,
               "idleTimeoutSeconds": idle_timeout_seconds}
    try:
        changes, where = plan(layout.sshd_config, layout.root, interval)
    except OSError as error:
        return dict(section, result="failed", reason=f"cannot read {layout.sshd_config}: {error.strerror}")
    if not changes:
        return dict(section, result="unchanged", reason=f"ClientAliveInterval {interval} in {where}")
    saved = host_keys.snapshot([c.path for c in changes])
    try:
        os.makedirs(os.path.dirname(changes[0].path), mode=0o755, exist_ok=True)
        host_keys.write_planned(changes)
        host_keys.check_sshd_config(sshd_cmd, layout.sshd_config)
        host_keys.reload_sshd(reload_cmd)
    except (OSError, host_keys.InstallError) as error:
        host_keys.restore(saved)
        reloaded = ""
        if isinstance(error, host_keys.ReloadFailed):
            try:
                host_keys.reload_sshd(reload_cmd)
            except host_keys.InstallError:
                reloaded = "; reload after rollback failed too"
        return dict(section, result="failed", reason=f"rolled back: {error}{reloaded}")
    return dict(section, result="changed", reason=f"ClientAliveInterval {interval} in {where}")
