"""The host-key installer's three modes and three sources, run as a command-line program.

Certificate mode end to end on one node: the program runs with --mode report-public-keys
(the node prints its own public host keys), a signer certifies exactly those keys into
/hpops/<cluster>/host-certificates/<instance-id>, and --mode certificate with that
parameter name fetches and installs the bundle. (The node agent calls the same functions as a
library; tests/node covers that path.) These tests run the real script
with a stand-in aws CLI and OpenSSH's own ssh-keygen as referee; no sshd is needed
(tests/ssh/test_real_sshd.py plays the same flow against real sshd).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import hpops_node_agent.host_keys
from hpops_core.host_identity import keys

SSH_KEYGEN = "/usr/bin/ssh-keygen"
NODE_SCRIPT = Path(hpops_node_agent.host_keys.__file__)
KEY_ARGS = {"ed25519": (), "ecdsa": ("-b", "256"), "rsa": ("-b", "3072")}
PARAMETER = "/hpops/test-cluster/host-certificates/i-0123456789abcdef0"
SECRET_ARN = "arn:aws:secretsmanager:us-west-2:123456789012:secret:hpops/test-cluster/host-keys-AbCdEf"

needs_ssh_keygen = pytest.mark.skipif(not os.access(SSH_KEYGEN, os.X_OK), reason="needs /usr/bin/ssh-keygen")


# --------------------------------------------------------------------------- helpers


def ssh_keygen(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([SSH_KEYGEN, *args], capture_output=True, text=True, timeout=60)


def node_root(tmp_path: Path, names=("ed25519", "ecdsa", "rsa")) -> Path:
    """A node's / with first-boot host keys (as ssh-keygen -A makes them) and an sshd_config."""
    root = tmp_path / "root"
    ssh_dir = root / "etc" / "ssh"
    ssh_dir.mkdir(parents=True)
    (ssh_dir / "sshd_config").write_text("Port 22\n")
    for name in names:
        path = ssh_dir / f"ssh_host_{name}_key"
        result = ssh_keygen("-q", "-t", name, *KEY_ARGS[name], "-N", "", "-C", "root@node", "-f", str(path))
        assert result.returncode == 0, result.stderr
    return root


def private_key(root: Path, name: str) -> Path:
    return root / "etc" / "ssh" / f"ssh_host_{name}_key"


def derived_line(root: Path, name: str) -> str:
    """What OpenSSH says the private key's public line is (type and base64, no comment)."""
    result = ssh_keygen("-y", "-f", str(private_key(root, name)))
    assert result.returncode == 0, result.stderr
    return " ".join(result.stdout.split()[:2])


def keygen_fingerprint(line: str, tmp_path: Path) -> str:
    path = tmp_path / "probe.pub"
    path.write_text(line + "\n")
    result = ssh_keygen("-lf", str(path))
    assert result.returncode == 0, result.stderr
    return result.stdout.split()[1]


def tree(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file and directory under root with content and mode: "nothing written" is equality."""
    state = {}
    for path in sorted(root.rglob("*")):
        mode = path.stat().st_mode & 0o7777
        state[str(path.relative_to(root))] = (path.read_bytes() if path.is_file() else b"<dir>", mode)
    return state


def private_body_lines(root: Path) -> list[str]:
    """Base64 lines of the private key files that are not also part of a public line.

    An openssh-key-v1 file embeds the public key, so a line of it can legitimately
    appear in a reported public line; every other line would be a leak.
    """
    ssh_dir = root / "etc" / "ssh"
    public = [derived_line(root, path.name[len("ssh_host_"):-len("_key")]) for path in ssh_dir.glob("ssh_host_*_key")]
    lines = []
    for path in ssh_dir.glob("ssh_host_*_key"):
        body = [line for line in path.read_text().splitlines() if line and not line.startswith("-----")]
        lines += [line for line in body if not any(line in public_line for public_line in public)]
    assert lines, "nothing left to look for"
    return lines


def assert_no_private_material(text: str, root: Path) -> None:
    assert "PRIVATE KEY" not in text
    for line in private_body_lines(root):
        assert line not in text


def run_script(*args, timeout: float = 60) -> subprocess.CompletedProcess:
    # -I -S: no site-packages, as on a node.
    return subprocess.run(
        [sys.executable, "-I", "-S", str(NODE_SCRIPT), *map(str, args)],
        capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
    )


def fake_aws(tmp_path: Path, bundle_text: str | None = None, fail: str | None = None) -> Path:
    """A stand-in aws CLI: records its argv one per line, prints the bundle (or fails like the real one)."""
    (tmp_path / "served.json").write_text(bundle_text or "")
    script = tmp_path / "aws"
    body = f"printf '%s\\n' \"$@\" > {tmp_path}/aws-argv\n"
    body += f"echo '{fail}' >&2\nexit 254\n" if fail else f"cat {tmp_path}/served.json\n"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    return script


def recorded_argv(tmp_path: Path) -> list[str] | None:
    path = tmp_path / "aws-argv"
    return path.read_text().splitlines() if path.exists() else None


def certificate_bundle(public_lines: dict[str, str], ca: keys.HostCA) -> keys.HostCertificateBundle:
    now = int(time.time())
    return keys.certify_host_keys(ca, public_lines, ["10.0.0.5"], "test-cluster/i-0123456789abcdef0", now - 60, now + 3600)


def report(root: Path) -> tuple[subprocess.CompletedProcess, dict]:
    result = run_script("--mode", "report-public-keys", "--root", root, "--ssh-keygen-cmd", SSH_KEYGEN)
    return result, json.loads(result.stdout)


# --------------------------------------------------------------------------- report-public-keys


@needs_ssh_keygen
@pytest.mark.parametrize("names", [("ed25519", "ecdsa", "rsa"), ("ed25519", "ecdsa"), ("rsa",)], ids="+".join)
def test_report_public_keys_lists_exactly_the_keys_present_and_writes_nothing(tmp_path, names):
    root = node_root(tmp_path, names)
    before = tree(root)

    result, summary = report(root)

    assert result.returncode == 0, result.stderr
    assert result.stdout.count("\n") == 1 and result.stderr == ""  # one JSON line, nothing else
    assert set(summary) == {"mode", "result", "public_keys", "fingerprints"}
    assert summary["mode"] == "report-public-keys" and summary["result"] == "reported"
    assert summary["public_keys"] == {name: derived_line(root, name) for name in names}
    assert summary["fingerprints"] == {
        keys.KEY_TYPES[name]: keygen_fingerprint(derived_line(root, name), tmp_path) for name in names
    }
    assert_no_private_material(result.stdout, root)
    assert tree(root) == before  # not even a lock or backup directory


@needs_ssh_keygen
def test_report_public_keys_trusts_the_private_key_over_a_stale_pub_file(tmp_path):
    root = node_root(tmp_path, ("ed25519",))
    stale = tmp_path / "stale"
    assert ssh_keygen("-q", "-t", "ed25519", "-N", "", "-f", str(stale)).returncode == 0
    pub = root / "etc" / "ssh" / "ssh_host_ed25519_key.pub"
    pub.write_text((tmp_path / "stale.pub").read_text())  # left over from an older key

    result, summary = report(root)

    assert result.returncode == 0, result.stderr
    assert summary["public_keys"] == {"ed25519": derived_line(root, "ed25519")}
    assert summary["public_keys"]["ed25519"].split()[1] != pub.read_text().split()[1]


def test_report_public_keys_without_any_host_key_fails_with_exit_3(tmp_path):
    root = tmp_path / "root"
    (root / "etc" / "ssh").mkdir(parents=True)
    (root / "etc" / "ssh" / "ssh_host_ed25519_key.pub").write_text("ssh-ed25519 AAAA root@node\n")  # no private key

    result = run_script("--mode", "report-public-keys", "--root", root, "--ssh-keygen-cmd", SSH_KEYGEN)

    assert result.returncode == 3
    summary = json.loads(result.stdout)
    assert summary["result"] == "failed" and "no host keys" in summary["reason"]
    assert "public_keys" not in summary
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("install_host_keys: ")
    assert sorted(p.name for p in root.rglob("*")) == ["etc", "ssh", "ssh_host_ed25519_key.pub"]


@needs_ssh_keygen
def test_unreadable_private_key_fails_the_report_instead_of_reporting_less(tmp_path):
    root = node_root(tmp_path, ("ed25519", "ecdsa"))
    private_key(root, "ecdsa").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\ngarbage\n-----END OPENSSH PRIVATE KEY-----\n")

    result = run_script("--mode", "report-public-keys", "--root", root, "--ssh-keygen-cmd", SSH_KEYGEN)

    assert result.returncode == 3
    summary = json.loads(result.stdout)
    assert summary["result"] == "failed" and "ssh-keygen -y failed" in summary["reason"]
    assert "ssh_host_ecdsa_key" in summary["reason"] and "public_keys" not in summary


# --------------------------------------------------------------------------- the flow on one node


@needs_ssh_keygen
def test_reported_keys_certified_by_the_signer_install_through_the_certificate_parameter(tmp_path):
    """report-public-keys -> certify_host_keys -> parameter -> --certificate-parameter: the whole loop."""
    root = node_root(tmp_path)
    reported, summary = report(root)
    assert reported.returncode == 0, reported.stderr
    ca = keys.generate_ca()
    bundle = certificate_bundle(summary["public_keys"], ca)
    aws = fake_aws(tmp_path, bundle.to_json())

    result = run_script(
        "--mode", "certificate", "--certificate-parameter", PARAMETER, "--region", "us-west-2",
        "--aws-cmd", aws, "--root", root, "--ssh-keygen-cmd", SSH_KEYGEN, "--sshd-cmd", "/bin/true",
        "--reload-cmd", "true",
    )

    assert result.returncode == 0, result.stderr
    assert recorded_argv(tmp_path) == [
        "ssm", "get-parameter", "--name", PARAMETER, "--query", "Parameter.Value", "--output", "text",
        "--region", "us-west-2",
    ]
    installed = json.loads(result.stdout)
    assert installed["result"] == "changed" and installed["mode"] == "certificate"
    assert installed["ca_fingerprint"] == ca.fingerprint()
    assert installed["certified_fingerprints"] == summary["fingerprints"]  # exactly the reported keys
    ssh_dir = root / "etc" / "ssh"
    config = (ssh_dir / "sshd_config").read_text()
    for name in ("ed25519", "ecdsa", "rsa"):
        cert_file = ssh_dir / f"ssh_host_{name}_key-cert.pub"
        assert cert_file.read_text() == bundle.certificates[name] + "\n"
        assert cert_file.stat().st_mode & 0o777 == 0o644
        assert f"HostCertificate {cert_file}" in config
        listing = ssh_keygen("-L", "-f", str(cert_file))  # OpenSSH agrees: host cert, our CA, this key
        assert listing.returncode == 0, listing.stderr
        assert "host certificate" in listing.stdout and ca.fingerprint() in listing.stdout
        assert summary["fingerprints"][keys.KEY_TYPES[name]] in listing.stdout
    assert_no_private_material(result.stdout + result.stderr, root)


def test_parameter_fetch_failure_is_one_line_and_changes_nothing(tmp_path):
    root = tmp_path / "root"
    (root / "etc" / "ssh").mkdir(parents=True)
    (root / "etc" / "ssh" / "sshd_config").write_text("Port 22\n")
    before = tree(root)
    aws = fake_aws(tmp_path, fail="An error occurred (ParameterNotFound) when calling the GetParameter operation")

    result = run_script("--mode", "certificate", "--certificate-parameter", PARAMETER, "--aws-cmd", aws, "--root", root)

    assert result.returncode == 3
    assert recorded_argv(tmp_path)[:4] == ["ssm", "get-parameter", "--name", PARAMETER]
    assert "--region" not in recorded_argv(tmp_path)  # no --region given: the CLI's own
    assert result.stderr.count("\n") == 1 and "ParameterNotFound" in result.stderr
    assert json.loads(result.stdout)["result"] == "failed"
    assert {k: v for k, v in tree(root).items() if not k.startswith("var")} == before


@pytest.mark.parametrize(
    "name",
    [
        "/hpops/test-cluster/host-certificates/i-0abc;reboot",
        "/hpops/test-cluster/host-certificates/$(id)",
        "/hpops/test-cluster/host-certificates/`id`",
        "/hpops/test cluster/host-certificates/i-0abc",
        "/hpops/test-cluster/host-certificates/i-0abc'",
        "/hpops/test-cluster/host-certificates/i-0abc\n",
        "/hpops/test-cluster/host-certificates/",
        "/hpops/test-cluster/host-certificates/i-0abc/extra",
        "/hpops/test-cluster/host-keys/i-0abc",
        "hpops/test-cluster/host-certificates/i-0abc",
        "/other/test-cluster/host-certificates/i-0abc",
        SECRET_ARN,
    ],
)
def test_bad_certificate_parameter_name_is_refused_without_calling_aws(tmp_path, name):
    root = tmp_path / "root"
    (root / "etc" / "ssh").mkdir(parents=True)
    (root / "etc" / "ssh" / "sshd_config").write_text("Port 22\n")
    before = tree(root)
    aws = fake_aws(tmp_path, "{}")

    result = run_script("--mode", "certificate", "--certificate-parameter", name, "--aws-cmd", aws, "--root", root)

    assert result.returncode == 3
    assert recorded_argv(tmp_path) is None  # the CLI never ran
    summary = json.loads(result.stdout)
    assert summary["result"] == "failed" and "/hpops/<cluster>/host-certificates/<instance-id>" in summary["reason"]
    assert tree(root) == before


# --------------------------------------------------------------------------- each mode reads its own source


MISMATCHES = {
    # name: (script arguments, words the reason must contain)
    "keys-from-certificate-parameter": (("--mode", "keys", "--certificate-parameter", PARAMETER), "--mode certificate"),
    "certificate-from-key-secret": (("--mode", "certificate", "--secret-id", SECRET_ARN), "--mode keys"),
    "report-with-secret": (("--mode", "report-public-keys", "--secret-id", SECRET_ARN), "reads no bundle"),
    "report-with-parameter": (("--mode", "report-public-keys", "--certificate-parameter", PARAMETER), "reads no bundle"),
    "report-with-bundle-file": (("--mode", "report-public-keys", "--bundle-file", "BUNDLE"), "reads no bundle"),
    "keys-without-source": (("--mode", "keys"), "needs one of"),
    "default-mode-without-source": ((), "needs one of"),
    "certificate-without-source": (("--mode", "certificate"), "needs one of"),
}


@needs_ssh_keygen
@pytest.mark.parametrize("case", sorted(MISMATCHES))
def test_source_that_does_not_fit_the_mode_is_refused_and_nothing_changes(tmp_path, case):
    arguments, reason = MISMATCHES[case]
    root = node_root(tmp_path, ("ed25519",))
    bundle_text = certificate_bundle({"ed25519": derived_line(root, "ed25519")}, keys.generate_ca()).to_json()
    bundle_file = tmp_path / "bundle.json"
    bundle_file.write_text(bundle_text)  # a valid bundle: only the pairing is wrong
    aws = fake_aws(tmp_path, bundle_text)
    arguments = tuple(str(bundle_file) if arg == "BUNDLE" else arg for arg in arguments)
    before = tree(root)

    result = run_script(*arguments, "--aws-cmd", aws, "--root", root, "--ssh-keygen-cmd", SSH_KEYGEN,
                        "--sshd-cmd", "/bin/true", "--reload-cmd", "true")

    assert result.returncode == 3, (result.stdout, result.stderr)
    summary = json.loads(result.stdout)
    assert summary["result"] == "failed" and reason in summary["reason"]
    assert "public_keys" not in summary
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("install_host_keys: ")
    assert recorded_argv(tmp_path) is None
    assert tree(root) == before


def test_two_sources_at_once_are_a_usage_error(tmp_path):
    result = run_script("--mode", "certificate", "--certificate-parameter", PARAMETER, "--bundle-file", "x",
                        "--root", tmp_path)
    assert result.returncode == 2 and "not allowed with argument" in result.stderr
    assert list(tmp_path.iterdir()) == []
