"""Simulated login nodes: host key files on disk, the real node agent, what sshd presents.

* Each login node gets its own root directory with etc/ssh/ssh_host_*_key files: a fresh node
  has its own keys, exactly the situation that makes users see "host key changed".
* Each login node runs the real node agent (node/hpops_node_agent) against that root, with its
  own boto3 session (so its calls hit the emulated account but are counted apart from the
  Lambdas'). The lifecycle script's `--once` run happens when the node is first seen Running;
  after that the agent ticks whenever the twin lets time pass for the nodes (tick_all) and right
  before a state machine reads that node's report (the agent polls at least once per wait).
* The verifier's network read (an SSH handshake to ip:22) is answered from the node's public
  key files and, for certificate algorithms, from the certificate files its sshd_config names
  (HostCertificate), which is what its sshd would present. The real handshake is covered by
  tests/ssh/test_real_sshd.py and tests/node against real sshd.
"""

from __future__ import annotations

import itertools
import json
import shutil
import tempfile
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import boto3
import botocore.session

from hpops_core.host_identity import verifier
from hpops_core.host_identity.keys import KEY_TYPES, HostKeyBundle, generate_bundle
from hpops_node_agent import agent as agent_module
from hpops_node_agent.agent import NodeAgent
from hpops_node_agent.config import AgentConfig
from hpops_twin import service_models

_BUNDLE_POOL: list[HostKeyBundle] = []  # RSA-3072 generation is slow; fresh nodes draw from a pool


NODE_BUNDLES = 4  # pool[0..3]: fresh nodes' own keys; pool[4]: the canonical set; pool[5]: its rotation


def _fill_pool() -> None:
    while len(_BUNDLE_POOL) < NODE_BUNDLES + 2:
        _BUNDLE_POOL.append(generate_bundle())


def node_bundle(index: int) -> HostKeyBundle:
    _fill_pool()
    return _BUNDLE_POOL[index % NODE_BUNDLES]


def canonical_bundle() -> HostKeyBundle:
    """A bundle no simulated node starts with (the operator's `hpops host-keys generate`)."""
    _fill_pool()
    return _BUNDLE_POOL[NODE_BUNDLES]


def rotation_bundle() -> HostKeyBundle:
    """The canonical set after `hpops host-keys rotate`."""
    _fill_pool()
    return _BUNDLE_POOL[NODE_BUNDLES + 1]


def ssh_keygen() -> str | None:
    return shutil.which("ssh-keygen")


@dataclass
class AgentSettings:
    """What the lifecycle bundle's agent.json would say for this twin (from the stack's outputs)."""

    cluster: str
    region: str
    report_bus: str
    login_group: str
    controller_group: str = "controller"
    node_channel: str | None = None  # the stack's NodeChannel function: the agents enroll their keys


class NodeHosts:
    def __init__(self, node_by_instance: Callable[[str], Any], node_by_ip: Callable[[str], Any],
                 running_login_nodes: Callable[[], list[Any]], agent_settings: Callable[[], AgentSettings],
                 exclusive: Any, identity_document: Callable[[Any], dict | None] = lambda node: None):
        self._node_by_instance = node_by_instance
        self._running_login_nodes = running_login_nodes
        self._node_by_ip = node_by_ip
        self._agent_settings = agent_settings
        self._exclusive = exclusive  # the Lambda dispatcher's lock (environment changes happen under it)
        self._identity_document = identity_document  # node -> what its IMDS serves (identity_documents.py)
        self._dir = Path(tempfile.mkdtemp(prefix="hpops-twin-nodes-"))
        self._counter = itertools.count()
        self.roots: dict[str, Path] = {}
        self.agents: dict[str, Any] = {}  # instance id -> NodeAgent
        self.agent_calls: Counter = Counter()  # the agents' own AWS calls, service.operation
        self.lifecycle_installs_agent = True  # False: a cluster whose on_create.sh lacks the hpops line
        self.stopped: set[str] = set()  # instance ids whose agent is down (crashed, masked by hand)
        self._locks: dict[str, threading.Lock] = {}
        self.journal: list[dict] = []  # what the agents logged, in order
        self.polls: Counter = Counter()  # instance id -> agent ticks (each is one 30 s poll on a cluster)

    # ------------------------------------------------------------------ the node agent
    def ensure_agents(self) -> list[str]:
        """HyperPod ran on_create on every Running login node: install its agent (its `--once` run).

        Returns the instance ids that got an agent now."""
        if not self.lifecycle_installs_agent:
            return []
        settings = self._agent_settings()
        installed = []
        for node in self._running_login_nodes():
            if node.instance_id not in self.agents:
                self.agents[node.instance_id] = self._make_agent(node, settings)
                installed.append(node.instance_id)
                self.tick(node.instance_id)
        return installed

    def install_agent(self, instance_id: str) -> bool:
        """install.sh run on a node that already runs (`hpops adopt`): its agent, and its first cycle.
        False when the node is not a Running login node (the twin's agents are login nodes')."""
        node = self._node_by_instance(instance_id)
        if node is None or node.status != "Running" or node not in self._running_login_nodes():
            return False
        if instance_id not in self.agents:
            self.agents[instance_id] = self._make_agent(node, self._agent_settings())
        self.tick(instance_id)
        return True

    def tick(self, instance_id: str) -> Any:
        """One poll of that node's agent (nothing if it has none or it is stopped)."""
        agent = self.agents.get(instance_id)
        node = self._node_by_instance(instance_id)
        if agent is None or instance_id in self.stopped or node is None or node.status != "Running":
            return None
        # Handlers change os.environ while they run (lambda_dispatch.py); a fork/exec (the agent's
        # ssh-keygen) racing that gets EFAULT. A real agent is its own process: hold that lock here.
        with self._exclusive, self._locks.setdefault(instance_id, threading.Lock()):
            self.polls[instance_id] += 1
            return agent.tick()

    def tick_all(self) -> None:
        """Time passes for the nodes: every live agent polls once."""
        self.ensure_agents()
        for instance_id in list(self.agents):
            self.tick(instance_id)

    def _make_agent(self, node: Any, settings: AgentSettings) -> Any:
        root = self.root(node.instance_id)
        config_dir = root / "opt" / "ml" / "config"
        config_dir.mkdir(parents=True, exist_ok=True)
        groups = [{"Name": settings.login_group, "Instances": [
            {"InstanceName": f"{settings.login_group}-1", "CustomerIpAddress": node.ip, "InstanceId": node.instance_id}]}]
        (config_dir / "resource_config.json").write_text(json.dumps({"InstanceGroups": groups}))
        provisioning = root / "etc" / "hpops" / "provisioning_parameters.json"
        provisioning.parent.mkdir(parents=True, exist_ok=True)
        provisioning.write_text(json.dumps({"workload_manager": "slurm", "login_group": settings.login_group,
                                            "controller_group": settings.controller_group}))
        config = AgentConfig.from_dict({
            "cluster": settings.cluster, "region": settings.region, "reportBus": settings.report_bus,
            "root": str(root), "resourceConfig": str(config_dir / "resource_config.json"),
            "provisioningParameters": str(provisioning), "stateDir": str(root / "var" / "lib" / "hpops-node-agent"),
            # The twin has no sshd: `sshd -t` and the reload are the real sshd's job in tests/node.
            "sshdCmd": "true", "reloadCmd": "true", "sshKeygenCmd": ssh_keygen() or "ssh-keygen",
            "instanceId": node.instance_id, "ip": node.ip, "pollSeconds": 30,
            **({"nodeChannel": settings.node_channel} if settings.node_channel else {}),
        })
        # A session per node, as each node has its own process; they share the twin's model loader
        # (service_models.py) so service models are parsed once. Counted apart from the Lambdas' calls.
        core = botocore.session.Session()
        core.register_component("data_loader", service_models.LOADER)
        session = boto3.session.Session(botocore_session=core, region_name=settings.region)
        session.events.register("before-call", self._count_agent_call)
        # The node's own IMDS: its agent (and anyone on that node) reads its instance identity document.
        return NodeAgent(config, session, identity_document=lambda: self._identity_document(node))

    def _journal(self, event: str, **fields: Any) -> None:
        self.journal.append({"event": event} | fields)

    def _count_agent_call(self, event_name: str, **_: Any) -> None:
        _, service, operation = event_name.split(".", 2)
        self.agent_calls[f"{service}.{operation}"] += 1

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

    def limits_file(self, instance_id: str) -> Path:
        return self.root(instance_id) / "etc" / "security" / "limits.d" / "90-hpops-maxlogins.conf"

    @contextmanager
    def installed(self) -> Iterator[NodeHosts]:
        with ExitStack() as stack:
            # The agents' journald lines are kept here, not printed over the demo's narrative.
            stack.enter_context(mock.patch.object(agent_module, "log", self._journal))
            stack.enter_context(mock.patch.object(verifier, "read_presented_public_keys", self.presented_public_keys))
            stack.enter_context(mock.patch.object(verifier, "read_presented_host_certificate", self.presented_host_certificate))
            try:
                yield self
            finally:
                shutil.rmtree(self._dir, ignore_errors=True)
