"""Where the install line goes in a cluster's on_create.sh, and putting it there.

HyperPod runs on_create.sh as root from a downloaded copy of the lifecycle S3 prefix. AWS's reference
on_create.sh (awsome-distributed-training, LifecycleScripts/base-config) configures sshd, users and
Slurm inside lifecycle_script.py and then ends with ``exit $exit_code``: a line appended after that
never runs. So the install line goes after the last command and before the script's final exit.

The line finds hpops/ next to the script itself, not through the working directory, so it works
whichever folder HyperPod starts the script from.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

INSTALL_LINE = 'bash "$(dirname "$0")/hpops/install.sh"'
# What counts as our line when checking a script: any call of the bundle's installer.
INSTALL_CALL = re.compile(r"""^\s*(?:sudo\s+)?(?:bash|sh|\.|source)?\s*["']?[^#\n]*hpops/install\.sh\b""")
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


def check(text: str) -> InstallLineCheck:
    """Does the script call hpops/install.sh before anything that ends it?"""
    lines = _lines(text)
    calls = [index for index, line in enumerate(lines) if INSTALL_CALL.match(line) and not line.lstrip().startswith("#")]
    final = _final_exit(lines)
    if not calls:
        return InstallLineCheck(False, False, None, None if final is None else final + 1,
                                "on_create.sh does not run hpops/install.sh")
    first = calls[0]
    exits_before = [index for index, line in enumerate(lines[:first]) if TOP_LEVEL_EXIT.match(line)]
    if exits_before:
        return InstallLineCheck(True, False, first + 1, None if final is None else final + 1,
                                "hpops/install.sh is on line {} after the script's exit on line {}: it never runs".format(
                                    first + 1, exits_before[-1] + 1))
    return InstallLineCheck(True, True, first + 1, None if final is None else final + 1,
                            "hpops/install.sh runs on line {}".format(first + 1))


def patch(text: str) -> tuple:
    """(new text, what was done). Inserts INSTALL_LINE before the final exit, or at the end.

    A script that already calls the installer where it is reached is returned unchanged; one that
    calls it only after its exit is refused (moving someone's line is theirs to decide)."""
    if not text.startswith("#!") and not text.strip():
        raise LifecycleScriptError("the script is empty")
    current = check(text)
    if current.has_line and current.reached:
        return text, "unchanged: " + current.reason
    if current.has_line:
        raise LifecycleScriptError(current.reason + "; move it above that exit")
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
