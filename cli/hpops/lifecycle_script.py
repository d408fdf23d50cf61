"""Where the install line goes in a cluster's on_create.sh, and putting it there.

HyperPod runs on_create.sh as root from a downloaded copy of the lifecycle S3 prefix. AWS's reference
on_create.sh (awsome-distributed-training, LifecycleScripts/base-config) configures sshd, users and
Slurm inside lifecycle_script.py and then ends with ``exit $exit_code``: a line appended after that
never runs. So the install line goes after the last command and before the script's final exit.

A second line goes first, right after the shebang: it enrolls the agent's key (and applies the IMDS
lockdown when it is on) before the lifecycle scripts set up users' directory access, so no user can be
on a new node before its agent has enrolled; the stack trusts the first key, and a verified instance
identity document, presented for an instance.

The lines find hpops/ next to the script itself, not through the working directory, so they work
whichever folder HyperPod starts the script from.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

INSTALL_LINE = 'bash "$(dirname "$0")/hpops/install.sh"'
ENROLL_LINE = 'bash "$(dirname "$0")/hpops/install.sh" --enroll-first'
# What counts as our line when checking a script: any call of the bundle's installer.
INSTALL_CALL = re.compile(r"""^\s*(?:sudo\s+)?(?:bash|sh|\.|source)?\s*["']?[^#\n]*hpops/install\.sh\b""")
ENROLL_FLAG = re.compile(r"\s--enroll-first\b")
# Lines that may come before the enroll line and still leave it first: set options, traps.
_PREAMBLE = re.compile(r"^\s*(?:set\s|trap\s|shopt\s)")
# A top-level exit (column 0 only: an indented exit belongs to an if/function body).
TOP_LEVEL_EXIT = re.compile(r"^exit(?:\s+[^#]*)?\s*(?:#.*)?$")


class LifecycleScriptError(ValueError):
    """The script cannot be patched as it is; the message says why."""


@dataclass(frozen=True)
class InstallLineCheck:
    """Whether a script runs the installer, and whether that line is ever reached."""

    has_line: bool
    reached: bool
    line_number: Optional[int]  # 1-based, of the first install call
    final_exit_line: Optional[int]  # 1-based, of the last top-level exit
    reason: str
    enrolls_first: bool = False  # the enroll line is the script's first command


def _lines(text: str) -> list:
    return text.splitlines()


def _final_exit(lines: list) -> Optional[int]:
    """0-based index of the last top-level ``exit`` if only blanks and comments follow it."""
    for index in range(len(lines) - 1, -1, -1):
        stripped = lines[index].strip()
        if not stripped or stripped.startswith("#"):
            continue
        return index if TOP_LEVEL_EXIT.match(lines[index]) else None
    return None


def _enrolls_first(lines: list) -> bool:
    """The first command (past the shebang, comments, blanks and set/trap lines) is the enroll line."""
    for line in lines:
        stripped = line.strip()
        if not stripped or stripped.startswith("#") or _PREAMBLE.match(line):
            continue
        return bool(INSTALL_CALL.match(line) and ENROLL_FLAG.search(line))
    return False


def check(text: str) -> InstallLineCheck:
    """Does the script call hpops/install.sh before anything that ends it (and enroll first)?"""
    lines = _lines(text)
    calls = [index for index, line in enumerate(lines)
             if INSTALL_CALL.match(line) and not line.lstrip().startswith("#") and not ENROLL_FLAG.search(line)]
    final = _final_exit(lines)
    first_command = _enrolls_first(lines)
    if not calls:
        return InstallLineCheck(False, False, None, None if final is None else final + 1,
                                "on_create.sh does not run hpops/install.sh", first_command)
    first = calls[0]
    exits_before = [index for index, line in enumerate(lines[:first]) if TOP_LEVEL_EXIT.match(line)]
    if exits_before:
        return InstallLineCheck(True, False, first + 1, None if final is None else final + 1,
                                "hpops/install.sh is on line {} after the script's exit on line {}: it never runs".format(
                                    first + 1, exits_before[-1] + 1), first_command)
    enrolled = ("its agent enrolls first" if first_command
                else "but not enrolling first (a user could reach a new node before its agent)")
    return InstallLineCheck(True, True, first + 1, None if final is None else final + 1,
                            "hpops/install.sh runs on line {}, {}".format(first + 1, enrolled), first_command)


def patch(text: str) -> tuple:
    """(new text, what was done). Inserts INSTALL_LINE before the final exit, or at the end.

    A script that already calls the installer where it is reached is returned unchanged; one that
    calls it only after its exit is refused (moving someone's line is theirs to decide)."""
    if not text.startswith("#!") and not text.strip():
        raise LifecycleScriptError("the script is empty")
    current = check(text)
    if current.has_line and not current.reached:
        raise LifecycleScriptError(current.reason + "; move it above that exit")
    if current.has_line and current.enrolls_first:
        return text, "unchanged: " + current.reason
    if not current.enrolls_first:
        text, enroll_where = _enroll_first(text)
    if current.has_line:
        return text, enroll_where
    patched, where = _install_last(text)
    return patched, where + ("; " + enroll_where if not current.enrolls_first else "")


def _enroll_first(text: str) -> tuple:
    """The enroll line as the first command, right after the shebang (lines already there stay)."""
    lines = _lines(text)
    at = 1 if lines and lines[0].startswith("#!") else 0
    block = ["# hpops: enroll the node agent's key before users can reach this node (never fails provisioning)",
             ENROLL_LINE, ""]
    return "\n".join(lines[:at] + block + lines[at:]) + "\n", "the enroll line put first (line {})".format(at + 2)


def _install_last(text: str) -> tuple:
    lines = _lines(text)
    final = _final_exit(lines)
    block = ["", "# hpops node agent (login-node autopilot); never fails provisioning unless HPOPS_REQUIRED=1",
             INSTALL_LINE]
    if final is None:
        new_lines = lines + block
        where = "appended at the end (the script has no final exit)"
    else:
        inserted = block[1:]
        if "$?" in lines[final]:
            # The exit passes on the status of the command before it: keep that status, not ours.
            inserted = [inserted[0], "hpops_saved_status=$?", INSTALL_LINE, "(exit $hpops_saved_status)"]
        new_lines = lines[:final] + inserted + [""] + lines[final:]
        where = "inserted before the final exit on line {}".format(final + 1)
    return "\n".join(new_lines) + "\n", where
