"""The unit's system-call restrictions, rebuilt as systemd builds them: a seccomp filter, then exec.

Run by the system's python3 (python3-seccomp, libseccomp's own binding) inside the sandbox, after the
mount namespace is set: ``python3 -I unit_seccomp.py '<json>' CMD...``. The JSON says which
restrictions the unit sets (systemd.exec(5)); each denied call fails with the errno systemd uses:

  RestrictAddressFamilies  socket()/socketpair() of another family: EAFNOSUPPORT
  RestrictNamespaces=yes   unshare()/clone() with a CLONE_NEW* flag, setns(): EPERM; clone3(): ENOSYS
                           (as systemd: glibc then falls back to clone, which the flags check covers)
  RestrictRealtime         sched_setscheduler()/sched_setattr() to SCHED_FIFO, SCHED_RR, SCHED_DEADLINE: EPERM
  RestrictSUIDSGID         chmod()/fchmod()/fchmodat() setting S_ISUID or S_ISGID: EPERM
  LockPersonality          personality() to anything but the default (0): EPERM (systemd also allows a query)
  ProtectHostname          sethostname()/setdomainname(): EPERM (the UTS namespace is the shell's unshare -u)
  ProtectClock             settimeofday(), clock_settime(), clock_adjtime(), adjtimex(): EPERM
  ProtectKernelModules     init_module(), finit_module(), delete_module(): EPERM
  ProtectKernelLogs        syslog(): EPERM
"""

import errno
import json
import os
import socket
import sys

import seccomp

CLONE_NEW = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000, 0x00000080)
REALTIME = (1, 2, 6)  # SCHED_FIFO, SCHED_RR, SCHED_DEADLINE
SUID_SGID = (0o4000, 0o2000)
DENIED_CALLS = {
    "ProtectHostname": ("sethostname", "setdomainname"),
    "ProtectClock": ("settimeofday", "clock_settime", "clock_adjtime", "adjtimex"),
    "ProtectKernelModules": ("init_module", "finit_module", "delete_module"),
    "ProtectKernelLogs": ("syslog",),
}


def build(spec: dict) -> seccomp.SyscallFilter:
    rules = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
    eperm = seccomp.ERRNO(errno.EPERM)
    families = spec.get("RestrictAddressFamilies")
    if families is not None:
        allowed = {getattr(socket, name) for name in families}
        for family in range(0, 64):
            if family not in allowed:
                for call in ("socket", "socketpair"):
                    rules.add_rule(seccomp.ERRNO(errno.EAFNOSUPPORT), call, seccomp.Arg(0, seccomp.EQ, family))
    if spec.get("RestrictNamespaces"):
        for flag in CLONE_NEW:
            for call in ("unshare", "clone"):
                rules.add_rule(eperm, call, seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
        rules.add_rule(eperm, "setns")
        rules.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    if spec.get("RestrictRealtime"):
        for policy in REALTIME:
            rules.add_rule(eperm, "sched_setscheduler", seccomp.Arg(1, seccomp.MASKED_EQ, 0x3fffffff, policy))
        rules.add_rule(eperm, "sched_setattr")
    if spec.get("RestrictSUIDSGID"):
        for bit in SUID_SGID:
            rules.add_rule(eperm, "chmod", seccomp.Arg(1, seccomp.MASKED_EQ, bit, bit))
            rules.add_rule(eperm, "fchmod", seccomp.Arg(1, seccomp.MASKED_EQ, bit, bit))
            rules.add_rule(eperm, "fchmodat", seccomp.Arg(2, seccomp.MASKED_EQ, bit, bit))
    if spec.get("LockPersonality"):
        # libseccomp takes one comparison per argument: a query (0xffffffff) is refused too, stricter than systemd.
        rules.add_rule(eperm, "personality", seccomp.Arg(0, seccomp.GT, 0))
    for setting, calls in DENIED_CALLS.items():
        if spec.get(setting):
            for call in calls:
                rules.add_rule(eperm, call)
    return rules


if __name__ == "__main__":
    build(json.loads(sys.argv[1])).load()
    os.execvp(sys.argv[2], sys.argv[2:])
