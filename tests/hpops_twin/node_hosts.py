"""Simulated login nodes' SSH side: host key files on disk, Run Command, what sshd presents.

* Each login node gets its own root directory with etc/ssh/ssh_host_*_key files: a fresh node
  has its own keys, exactly the situation that makes users see "host key changed".
* SendCommand with the stack's document runs the node script *extracted from template.yaml's
  document* against that root, in the document's Mode (keys, certificate, report-public-keys).
  The node reads its bundle with its own role (the key secret, or its certificate parameter);
  here the twin hands it that value on stdin, never on a command line. moto records commands but
  runs nothing, so SendCommand / GetCommandInvocation are wrapped for these documents only.
* SendCommand with the stack's LoginLimitsDocument likewise runs its extracted script (issue 4)
  against the node's root, which then holds etc/security/limits.d/90-hpops-maxlogins.conf.
* The verifier's network read (an SSH handshake to ip:22) is answered from the node's public
  key files and, for certificate algorithms, from the certificate files its sshd_config names
  (HostCertificate), which is what its sshd would present. The real handshake is covered by
  tests/ssh/test_real_sshd.py against real sshd and haproxy.
"""

from __future__ import annotations

import itertools
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

from moto.ssm.models import SimpleSystemManagerBackend

from hpops_core.host_identity import verifier
from hpops_core.host_identity.keys import KEY_TYPES, HostKeyBundle, generate_bundle
from hpops_twin.ssm_document import extract_script

_BUNDLE_POOL: list[HostKeyBundle] = []  # RSA-3072 generation is slow; fresh nodes draw from a pool


NODE_BUNDLES = 4  # pool[0..3]: fresh nodes' own keys; pool[4]: the canonical set


def _fill_pool() -> None:
    while len(_BUNDLE_POOL) < NODE_BUNDLES + 1:
        _BUNDLE_POOL.append(generate_bundle())


def node_bundle(index: int) -> HostKeyBundle:
    _fill_pool()
    return _BUNDLE_POOL[index % NODE_BUNDLES]


def canonical_bundle() -> HostKeyBundle:
    """A bundle no simulated node starts with (the operator's `hpops host-keys generate`)."""
    _fill_pool()
    return _BUNDLE_POOL[NODE_BUNDLES]


def ssh_keygen() -> str | None:
    return shutil.which("ssh-keygen")


class NodeHosts:
    def __init__(self, node_by_instance: Callable[[str], Any], node_by_ip: Callable[[str], Any],
                 document_name: Callable[[], str], document_content: Callable[[], dict], secret_value: Callable[[str], str],
                 parameter_value: Callable[[str], str] | None = None,
                 limits_document_name: Callable[[], str] | None = None,
                 limits_document_content: Callable[[], dict] | None = None):
        self._node_by_instance = node_by_instance
        self._limits_document_name = limits_document_name
        self._limits_document_content = limits_document_content
        self._node_by_ip = node_by_ip
        self._document_name = document_name
        self._document_content = document_content
        self._secret_value = secret_value
        self._parameter_value = parameter_value
        self._dir = Path(tempfile.mkdtemp(prefix="hpops-twin-nodes-"))
        self._counter = itertools.count()
        self.roots: dict[str, Path] = {}
        self.unreachable: set[str] = set()  # instance ids Run Command cannot reach (agent down)
        self.results: dict[tuple[str, str], dict] = {}
        self.runs: list[dict] = []

    def root(self, instance_id: str) -> Path:
        """The node's filesystem root, created with the node's own (non-canonical) host keys."""
        if instance_id not in self.roots:
            root = self._dir / instance_id
            ssh = root / "etc" / "ssh"
            ssh.mkdir(parents=True)
            (ssh / "sshd_config").write_text("# simulated node\n")
            for pair in node_bundle(next(self._counter)).pairs():
                key = ssh / f"ssh_host_{pair.name}_key"
                key.write_text(pair.private_openssh)
                key.chmod(0o600)
                (ssh / f"ssh_host_{pair.name}_key.pub").write_text(pair.public_line + "\n")
            self.roots[instance_id] = root
        return self.roots[instance_id]

    def presented_public_keys(self, ip: str, port: int, key_types: tuple[str, ...] = (), timeout: float = 5.0) -> dict[str, str]:
        node = self._node_by_ip(ip)
        if node is None or node.status != "Running":
            raise verifier.HostUnreachable(f"{ip}:{port}: connection refused")
        ssh = self.root(node.instance_id) / "etc" / "ssh"
        lines = {}
        for name in KEY_TYPES:
            line = (ssh / f"ssh_host_{name}_key.pub").read_text().strip()
            lines[line.split()[0]] = line
        return lines

    def presented_host_certificate(self, ip: str, port: int, key_type: str = "ssh-ed25519",
                                   timeout: float = 5.0) -> verifier.PresentedHostCertificate:
        """What sshd offers under <key_type>-cert-v01: the certificate file sshd_config names, if any."""
        node = self._node_by_ip(ip)
        if node is None or node.status != "Running":
            raise verifier.HostUnreachable(f"{ip}:{port}: connection refused")
        ssh = self.root(node.instance_id) / "etc" / "ssh"
        configured = {line.split()[1] for line in (ssh / "sshd_config").read_text().splitlines()
                      if len(line.split()) >= 2 and line.split()[0].lower() == "hostcertificate"}
        for path in map(Path, sorted(configured)):
            if path.exists() and path.read_text().split()[0] == key_type + "-cert-v01@openssh.com":
                return verifier._describe_certificate(path.read_text().strip(), key_type, f"{ip}:{port}")
        raise verifier.HostCertificateMissing(f"{ip}:{port} offers no {key_type} host certificate")

    def run_document(self, command_id: str, instance_id: str, parameters: dict) -> dict:
        mode, source = parameters["Mode"][0], parameters["Source"][0]

        def bundle() -> bytes:
            if mode == "keys":
                return self._secret_value(source).encode()
            if mode == "certificate":
                assert self._parameter_value is not None
                return self._parameter_value(source).encode()
            return b""

        return self._run(command_id, instance_id, self._document_name(), "InstallHostIdentity",
                         lambda: self._document_content(), "install_host_keys.py",
                         lambda root: ["--mode", mode, *(["--bundle-file", "-"] if mode != "report-public-keys" else []),
                                       "--root", str(root), "--sshd-cmd", "true", "--reload-cmd", "true",
                                       "--ssh-keygen-cmd", ssh_keygen() or "ssh-keygen"],
                         bundle)

    def run_limits_document(self, command_id: str, instance_id: str, parameters: dict) -> dict:
        assert self._limits_document_name is not None and self._limits_document_content is not None
        return self._run(command_id, instance_id, self._limits_document_name(), "ApplyLoginLimits",
                         self._limits_document_content, "apply_login_limits.py",
                         lambda root: ["--root", str(root), "--limits-json", parameters["LimitsJson"][0]],
                         lambda: b"")

    def limits_file(self, instance_id: str) -> Path:
        return self.root(instance_id) / "etc" / "security" / "limits.d" / "90-hpops-maxlogins.conf"

    def _run(self, command_id: str, instance_id: str, document_name: str, plugin: str, content: Callable[[], dict],
             script_name: str, arguments: Callable[[Path], list[str]], stdin: Callable[[], bytes]) -> dict:
        node = self._node_by_instance(instance_id)
        if node is None or instance_id in self.unreachable:
            result = {"Status": "Failed", "StatusDetails": "Undeliverable", "StandardOutputContent": "",
                      "ResponseCode": -1}
        else:
            script = self._script_dir() / script_name
            script.write_text(extract_script(content()))
            completed = subprocess.run(
                [sys.executable, str(script), *arguments(self.root(instance_id))],
                input=stdin(), capture_output=True, timeout=60,
            )
            result = {
                "Status": "Success" if completed.returncode == 0 else "Failed",
                "StatusDetails": "Success" if completed.returncode == 0 else "Failed",
                "StandardOutputContent": completed.stdout.decode(errors="replace"),
                "StandardErrorContent": completed.stderr.decode(errors="replace"),
                "ResponseCode": completed.returncode,
            }
        result |= {"CommandId": command_id, "InstanceId": instance_id, "DocumentName": document_name,
                   "PluginName": plugin}
        self.results[(command_id, instance_id)] = result
        self.runs.append(result)
        return result

    def _script_dir(self) -> Path:
        path = self._dir / "_scripts"
        path.mkdir(exist_ok=True)
        return path

    @contextmanager
    def installed(self) -> Iterator[NodeHosts]:
        hosts = self
        real_send = SimpleSystemManagerBackend.send_command
        real_invocation = SimpleSystemManagerBackend.get_command_invocation

        def send_command(backend, *args: Any, **kwargs: Any):
            command = real_send(backend, *args, **kwargs)
            if command.document_name == hosts._document_name():
                for instance_id in command.instance_ids:
                    hosts.run_document(command.command_id, instance_id, command.parameters)
            elif hosts._limits_document_name is not None and command.document_name == hosts._limits_document_name():
                for instance_id in command.instance_ids:
                    hosts.run_limits_document(command.command_id, instance_id, command.parameters)
            return command

        def get_command_invocation(backend, command_id: str, instance_id: str, plugin_name: str | None):
            if (command_id, instance_id) in hosts.results:
                return hosts.results[(command_id, instance_id)]
            return real_invocation(backend, command_id, instance_id, plugin_name)

        with ExitStack() as stack:
            stack.enter_context(mock.patch.object(SimpleSystemManagerBackend, "send_command", send_command))
            stack.enter_context(mock.patch.object(SimpleSystemManagerBackend, "get_command_invocation", get_command_invocation))
            stack.enter_context(mock.patch.object(verifier, "read_presented_public_keys", self.presented_public_keys))
            stack.enter_context(mock.patch.object(verifier, "read_presented_host_certificate", self.presented_host_certificate))
            try:
                yield self
            finally:
                shutil.rmtree(self._dir, ignore_errors=True)
