"""Prune and compile a layer that pip installed: the last step of layers/*/Makefile.

    python prune_layer.py <layer>/python [--drop NAME ...]

* botocore/data and boto3/data keep only the services in AWS_SERVICES (plus botocore's top-level
  data files: endpoints, partitions, retry and default configuration), and of each service only
  its newest API version, the one clients use when no api_version is given;
* --drop removes installed distributions by name (package, module and .dist-info);
* scripts (bin/) go;
* every module is compiled to __pycache__/*.cpython-311.pyc, see compile_layer().

Standard library only, and it must run on Python 3.11: bytecode is specific to the minor version.
"""

from __future__ import annotations

import argparse
import compileall
import py_compile
import re
import shutil
import sys
from pathlib import Path

# The ONE list of AWS services the layer keeps models for. Every service our code makes a client
# (or boto3 resource) for must be here: tests/unit/test_footprint.py greps layers/ and functions/
# for client("...") and checks it, and that a client for each service here can be made from the
# pruned tree. Names as boto3.client() takes them (botocore/data/<name>).
AWS_SERVICES = (
    "budgets",         # budget_guard: the cluster's and users' budgets
    "ce",              # budget_guard: month-to-date cost and billed rates
    "dynamodb",        # the state table (leases, node reports, alerts, session ledger)
    "ec2",             # login_sync: the target group's VPC CIDRs
    "elbv2",           # login_sync: the SSH target group
    "events",          # budget_guard: alerts on the default bus; node_channel: sessions changed
    "iam",             # session_limits: run-as tags of session owners
    "pricing",         # budget_guard: AWS Price List on-demand rates
    "sagemaker",       # the HyperPod cluster and its nodes
    "secretsmanager",  # host_identity: the host CA (certificate mode)
    "sns",             # alerts
    "ssm",             # node channel parameters, Session Manager sessions
    "stepfunctions",   # session_limits: a node's report starts a check (CheckReportedSessions)
    # The X-Ray SDK makes an xray client for centralised sampling when it runs outside Lambda
    # (in Lambda it samples locally); kept so that importing the layer's code anywhere works.
    "xray",
)

PYTHON_VERSION = (3, 11)
# Where Lambda mounts a layer's python/ folder: the path tracebacks show.
LAMBDA_LAYER_PATH = "/opt/python"


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def prune_service_data(root: Path, services: tuple[str, ...] = AWS_SERVICES) -> None:
    botocore_data = root / "botocore" / "data"
    if botocore_data.is_dir():
        for entry in botocore_data.iterdir():
            if entry.is_dir() and entry.name not in services:
                _remove(entry)
        for service in services:
            versions = sorted(p for p in (botocore_data / service).glob("*") if p.is_dir())
            for old in versions[:-1]:  # API versions sort as dates: the last is the newest
                _remove(old)
    boto3_data = root / "boto3" / "data"
    if boto3_data.is_dir():
        for entry in boto3_data.iterdir():
            if entry.is_dir() and entry.name not in services:
                _remove(entry)


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def drop_distributions(root: Path, names: list[str]) -> None:
    """Remove each named distribution: its top-level packages/modules (from top_level.txt or
    RECORD) and its .dist-info."""
    wanted = {_normalized(n) for n in names}
    for info in root.glob("*.dist-info"):
        if _normalized(info.name.split("-", 1)[0]) not in wanted:
            continue
        tops = set()
        record = info / "RECORD"
        if record.exists():
            for line in record.read_text().splitlines():
                first = line.split(",", 1)[0].split("/", 1)[0]
                if first and not first.endswith(".dist-info") and first != "..":
                    tops.add(first)
        for top in tops:
            _remove(root / top)
        _remove(info)
        wanted.discard(_normalized(info.name.split("-", 1)[0]))
    if wanted:
        raise SystemExit(f"prune_layer: nothing installed under {sorted(wanted)} to drop")


def compile_layer(root: Path) -> None:
    """Bytecode in: /opt is read-only on Lambda, so without it every cold start compiles every
    module it imports, every time. unchecked-hash: the .pyc is used without looking at the source's
    mtime, which the zip a layer travels in keeps only to 2 s (a timestamp .pyc would be stale for
    about half the files and silently recompiled on every cold start)."""
    for cache in list(root.rglob("__pycache__")):
        _remove(cache)
    ok = compileall.compile_dir(
        str(root), quiet=1, workers=0, stripdir=str(root), prependdir=LAMBDA_LAYER_PATH,
        invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
    )
    if not ok:
        raise SystemExit("prune_layer: some modules did not compile")


def main(argv: list[str] | None = None) -> int:
    if sys.version_info[:2] != PYTHON_VERSION:
        raise SystemExit(f"prune_layer: needs Python {'.'.join(map(str, PYTHON_VERSION))} (the runtime's bytecode), "
                         f"this is {sys.version.split()[0]}")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="the layer's python/ folder")
    parser.add_argument("--drop", nargs="*", default=[], help="distributions to remove")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    if not root.is_dir():
        raise SystemExit(f"prune_layer: {root} is not a folder")
    prune_service_data(root)
    if args.drop:
        drop_distributions(root, args.drop)
    _remove(root / "bin")
    compile_layer(root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
