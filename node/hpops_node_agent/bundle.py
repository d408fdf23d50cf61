"""Build the lifecycle bundle: the hpops/ folder users drop next to on_create.sh.

    python -m hpops_node_agent.bundle --out DIR --cluster C --region R --report-bus B [--no-vendor]

writes DIR/hpops/ with install.sh, the systemd unit, agent.json, the agent package, the
standard-library part of hpops_core (node_channel and validation), and lib/ with boto3/botocore (pure Python)
pinned to the versions this environment runs, so nodes need nothing from PyPI.
Runs on the operator's machine (Python 3.11), not on nodes.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from hpops_core.node_channel import contract

from . import imds_guard
from .__main__ import MIN_PYTHON
from .config import AgentConfig

PACKAGE_DIR = Path(__file__).resolve().parent
# install.sh and the systemd unit: package data, so an installed `hpops lifecycle` finds them too.
LIFECYCLE_DIR = PACKAGE_DIR / "lifecycle"
# Modules only the operator's machine needs.
NOT_SHIPPED = {"bundle.py"}
UNITS = ("hpops-node-agent.service", "hpops-imds-lockdown.service")
# The oldest Python the agent accepts (the HyperPod Slurm AMI's, 3.10); wheels are resolved for it,
# not for the operator's Python.
NODE_PYTHON_VERSION = "{}.{}".format(*MIN_PYTHON)


# The standard-library half of hpops_core.node_channel; the rest of that package is the stack's.
SHIPPED_CHANNEL_MODULES = ("__init__.py", "contract.py", "leave_notices.py", "login_limits.py", "login_slots.py",
                           "proof_format.py", "ssh_keepalive.py", "user_caps.py", "user_holds.py")
# Standard-library modules of hpops_core.common that the channel modules import (the name and id rules,
# and the error root their exceptions derive from).
SHIPPED_COMMON_MODULES = ("__init__.py", "errors.py", "validation.py")


def _node_channel_dir() -> Path:
    import hpops_core.node_channel

    return Path(hpops_core.node_channel.__file__).resolve().parent


def _core_dir() -> Path:
    return _node_channel_dir().parent


def build_bundle(out_dir: Path, cluster: str, region: str, report_bus: str, vendor: bool = True,
                 node_channel: str | None = None, imds_lockdown: str = "off", imds_allowed_groups: str = "") -> Path:
    """Write out_dir/hpops/ and return its path (replacing an older one)."""
    contract.parameter_prefix(cluster)  # raises ValueError for a name the agent would refuse
    if not region or not report_bus:
        raise ValueError("region and report bus are required")
    agent_config = {"cluster": cluster, "region": region, "reportBus": report_bus,
                    "imdsLockdown": imds_lockdown, "imdsAllowedGroups": imds_allowed_groups,
                    "imdsProbe": imds_guard.IMDS_V4}
    if node_channel:  # the stack's NodeChannelFunctionName: where the agent enrolls its key
        agent_config["nodeChannel"] = node_channel
    AgentConfig.from_dict(agent_config)  # raises ConfigError (a ValueError) for a value the agent would refuse
    bundle = Path(out_dir) / "hpops"
    if bundle.exists():
        shutil.rmtree(bundle)
    bundle.mkdir(parents=True)

    installer = (LIFECYCLE_DIR / "install.sh").read_text()
    (bundle / "install.sh").write_text(installer.replace("@MIN_PYTHON@", "{}.{}".format(*MIN_PYTHON)))
    (bundle / "install.sh").chmod(0o755)
    for unit in UNITS:
        shutil.copy2(LIFECYCLE_DIR / unit, bundle / unit)
    (bundle / "agent.json").write_text(json.dumps(agent_config, indent=2, sort_keys=True) + "\n")

    package = bundle / "hpops_node_agent"
    package.mkdir()
    for source in sorted(PACKAGE_DIR.glob("*.py")):
        if source.name not in NOT_SHIPPED:
            shutil.copy2(source, package / source.name)

    core = bundle / "hpops_core"
    (core / "node_channel").mkdir(parents=True)
    (core / "__init__.py").write_text("")
    for name in SHIPPED_CHANNEL_MODULES:
        shutil.copy2(_node_channel_dir() / name, core / "node_channel" / name)
    (core / "common").mkdir()
    for name in SHIPPED_COMMON_MODULES:
        shutil.copy2(_core_dir() / "common" / name, core / "common" / name)

    if vendor:
        vendor_boto3(bundle / "lib")
    return bundle


def vendor_boto3(target: Path) -> None:
    """pip install boto3/botocore (same versions as here) into target, for the node's Python."""
    pins = ["boto3=={}".format(metadata.version("boto3")), "botocore=={}".format(metadata.version("botocore"))]
    command = [
        sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
        "--target", str(target), "--no-compile",
        "--only-binary=:all:", "--python-version", NODE_PYTHON_VERSION, "--implementation", "py",
        *pins,
    ]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        tail = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError("pip could not vendor {}: {}".format(" ".join(pins), tail))
    for leftover in target.glob("bin"):
        shutil.rmtree(leftover)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build the hpops lifecycle bundle (the hpops/ folder).")
    parser.add_argument("--out", required=True, type=Path, help="directory to write hpops/ into")
    parser.add_argument("--cluster", required=True)
    parser.add_argument("--region", required=True)
    parser.add_argument("--report-bus", required=True)
    parser.add_argument("--node-channel", help="the stack's NodeChannelFunctionName output (agents enroll their key)")
    parser.add_argument("--no-vendor", action="store_true", help="skip lib/ (nodes must have boto3 >= 1.28)")
    args = parser.parse_args(argv)
    try:
        path = build_bundle(args.out, args.cluster, args.region, args.report_bus, vendor=not args.no_vendor,
                            node_channel=args.node_channel)
    except (ValueError, RuntimeError) as error:
        print("hpops bundle: {}".format(error), file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
