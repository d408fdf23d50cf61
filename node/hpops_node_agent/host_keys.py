#!/usr/bin/env python3
"""Install the canonical SSH host identity on a HyperPod login node.

Runs on the node as root. The node agent (hpops_node_agent.agent) imports it as a
library and calls plan/install_bundle/report_public_keys; it also still works as a
command-line program for operators and tests. Python 3.8+ standard library only.

  keys mode (default)   the bundle holds the shared ed25519/ecdsa/rsa host keys;
                        they replace /etc/ssh/ssh_host_<type>_key{,.pub}.
  certificate mode      the node keeps its own keys; the bundle holds host
                        certificates for them plus the CA public line; they go to
                        /etc/ssh/ssh_host_<type>_key-cert.pub and sshd_config gets
                        matching HostCertificate lines.
  report-public-keys    changes nothing: prints the node's own public host keys,
                        derived from the private key files, so a signer can
                        certify exactly those keys (the first half of certificate mode).

Where the bundle comes from on the command line (exactly one, for keys and
certificate mode; none for report-public-keys; the agent passes the text itself):

  --secret-id ARN               keys mode: Secrets Manager, through the aws CLI
  --certificate-parameter NAME  certificate mode: the SSM parameter
                                /hpops/<cluster>/host-certificates/<instance-id>
                                (public data), through the aws CLI
  --bundle-file PATH            either mode: a file, or '-' for stdin

The aws CLI runs with the node's own role. Key material is never printed, never
put on a command line, and never included in an error message.

Every change is a transaction. New keys must first pass a signing self-test
in a private staging directory (OpenSSH before 9.8 re-reads host key files for
every new connection, so a key is live the moment it lands in /etc/ssh). Then
current files are backed up, new files are written atomically, ``sshd -t`` must
pass and the reload must succeed; otherwise the previous files are restored.
sshd is reloaded with SIGHUP semantics, so established sessions survive.

Output: one JSON line on stdout (public information only). On failure also one
line on stderr, and a non-zero exit code:
  1 unexpected local error (e.g. permissions) before anything was written
  2 command line not understood (argparse usage error)
  3 bundle unavailable or rejected, a source that does not fit the mode, or the
    node lacks what it needs (nothing was changed)
  4 sshd -t rejected the written files, or writing failed (rolled back)
  5 reload failed (rolled back)
  6 rollback failed (node needs attention; see the backup directory)
  7 another run holds the lock
"""

from __future__ import annotations

import argparse
import base64
import binascii
import datetime
import errno
import fcntl
import functools
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time

MODES = ("keys", "certificate", "report-public-keys")
BUNDLE_FORMAT = "hpops.host-keys.v1"
CERTIFICATE_BUNDLE_FORMAT = "hpops.host-certificates.v1"
# Short name (as in ssh_host_<name>_key) -> SSH public key type.
KEY_TYPES = {"ed25519": "ssh-ed25519", "ecdsa": "ecdsa-sha2-nistp256", "rsa": "ssh-rsa"}
CERT_TYPES = {name: key_type + "-cert-v01@openssh.com" for name, key_type in KEY_TYPES.items()}
# Number of public-key fields after the type in a key blob (and after the nonce in a cert).
KEY_FIELD_COUNT = {"ssh-ed25519": 1, "ecdsa-sha2-nistp256": 2, "ssh-rsa": 2}
SSH_CERT_TYPE_HOST = 2

PRIVATE_BEGIN = "-----BEGIN OPENSSH PRIVATE KEY-----"
PRIVATE_END = "-----END OPENSSH PRIVATE KEY-----"
OPENSSH_KEY_MAGIC = b"openssh-key-v1\x00"
MAX_BUNDLE_BYTES = 256 * 1024
# The only parameters a node may read its certificates from (the stack's naming scheme).
CERTIFICATE_PARAMETER_PATTERN = re.compile(r"^/hpops/[A-Za-z0-9_.-]+/host-certificates/[A-Za-z0-9_.-]+$")
SELFTEST_NAMESPACE = "hpops-host-key-selftest"
BACKUPS_KEPT = 3
LOCK_WAIT_SECONDS = 60
COMMAND_TIMEOUT_SECONDS = 60

EXIT_BUNDLE_REJECTED = 3
EXIT_VALIDATION_FAILED = 4
EXIT_RELOAD_FAILED = 5
EXIT_ROLLBACK_FAILED = 6
EXIT_BUSY = 7


class InstallError(Exception):
    """A failure with a one-line, secret-free reason and an exit code."""

    exit_code = 1
    rolled_back = False


class BundleRejected(InstallError):
    exit_code = EXIT_BUNDLE_REJECTED


class PreconditionFailed(InstallError):
    exit_code = EXIT_BUNDLE_REJECTED


class ValidationFailed(InstallError):
    exit_code = EXIT_VALIDATION_FAILED
    rolled_back = True


class ReloadFailed(InstallError):
    exit_code = EXIT_RELOAD_FAILED
    rolled_back = True


class RollbackFailed(InstallError):
    exit_code = EXIT_ROLLBACK_FAILED


class LockBusy(InstallError):
    exit_code = EXIT_BUSY


# --------------------------------------------------------------------------- SSH wire format


class WireReader:
    """Reads SSH wire-format fields; raises ValueError when data runs out."""

    def __init__(self, data):
        self.data = data
        self.pos = 0

    def take(self, count):
        if count < 0 or self.pos + count > len(self.data):
            raise ValueError("truncated")
        chunk = self.data[self.pos : self.pos + count]
        self.pos += count
        return chunk

    def uint32(self):
        return struct.unpack(">I", self.take(4))[0]

    def uint64(self):
        return struct.unpack(">Q", self.take(8))[0]

    def string(self):
        return self.take(self.uint32())

    def at_end(self):
        return self.pos == len(self.data)


def fingerprint(blob):
    """SHA256 fingerprint as ssh-keygen -l prints it."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode("ascii").rstrip("=")


def parse_public_line(line, expected_type, what):
    """Return the key blob of '<type> <base64> [comment]' after checking its type."""
    parts = line.split()
    if len(parts) < 2 or parts[0] != expected_type:
        raise BundleRejected("{}: expected a {} line".format(what, expected_type))
    try:
        blob = base64.b64decode(parts[1], validate=True)
        declared = WireReader(blob).string().decode("ascii")
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise BundleRejected("{}: public line is not valid".format(what)) from None
    if declared != expected_type:
        raise BundleRejected("{}: public line type does not match its blob".format(what))
    return blob


def key_fields(blob):
    """The key's number fields (everything after the type) of a plain public key blob."""
    reader = WireReader(blob)
    key_type = reader.string().decode("ascii")
    fields = [reader.string() for _ in range(KEY_FIELD_COUNT[key_type])]
    return key_type, fields


# --------------------------------------------------------------------------- bundles


def load_json_object(text, what):
    try:
        document = json.loads(text)
    except ValueError as exc:
        # The message is position-only ("line 1 column 5"); the document is never echoed.
        raise BundleRejected("{} is not valid JSON ({})".format(what, type(exc).__name__)) from None
    if not isinstance(document, dict):
        raise BundleRejected("{} must be a JSON object".format(what))
    return document


def parse_key_bundle(text):
    """Validate a keys-mode bundle; returns {name: (private_text, public_line, public_blob)}."""
    document = load_json_object(text, "bundle")
    if document.get("format") != BUNDLE_FORMAT:
        raise BundleRejected("bundle format must be {}".format(BUNDLE_FORMAT))
    keys = document.get("keys")
    if not isinstance(keys, dict) or sorted(keys) != sorted(KEY_TYPES):
        raise BundleRejected("bundle must hold exactly the keys {}".format(", ".join(sorted(KEY_TYPES))))
    entries = {}
    for name, key_type in KEY_TYPES.items():
        entry = keys[name]
        if not isinstance(entry, dict):
            raise BundleRejected("{}: entry must be an object".format(name))
        private_text, public_line = entry.get("private"), entry.get("public")
        if not isinstance(private_text, str) or not isinstance(public_line, str):
            raise BundleRejected("{}: 'private' and 'public' must be strings".format(name))
        public_blob = parse_public_line(public_line, key_type, name)
        check_private_key_text(private_text, public_blob, key_type, name)
        entries[name] = (private_text, public_line.strip(), public_blob)
    return entries


def check_private_key_text(text, public_blob, key_type, name):
    """Structural check of an unencrypted openssh-key-v1 file that must match public_blob.

    Cheap and dependency-free: rejects truncated, encrypted or mismatched keys.
    Whether the key can really sign for that public key is the ssh-keygen
    self-test's job (self_test_bundle_keys).
    """
    lines = text.strip().splitlines()
    if len(lines) < 3 or lines[0].strip() != PRIVATE_BEGIN or lines[-1].strip() != PRIVATE_END:
        raise BundleRejected("{}: private key is not in OpenSSH format".format(name))
    try:
        data = base64.b64decode("".join(line.strip() for line in lines[1:-1]), validate=True)
        if not data.startswith(OPENSSH_KEY_MAGIC):
            raise ValueError("magic")
        reader = WireReader(data[len(OPENSSH_KEY_MAGIC) :])
        cipher, kdf, _kdf_options, key_count = reader.string(), reader.string(), reader.string(), reader.uint32()
        embedded_public = reader.string()
        private_section = WireReader(reader.string())
        check_one, check_two = private_section.uint32(), private_section.uint32()
        private_type = private_section.string()
    except (binascii.Error, ValueError):
        raise BundleRejected("{}: private key is corrupt".format(name)) from None
    if cipher != b"none" or kdf != b"none":
        raise BundleRejected("{}: private key is passphrase-protected".format(name))
    if key_count != 1 or check_one != check_two or private_type != key_type.encode("ascii"):
        raise BundleRejected("{}: private key is corrupt".format(name))
    if embedded_public != public_blob:
        raise BundleRejected("{}: private key does not belong to the public line".format(name))


def parse_certificate_bundle(text):
    """Validate a certificate-mode bundle; returns (ca_blob, {name: (cert_line, cert_blob)})."""
    document = load_json_object(text, "bundle")
    if document.get("format") != CERTIFICATE_BUNDLE_FORMAT:
        raise BundleRejected("bundle format must be {}".format(CERTIFICATE_BUNDLE_FORMAT))
    ca_line = document.get("ca_public")
    if not isinstance(ca_line, str) or not ca_line.split():
        raise BundleRejected("bundle needs a ca_public line")
    ca_blob = parse_public_line(ca_line, ca_line.split()[0], "ca_public")
    certificates = document.get("certificates")
    if not isinstance(certificates, dict) or not certificates or not set(certificates) <= set(KEY_TYPES):
        raise BundleRejected("certificates must map some of {} to lines".format(", ".join(sorted(KEY_TYPES))))
    parsed = {}
    for name, line in sorted(certificates.items()):
        if not isinstance(line, str):
            raise BundleRejected("{}: certificate must be a string".format(name))
        parsed[name] = (line.strip(), parse_public_line(line, CERT_TYPES[name], name + " certificate"))
    return ca_blob, parsed


def read_host_certificate(cert_blob, name):
    """The fields of an OpenSSH certificate blob that the node can check without crypto."""
    try:
        reader = WireReader(cert_blob)
        reader.string()  # certificate type
        reader.string()  # nonce
        fields = [reader.string() for _ in range(KEY_FIELD_COUNT[KEY_TYPES[name]])]
        reader.uint64()  # serial
        cert_type = reader.uint32()
        reader.string()  # key id
        principals = reader.string()
        valid_after, valid_before = reader.uint64(), reader.uint64()
        reader.string(), reader.string(), reader.string()  # critical options, extensions, reserved
        signature_key = reader.string()
        reader.string()  # signature
        if not reader.at_end():
            raise ValueError("trailing data")
    except ValueError:
        raise BundleRejected("{}: certificate is corrupt".format(name)) from None
    return {
        "key_fields": fields,
        "cert_type": cert_type,
        "has_principals": bool(principals),
        "valid_after": valid_after,
        "valid_before": valid_before,
        "signature_key": signature_key,
    }


# --------------------------------------------------------------------------- the node's files


class NodeLayout:
    """Where things live under --root (the real paths sshd sees when root is /)."""

    def __init__(self, root, sshd_config=None):
        self.root = os.path.abspath(root)
        self.ssh_dir = os.path.join(self.root, "etc", "ssh")
        self.sshd_config = sshd_config or os.path.join(self.ssh_dir, "sshd_config")
        self.backup_base = os.path.join(self.root, "var", "backups", "hpops-host-keys")

    def private_key(self, name):
        return os.path.join(self.ssh_dir, "ssh_host_{}_key".format(name))

    def public_key(self, name):
        return self.private_key(name) + ".pub"

    def certificate(self, name):
        return self.private_key(name) + "-cert.pub"


class PlannedFile:
    """Desired content of one file; ``same`` decides whether what is on disk already matches."""

    def __init__(self, path, content, mode, same=None):
        self.path = path
        self.content = content
        self.mode = mode
        self._same = same or (lambda current: current == content)

    def is_current(self):
        try:
            with open(self.path, "rb") as handle:
                current = handle.read()
            mode = os.stat(self.path).st_mode & 0o7777
        except FileNotFoundError:
            return False
        return mode == self.mode and self._same(current)


def same_public_key(blob):
    """A .pub/-cert.pub file matches if type and blob match; comments do not matter."""

    def compare(current):
        parts = current.decode("ascii", "replace").split()
        try:
            return len(parts) >= 2 and base64.b64decode(parts[1], validate=True) == blob
        except binascii.Error:
            return False

    return compare


def private_file_content(private_text):
    return (private_text if private_text.endswith("\n") else private_text + "\n").encode("ascii")


def plan_key_files(entries, layout):
    planned = []
    for name, (private_text, public_line, public_blob) in entries.items():
        planned.append(PlannedFile(layout.private_key(name), private_file_content(private_text), 0o600))
        public_content = (public_line + "\n").encode("ascii")
        planned.append(PlannedFile(layout.public_key(name), public_content, 0o644, same_public_key(public_blob)))
    return planned


def plan_certificate_files(ca_blob, certificates, layout, keygen_cmd):
    """Certificate files plus the sshd_config lines that make sshd present them.

    Returns (planned files, {key type: fingerprint of the certified node key}).
    """
    now = int(time.time())
    planned, certified = [], {}
    for name, (cert_line, cert_blob) in certificates.items():
        certificate = read_host_certificate(cert_blob, name)
        node_blob = check_certificate_for_node(name, certificate, ca_blob, layout, keygen_cmd, now)
        certified[KEY_TYPES[name]] = fingerprint(node_blob)
        content = (cert_line + "\n").encode("ascii")
        planned.append(PlannedFile(layout.certificate(name), content, 0o644, same_public_key(cert_blob)))
    try:
        with open(layout.sshd_config, "rb") as handle:
            config = handle.read().decode("utf-8")
        config_mode = os.stat(layout.sshd_config).st_mode & 0o7777
    except (OSError, UnicodeDecodeError):
        raise PreconditionFailed("cannot read {}".format(layout.sshd_config)) from None
    wanted = [layout.certificate(name) for name in sorted(certificates)]
    planned.append(
        PlannedFile(layout.sshd_config, config_with_host_certificates(config, wanted).encode("utf-8"), config_mode)
    )
    return planned, certified


def check_certificate_for_node(name, cert, ca_blob, layout, keygen_cmd, now):
    if cert["cert_type"] != SSH_CERT_TYPE_HOST:
        raise BundleRejected("{}: certificate is not a host certificate".format(name))
    if not cert["has_principals"]:
        # OpenSSH would accept a principal-less host certificate for any host name.
        raise BundleRejected("{}: certificate has no principals".format(name))
    if cert["signature_key"] != ca_blob:
        raise BundleRejected("{}: certificate is not signed by the bundle's CA".format(name))
    if not cert["valid_after"] <= now < cert["valid_before"]:
        raise BundleRejected("{}: certificate is not valid now".format(name))
    node_blob = derive_public_blob(keygen_cmd, layout.private_key(name), name)
    if cert["key_fields"] != key_fields(node_blob)[1]:
        raise BundleRejected("{}: certificate is for a different host key than this node's".format(name))
    return node_blob


def derive_public_blob(keygen_cmd, private_path, name):
    """The public key sshd will actually use: derived from the private key file itself."""
    if not os.path.exists(private_path):
        raise PreconditionFailed("{}: this node has no {}".format(name, private_path))
    result = run_command([keygen_cmd, "-y", "-f", private_path], "ssh-keygen -y", PreconditionFailed)
    return parse_public_line(result.stdout.decode("ascii", "replace"), KEY_TYPES[name], name + " node key")


def config_with_host_certificates(config, certificate_paths):
    """sshd_config text with a HostCertificate line for each path (idempotent)."""
    present = set()
    for line in config.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0].lower() == "hostcertificate":
            present.add(os.path.normpath(words[1]))
    missing = [path for path in certificate_paths if os.path.normpath(path) not in present]
    if not missing:
        return config
    block = "# hpops: host certificates (certificate mode)\n"
    block += "".join("HostCertificate {}\n".format(path) for path in missing)
    lines = config.splitlines(True)
    # Global keywords must come before the first Match block, or sshd -t rejects them.
    for index, line in enumerate(lines):
        words = line.split()
        if words and words[0].lower() == "match":
            return "".join(lines[:index]) + block + "".join(lines[index:])
    if config and not config.endswith("\n"):
        config += "\n"
    return config + block


# --------------------------------------------------------------------------- the transaction


def snapshot(paths):
    """Current bytes, mode and ownership of each path (None if absent)."""
    state = {}
    for path in paths:
        try:
            with open(path, "rb") as handle:
                content = handle.read()
            info = os.stat(path)
            state[path] = (content, info.st_mode & 0o7777, info.st_uid, info.st_gid)
        except FileNotFoundError:
            state[path] = None
    return state


def save_backup(state, layout):
    """Copy the files about to change into a root-only, timestamped backup directory."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    directory = os.path.join(layout.backup_base, "{}-{}".format(stamp, os.getpid()))
    os.makedirs(directory, mode=0o700)
    for path, saved in state.items():
        if saved is not None:
            atomic_write(os.path.join(directory, os.path.basename(path)), saved[0], 0o600)
    prune_backups(layout.backup_base)
    return directory


def prune_backups(base):
    # Old backups hold old private keys; keep only a few.
    backups = sorted(entry for entry in os.listdir(base) if not entry.startswith("."))
    for entry in backups[:-BACKUPS_KEPT]:
        shutil.rmtree(os.path.join(base, entry), ignore_errors=True)


def atomic_write(path, content, mode, owner=None):
    """Write via a temp file in the same directory and rename; readers see old or new, never half."""
    directory = os.path.dirname(path)
    descriptor, temp_path = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", dir=directory)
    try:
        os.fchmod(descriptor, mode)  # mkstemp starts at 0600, so secrets are never world-readable
        if owner is not None:
            os.fchown(descriptor, owner[0], owner[1])
        with os.fdopen(descriptor, "wb") as handle:
            descriptor = None
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp_path, path)
    except BaseException:
        if descriptor is not None:
            os.close(descriptor)
        if os.path.exists(temp_path):
            os.unlink(temp_path)
        raise
    fsync_directory(directory)


def fsync_directory(directory):
    handle = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def root_owner():
    return (0, 0) if os.geteuid() == 0 else None


def write_planned(changes):
    for planned in changes:
        atomic_write(planned.path, planned.content, planned.mode, root_owner())


def restore(state):
    for path, saved in state.items():
        if saved is None:
            if os.path.exists(path):
                os.unlink(path)
        else:
            owner = (saved[2], saved[3]) if os.geteuid() == 0 else None
            atomic_write(path, saved[0], saved[1], owner)


# --------------------------------------------------------------------------- checks and reload


def run_command(argv, label, error, input_bytes=None, shell=False):
    """Run a command with a timeout; never echo its output except a short error tail."""
    try:
        result = subprocess.run(
            argv,
            input=input_bytes,
            stdin=None if input_bytes is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            timeout=COMMAND_TIMEOUT_SECONDS,
            shell=shell,
        )
    except FileNotFoundError:
        raise error("{}: command not found".format(label)) from None
    except subprocess.TimeoutExpired:
        raise error("{}: timed out after {}s".format(label, COMMAND_TIMEOUT_SECONDS)) from None
    if result.returncode != 0:
        raise error("{} failed (exit {}): {}".format(label, result.returncode, last_line(result.stderr)))
    return result


def last_line(output):
    lines = [line.strip() for line in output.decode("utf-8", "replace").splitlines() if line.strip()]
    return (lines[-1] if lines else "no output")[:300]


def self_test_bundle_keys(keygen_cmd, entries, layout):
    """Prove OpenSSH can load and sign with every new key before it replaces anything."""
    os.makedirs(layout.backup_base, mode=0o700, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".selftest-", dir=layout.backup_base)  # 0700, root only
    try:
        for name, (private_text, _, public_blob) in entries.items():
            path = os.path.join(staging, "ssh_host_{}_key".format(name))
            atomic_write(path, private_file_content(private_text), 0o600)
            self_test_private_key(keygen_cmd, path, fingerprint(public_blob), name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def self_test_private_key(keygen_cmd, private_path, expected_fingerprint, name):
    """Sign and verify with the key file: proves OpenSSH can load it and it matches the bundle."""
    challenge = os.urandom(32)
    signed = run_command(
        [keygen_cmd, "-Y", "sign", "-f", private_path, "-n", SELFTEST_NAMESPACE],
        name + " key self-test (sign)",
        BundleRejected,
        input_bytes=challenge,
    )
    with tempfile.NamedTemporaryFile(prefix="hpops-selftest-", suffix=".sig") as signature:
        signature.write(signed.stdout)  # a signature is public information
        signature.flush()
        checked = run_command(
            [keygen_cmd, "-Y", "check-novalidate", "-n", SELFTEST_NAMESPACE, "-s", signature.name],
            name + " key self-test (verify)",
            BundleRejected,
            input_bytes=challenge,
        )
    reported = checked.stdout.decode("ascii", "replace") + checked.stderr.decode("ascii", "replace")
    if expected_fingerprint not in reported:
        raise BundleRejected("{} key self-test: signature is not from the bundle's key".format(name))


def check_sshd_config(sshd_cmd, config_path):
    run_command([sshd_cmd, "-t", "-f", config_path], "sshd -t", ValidationFailed)


def reload_sshd(reload_cmd):
    run_command(reload_cmd, "reload ({})".format(reload_cmd), ReloadFailed, shell=True)


# --------------------------------------------------------------------------- bundle source


def check_source_fits_mode(args):
    """Each mode reads from its own kind of source; a mismatch is a caller bug, refused before any work.

    argparse already allows at most one source. A keys bundle never lives in a
    certificate parameter and certificates never in the key secret, so the pairing
    is enforced here rather than trusting whatever the document was called with.
    """
    if args.mode == "report-public-keys":
        if args.secret_id or args.certificate_parameter or args.bundle_file:
            raise BundleRejected("--mode report-public-keys reads no bundle; drop the bundle source")
        return
    if not (args.secret_id or args.certificate_parameter or args.bundle_file):
        raise BundleRejected(
            "--mode {} needs one of --secret-id, --certificate-parameter, --bundle-file".format(args.mode)
        )
    if args.secret_id and args.mode != "keys":
        raise BundleRejected("--secret-id holds shared host keys; it only fits --mode keys")
    if args.certificate_parameter is not None:
        if args.mode != "certificate":
            raise BundleRejected("--certificate-parameter holds host certificates; it only fits --mode certificate")
        # fullmatch: '$' alone would also accept a trailing newline.
        if not CERTIFICATE_PARAMETER_PATTERN.fullmatch(args.certificate_parameter):
            raise BundleRejected("--certificate-parameter must look like /hpops/<cluster>/host-certificates/<instance-id>")


def fetch_bundle(args):
    if args.bundle_file:
        return read_bundle_file(args.bundle_file)
    if args.certificate_parameter:
        argv = [args.aws_cmd, "ssm", "get-parameter", "--name", args.certificate_parameter]
        argv += ["--query", "Parameter.Value", "--output", "text"]
        return fetch_with_aws_cli(argv, args.region, "aws ssm get-parameter", "parameter")
    argv = [args.aws_cmd, "secretsmanager", "get-secret-value", "--secret-id", args.secret_id]
    argv += ["--query", "SecretString", "--output", "text"]
    return fetch_with_aws_cli(argv, args.region, "aws secretsmanager get-secret-value", "secret")


def fetch_with_aws_cli(argv, region, label, what):
    if region:
        argv = argv + ["--region", region]
    result = run_command(argv, label, BundleRejected)
    if len(result.stdout) > MAX_BUNDLE_BYTES:
        raise BundleRejected("{} is larger than {} bytes".format(what, MAX_BUNDLE_BYTES))
    return result.stdout.decode("utf-8", "replace")


def read_bundle_file(path):
    try:
        if path == "-":
            data = sys.stdin.buffer.read(MAX_BUNDLE_BYTES + 1)
        else:
            with open(path, "rb") as handle:
                data = handle.read(MAX_BUNDLE_BYTES + 1)
    except OSError as exc:
        raise BundleRejected("cannot read bundle file: {}".format(exc.strerror)) from None
    if len(data) > MAX_BUNDLE_BYTES:
        raise BundleRejected("bundle file is larger than {} bytes".format(MAX_BUNDLE_BYTES))
    return data.decode("utf-8", "replace")


# --------------------------------------------------------------------------- main flow


class InstallLock:
    """One run at a time per node (the agent, its --once run at install time and an operator may overlap)."""

    def __init__(self, layout):
        self.path = os.path.join(layout.backup_base, ".lock")
        self.handle = None

    def __enter__(self):
        os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
        self.handle = open(self.path, "a")
        deadline = time.monotonic() + LOCK_WAIT_SECONDS
        while True:
            try:
                fcntl.flock(self.handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() > deadline:
                    self.handle.close()
                    raise LockBusy("another install_host_keys run holds {}".format(self.path)) from None
                time.sleep(0.5)

    def __exit__(self, *exc_info):
        self.handle.close()


def plan(args, layout, bundle_text):
    """Validate the bundle; return (planned files, public summary, preflight check). Writes nothing."""
    if args.mode == "keys":
        entries = parse_key_bundle(bundle_text)
        fingerprints = {KEY_TYPES[name]: fingerprint(entry[2]) for name, entry in entries.items()}
        preflight = functools.partial(self_test_bundle_keys, args.ssh_keygen_cmd, entries, layout)
        return plan_key_files(entries, layout), {"fingerprints": fingerprints}, preflight
    ca_blob, certificates = parse_certificate_bundle(bundle_text)
    planned, certified = plan_certificate_files(ca_blob, certificates, layout, args.ssh_keygen_cmd)
    summary = {"ca_fingerprint": fingerprint(ca_blob), "certified_fingerprints": certified}
    return planned, summary, no_preflight


def report_public_keys(args, layout):
    """Public line and fingerprint of each host key the node has; reads only, writes nothing.

    The lines come from the private key files (``ssh-keygen -y``), not from the .pub
    files: sshd serves the private key, and a .pub left over from an older key would
    get a certificate the node can never present. Only the path reaches ssh-keygen.
    """
    public_keys, fingerprints = {}, {}
    for name, key_type in KEY_TYPES.items():
        if not os.path.exists(layout.private_key(name)):
            continue  # e.g. an image built without RSA: report what sshd can serve
        blob = derive_public_blob(args.ssh_keygen_cmd, layout.private_key(name), name)
        public_keys[name] = "{} {}".format(key_type, base64.b64encode(blob).decode("ascii"))
        fingerprints[key_type] = fingerprint(blob)
    if not public_keys:
        raise PreconditionFailed("no host keys under {}".format(layout.ssh_dir))
    return {"result": "reported", "public_keys": public_keys, "fingerprints": fingerprints}


def no_preflight():
    """Certificates were already matched against this node's own keys while planning."""


def apply_changes(args, layout, changes):
    """Backup, write, validate, reload; restore the previous files on any failure."""
    state = snapshot([planned.path for planned in changes])
    backup_dir = save_backup(state, layout)
    try:
        write_planned(changes)
        check_sshd_config(args.sshd_cmd, layout.sshd_config)
    except InstallError as exc:
        roll_back(state, backup_dir, reload_cmd=None)
        raise ValidationFailed(str(exc)) from None
    except OSError as exc:
        roll_back(state, backup_dir, reload_cmd=None)
        raise ValidationFailed("writing files failed: {}".format(exc)) from None
    try:
        reload_sshd(args.reload_cmd)
    except ReloadFailed:
        # The reload may have half-happened; put the old files back and reload them.
        roll_back(state, backup_dir, reload_cmd=args.reload_cmd)
        raise
    return backup_dir


def roll_back(state, backup_dir, reload_cmd):
    try:
        restore(state)
    except OSError as exc:
        reason = "rollback failed ({}); previous files are in {}".format(exc.strerror, backup_dir)
        raise RollbackFailed(reason) from None
    if reload_cmd:
        try:
            reload_sshd(reload_cmd)
        except ReloadFailed:
            pass  # best effort: the daemon already failed to reload once


def emit(summary):
    sys.stdout.write(json.dumps(summary, sort_keys=True) + "\n")
    sys.stdout.flush()


def parse_args(argv):
    parser = argparse.ArgumentParser(description="Install the canonical SSH host identity on this node.")
    # Not required=True: report-public-keys reads no bundle (check_source_fits_mode enforces the rest).
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--secret-id", help="keys mode: Secrets Manager secret holding the key bundle JSON")
    source.add_argument(
        "--certificate-parameter",
        help="certificate mode: SSM parameter /hpops/<cluster>/host-certificates/<instance-id>",
    )
    source.add_argument("--bundle-file", help="read the bundle JSON from this file ('-' for stdin)")
    parser.add_argument("--region", help="AWS region for the aws CLI (default: the CLI's own)")
    parser.add_argument("--aws-cmd", default="aws", help=argparse.SUPPRESS)
    parser.add_argument(
        "--mode",
        choices=MODES,
        default="keys",
        help="keys: install shared keys; certificate: install host certificates; "
        "report-public-keys: print this node's public host keys and change nothing",
    )
    parser.add_argument("--root", default="/", help="alternate root directory (default /)")
    parser.add_argument("--sshd-cmd", default="/usr/sbin/sshd")
    parser.add_argument("--sshd-config", help="default ROOT/etc/ssh/sshd_config")
    parser.add_argument("--ssh-keygen-cmd", default="/usr/bin/ssh-keygen")
    parser.add_argument("--reload-cmd", default="systemctl reload ssh || systemctl reload sshd")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    layout = NodeLayout(args.root, args.sshd_config)
    summary = {"mode": args.mode}
    try:
        check_source_fits_mode(args)
        if args.mode == "report-public-keys":
            # No lock: nothing is written, and every key file is replaced atomically,
            # so a concurrent install shows this run either the old or the new key.
            summary.update(report_public_keys(args, layout))
            emit(summary)
            return 0
        install_bundle(args, layout, fetch_bundle(args), summary)
        emit(summary)
        return 0
    except InstallError as exc:
        return report_failure(summary, str(exc), exc.rolled_back, exc.exit_code)
    except OSError as exc:  # e.g. no permission to create the lock or backup directory
        return report_failure(summary, "local error: {}: {}".format(exc.strerror, exc.filename), False, 1)


def install_bundle(args, layout, bundle_text, summary):
    """The whole transaction for one bundle text, under the node lock.

    ``args`` needs mode ("keys"/"certificate"), ssh_keygen_cmd, sshd_cmd and reload_cmd.
    Updates ``summary`` in place (public facts first, so a failure still reports them) and
    returns it with result "changed" or "unchanged"; raises InstallError (or OSError).
    """
    with InstallLock(layout):
        planned, public_facts, preflight = plan(args, layout, bundle_text)
        summary.update(public_facts)
        changes = [item for item in planned if not item.is_current()]
        if not changes:
            summary["result"] = "unchanged"
            return summary
        preflight()
        summary["backup"] = apply_changes(args, layout, changes)
        summary["result"] = "changed"
        summary["files"] = sorted(item.path for item in changes)
        return summary


def report_failure(summary, reason, rolled_back, exit_code):
    summary.update(result="failed", reason=reason, rolled_back=rolled_back)
    emit(summary)
    sys.stderr.write("install_host_keys: {}\n".format(reason))
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
