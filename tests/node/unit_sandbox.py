"""The file-system sandbox a systemd unit describes, rebuilt without systemd (PID 1 here is not systemd).

Reads the unit's [Service] settings and runs a command in a private mount namespace (``unshare -m``)
where the same paths are read-only, writable, private or hidden as systemd.exec(5) says, with the
node's paths rebased under a test root (the agent's ``root`` option). The real file system is made
read-only too (``ProtectSystem=strict``), so a write anywhere the unit does not allow fails with
EROFS, in the test as on a node.

Reproduced: ProtectSystem (yes/full/strict), ProtectHome (yes/read-only/tmpfs), PrivateTmp,
ReadWritePaths, ReadOnlyPaths, InaccessiblePaths (with the '-' prefix: ignore if missing),
StateDirectory/RuntimeDirectory/CacheDirectory/LogsDirectory (created and writable),
ConfigurationDirectory (created, read-only), ProtectKernelTunables, ProtectControlGroups, UMask,
PrivateDevices (a /dev with null, zero, full, random, urandom, tty, pts and shm only).
NoNewPrivileges (setpriv --no-new-privs), ProtectHostname (a UTS namespace, and sethostname denied),
ProtectClock, ProtectKernelModules and ProtectKernelLogs (their capabilities dropped from the bounding
set, /usr/lib/modules and /proc/kmsg hidden, their calls denied), RestrictNamespaces,
RestrictAddressFamilies, RestrictSUIDSGID, RestrictRealtime, LockPersonality (a seccomp filter built
by tests/node/unit_seccomp.py with libseccomp, as systemd builds it).
Any other [Service] setting (BindPaths=, RootDirectory=, User=, SystemCallFilter=,
MemoryDenyWriteExecute=...) raises UnsupportedSetting naming it: the test fails until this file
learns it, instead of passing a sandbox weaker than the unit's.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Tuple

# systemd.exec(5): the directories each *Directory= setting names its entries under.
MANAGED_DIRECTORIES = {"StateDirectory": "/var/lib", "RuntimeDirectory": "/run", "CacheDirectory": "/var/cache",
                       "LogsDirectory": "/var/log", "ConfigurationDirectory": "/etc"}
PROTECT_SYSTEM = {"yes": ("/usr", "/boot", "/efi"), "true": ("/usr", "/boot", "/efi"),
                  "full": ("/usr", "/boot", "/efi", "/etc"), "strict": ("/",)}
HOME_PATHS = ("/home", "/root", "/run/user")


# Settings that are no sandbox (how the service starts and restarts), and the sandbox settings rebuilt here.
NOT_SANDBOX = ("Type", "Environment", "ExecStart", "Restart", "RestartSec", "RemainAfterExit", "TimeoutStartSec")
REBUILT = ("ProtectSystem", "ProtectHome", "PrivateTmp", "ReadWritePaths", "ReadOnlyPaths", "InaccessiblePaths",
           "StateDirectory", "StateDirectoryMode", "RuntimeDirectory", "CacheDirectory", "LogsDirectory",
           "ConfigurationDirectory", "ProtectKernelTunables", "ProtectControlGroups", "UMask", "PrivateDevices",
           "NoNewPrivileges", "ProtectHostname", "ProtectClock", "ProtectKernelModules", "ProtectKernelLogs",
           "RestrictNamespaces", "RestrictAddressFamilies", "RestrictSUIDSGID", "RestrictRealtime", "LockPersonality")
# systemd.exec(5): the capabilities each drops from the bounding set, the paths each hides.
DROPPED_CAPABILITIES = {"ProtectClock": ("sys_time", "wake_alarm"), "ProtectKernelModules": ("sys_module",),
                        "ProtectKernelLogs": ("syslog",)}
HIDDEN_BY = {"ProtectKernelModules": ("/usr/lib/modules",), "ProtectKernelLogs": ("/proc/kmsg",)}
SECCOMP = ("RestrictNamespaces", "RestrictSUIDSGID", "RestrictRealtime", "LockPersonality", "ProtectHostname",
           "ProtectClock", "ProtectKernelModules", "ProtectKernelLogs")
SECCOMP_LAUNCHER = Path(__file__).resolve().parent / "unit_seccomp.py"
SYSTEM_PYTHON = "/usr/bin/python3"  # has python3-seccomp


class UnsupportedSetting(AssertionError):
    """The unit uses a file-system setting this sandbox cannot rebuild."""


def service_settings(unit_text: str) -> Dict[str, List[str]]:
    """[Service] key -> every value assigned, in order; an empty assignment resets a list (systemd's rule)."""
    settings: Dict[str, List[str]] = {}
    section = None
    for raw in unit_text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        if section != "Service" or "=" not in line:
            continue
        key, value = (part.strip() for part in line.split("=", 1))
        if value == "":
            settings[key] = []
        else:
            settings.setdefault(key, []).append(value)
    return settings


@dataclass(frozen=True)
class Sandbox:
    read_only: Tuple[str, ...]  # node paths
    writable: Tuple[Tuple[str, bool], ...]  # (node path, may be missing)
    created: Tuple[Tuple[str, str], ...]  # (node path, mode) systemd creates before starting
    hidden: Tuple[Tuple[str, bool], ...]
    private_tmp: bool
    kernel_read_only: Tuple[str, ...]  # real paths (/proc/sys, /sys...)
    umask: str = "0022"
    private_devices: bool = False
    no_new_privileges: bool = False
    own_hostname: bool = False  # ProtectHostname: a UTS namespace of its own
    dropped_capabilities: Tuple[str, ...] = ()
    system_calls: Tuple[Tuple[str, object], ...] = ()  # what unit_seccomp.py denies

    @classmethod
    def from_unit(cls, unit_text: str) -> "Sandbox":
        settings = service_settings(unit_text)
        used = sorted(set(settings) - set(NOT_SANDBOX) - set(REBUILT))
        if used:
            raise UnsupportedSetting(f"the unit sets {', '.join(used)}, which tests/node/unit_sandbox.py does not "
                                     "rebuild: teach it, so the sandbox test stays as strict as the unit")

        def last(key: str, default: str = "no") -> str:
            return (settings.get(key) or [default])[-1].lower()

        def paths(key: str) -> List[Tuple[str, bool]]:
            found = []
            for value in settings.get(key, []):
                for word in shlex.split(value):
                    optional = word.startswith("-")
                    word = word.lstrip("-+")
                    if not word.startswith("/"):
                        raise UnsupportedSetting(f"{key}={word}: only absolute paths are rebuilt")
                    found.append((word, optional))
            return found

        read_only = list(PROTECT_SYSTEM.get(last("ProtectSystem"), ()))
        hidden = paths("InaccessiblePaths")
        home = last("ProtectHome")
        if home == "read-only":
            read_only += HOME_PATHS
        elif home in ("yes", "true", "tmpfs"):
            hidden += [(path, True) for path in HOME_PATHS]
        read_only += [path for path, _ in paths("ReadOnlyPaths")]
        writable = paths("ReadWritePaths")
        mode = settings.get("StateDirectoryMode", ["0755"])[-1]
        created = []
        for key, base in MANAGED_DIRECTORIES.items():
            for value in settings.get(key, []):
                for name in value.split():
                    path = f"{base}/{name.split(':')[0]}"
                    created.append((path, mode if key == "StateDirectory" else "0755"))
                    if key == "ConfigurationDirectory":
                        read_only.append(path)
                    else:
                        writable.append((path, False))
        kernel = []
        if last("ProtectKernelTunables") in ("yes", "true"):
            kernel += ["/proc/sys", "/sys"]
        if last("ProtectControlGroups") in ("yes", "true"):
            kernel.append("/sys/fs/cgroup")
        def on(key: str) -> bool:
            return last(key) in ("yes", "true", "1", "on")

        if last("RestrictNamespaces") not in ("no", "false", "yes", "true"):
            raise UnsupportedSetting(f"RestrictNamespaces={last('RestrictNamespaces')}: only yes/no are rebuilt")
        calls: Dict[str, object] = {key: True for key in SECCOMP if on(key)}
        families = " ".join(settings.get("RestrictAddressFamilies", [])).split()
        if families:
            if families[0].startswith("~") or any(not f.startswith("AF_") for f in families):
                raise UnsupportedSetting(f"RestrictAddressFamilies={' '.join(families)}: only an allow-list is rebuilt")
            calls["RestrictAddressFamilies"] = families
        hidden += [(path, True) for key, paths in HIDDEN_BY.items() if on(key) for path in paths]
        dropped = tuple(cap for key, caps in DROPPED_CAPABILITIES.items() if on(key) for cap in caps)
        return cls(tuple(read_only), tuple(writable), tuple(created), tuple(hidden),
                   last("PrivateTmp") in ("yes", "true"), tuple(kernel), last("UMask", "0022"),
                   last("PrivateDevices") in ("yes", "true"), on("NoNewPrivileges"), on("ProtectHostname"),
                   dropped, tuple(sorted(calls.items())))

    def script(self, root: Path, host_paths: Tuple[str, ...] = ()) -> str:
        """bash: set up the namespace for a node rebased at ``root``, then exec "$@".

        ``host_paths``: the test host's own interpreter and checkout, which stand in for the node's
        /usr/bin/python3; a checkout under /tmp (CI may clone there) stays visible, read-only, under
        PrivateTmp, as /usr would on a node. Nothing of the node's is kept that way."""
        def at(path: str) -> str:
            return shlex.quote(str(root) + ("" if path == "/" else path))

        under_tmp = [p for p in host_paths if self.private_tmp and p.startswith(("/tmp/", "/var/tmp/"))]
        lines = ["set -eu", "mount --make-rprivate /"]
        if under_tmp:
            # Reached through a bind made before the private /tmp hides them (/dev/shm: never made read-only).
            lines += ["keep=$(mktemp -d /dev/shm/unit-sandbox-keep.XXXXXX)", 'mount --rbind / "$keep"']
        for path, mode in self.created:
            lines.append(f"install -d -m {mode} {at(path)}")
        for path, optional in self.writable:
            # systemd refuses to start a unit whose ReadWritePaths entry is missing (226/NAMESPACE).
            lines.append(f"if [ -e {at(path)} ]; then mount --bind {at(path)} {at(path)}; "
                         + ("fi" if optional else
                            f"else echo 'sandbox: ReadWritePaths {path} does not exist (226/NAMESPACE)' >&2; exit 226; fi"))
        writable = " ".join(shlex.quote(str(root) + p) for p, _ in self.writable)
        for path in self.read_only:
            if path == "/":
                # Every mount of the real system read-only, except the API file systems and the writable binds.
                lines.append(
                    "awk '{print $5}' /proc/self/mountinfo | sort -u | while read -r mp; do case \"$mp\" in "
                    "/proc|/proc/*|/sys|/sys/*|/dev|/dev/*) continue;; esac; skip=; for w in " + writable
                    + "; do case \"$mp\" in \"$w\"|\"$w\"/*) skip=1;; esac; done; [ -n \"$skip\" ] || "
                    "mount -o remount,bind,ro \"$mp\"; done")
            else:
                for target in (at(path), shlex.quote(path)):
                    lines.append(f"if [ -d {target} ]; then mount --rbind {target} {target}; "
                                 f"mount -o remount,bind,ro {target}; fi")
        for path, _ in self.hidden:
            for target in (at(path), shlex.quote(path)):
                lines.append(f"if [ -d {target} ]; then mount -t tmpfs -o ro,mode=000 tmpfs {target}; "
                             f"elif [ -e {target} ]; then mount --bind /dev/null {target}; fi")
        if self.private_tmp:
            lines += ["mount -t tmpfs -o mode=1777 tmpfs /tmp", "mount -t tmpfs -o mode=1777 tmpfs /var/tmp"]
            for path in under_tmp:
                quoted = shlex.quote(path)
                lines += [f"mkdir -p {quoted}", f'mount --rbind "$keep"{quoted} {quoted}',
                          f"mount -o remount,bind,ro {quoted}"]
            if under_tmp:
                lines += ['umount -l "$keep"', 'rmdir "$keep"']
        if self.private_devices:
            # Built on a tmpfs mounted over /mnt (in this namespace only), then moved over /dev.
            lines += ["staging=/mnt",
                      "mount -t tmpfs -o mode=755,nosuid tmpfs \"$staging\"",
                      "for name in null zero full random urandom tty; do touch \"$staging/$name\"; "
                      "mount --bind \"/dev/$name\" \"$staging/$name\"; done",
                      "mkdir \"$staging/pts\" \"$staging/shm\"", "mount --rbind /dev/pts \"$staging/pts\"",
                      "mount -t tmpfs -o mode=1777 tmpfs \"$staging/shm\"", "mount -n --move \"$staging\" /dev"]
        for path in self.kernel_read_only:
            lines.append(f"mount --bind {path} {path}; mount -o remount,bind,ro {path}")
        launch = []
        if self.no_new_privileges or self.dropped_capabilities:
            launch += ["setpriv"] + (["--no-new-privs"] if self.no_new_privileges else [])
            if self.dropped_capabilities:
                launch += ["--bounding-set", ",".join("-" + cap for cap in self.dropped_capabilities)]
        if self.system_calls:
            launch += [SYSTEM_PYTHON, "-I", str(SECCOMP_LAUNCHER), json.dumps(dict(self.system_calls))]
        lines += [f"umask {shlex.quote(self.umask)}", "exec " + " ".join(map(shlex.quote, launch)) + ' "$@"']
        return "\n".join(lines)

    def command(self, root: Path, argv: List[str], host_paths: Tuple[str, ...] = ()) -> List[str]:
        return ["unshare", "-m", *(["-u"] if self.own_hostname else []), "--propagation", "private", "bash", "-c",
                self.script(root, host_paths), "unit-sandbox", *argv]
