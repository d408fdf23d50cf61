#!/usr/bin/env python3
"""Apply the stack's per-user session limits on a login node as pam_limits `maxlogins` (hpops).

Standard library only: this file runs on the node itself, inlined into the stack's SSM Command
document LoginLimitsDocument (template.yaml, written by `make ssm-document`).

    python3 apply_login_limits.py --limits-json '{"default": 2, "overrides": {"alice": 4}, "exempt": ["ops"]}'

Writes ROOT/etc/security/limits.d/90-hpops-maxlogins.conf (atomically: temp file + rename, mode
0644) with one `hard maxlogins` line for everybody (`*`), one per override and one per exempt user
(a value no one reaches). A user's own line wins over `*` in pam_limits. When the file already
says exactly this, nothing is written. Prints one JSON line {"result": "changed"|"unchanged", ...}.
Input that does not validate (user names ^[a-z_][a-z0-9_-]{0,31}$, integer limits in range) is
refused with exit code 3 and nothing is changed.

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
import os
import re
import sys
import tempfile
from pathlib import Path

RELATIVE_PATH = Path("etc/security/limits.d/90-hpops-maxlogins.conf")
USER_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
MAX_LIMIT = 10_000
EXEMPT_LIMIT = 65_535  # "no limit" for an exempt user: far beyond anything a person opens
EXIT_BAD_INPUT = 3


class BadInput(ValueError):
    """The limits JSON is not exactly what this script accepts."""


def _limit(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= MAX_LIMIT:
        raise BadInput(f"{name} must be an integer from {minimum} to {MAX_LIMIT}")
    return value


def _user(value: object) -> str:
    if not isinstance(value, str) or not USER_RE.match(value):
        raise BadInput(f"not a valid user name: {str(value)[:40]!r}")
    return value


def parse_limits(raw: str) -> dict:
    """{"default": N, "overrides": {user: N}, "exempt": [user]} -> the same, validated and normalized."""
    try:
        value = json.loads(raw)
    except ValueError:
        raise BadInput("limits are not valid JSON") from None
    if not isinstance(value, dict) or not set(value) <= {"default", "overrides", "exempt"} or "default" not in value:
        raise BadInput('limits must be an object with "default" and optional "overrides", "exempt"')
    overrides = value.get("overrides", {})
    exempt = value.get("exempt", [])
    if not isinstance(overrides, dict):
        raise BadInput('"overrides" must be an object of user -> limit')
    if not isinstance(exempt, list):
        raise BadInput('"exempt" must be a list of user names')
    return {
        "default": _limit("default", value["default"], 1),
        "overrides": {_user(user): _limit(f"overrides[{user}]", limit, 0) for user, limit in sorted(overrides.items())},
        "exempt": sorted({_user(user) for user in exempt}),
    }


def canonical_json(limits: dict) -> str:
    """The one spelling of a set of limits (what the stack sends and hashes)."""
    return json.dumps(limits, sort_keys=True, separators=(",", ":"))


def render(limits: dict) -> str:
    lines = [
        "# Managed by hpops (HyperPod login-node autopilot): per-user session limits. Do not edit;",
        "# the next push overwrites this file. Needs `session required pam_limits.so` for sshd.",
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
    fd, temp = tempfile.mkstemp(prefix=".hpops-maxlogins.", dir=str(path.parent))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(wanted)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temp, 0o644)
        os.replace(temp, path)
    except BaseException:
        try:
            os.unlink(temp)
        except FileNotFoundError:
            pass
        raise
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
