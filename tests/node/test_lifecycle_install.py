"""The lifecycle bundle and install.sh, installed into a temporary root (no systemd).

A compute node gets the agent files and config but nothing else; a login node also runs one agent
cycle against a moto server (so it joins with the cluster's keys) and gets the systemd unit.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
from real_tools import MotoServer

from hpops_core.host_identity import keys
from hpops_core.node_channel import contract
from hpops_node_agent import bundle as bundle_module
from hpops_node_agent import host_keys

CLUSTER = "install-cluster"
REGION = "us-west-2"
BUS = "hpops-node-reports"
AGENT_MODULES = sorted(Path(bundle_module.__file__).parent.glob("*.py")) + [
    Path(bundle_module._node_channel_dir()) / name for name in bundle_module.SHIPPED_CHANNEL_MODULES] + [
    Path(bundle_module._core_dir()) / "common" / name for name in bundle_module.SHIPPED_COMMON_MODULES]
# What the shipped modules may import from hpops_core: exactly what the bundle ships.
SHIPPED_CORE = {"hpops_core.node_channel", "hpops_core.common", "hpops_core.common.validation", "hpops_core.common.errors"}
ALLOWED_IMPORTS = {"hpops_core", "boto3", "botocore"}


@pytest.mark.parametrize("path", AGENT_MODULES, ids=lambda p: p.name)
def test_agent_modules_parse_as_python_38_and_import_only_stdlib_and_boto3(path):
    tree = ast.parse(path.read_text(), feature_version=(3, 8))
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module]
        for name in names:
            top = name.split(".")[0]
            assert top in sys.stdlib_module_names or top in ALLOWED_IMPORTS or path.name == "bundle.py", name
            if top == "hpops_core" and path.name != "bundle.py":
                assert any(name == m or name.startswith(m + ".") for m in SHIPPED_CORE), name


def build(tmp_path: Path, **agent_overrides) -> Path:
    """A lifecycle folder: provisioning_parameters.json next to the hpops/ bundle."""
    lifecycle = tmp_path / "lifecycle"
    lifecycle.mkdir()
    (lifecycle / "provisioning_parameters.json").write_text(json.dumps({
        "controller_group": "controller-machine", "login_group": "login", "worker_groups": []}))
    resource = tmp_path / "resource_config.json"
    resource.write_text(json.dumps({"InstanceGroups": [
        {"Name": "login", "Instances": [{"InstanceName": "l1", "CustomerIpAddress": "10.1.0.5",
                                         "InstanceId": "i-0123456789abcdef0"}]},
        {"Name": "gpu", "Instances": [{"InstanceName": "g1", "CustomerIpAddress": "10.1.1.9"}]}]}))
    bundle = bundle_module.build_bundle(lifecycle, CLUSTER, REGION, BUS, vendor=False)
    config = json.loads((bundle / "agent.json").read_text())
    assert config == {"cluster": CLUSTER, "region": REGION, "reportBus": BUS, "imdsLockdown": "off",
                      "imdsAllowedGroups": "", "imdsProbe": "169.254.169.254"}
    config["imdsProbe"] = ""  # this machine may answer on IMDS's address; the probe has its own test
    config.update({"resourceConfig": str(resource)}, **agent_overrides)
    (bundle / "agent.json").write_text(json.dumps(config))
    return bundle


def install(bundle: Path, root: Path, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if not key.startswith("AWS_")}
    env["HPOPS_PYTHON"] = sys.executable
    env.update(env_extra or {})
    return subprocess.run(["bash", str(bundle / "install.sh"), "--root", str(root), "--no-systemd"],
                          capture_output=True, text=True, timeout=120, env=env, cwd=bundle.parent)


def test_bundle_layout(tmp_path):
    bundle = bundle_module.build_bundle(tmp_path, CLUSTER, REGION, BUS, vendor=False)
    assert (bundle / "install.sh").stat().st_mode & 0o111
    assert (bundle / "hpops_node_agent" / "agent.py").exists()
    assert not (bundle / "hpops_node_agent" / "bundle.py").exists()
    assert (bundle / "hpops_core" / "__init__.py").read_text() == ""
    assert (bundle / "hpops_core" / "node_channel" / "contract.py").exists()
    assert not (bundle / "lib").exists()
    assert "@PYTHON@ -m hpops_node_agent" in (bundle / "hpops-node-agent.service").read_text()
    with pytest.raises(ValueError):
        bundle_module.build_bundle(tmp_path, "not a cluster", REGION, BUS, vendor=False)


def test_compute_node_installs_the_agent_and_nothing_else(tmp_path):
    bundle = build(tmp_path, ip="10.1.1.9")
    root = tmp_path / "root"
    root.mkdir()
    result = install(bundle, root)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "node role: compute" in result.stdout and "nothing more to install" in result.stdout
    config = json.loads((root / "etc" / "hpops" / "node-agent.json").read_text())
    assert config["root"] == str(root)
    assert config["provisioningParameters"] == str(root / "opt" / "hpops-node-agent" / "provisioning_parameters.json")
    assert (root / "opt" / "hpops-node-agent" / "provisioning_parameters.json").exists()
    assert (root / "opt" / "hpops-node-agent" / "hpops_node_agent" / "__main__.py").exists()
    assert not (root / "etc" / "systemd").exists() and not (root / "var").exists()


def test_missing_python_is_one_clear_line(tmp_path):
    bundle = build(tmp_path, ip="10.1.1.9")
    root = tmp_path / "root"
    root.mkdir()
    result = install(bundle, root, {"HPOPS_PYTHON": str(tmp_path / "no-python")})
    assert result.returncode == 0, "a missing python must not fail the node's provisioning"
    assert result.stderr.strip().count("\n") == 0 and "python3 >= 3.10" in result.stderr
    assert not (root / "etc" / "systemd").exists()
    strict = install(bundle, root, {"HPOPS_PYTHON": str(tmp_path / "no-python"), "HPOPS_REQUIRED": "1"})
    assert strict.returncode == 78


def test_login_node_runs_one_cycle_then_gets_the_unit(tmp_path):
    with MotoServer() as moto:
        endpoint = moto.endpoint
        credentials = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": REGION, "AWS_ENDPOINT_URL": endpoint}
        session = boto3.session.Session(region_name=REGION, aws_access_key_id="testing",
                                        aws_secret_access_key="testing")
        session.client("events", endpoint_url=endpoint).create_event_bus(Name=BUS)
        canonical = keys.generate_bundle()
        arn = session.client("secretsmanager", endpoint_url=endpoint).create_secret(
            Name="hk", SecretString=canonical.to_secret_json())["ARN"]
        session.client("ssm", endpoint_url=endpoint).put_parameter(
            Name=contract.host_identity_parameter(CLUSTER), Type="String", Value=json.dumps({
                "format": contract.HOST_IDENTITY_FORMAT, "mode": "keys", "version": "v1", "secretArn": arn,
                "fingerprints": canonical.public_fingerprints()}))

        bundle = build(tmp_path, ip="10.1.0.5", sshdCmd="true", reloadCmd="true")
        root = tmp_path / "root"
        (root / "etc" / "ssh").mkdir(parents=True)
        (root / "etc" / "ssh" / "sshd_config").write_text("Port 22\n")
        result = install(bundle, root, credentials)
    assert result.returncode == 0, result.stdout + result.stderr
    # Without a NodeChannel (this bundle names none) the node role reads no host keys: the first cycle
    # says so and installs nothing; with one, tests/node/test_enrollment_real_process.py installs them.
    assert "node role: login" in result.stdout and "first cycle did not converge" in result.stdout
    assert "no NodeChannel configured" in result.stdout
    assert not (root / "etc" / "ssh" / "ssh_host_ed25519_key.pub").exists()
    unit = (root / "etc" / "systemd" / "system" / "hpops-node-agent.service").read_text()
    assert f"ExecStart={sys.executable} -m hpops_node_agent --config /etc/hpops/node-agent.json" in unit
    assert "Restart=always" in unit and "RestartSec=10" in unit
    assert "ReadWritePaths=/etc/ssh /etc/security/limits.d" in unit
    assert "skipped systemctl" in result.stdout


def test_help_is_fast_and_config_errors_exit_78(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(Path(bundle_module.__file__).parent.parent))
    result = subprocess.run([sys.executable, "-m", "hpops_node_agent", "--help"], capture_output=True, text=True,
                            timeout=30, env=env)
    assert result.returncode == 0 and "--once" in result.stdout
    (tmp_path / "c.json").write_text(json.dumps({"cluster": CLUSTER, "region": REGION}))
    result = subprocess.run([sys.executable, "-m", "hpops_node_agent", "--config", str(tmp_path / "c.json")],
                            capture_output=True, text=True, timeout=30, env=env)
    assert result.returncode == 78
    assert result.stderr == "hpops-node-agent: config is missing required key 'reportBus'\n"


def test_without_boto3_the_agent_says_what_is_missing(tmp_path):
    (tmp_path / "c.json").write_text(json.dumps({"cluster": CLUSTER, "region": REGION, "reportBus": BUS,
                                                 "role": "login", "ip": "10.1.0.5",
                                                 "instanceId": "i-0123456789abcdef0"}))
    bundle = bundle_module.build_bundle(tmp_path / "b", CLUSTER, REGION, BUS, vendor=False)
    # -S -I: no site-packages, so boto3 is really absent; the bundle brings everything else.
    result = subprocess.run([sys.executable, "-I", "-S", "-c",
                             f"import sys; sys.path.insert(0, {str(bundle)!r}); import runpy; "
                             "sys.argv=['hpops_node_agent', '--config', "
                             f"{str(tmp_path / 'c.json')!r}]; runpy.run_module('hpops_node_agent', "
                             "run_name='__main__')"],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 78
    assert result.stderr.count("\n") == 1 and "boto3 is not importable" in result.stderr
