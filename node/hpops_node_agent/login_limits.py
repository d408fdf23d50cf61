#!/usr/bin/env python3
"""Apply the stack's per-user session limits on a login node as pam_limits `maxlogins` (hpops).

Standard library only. The node agent calls `apply` with the limits the stack published in
/hpops/<cluster>/node/login-limits; the same file also works by hand:

    python3 -m hpops_node_agent.login_limits --limits-json '{"default": 2, "overrides": {"alice": 4}, "exempt": ["ops"]}'

Writes ROOT/etc/security/limits.d/90-hpops-maxlogins.conf (atomically: temp file + rename, mode
0644) with one `hard maxlogins` line for everybody (`*`), one per override and one per exempt user
(a value no one reaches). A user's own line wins over `*` in pam_limits. When the file already
says exactly this, nothing is written. Prints one JSON line {"result": "changed"|"unchanged", ...}.
Input that does not validate (hpops_core/node_channel/login_limits.py: user names, integer limits
in range) is refused with exit code 3 and nothing is changed.

Notes for operators:
* pam_limits must be enabled for sshd (`session required pam_limits.so` in /etc/pam.d/sshd, the
  Ubuntu default); otherwise the file is written but nothing enforces it.
* `maxlogins` counts all of a user's logins on that node (every PAM login recorded in utmp: ssh,
  console...), not only Session Manager sessions, and it is per node, not per cluster. It does not
  apply to root (uid 0). Session Manager sessions themselves are limited by the SessionLimits
  state machine, which counts sessions across all login nodes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import host_keys
from hpops_core.node_channel.login_limits import EXEMPT_LIMIT, BadInput, canonical_json, parse_limits  # noqa: F401

RELATIVE_PATH = Path("etc/security/limits.d/90-hpops-maxlogins.conf")
EXIT_BAD_INPUT = 3


def render(limits: dict) -> str:
    lines = [
        "# Managed by hpops (HyperPod login-node autopilot): per-user session limits. Do not edit;",
        "# the node agent overwrites this file. Needs `session required pam_limits.so` for sshd.",
        f"*  hard  maxlogins  {limits['default']}",
    ]
    exempt = set(limits["exempt"])
    lines += [f"{user}  hard  maxlogins  {limit}" for user, limit in sorted(limits["overrides"].items()) if user not in exempt]
    lines += [f"{user}  hard  maxlogins  {EXEMPT_LIMIT}" for user in sorted(exempt)]
    return "\n".join(lines) + "\n"


def apply(root: Path, limits: dict) -> str:
    """Write the file if it differs; return "changed" or "unchanged"."""
    path = root / RELATIVE_PATH
    wanted = render(limits)
    try:
        if path.read_text(encoding="utf-8") == wanted and (path.stat().st_mode & 0o777) == 0o644:
            return "unchanged"
    except FileNotFoundError:
        pass
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    host_keys.atomic_write(str(path), wanted.encode("utf-8"), 0o644)
    return "changed"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Apply per-user maxlogins limits (pam_limits).")
    parser.add_argument("--root", default="/", help="filesystem root (tests use a directory)")
    parser.add_argument("--limits-json", required=True)
    args = parser.parse_args(argv)
    try:
        limits = parse_limits(args.limits_json)
    except BadInput as error:
        print(json.dumps({"result": "failed", "reason": f"refused: {error}"}))
        return EXIT_BAD_INPUT
    result = apply(Path(args.root), limits)
    print(json.dumps({
        "result": result,
        "reason": f"maxlogins {result}: default {limits['default']}, {len(limits['overrides'])} override(s), "
                  f"{len(limits['exempt'])} exempt",
        "path": "/" + RELATIVE_PATH.as_posix(),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
