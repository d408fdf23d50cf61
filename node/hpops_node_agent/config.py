"""The node agent's configuration file (JSON, default /etc/hpops/node-agent.json).

Written by the lifecycle installer from the bundle's agent.json. Only cluster, region and
reportBus are required; everything else has a production default, and the identity overrides
(instanceId, ip, role) exist for tests and the local twin.

Paths the agent writes (etc/ssh, etc/security/limits.d, stateDir) live under ``root``; the files
it only reads (resourceConfig, platformProvisioningParameters, provisioningParameters) are used
as given.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Optional

from hpops_core.common import validation
from hpops_core.node_channel import contract

DEFAULT_CONFIG_PATH = "/etc/hpops/node-agent.json"
DEFAULT_RESOURCE_CONFIG = "/opt/ml/config/resource_config.json"
DEFAULT_PROVISIONING_PARAMETERS = "/opt/hpops-node-agent/provisioning_parameters.json"
# API-driven Slurm configuration: HyperPod writes this on every node, and nothing in the lifecycle prefix.
DEFAULT_PLATFORM_PROVISIONING_PARAMETERS = "/opt/ml/config/provisioning_parameters.json"
DEFAULT_STATE_DIR = "/var/lib/hpops-node-agent"
DEFAULT_SSHD_CMD = "/usr/sbin/sshd"
DEFAULT_RELOAD_CMD = "systemctl reload ssh || systemctl reload sshd"
DEFAULT_SSH_KEYGEN_CMD = "/usr/bin/ssh-keygen"

REQUIRED = ("cluster", "region", "reportBus")
# JSON key -> (dataclass field, type, default)
OPTIONAL = {
    "pollSeconds": ("poll_seconds", (int, float), contract.DEFAULT_POLL_SECONDS),
    "heartbeatSeconds": ("heartbeat_seconds", (int, float), contract.DEFAULT_HEARTBEAT_SECONDS),
    "root": ("root", str, "/"),
    "resourceConfig": ("resource_config", str, DEFAULT_RESOURCE_CONFIG),
    "provisioningParameters": ("provisioning_parameters", str, DEFAULT_PROVISIONING_PARAMETERS),
    "platformProvisioningParameters": ("platform_provisioning_parameters", str,
                                       DEFAULT_PLATFORM_PROVISIONING_PARAMETERS),
    "stateDir": ("state_dir", str, DEFAULT_STATE_DIR),
    "sshdCmd": ("sshd_cmd", str, DEFAULT_SSHD_CMD),
    "reloadCmd": ("reload_cmd", str, DEFAULT_RELOAD_CMD),
    # How systemd is told to read the per-user slice caps ("": systemctl daemon-reload on a node's own
    # root, nothing on another root, which has no systemd of its own).
    "daemonReloadCmd": ("daemon_reload_cmd", str, ""),
    "sshKeygenCmd": ("ssh_keygen_cmd", str, DEFAULT_SSH_KEYGEN_CMD),
    "instanceId": ("instance_id", str, None),
    "ip": ("ip", str, None),
    "role": ("role", str, None),
    # Controller node: how often Slurm usage is collected and shipped (0: never); sacct's path
    # ("": PATH, then /opt/slurm/bin where HyperPod installs Slurm).
    "usageSeconds": ("usage_seconds", (int, float), contract.DEFAULT_USAGE_SECONDS),
    "sacctCmd": ("sacct_cmd", str, ""),
    # Optional IMDS lockdown (imds_guard.py): "on" lets only root and imdsAllowedGroups (comma-separated
    # group names) reach IMDS; imdsProbe is the address whose reachability by non-root processes every
    # report states ("": not probed; the bundle writes IMDS's address).
    "imdsLockdown": ("imds_lockdown", str, "off"),
    "imdsAllowedGroups": ("imds_allowed_groups", str, ""),
    "imdsProbe": ("imds_probe", str, ""),
    # The stack's NodeChannel function (name or ARN): enrollment of the agent's key. Absent (an agent.json
    # from before enrollment existed): reports go unsigned, and a stack that checks them refuses them.
    "nodeChannel": ("node_channel", str, None),
}
MIN_POLL_SECONDS = 1
MAX_POLL_SECONDS = 3600
MIN_USAGE_SECONDS = 60
IMDS_LOCKDOWN_VALUES = contract.IMDS_LOCKDOWN_VALUES
# Where the probe may connect: IMDS (IPv4, IPv6), or the loopback a test serves a stand-in on.
IMDS_ADDRESSES = ("169.254.169.254", "fd00:ec2::254", "127.0.0.1")


class ConfigError(ValueError):
    """The config file is missing, unreadable or not what the agent accepts (message names the key)."""


@dataclass(frozen=True)
class AgentConfig:
    cluster: str
    region: str
    report_bus: str
    poll_seconds: float = contract.DEFAULT_POLL_SECONDS
    heartbeat_seconds: float = contract.DEFAULT_HEARTBEAT_SECONDS
    root: str = "/"
    resource_config: str = DEFAULT_RESOURCE_CONFIG
    provisioning_parameters: str = DEFAULT_PROVISIONING_PARAMETERS
    platform_provisioning_parameters: str = DEFAULT_PLATFORM_PROVISIONING_PARAMETERS
    state_dir: str = DEFAULT_STATE_DIR
    sshd_cmd: str = DEFAULT_SSHD_CMD
    reload_cmd: str = DEFAULT_RELOAD_CMD
    daemon_reload_cmd: str = ""
    ssh_keygen_cmd: str = DEFAULT_SSH_KEYGEN_CMD
    instance_id: Optional[str] = None
    ip: Optional[str] = None
    role: Optional[str] = None
    usage_seconds: float = contract.DEFAULT_USAGE_SECONDS
    sacct_cmd: str = ""
    node_channel: Optional[str] = None
    imds_lockdown: str = "off"
    imds_allowed_groups: str = ""
    imds_probe: str = ""

    @property
    def imds_groups(self) -> tuple:
        return tuple(name.strip() for name in self.imds_allowed_groups.split(",") if name.strip())

    @classmethod
    def from_dict(cls, document: object) -> "AgentConfig":
        if not isinstance(document, dict):
            raise ConfigError("config must be a JSON object")
        unknown = sorted(set(document) - set(REQUIRED) - set(OPTIONAL))
        if unknown:
            raise ConfigError("config has unknown key(s): {}".format(", ".join(unknown)))
        values = {}
        for key, field in (("cluster", "cluster"), ("region", "region"), ("reportBus", "report_bus")):
            value = document.get(key)
            if value is None:
                raise ConfigError("config is missing required key '{}'".format(key))
            if not isinstance(value, str) or not value.strip():
                raise ConfigError("config key '{}' must be a non-empty string".format(key))
            values[field] = value
        try:
            contract.parameter_prefix(values["cluster"])
        except ValueError:
            raise ConfigError("config key 'cluster' is not a HyperPod cluster name") from None
        for key, (field, kind, default) in OPTIONAL.items():
            value = document.get(key, default)
            if value is None:
                values[field] = None
                continue
            if isinstance(value, bool) or not isinstance(value, kind):
                raise ConfigError("config key '{}' has the wrong type".format(key))
            values[field] = value
        for key in ("pollSeconds", "heartbeatSeconds"):
            field = OPTIONAL[key][0]
            if not MIN_POLL_SECONDS <= values[field] <= 24 * 3600:
                raise ConfigError("config key '{}' must be between {} and 86400 seconds".format(key, MIN_POLL_SECONDS))
        if values["poll_seconds"] > MAX_POLL_SECONDS:
            raise ConfigError("config key 'pollSeconds' must be at most {}".format(MAX_POLL_SECONDS))
        usage_seconds = values["usage_seconds"]
        if usage_seconds != 0 and not MIN_USAGE_SECONDS <= usage_seconds <= 24 * 3600:
            raise ConfigError("config key 'usageSeconds' must be 0 (off) or between {} and 86400 seconds".format(
                MIN_USAGE_SECONDS))
        if values["sacct_cmd"] and not os.path.isabs(values["sacct_cmd"]):
            raise ConfigError("config key 'sacctCmd' must be an absolute path")
        if values["imds_lockdown"] not in IMDS_LOCKDOWN_VALUES:
            raise ConfigError("config key 'imdsLockdown' must be one of {}".format(", ".join(IMDS_LOCKDOWN_VALUES)))
        groups = [name.strip() for name in values["imds_allowed_groups"].split(",") if name.strip()]
        if not all(validation.is_posix_user(name) for name in groups):
            raise ConfigError("config key 'imdsAllowedGroups' must be comma-separated group names")
        if values["imds_probe"] and values["imds_probe"] not in IMDS_ADDRESSES:
            raise ConfigError("config key 'imdsProbe' must be \"\" or one of {}".format(", ".join(IMDS_ADDRESSES)))
        if values["role"] is not None and values["role"] not in contract.ROLES:
            raise ConfigError("config key 'role' must be one of {}".format(", ".join(contract.ROLES)))
        if values["instance_id"] is not None:
            try:
                contract.check_instance_id(values["instance_id"], "config key 'instanceId'")
            except ValueError as error:
                raise ConfigError(str(error)) from None
        for key in ("root", "stateDir"):
            if not os.path.isabs(values[OPTIONAL[key][0]]):
                raise ConfigError("config key '{}' must be an absolute path".format(key))
        return cls(**values)

    def under_root(self, path: str) -> str:
        """An absolute node path (e.g. the state dir) inside ``root``."""
        return os.path.join(self.root, path.lstrip("/"))


def load_config(path: str = DEFAULT_CONFIG_PATH) -> AgentConfig:
    try:
        with open(path, "rb") as handle:
            text = handle.read(1024 * 1024)
    except OSError as error:
        raise ConfigError("cannot read config {}: {}".format(path, error.strerror)) from None
    try:
        document = json.loads(text.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        raise ConfigError("config {} is not valid JSON".format(path)) from None
    return AgentConfig.from_dict(document)
