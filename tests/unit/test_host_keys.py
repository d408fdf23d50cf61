"""Host identity: bundles, fingerprints, CA-signed host certificates, the node script's pure parts.

OpenSSH's own ssh-keygen is the referee wherever a format matters: if our
fingerprint or certificate differs from what OpenSSH computes, these fail.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

import hpops_node_agent.host_keys
from hpops_core.host_identity import keys, verifier
from hpops_core.host_identity.keys import (
    HostIdentityError,
    InvalidCertificateRequest,
    InvalidHostKeyBundle,
    adopt_bundle,
    fingerprint,
    generate_bundle,
    generate_ca,
    sign_host_certificate,
)

SSH_KEYGEN = "/usr/bin/ssh-keygen"
NODE_SCRIPT = Path(hpops_node_agent.host_keys.__file__)

needs_ssh_keygen = pytest.mark.skipif(not os.access(SSH_KEYGEN, os.X_OK), reason="needs /usr/bin/ssh-keygen")


@pytest.fixture(scope="module")
def bundle() -> keys.HostKeyBundle:
    return generate_bundle()


@pytest.fixture(scope="module")
def other_bundle() -> keys.HostKeyBundle:
    return generate_bundle()


def private_body_lines(private_text: str) -> list[str]:
    """The base64 lines of a private key: any of them in output would be a leak."""
    return [line for line in private_text.splitlines() if line and not line.startswith("-----")]


def assert_no_private_material(text: str, *private_texts: str) -> None:
    assert "PRIVATE KEY" not in text
    for private_text in private_texts:
        for line in private_body_lines(private_text):
            assert line not in text


def ssh_keygen(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([SSH_KEYGEN, *args], capture_output=True, text=True, timeout=timeout)


def ssh_keygen_fingerprint(path: Path) -> str:
    result = ssh_keygen("-lf", str(path))
    assert result.returncode == 0, result.stderr
    return result.stdout.split()[1]


# --------------------------------------------------------------------------- bundle


def test_generated_bundle_has_the_three_canonical_key_types(bundle):
    assert [p.name for p in bundle.pairs()] == ["ed25519", "ecdsa", "rsa"]
    assert bundle.ed25519.public_line.startswith("ssh-ed25519 ")
    assert bundle.ecdsa.public_line.startswith("ecdsa-sha2-nistp256 ")
    assert bundle.rsa.public_line.startswith("ssh-rsa ")
    assert all(p.private_openssh.startswith("-----BEGIN OPENSSH PRIVATE KEY-----") for p in bundle.pairs())
    assert set(bundle.public_fingerprints()) == {"ssh-ed25519", "ecdsa-sha2-nistp256", "ssh-rsa"}


def test_bundle_round_trips_through_secret_json(bundle):
    secret = bundle.to_secret_json()
    document = json.loads(secret)
    assert document["format"] == keys.BUNDLE_FORMAT
    assert sorted(document["keys"]) == ["ecdsa", "ed25519", "rsa"]
    restored = keys.HostKeyBundle.from_secret_json(secret)
    assert restored == bundle
    assert restored.public_fingerprints() == bundle.public_fingerprints()


def test_two_generated_bundles_differ(bundle, other_bundle):
    assert set(bundle.public_fingerprints().values()).isdisjoint(other_bundle.public_fingerprints().values())


@needs_ssh_keygen
def test_fingerprints_equal_ssh_keygen_output(bundle, tmp_path):
    for pair in bundle.pairs():
        public_file = tmp_path / f"ssh_host_{pair.name}_key.pub"
        public_file.write_text(pair.public_line + "\n")
        private_file = tmp_path / f"ssh_host_{pair.name}_key"
        private_file.write_text(pair.private_openssh)
        private_file.chmod(0o600)
        expected = bundle.public_fingerprints()[keys.KEY_TYPES[pair.name]]
        assert ssh_keygen_fingerprint(public_file) == expected
        # The private file describes the same key for OpenSSH too.
        derived = ssh_keygen("-y", "-f", str(private_file))
        assert derived.returncode == 0, derived.stderr
        assert fingerprint(derived.stdout) == expected


def test_fingerprint_accepts_line_bytes_and_blob_without_padding(bundle):
    line = bundle.ed25519.public_line
    blob = keys.public_key_blob(line)
    assert fingerprint(line) == fingerprint(line.encode()) == fingerprint(blob) == fingerprint(line + " a comment")
    assert fingerprint(line).startswith("SHA256:") and not fingerprint(line).endswith("=")
    assert len(fingerprint(line)) == len("SHA256:") + 43  # 32 bytes base64 without its one '='


@pytest.mark.parametrize("bad", ["", "ssh-ed25519", "ssh-ed25519 !!!notbase64", b"\xff\xfe", b"\x00\x00"])
def test_fingerprint_rejects_garbage(bad):
    with pytest.raises(keys.InvalidPublicKey):
        fingerprint(bad)


def test_fingerprint_rejects_line_whose_type_lies(bundle):
    blob_part = bundle.ed25519.public_line.split()[1]
    with pytest.raises(keys.InvalidPublicKey):
        fingerprint(f"ssh-rsa {blob_part}")


def test_repr_and_str_never_contain_private_material(bundle):
    ca = generate_ca()
    shown = [bundle, bundle.rsa, bundle.ed25519, ca, [bundle]]
    rendered = " ".join([*map(repr, shown), *map(str, shown), f"{bundle}"])
    assert_no_private_material(rendered, *(p.private_openssh for p in bundle.pairs()), ca.private_openssh)
    assert bundle.public_fingerprints()["ssh-ed25519"] in repr(bundle)  # useful, public, still there


# --------------------------------------------------------------------------- adopt


def ssh_keygen_host_keys(directory: Path, *extra_rsa_args: str) -> dict[str, bytes]:
    for key_type, extra in (("ed25519", ()), ("ecdsa", ("-b", "256")), ("rsa", ("-b", "3072", *extra_rsa_args))):
        path = directory / f"ssh_host_{key_type}_key"
        result = ssh_keygen("-q", "-t", key_type, *extra, "-N", "", "-C", "root@node", "-f", str(path))
        assert result.returncode == 0, result.stderr
    return {str(path): path.read_bytes() for path in directory.iterdir()}


@needs_ssh_keygen
def test_adopt_bundle_from_existing_ssh_keygen_files(tmp_path):
    files = ssh_keygen_host_keys(tmp_path)
    assert len(files) == 6  # private and .pub files; .pub are ignored
    adopted = adopt_bundle(files)
    for pair in adopted.pairs():
        private_path = tmp_path / f"ssh_host_{pair.name}_key"
        assert pair.private_openssh.encode() == private_path.read_bytes()  # kept byte for byte
        assert adopted.public_fingerprints()[keys.KEY_TYPES[pair.name]] == ssh_keygen_fingerprint(
            Path(str(private_path) + ".pub")
        )
    assert keys.HostKeyBundle.from_secret_json(adopted.to_secret_json()) == adopted


@needs_ssh_keygen
def test_adopt_converts_pem_rsa_key_to_openssh_format(tmp_path):
    files = ssh_keygen_host_keys(tmp_path, "-m", "PEM")
    assert (tmp_path / "ssh_host_rsa_key").read_bytes().startswith(b"-----BEGIN RSA PRIVATE KEY-----")
    adopted = adopt_bundle(files)
    assert adopted.rsa.private_openssh.startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    assert adopted.public_fingerprints()["ssh-rsa"] == ssh_keygen_fingerprint(tmp_path / "ssh_host_rsa_key.pub")


def bundle_files(bundle: keys.HostKeyBundle) -> dict[str, bytes]:
    return {f"/etc/ssh/ssh_host_{p.name}_key": p.private_openssh.encode() for p in bundle.pairs()}


def test_adopt_bundle_from_generated_private_files(bundle):
    assert adopt_bundle(bundle_files(bundle)) == bundle


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda files, other: files.pop("/etc/ssh/ssh_host_rsa_key"), "missing host key files: ssh_host_rsa_key"),
        (lambda files, other: files.update({"/etc/ssh/ssh_host_dsa_key": b"x"}), "unexpected host key file"),
        (lambda files, other: files.update({"/etc/ssh/ssh_host_ed25519_key": b"garbage"}), "does not parse"),
        (
            lambda files, other: files.update({"/etc/ssh/ssh_host_ed25519_key": other.ecdsa.private_openssh.encode()}),
            "not a ssh-ed25519 key",
        ),
        (
            lambda files, other: files.update(
                {"/etc/ssh/ssh_host_ed25519_key": other.ed25519.private_openssh.encode()[:-80]}
            ),
            "does not parse",
        ),
    ],
    ids=["missing", "unexpected-name", "garbage", "wrong-type", "truncated"],
)
def test_adopt_rejects_bad_files_with_named_error(bundle, other_bundle, mutate, message):
    files = bundle_files(bundle)
    mutate(files, other_bundle)
    with pytest.raises(InvalidHostKeyBundle, match=message) as caught:
        adopt_bundle(files)
    assert isinstance(caught.value, HostIdentityError)
    all_pairs = (*bundle.pairs(), *other_bundle.pairs())
    assert_no_private_material(str(caught.value), *(p.private_openssh for p in all_pairs))


@needs_ssh_keygen
def test_adopt_rejects_passphrase_protected_key(tmp_path, bundle):
    path = tmp_path / "ssh_host_ed25519_key"
    assert ssh_keygen("-q", "-t", "ed25519", "-N", "secret-pass", "-f", str(path)).returncode == 0
    files = bundle_files(bundle) | {str(path): path.read_bytes()}
    with pytest.raises(InvalidHostKeyBundle, match="passphrase-protected"):
        adopt_bundle(files)


# --------------------------------------------------------------------------- invalid secret JSON


def swap_public_lines(bundle, other) -> str:
    document = json.loads(bundle.to_secret_json())
    document["keys"]["ed25519"]["public"] = other.ed25519.public_line
    return json.dumps(document)


@pytest.mark.parametrize(
    "make_secret, message",
    [
        (lambda b, o: b.to_secret_json()[:-40], "not valid JSON"),
        (lambda b, o: "[]", "must be an object"),
        (lambda b, o: b.to_secret_json().replace(keys.BUNDLE_FORMAT, "v0"), "format"),
        (lambda b, o: json.dumps({"format": keys.BUNDLE_FORMAT, "keys": {}}), "exactly the keys"),
        (swap_public_lines, "does not belong to the private key"),
        (lambda b, o: b.to_secret_json().replace("AAAA", "AAAB", 1), "does not parse"),
    ],
    ids=["truncated-json", "not-object", "wrong-format", "no-keys", "mismatched-public", "corrupt-private"],
)
def test_invalid_secret_raises_named_error_without_leaking(bundle, other_bundle, make_secret, message):
    with pytest.raises(InvalidHostKeyBundle, match=message) as caught:
        keys.HostKeyBundle.from_secret_json(make_secret(bundle, other_bundle))
    assert_no_private_material(str(caught.value), *(p.private_openssh for p in bundle.pairs()))


def test_ca_round_trips_and_rejects_wrong_format():
    ca = generate_ca()
    assert keys.HostCA.from_secret_json(ca.to_secret_json()) == ca
    assert ca.known_hosts_line("*.login.example") == f"@cert-authority *.login.example {ca.public_line}"
    with pytest.raises(InvalidHostKeyBundle):
        keys.HostCA.from_secret_json(json.dumps({"format": "other"}))


# --------------------------------------------------------------------------- host certificates


@needs_ssh_keygen
@pytest.mark.parametrize("name", ["ed25519", "ecdsa", "rsa"])
def test_ca_signed_host_certificate_verifies_with_ssh_keygen(bundle, tmp_path, name):
    ca = generate_ca()
    valid_after = datetime(2030, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    pair = getattr(bundle, name)
    cert_line = sign_host_certificate(
        ca, pair.public_line, ["login.example.internal", "10.0.0.5"], "hyperpod:cluster-a/node-1",
        valid_after, valid_after + timedelta(days=30),
    )
    assert cert_line.startswith(f"{keys.KEY_TYPES[name]}-cert-v01@openssh.com ")
    cert_file = tmp_path / f"ssh_host_{name}_key-cert.pub"
    cert_file.write_text(cert_line + "\n")

    listing = ssh_keygen("-L", "-f", str(cert_file))
    assert listing.returncode == 0, listing.stderr
    text = listing.stdout
    assert "host certificate" in text
    assert f"Signing CA: ED25519 {ca.fingerprint()}" in text
    assert bundle.public_fingerprints()[keys.KEY_TYPES[name]] in text  # certifies this host key
    assert 'Key ID: "hyperpod:cluster-a/node-1"' in text
    assert "login.example.internal" in text and "10.0.0.5" in text
    assert "from 2030-01-02T" in text and " to 2030-02-01T" in text  # local time rendering; date is enough


@needs_ssh_keygen
def test_tampered_certificate_is_rejected_by_ssh_keygen(bundle, tmp_path):
    """Proves the previous test's ssh-keygen -L really checks the CA signature."""
    import base64

    ca = generate_ca()
    now = datetime.now(timezone.utc)
    cert_type, cert_b64 = sign_host_certificate(
        ca, bundle.ed25519.public_line, ["host"], "id", now, now + timedelta(hours=1)
    ).split()
    raw = bytearray(base64.b64decode(cert_b64))
    raw[-5] ^= 0x01  # inside the signature
    cert_file = tmp_path / "tampered-cert.pub"
    cert_file.write_text(f"{cert_type} {base64.b64encode(bytes(raw)).decode()}\n")
    assert ssh_keygen("-L", "-f", str(cert_file)).returncode != 0


@pytest.mark.parametrize(
    "principals, after, before, message",
    [
        ([], 0, 100, "principals"),
        (["two words"], 0, 100, "principals"),
        (["host"], 100, 100, "later"),
        (["host"], datetime(2030, 1, 1), 10**10, "timezone-aware"),
    ],
)
def test_sign_host_certificate_refuses_unsafe_requests(bundle, principals, after, before, message):
    with pytest.raises(InvalidCertificateRequest, match=message):
        sign_host_certificate(generate_ca(), bundle.ed25519.public_line, principals, "id", after, before)


def test_certify_host_keys_builds_node_certificate_bundle(bundle):
    ca = generate_ca()
    now = int(time.time())
    lines = {p.name: p.public_line for p in bundle.pairs()}
    cert_bundle = keys.certify_host_keys(ca, lines, ["login"], "node-1", now, now + 3600)
    document = json.loads(cert_bundle.to_json())
    assert document["format"] == keys.CERTIFICATE_BUNDLE_FORMAT
    assert document["ca_public"] == ca.public_line
    assert sorted(document["certificates"]) == ["ecdsa", "ed25519", "rsa"]
    assert document["certificates"]["rsa"].startswith("ssh-rsa-cert-v01@openssh.com ")


# --------------------------------------------------------------------------- verifier (no sshd needed)


def test_compare_fingerprints_outcomes():
    expected = {"ssh-ed25519": "SHA256:a", "ssh-rsa": "SHA256:b"}
    assert verifier.compare_fingerprints(expected, dict(expected)) == (True, "all 2 host keys match")
    ok, reason = verifier.compare_fingerprints(expected, {"ssh-ed25519": "SHA256:a", "ssh-rsa": "SHA256:x"})
    assert not ok and "ssh-rsa: presented SHA256:x, expected SHA256:b" in reason
    ok, reason = verifier.compare_fingerprints(expected, {"ssh-ed25519": "SHA256:a"})
    assert not ok and "ssh-rsa: not presented" in reason
    ok, reason = verifier.compare_fingerprints(expected, {**expected, "ecdsa-sha2-nistp256": "SHA256:c"})
    assert not ok and "presented but not expected" in reason
    assert verifier.compare_fingerprints({}, {})[0] is False


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_verifier_raises_host_unreachable_on_refused_connection():
    with pytest.raises(verifier.HostUnreachable):
        verifier.read_presented_host_keys("127.0.0.1", closed_port(), timeout=2)


def test_verifier_does_not_hang_on_a_silent_server():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        started = time.monotonic()
        with pytest.raises(verifier.HostUnreachable):
            verifier.read_presented_host_keys("127.0.0.1", server.getsockname()[1], timeout=1.0)
        assert time.monotonic() - started < 5


# --------------------------------------------------------------------------- node script, pure parts


@pytest.fixture(scope="module")
def node_script():
    spec = importlib.util.spec_from_file_location("install_host_keys", NODE_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_node_script_imports_only_the_standard_library():
    tree = ast.parse(NODE_SCRIPT.read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert imported - {"__future__"} <= set(sys.stdlib_module_names)


def test_node_script_accepts_what_keys_produces_and_agrees_on_fingerprints(node_script, bundle):
    entries = node_script.parse_key_bundle(bundle.to_secret_json())
    script_fingerprints = {node_script.KEY_TYPES[n]: node_script.fingerprint(e[2]) for n, e in entries.items()}
    assert script_fingerprints == bundle.public_fingerprints()


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda b, o: b.to_secret_json()[:-40],
        lambda b, o: swap_public_lines(b, o),
        lambda b, o: b.to_secret_json().replace("-----END OPENSSH PRIVATE KEY-----", "", 1),
        lambda b, o: b.to_secret_json().replace("AAAA", "AAA", 1),
    ],
    ids=["truncated-json", "mismatched-public", "no-end-marker", "broken-base64"],
)
def test_node_script_rejects_corrupt_bundles_before_touching_disk(node_script, bundle, other_bundle, corrupt):
    with pytest.raises(node_script.BundleRejected) as caught:
        node_script.parse_key_bundle(corrupt(bundle, other_bundle))
    assert_no_private_material(str(caught.value), *(p.private_openssh for p in bundle.pairs()))


def test_sshd_config_gets_host_certificate_lines_once_and_before_match(node_script):
    config = "Port 22\nMatch User sftp\n  ForceCommand internal-sftp\n"
    paths = ["/etc/ssh/ssh_host_ed25519_key-cert.pub", "/etc/ssh/ssh_host_rsa_key-cert.pub"]
    updated = node_script.config_with_host_certificates(config, paths)
    lines = updated.splitlines()
    assert lines.index("HostCertificate /etc/ssh/ssh_host_rsa_key-cert.pub") < lines.index("Match User sftp")
    assert node_script.config_with_host_certificates(updated, paths) == updated  # idempotent


def test_node_script_fetches_bundle_through_aws_cli_without_printing_it(bundle, tmp_path):
    """--secret-id path with a stand-in aws CLI: right arguments, secret never echoed."""
    (tmp_path / "bundle.json").write_text(bundle.to_secret_json())
    fake_aws = tmp_path / "aws"
    fake_aws.write_text(
        "#!/bin/sh\n"
        f'echo "$@" > {tmp_path}/aws-args\n'
        f"cat {tmp_path}/bundle.json\n"
    )
    fake_aws.chmod(0o755)
    root = tmp_path / "root"
    (root / "etc" / "ssh").mkdir(parents=True)
    (root / "etc" / "ssh" / "sshd_config").write_text("Port 22\n")
    result = subprocess.run(
        [sys.executable, "-I", "-S", str(NODE_SCRIPT), "--secret-id", "hpops/host-keys", "--region", "us-west-2",
         "--aws-cmd", str(fake_aws), "--root", str(root), "--sshd-cmd", "/bin/true", "--reload-cmd", "true"],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "aws-args").read_text().split() == [
        "secretsmanager", "get-secret-value", "--secret-id", "hpops/host-keys",
        "--query", "SecretString", "--output", "text", "--region", "us-west-2",
    ]
    summary = json.loads(result.stdout)
    assert summary["result"] == "changed" and summary["fingerprints"] == bundle.public_fingerprints()
    assert_no_private_material(result.stdout + result.stderr, *(p.private_openssh for p in bundle.pairs()))
    installed = root / "etc" / "ssh" / "ssh_host_ed25519_key"
    assert installed.read_text() == bundle.ed25519.private_openssh
    assert installed.stat().st_mode & 0o777 == 0o600
    assert (root / "etc" / "ssh" / "ssh_host_ed25519_key.pub").stat().st_mode & 0o777 == 0o644


def test_node_script_reports_aws_failure_in_one_line(tmp_path):
    fake_aws = tmp_path / "aws"
    fake_aws.write_text("#!/bin/sh\necho 'An error occurred (AccessDeniedException)' >&2\nexit 254\n")
    fake_aws.chmod(0o755)
    result = subprocess.run(
        [sys.executable, "-I", "-S", str(NODE_SCRIPT), "--secret-id", "x", "--aws-cmd", str(fake_aws),
         "--root", str(tmp_path)],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 3
    assert result.stderr.count("\n") == 1 and "AccessDeniedException" in result.stderr
    assert not (tmp_path / "etc").exists()
