"""The node agent's loop: poll desired state, converge, report (cfn-hup style, pull only).

One tick:
  1. ssm:GetParameters for the host-identity, login-limits and this node's certificate parameter
     (one call; parameters that do not exist are simply absent).
  2. Host identity, level-triggered: what is on disk is compared with what is desired every tick.
     Keys mode fetches the secret only when the local fingerprints differ from the desired ones and
     installs it through host_keys' transaction (self-test, backup, atomic write, sshd -t, reload,
     rollback). Certificate mode reports the node's own public keys (for the signer) and installs
     its certificate bundle when the parameter's version is new.
  3. Login limits: pam_limits maxlogins file from the login-limits parameter; sshd keepalives
     under the load balancer's idle timeout from the ssh-keepalive parameter (sshd_keepalive.py).
     The node's pressure (PSI, node_load.py) goes into every report, for load-aware admission.
  4. events:PutEvents, one entry, when something changed, the outcome differs from the last report
     sent, on start, or when the heartbeat is due. A failed send is retried on the next tick.
  5. State (installed certificate version, last report digest, failure backoff) persisted as
     JSON, mode 0600.

On the controller node (where slurmctld runs) the loop is another one: every usageSeconds it
collects per-user Slurm usage from accounting (usage.py) and sends it, one entry per window part,
with the same events:PutEvents path (detail-type contract.USAGE_DETAIL_TYPE); every poll it
converges Slurm's association limits to the budget holds parameter (slurm_holds.py) and reports
what it applied when that changed (detail-type user_holds.HOLDS_DETAIL_TYPE). That report also carries
the controller's own IMDS probe (probed once per heartbeat, as on login nodes), so `hpops doctor`
knows whether a user on the controller can take its role.

Nothing here ever logs or reports key material: reports carry versions, fingerprints, public
keys and host_keys' one-line, secret-free reasons.
"""

from __future__ import annotations

import collections
import datetime
import errno
import hashlib
import json
import os
import random
import re
import shlex
import subprocess
import sys
import threading
import time
from argparse import Namespace
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Tuple

import botocore.config
from botocore.exceptions import BotoCoreError, ClientError

from hpops_core.node_channel import contract, login_slots, ssh_keepalive, user_holds

from . import (__version__, agent_key, fetch_client, host_keys, imds_guard, leave_notice, login_limits, node_load,
               slurm_holds, ssh_sessions, sshd_keepalive, usage, user_caps)
from .config import AgentConfig
from .identity import IdentityError, NodeIdentity, describe_groups_with, imds_identity_document, read_layout, resolve
from .node_identity import AgentIdentity, NodeIdentityError

LOGIN_SLOT_SCRIPT = "etc/profile.d/hpops-login-slot.sh"
FAILURE_RETRY_SECONDS = 600  # a failed install of one desired version is retried at most this often
JITTER = 0.2
STATE_FILE = "state.json"
REASON_MAX = 300
VERSION_RE = re.compile(r"^[A-Za-z0-9:._-]{1,128}$")
AWS_ERRORS = (BotoCoreError, ClientError)
PUT_EVENTS_MAX_ENTRIES = 10
PUT_EVENTS_MAX_BYTES = 256 * 1024  # per request, all entries together
CLIENT_CONFIG = botocore.config.Config(
    retries={"mode": "standard", "max_attempts": 3}, connect_timeout=5, read_timeout=10
)


def log(event: str, **fields: Any) -> None:
    """One JSON line per action on stdout (journald keeps it); callers pass only public facts."""
    line = {"ts": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "event": event}
    line.update(fields)
    sys.stdout.write(json.dumps(line, sort_keys=True, default=str) + "\n")
    sys.stdout.flush()


def aws_reason(operation: str, error: Exception) -> str:
    if isinstance(error, ClientError):
        code = error.response.get("Error", {}).get("Code", "Error")
        return "{}: {}".format(operation, code)[:REASON_MAX]
    return "{}: {}".format(operation, type(error).__name__)[:REASON_MAX]


def short(reason: str) -> str:
    return " ".join(str(reason).split())[:REASON_MAX]


@dataclass
class TickOutcome:
    """What one tick did; ``api_calls`` counts AWS operations ("ssm:GetParameters": 1, ...)."""

    role: str
    host_identity: Optional[Dict[str, Any]] = None
    login_limits: Optional[Dict[str, Any]] = None
    report_sent: bool = False
    trigger: Optional[str] = None
    api_calls: Dict[str, int] = field(default_factory=dict)
    error: Optional[str] = None

    @property
    def host_identity_result(self) -> Optional[str]:
        return (self.host_identity or {}).get("result")


@dataclass
class UsageOutcome:
    """What one usage run did: the reports collected (unsplit) and how many windows were sent."""

    reports: list = field(default_factory=list)
    windows_sent: int = 0
    api_calls: Dict[str, int] = field(default_factory=dict)
    switched_off: bool = False  # the stack's UserSpendEnabled=false: nothing collected


def section(mode: str, version: Optional[str], result: str, reason: str, **extra: Any) -> Dict[str, Any]:
    value = {"mode": mode, "version": version, "result": result, "reason": short(reason)}
    value.update(extra)
    return value


def report_digest(report: Dict[str, Any]) -> str:
    """Digest of what a report says about the node, not when or why it was sent.

    "changed" and "unchanged" both mean "converged to this version", so a tick after an install
    does not count as news; reasons count only for failed/waiting (they explain the state).
    """

    def normal(part: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
        if part is None:
            return None
        part = dict(part)
        if part.get("result") in ("changed", "unchanged"):
            part["result"] = "converged"
            part.pop("reason", None)
        return part

    essence = {
        "instanceId": report.get("instanceId"),
        "ip": report.get("ip"),
        "hostIdentity": normal(report.get("hostIdentity")),
        "loginLimits": normal(report.get("loginLimits")),
        "sessions": report.get("sessions"),  # a session opened or closed is news for the stack
        # The reason says which caps are applied: a change of caps is news even when both are "changed".
        "userCaps": dict(normal(report.get("userCaps")) or {}, reason=(report.get("userCaps") or {}).get("reason")),
        # Pressure moves all the time: only a move into another band is news; the heartbeat carries the rest.
        "loadBand": node_load.band(report.get("load")),
    }
    return hashlib.sha256(json.dumps(essence, sort_keys=True).encode("utf-8")).hexdigest()


def choose_trigger(pending_start: bool, changed: bool, digest: str, state: Dict[str, Any], now: float,
                   heartbeat_seconds: float) -> Optional[str]:
    if pending_start:
        return "start"
    if changed or digest != state.get("lastReportDigest"):
        return "change"
    if now - float(state.get("lastReportAt") or 0) >= heartbeat_seconds:
        return "heartbeat"
    return None


def backoff_active(state: Dict[str, Any], key: str, now: float) -> Optional[str]:
    """The stored failure reason while the same desired version is inside its retry delay."""
    backoff = state.get("backoff") or {}
    if backoff.get("key") == key and now - float(backoff.get("at") or 0) < FAILURE_RETRY_SECONDS:
        return backoff.get("reason") or "failed"
    return None


class NodeAgent:
    def __init__(self, config: AgentConfig, session: Any, clock: Callable[[], float] = time.time,
                 identity: Optional[NodeIdentity] = None,
                 imds_probe: Callable[[str], tuple] = imds_guard.probe,
                 identity_document: Optional[Callable[[], Optional[Dict[str, str]]]] = None) -> None:
        self.config = config
        self._imds_probe = imds_probe
        self._imds: Optional[Dict[str, Any]] = None
        self._imds_at = float("-inf")
        self.session = session
        self.clock = clock
        self._identity = identity
        self._clients: Dict[str, Any] = {}
        self._calls: collections.Counter = collections.Counter()
        self.layout = host_keys.NodeLayout(config.root)
        self.state_path = os.path.join(config.under_root(config.state_dir), STATE_FILE)
        self.state = self._load_state()
        self._saved_state_text: Optional[str] = None
        self._pending_start = True
        self._public_keys_cache: Optional[tuple] = None
        self._last_logged: Dict[str, Any] = {}
        self._usage: Optional[usage.UsageCollector] = None
        self._holds: Optional[slurm_holds.SlurmHolds] = None
        self.proof: Optional[AgentIdentity] = None
        # Instructions for this node only, fetched with the enrolled key when their public marker moves.
        self._end_sessions = fetch_client.Instructions(fetch_client.END_SESSIONS, lambda item: self._fetch(item))
        self._user_holds = fetch_client.Instructions(fetch_client.USER_HOLDS, lambda item: self._fetch(item))
        if identity_document is None:
            # IMDS at the address the bundle names (imdsProbe); none configured (tests): no document.
            def identity_document() -> Optional[Dict[str, str]]:
                return imds_identity_document(config.imds_probe) if config.imds_probe else None
        if config.node_channel:
            self.proof = AgentIdentity(config.under_root(config.state_dir), config.cluster, self._invoke_channel,
                                       lambda *args, **fields: log(*args, **fields), config.ssh_keygen_cmd,
                                       identity_document=identity_document)

    # ------------------------------------------------------------------ plumbing

    def identity(self) -> NodeIdentity:
        if self._identity is None:
            self._identity = resolve(self.config)
        return self._identity

    def _client(self, service: str) -> Any:
        if service not in self._clients:
            # AWS_ENDPOINT_URL (boto3 >= 1.28) is honoured by botocore itself.
            self._clients[service] = self.session.client(service, region_name=self.config.region,
                                                         config=CLIENT_CONFIG)
        return self._clients[service]

    def _call(self, service: str, operation: str, method: str, **kwargs: Any) -> Dict[str, Any]:
        self._calls["{}:{}".format(service, operation)] += 1
        return getattr(self._client(service), method)(**kwargs)

    def _invoke_channel(self, request: Dict[str, Any]) -> Dict[str, Any]:
        """One synchronous NodeChannel call; the answer is for this caller only (never logged whole)."""
        response = self._call("lambda", "Invoke", "invoke", FunctionName=self.config.node_channel,
                              Payload=json.dumps(request).encode("utf-8"))
        payload = response["Payload"].read()
        if response.get("FunctionError"):
            raise NodeIdentityError("NodeChannel failed ({})".format(response["FunctionError"]))
        answer = json.loads(payload.decode("utf-8"))
        if not isinstance(answer, dict):
            raise NodeIdentityError("NodeChannel answered something other than an object")
        return answer

    def signed(self, detail: Dict[str, Any], instance_id: Optional[str], ip: str) -> Optional[Dict[str, Any]]:
        """The detail as the stack accepts it: enrolled and signed; None (do not send) while this agent
        cannot prove itself. Without a configured NodeChannel the detail goes unsigned, as before."""
        if self.proof is None:
            return detail
        try:
            if instance_id is None or not self.proof.ensure_enrolled(instance_id, ip):
                return None
            return self.proof.sign_report(detail)
        except AWS_ERRORS as error:
            log("enrollment-failed", reason=aws_reason("lambda:Invoke", error))
        except (agent_key.AgentKeyError, NodeIdentityError, OSError, ValueError) as error:
            log("enrollment-failed", reason=short(str(error)))
        return None

    def enroll_now(self) -> Tuple[bool, str]:
        """One enrollment attempt at once (`hpops-node-agent enroll`): first thing on a new node, and after
        an operator's approval (`hpops adopt` records one); (enrolled?, what happened, in one line)."""
        if self.proof is None:
            return False, "no NodeChannel configured (agent.json nodeChannel): nothing to enroll with"
        try:
            node = self.identity()
            if node.role not in ("login", "controller"):
                return True, "{} node: its agent does not enroll".format(node.role)
            instance_id = node.instance_id if node.role == "login" else self.usage_collector().instance_id
            if instance_id is None:
                return False, "this node's instance id is unknown (resource_config.json, IMDS)"
            enrolled = self.proof.ensure_enrolled(instance_id, node.ip, force=True)
        except (IdentityError, agent_key.AgentKeyError, NodeIdentityError, OSError, ValueError) as error:
            return False, short(str(error))
        except AWS_ERRORS as error:
            return False, aws_reason("lambda:Invoke", error)
        if enrolled:
            return True, "enrolled {} ({})".format(instance_id, self.proof.state.get("via") or "already")
        return False, "refused for {}: {}".format(instance_id, self.proof.state.get("refusal") or "see the log")

    def _fetch(self, item: str) -> Optional[dict]:
        """One NodeChannel fetch of ``item`` for this node, signed by the enrolled key (fetch_client)."""
        if self.proof is None:
            raise fetch_client.FetchFailed("no NodeChannel configured (agent.json nodeChannel): secrets and "
                                           "instructions reach only an enrolled agent")
        try:
            node = self.identity()
            instance_id = node.instance_id if node.role == "login" else self.usage_collector().instance_id
            if instance_id is None or not self.proof.ensure_enrolled(instance_id, node.ip):
                raise fetch_client.FetchFailed("this agent's key is not enrolled yet")
        except (IdentityError, agent_key.AgentKeyError, NodeIdentityError, OSError, ValueError) as error:
            raise fetch_client.FetchFailed(short(str(error))) from None
        except AWS_ERRORS as error:
            raise fetch_client.FetchFailed(aws_reason("lambda:Invoke", error)) from None
        # The wall clock, as for enrollment: NodeChannel compares issuedAt with its own.
        return fetch_client.fetch(self.proof, instance_id, [item], self.proof.clock())[item]

    def _instruction(self, kind: fetch_client.Instructions, marker: Optional[dict]) -> Optional[str]:
        """The instruction to act on: fetched when the marker moved; the last one fetched if that failed."""
        try:
            return kind.current(marker["Value"] if marker else None)
        except fetch_client.FetchFailed as error:
            self._log_once("fetch:" + kind.item, "fetch-failed", {"item": kind.item, "reason": short(str(error))})
            return kind.value

    def _install_args(self, mode: str) -> Namespace:
        return Namespace(mode=mode, ssh_keygen_cmd=self.config.ssh_keygen_cmd, sshd_cmd=self.config.sshd_cmd,
                         reload_cmd=self.config.reload_cmd)

    def _load_state(self) -> Dict[str, Any]:
        try:
            with open(self.state_path, "r", encoding="utf-8") as handle:
                state = json.load(handle)
            return state if isinstance(state, dict) else {}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as error:
            log("state-unreadable", path=self.state_path, reason=type(error).__name__)
            return {}

    def _save_state(self) -> None:
        text = json.dumps(self.state, sort_keys=True)
        if text == self._saved_state_text:
            return
        directory = os.path.dirname(self.state_path)
        try:
            os.makedirs(directory, mode=0o700, exist_ok=True)
            host_keys.atomic_write(self.state_path, text.encode("utf-8"), 0o600)
            self._saved_state_text = text
        except OSError as error:
            log("state-not-saved", path=self.state_path, reason=short(error.strerror or str(error)))

    def _log_once(self, key: str, event: str, value: Dict[str, Any]) -> None:
        """Log an outcome when it differs from the previous tick's, or whenever something changed."""
        if value.get("result") == "changed" or self._last_logged.get(key) != value:
            fields = {k: v for k, v in value.items() if k != "publicKeys"}
            log(event, **fields)
        self._last_logged[key] = value

    # ------------------------------------------------------------------ the loop

    def run(self, stop: threading.Event) -> None:
        role = self.identity().role
        if role == "compute":
            log("idle", role=role, reason="compute node: nothing to do")
            return
        if role == "controller":
            if not self.config.usage_seconds:
                log("idle", role=role, reason="controller: Slurm usage collection is off (usageSeconds 0)")
                return
            self.run_usage(stop)
            return
        log("started", role=role, agentVersion=__version__, pollSeconds=self.config.poll_seconds,
            instanceId=self.identity().instance_id, ip=self.identity().ip)
        while not stop.is_set():
            try:
                self.tick()
            except Exception as error:  # a bug must not end the loop; systemd would only restart it
                log("tick-crashed", reason=short("{}: {}".format(type(error).__name__, error)))
            stop.wait(self.next_interval())
        log("stopped", reason="stop requested")

    def run_usage(self, stop: threading.Event) -> None:
        log("started", role="controller", agentVersion=__version__, usageSeconds=self.config.usage_seconds)
        usage_due = 0.0
        while not stop.is_set():
            if self.clock() >= usage_due:
                usage_due = self.clock() + self.config.usage_seconds
                try:
                    self.usage_tick()
                except Exception as error:  # a bug must not end the loop; systemd would only restart it
                    log("usage-crashed", reason=short("{}: {}".format(type(error).__name__, error)))
            # Holds are polled like login nodes poll their desired state: a hold lands within a poll.
            try:
                self.holds_tick()
            except Exception as error:
                log("holds-crashed", reason=short("{}: {}".format(type(error).__name__, error)))
            stop.wait(min(self.next_interval(), max(0.0, usage_due - self.clock())))
        log("stopped", reason="stop requested")

    def next_interval(self) -> float:
        # Jitter spreads a fleet's polls so they do not hit Parameter Store in lockstep.
        return self.config.poll_seconds * random.uniform(1 - JITTER, 1 + JITTER)

    def tick(self) -> TickOutcome:
        self._calls = collections.Counter()
        now = self.clock()
        try:
            node = self.identity()
        except IdentityError as error:
            log("identity-failed", reason=short(str(error)))
            return TickOutcome(role="unknown", error=short(str(error)))
        if node.role != "login":
            return TickOutcome(role=node.role)
        cluster = self.config.cluster
        names = {
            "host": contract.host_identity_parameter(cluster),
            "limits": contract.login_limits_parameter(cluster),
            "certificate": contract.certificate_parameter(cluster, node.instance_id),
            "endSessions": contract.instruction_marker_parameter(contract.end_sessions_parameter(cluster, node.instance_id)),
            "userCaps": contract.user_caps_parameter(cluster),
            "keepalive": contract.ssh_keepalive_parameter(cluster),
            "slots": contract.login_slots_parameter(cluster),
            "leave": contract.leave_notices_parameter(cluster),
        }
        try:
            response = self._call("ssm", "GetParameters", "get_parameters", Names=list(names.values()))
        except AWS_ERRORS as error:
            reason = aws_reason("ssm:GetParameters", error)
            log("poll-failed", reason=reason)
            return TickOutcome(role=node.role, api_calls=dict(self._calls), error=reason)
        found = {parameter["Name"]: parameter for parameter in response.get("Parameters", [])}

        host = self._host_identity(found.get(names["host"]), found.get(names["certificate"]), now)
        limits = self._login_limits(found.get(names["limits"]))
        self._log_once("host", "host-identity", host)
        self._log_once("limits", "login-limits", limits)

        report = self._report(node, host, limits)
        end = self._instruction(self._end_sessions, found.get(names["endSessions"]))
        sessions, self.state["sessionsEnded"] = ssh_sessions.report_section(
            end, self.state.get("sessionsEnded") or {}, Path(self.config.under_root("/proc")))
        if sessions is not None:
            report["sessions"] = sessions
        imds = self.imds_section(now)
        if imds is not None:
            report["imds"] = imds
        report["load"] = node_load.load_section(Path(self.config.under_root("/proc")))
        caps = self._user_caps(found.get(names["userCaps"]))
        if caps is not None:
            report["userCaps"] = caps
            self._log_once("caps", "user-caps", caps)
        keepalive = self._ssh_keepalive(found.get(names["keepalive"]))
        if keepalive is not None:
            report["sshKeepalive"] = keepalive
            self._log_once("keepalive", "ssh-keepalive", keepalive)
        self._log_once("slot", "login-slot", self._login_slot(found.get(names["slots"]), node.ip))
        self._log_once("leave", "leave-notice", self._leave_notice(found.get(names["leave"]), node.instance_id))
        changed = host["result"] == "changed" or limits["result"] == "changed"
        digest = report_digest(report)
        trigger = choose_trigger(self._pending_start, changed, digest, self.state, now,
                                 self.config.heartbeat_seconds)
        sent = False
        if trigger is not None:
            report["trigger"] = trigger
            sent = self._send(report)
            if sent:
                self._pending_start = False
                self.state["lastReportDigest"] = digest
                self.state["lastReportAt"] = now
        self._save_state()
        return TickOutcome(role=node.role, host_identity=host, login_limits=limits, report_sent=sent,
                           trigger=trigger, api_calls=dict(self._calls))

    # ------------------------------------------------------------------ host identity

    def _host_identity(self, parameter: Optional[dict], certificate: Optional[dict], now: float) -> Dict[str, Any]:
        if parameter is None:
            return section("off", None, "waiting", "no host-identity parameter published yet",
                           fingerprints=self._local_fingerprints())
        try:
            document = json.loads(parameter["Value"])
            if not isinstance(document, dict) or document.get("format") != contract.HOST_IDENTITY_FORMAT:
                raise ValueError("format is not {}".format(contract.HOST_IDENTITY_FORMAT))
            mode, version = document.get("mode"), document.get("version")
            if mode not in contract.MODES:
                raise ValueError("unknown mode")
            if not isinstance(version, str) or not VERSION_RE.match(version):
                raise ValueError("version is not a version string")
        except (ValueError, TypeError) as error:
            return section("off", None, "failed", "desired host identity is malformed: {}".format(error),
                           fingerprints=self._local_fingerprints())
        if mode == "keys":
            return self._keys_mode(document, version, now)
        if mode == "certificate":
            return self._certificate_mode(document, version, certificate, now)
        return section("off", version, "waiting", "host identity mode is off; nothing to converge to",
                       fingerprints=self._local_fingerprints())

    def _local_fingerprints(self) -> Dict[str, str]:
        """Fingerprints of the .pub files sshd's keys came with (cheap; no subprocess)."""
        fingerprints = {}
        for name, key_type in host_keys.KEY_TYPES.items():
            try:
                with open(self.layout.public_key(name), "r", encoding="ascii", errors="replace") as handle:
                    blob = host_keys.parse_public_line(handle.read(), key_type, name)
            except (OSError, host_keys.InstallError):
                continue
            if os.path.exists(self.layout.private_key(name)):
                fingerprints[key_type] = host_keys.fingerprint(blob)
        return fingerprints

    def _keys_mode(self, document: dict, version: str, now: float) -> Dict[str, Any]:
        desired, secret_arn = document.get("fingerprints"), document.get("secretArn")
        if not isinstance(desired, dict) or not desired or not isinstance(secret_arn, str) or not secret_arn:
            return section("keys", version, "waiting", "no shared host keys initialised yet",
                           fingerprints=self._local_fingerprints())
        local = self._local_fingerprints()
        if local == desired:
            self._clear_backoff("keys:")
            return section("keys", version, "unchanged", "presenting version {}".format(version), fingerprints=local)
        key = "keys:" + version
        held = backoff_active(self.state, key, now)
        if held:
            return section("keys", version, "failed", held, fingerprints=local)
        # The node role cannot read the secret: only this node's enrolled agent gets it, from NodeChannel.
        try:
            fetched = self._fetch(fetch_client.HOST_KEYS)
        except fetch_client.FetchFailed as error:
            return section("keys", version, "failed", short(str(error)), fingerprints=local)
        secret_text = fetched.get("value") if isinstance(fetched, dict) else None
        if not isinstance(secret_text, str):
            return self._failed("keys", version, key, now, "NodeChannel returned no host keys", local)
        try:
            entries = host_keys.parse_key_bundle(secret_text)
        except host_keys.InstallError as error:
            return self._failed("keys", version, key, now, str(error), local)
        offered = {host_keys.KEY_TYPES[name]: host_keys.fingerprint(entry[2]) for name, entry in entries.items()}
        if offered != desired:
            return section("keys", version, "waiting",
                           "the secret holds other keys than version {} (rotation in flight)".format(version),
                           fingerprints=local)
        summary: Dict[str, Any] = {}
        try:
            host_keys.install_bundle(self._install_args("keys"), self.layout, secret_text, summary)
        except host_keys.InstallError as error:
            return self._failed("keys", version, key, now, str(error), self._local_fingerprints())
        except OSError as error:
            reason = "local error: {}: {}".format(error.strerror, error.filename)
            return self._failed("keys", version, key, now, reason, self._local_fingerprints())
        self._clear_backoff("keys:")
        result = summary["result"]
        reason = ("installed version {} ({} files)".format(version, len(summary.get("files", [])))
                  if result == "changed" else "presenting version {}".format(version))
        return section("keys", version, result, reason, fingerprints=self._local_fingerprints())

    def _failed(self, mode: str, version: str, key: str, now: float, reason: str, fingerprints: Dict[str, str],
                **extra: Any) -> Dict[str, Any]:
        reason = short(reason)
        self.state["backoff"] = {"key": key, "at": now, "reason": reason}
        return section(mode, version, "failed", reason, fingerprints=fingerprints, **extra)

    def _clear_backoff(self, prefix: str) -> None:
        if (self.state.get("backoff") or {}).get("key", "").startswith(prefix):
            self.state.pop("backoff", None)

    def _own_public_keys(self) -> Dict[str, Any]:
        """host_keys' report-public-keys (ssh-keygen -y per key), rerun only when a key file changed."""
        signature = []
        for name in host_keys.KEY_TYPES:
            try:
                info = os.stat(self.layout.private_key(name))
                signature.append((name, info.st_ino, info.st_mtime_ns, info.st_size))
            except FileNotFoundError:
                signature.append((name, None))
        if self._public_keys_cache is None or self._public_keys_cache[0] != signature:
            result = host_keys.report_public_keys(self._install_args("report-public-keys"), self.layout)
            self._public_keys_cache = (signature, result)
        return self._public_keys_cache[1]

    def _certificate_mode(self, document: dict, version: str, certificate: Optional[dict],
                          now: float) -> Dict[str, Any]:
        try:
            own = self._own_public_keys()
        except host_keys.InstallError as error:
            return section("certificate", version, "failed", str(error), fingerprints=self._local_fingerprints())
        installed_version = self.state.get("certificateVersion")
        base = {"fingerprints": own["fingerprints"], "publicKeys": own["public_keys"],
                "certificateVersion": installed_version, "certificateDigest": self.state.get("certificateDigest")}
        ca = document.get("caFingerprint")
        if not isinstance(ca, str) or not ca:
            return section("certificate", version, "waiting", "no certificate authority initialised yet", **base)
        current = installed_version is not None and self.state.get("certificateCa") == ca
        if certificate is None:
            if current and self._certificate_files_present():
                return section("certificate", version, "unchanged",
                               "presenting certificate version {}".format(installed_version), **base)
            return section("certificate", version, "waiting",
                           "waiting for the signer to certify this node's public keys", **base)
        parameter_version = int(certificate.get("Version") or 0)
        text = certificate.get("Value") or ""
        # The stack deletes a node's parameter once installed, so a later renewal may come back as
        # version 1 again: the content, not the version alone, says whether it is new.
        digest = contract.certificate_digest(text)
        if (current and parameter_version == installed_version and self.state.get("certificateDigest") == digest
                and self._certificate_files_present()):
            return section("certificate", version, "unchanged",
                           "presenting certificate version {}".format(installed_version), **base)
        key = "certificate:{}:{}".format(version, parameter_version)
        held = backoff_active(self.state, key, now)
        if held:
            return section("certificate", version, "failed", held, **base)
        try:
            ca_blob, _ = host_keys.parse_certificate_bundle(text)
        except host_keys.InstallError as error:
            return self._failed("certificate", version, key, now, str(error), base.pop("fingerprints"), **base)
        if host_keys.fingerprint(ca_blob) != ca:
            return section("certificate", version, "waiting",
                           "the certificate parameter is from another CA than desired (re-signing in flight)",
                           **base)
        summary: Dict[str, Any] = {}
        try:
            host_keys.install_bundle(self._install_args("certificate"), self.layout, text, summary)
        except host_keys.InstallError as error:
            return self._failed("certificate", version, key, now, str(error), base.pop("fingerprints"), **base)
        except OSError as error:
            reason = "local error: {}: {}".format(error.strerror, error.filename)
            return self._failed("certificate", version, key, now, reason, base.pop("fingerprints"), **base)
        self._clear_backoff("certificate:")
        self.state["certificateVersion"] = parameter_version
        self.state["certificateDigest"] = digest
        self.state["certificateCa"] = ca
        base["certificateVersion"] = parameter_version
        base["certificateDigest"] = digest
        return section("certificate", version, summary["result"],
                       "installed certificate version {}".format(parameter_version), **base)

    def _certificate_files_present(self) -> bool:
        own = self._public_keys_cache[1]["public_keys"] if self._public_keys_cache else {}
        return bool(own) and all(os.path.exists(self.layout.certificate(name)) for name in own)

    # ------------------------------------------------------------------ login limits

    def _login_limits(self, parameter: Optional[dict]) -> Dict[str, Any]:
        if parameter is None:
            return {"version": None, "result": "waiting", "reason": "no login-limits parameter published yet"}
        version = None
        try:
            document = json.loads(parameter["Value"])
            if not isinstance(document, dict) or document.get("format") != contract.LOGIN_LIMITS_FORMAT:
                raise ValueError("format is not {}".format(contract.LOGIN_LIMITS_FORMAT))
            version = document.get("version")
            if not isinstance(version, str) or not VERSION_RE.match(version):
                version = None
                raise ValueError("version is not a version string")
            if "limits" not in document:
                raise ValueError("no limits")
            limits = login_limits.parse_limits(json.dumps(document["limits"]))
        except (ValueError, TypeError) as error:  # login_limits.BadInput is a ValueError
            return {"version": version, "result": "failed", "reason": short("limits refused: {}".format(error))}
        try:
            result = login_limits.apply(Path(self.config.root), limits)
        except OSError as error:
            return {"version": version, "result": "failed",
                    "reason": short("cannot write limits: {}".format(error.strerror))}
        return {"version": version, "result": result,
                "reason": short("maxlogins default {}, {} override(s), {} exempt".format(
                    limits["default"], len(limits["overrides"]), len(limits["exempt"])))}

    def _user_caps(self, parameter: Optional[dict]) -> Optional[Dict[str, Any]]:
        """Per-user CPU/memory/task caps (user_caps.py); None while caps were never on here."""
        try:
            caps = user_caps.caps_of_document(json.loads(parameter["Value"])) if parameter else None
        except (ValueError, TypeError) as error:  # BadCaps is a ValueError: nothing written
            return {"result": "failed", "reason": short("caps refused: {}".format(error))}
        # systemd reads the drop-ins at daemon-reload; another root has no systemd of its own to tell.
        reload_cmd = (shlex.split(self.config.daemon_reload_cmd) if self.config.daemon_reload_cmd else
                      ["systemctl", "daemon-reload"] if self.config.root == "/" else None)
        try:
            outcome = user_caps.apply(Path(self.config.root), caps, reload_cmd=reload_cmd)
        except (OSError, subprocess.SubprocessError) as error:
            return {"result": "failed", "reason": short("cannot apply caps: {}".format(error))}
        if caps is None and outcome["result"] == "unchanged":
            return None
        section = {"result": outcome["result"], "reason": short(str(outcome["reason"]))}
        if caps is not None:
            # Who reached a cap since the last poll (their slice's counters rose): shown by `hpops status`.
            section["atCap"], self.state["capCounters"] = user_caps.users_at_cap(
                Path(self.config.under_root("/sys/fs/cgroup")), self.state.get("capCounters") or {})
        return section

    # ------------------------------------------------------------------ IMDS exposure

    def imds_section(self, now: float) -> Optional[Dict[str, Any]]:
        """Can a non-root process on this node take the role from IMDS? Probed once per heartbeat."""
        if not self.config.imds_probe:
            return None
        if self._imds is None or now - self._imds_at >= self.config.heartbeat_seconds:
            result, reason = self._imds_probe(self.config.imds_probe)
            self._imds = {"nonRoot": result, "reason": short(reason), "lockdown": self.config.imds_lockdown}
            self._imds_at = now
            self._log_once("imds", "imds-exposure", self._imds)
        return dict(self._imds)

    def _ssh_keepalive(self, parameter: Optional[dict]) -> Optional[Dict[str, Any]]:
        """sshd keepalives under the listener's idle timeout; None before a stack publishes one."""
        if parameter is None:
            return None
        try:
            timeout = ssh_keepalive.parse_document(parameter["Value"])
        except ssh_keepalive.BadKeepalive as error:
            return {"result": "failed", "reason": short("keepalive refused: {}".format(error))}
        outcome = sshd_keepalive.apply(self.config.root, timeout, self.config.sshd_cmd, self.config.reload_cmd)
        return dict(outcome, reason=short(outcome["reason"]))

    def _leave_notice(self, parameter: Optional[dict], instance_id: Optional[str]) -> Dict[str, Any]:
        """While the stack says this node leaves rotation, each session's terminal is told once."""
        if instance_id is None:
            return {"result": "waiting", "reason": "no instance id"}
        section, self.state["leaveNotice"] = leave_notice.converge(
            parameter["Value"] if parameter else None, instance_id, self.state.get("leaveNotice") or {},
            Path(self.config.under_root("/proc")), Path(self.config.under_root("/dev")))
        return dict(section, reason=short(str(section["reason"])))

    def _login_slot(self, parameter: Optional[dict], ip: str) -> Dict[str, Any]:
        """The login message naming this node's slot (LoginNodeSlots); removed when it has none."""
        try:
            found = login_slots.slot_of(parameter["Value"], ip) if parameter else None
        except login_slots.BadSlots as error:
            return {"result": "failed", "reason": short("slots refused: {}".format(error))}
        path = Path(self.config.under_root("/" + LOGIN_SLOT_SCRIPT))
        if found is None:
            if path.exists():
                path.unlink()
                return {"result": "changed", "reason": "no slot: login message removed"}
            return {"result": "unchanged", "reason": "no slot"}
        line = login_slots.login_line(*found)
        wanted = ("# Managed by hpops-node-agent: this login node's slot (LoginNodeSlots).\n"
                  "case $- in *i*) echo {} ;; esac\n".format(shlex.quote(line))).encode()
        try:
            if path.exists() and path.read_bytes() == wanted:
                return {"result": "unchanged", "reason": line}
            if not path.parent.is_dir():
                try:
                    path.parent.mkdir(mode=0o755, parents=True)
                except OSError as error:
                    if error.errno not in (errno.EROFS, errno.EACCES):
                        raise
                    # The unit may write there only where it exists (ReadWritePaths=-/etc/profile.d).
                    return {"result": "unchanged", "reason": "no {} on this node, and the service may not create "
                                                             "it: no login message".format(path.parent)}
            host_keys.atomic_write(str(path), wanted, 0o644)
        except OSError as error:
            return {"result": "failed", "reason": short("cannot write {}: {}".format(path, error.strerror))}
        return {"result": "changed", "reason": line}

    # ------------------------------------------------------------------ report

    def _report(self, node: NodeIdentity, host: Dict[str, Any], limits: Dict[str, Any]) -> Dict[str, Any]:
        return {
            "format": contract.REPORT_FORMAT,
            "cluster": self.config.cluster,
            "instanceId": node.instance_id,
            "ip": node.ip,
            "role": node.role,
            "agentVersion": __version__,
            "reportedAt": datetime.datetime.fromtimestamp(self.clock(), datetime.timezone.utc)
            .isoformat(timespec="seconds"),
            "trigger": None,
            "hostIdentity": host,
            "loginLimits": limits,
        }

    def _send(self, report: Dict[str, Any]) -> bool:
        node = self.identity()
        signed = self.signed(report, node.instance_id, node.ip)
        if signed is None:
            log("report-not-sent", trigger=report["trigger"], reason="this agent's key is not enrolled yet")
            return False
        detail = json.dumps(signed, sort_keys=True, separators=(",", ":"))
        if len(detail.encode("utf-8")) > contract.MAX_REPORT_BYTES:
            log("report-too-large", bytes=len(detail.encode("utf-8")))
        entry = {"Source": contract.REPORT_SOURCE, "DetailType": contract.REPORT_DETAIL_TYPE,
                 "Detail": detail, "EventBusName": self.config.report_bus}
        try:
            response = self._call("events", "PutEvents", "put_events", Entries=[entry])
        except AWS_ERRORS as error:
            log("report-not-sent", trigger=report["trigger"], reason=aws_reason("events:PutEvents", error))
            return False
        if response.get("FailedEntryCount"):
            failed = (response.get("Entries") or [{}])[0]
            log("report-not-sent", trigger=report["trigger"],
                reason=short("events:PutEvents: {}".format(failed.get("ErrorCode", "entry failed"))))
            return False
        log("report-sent", trigger=report["trigger"], hostIdentity=report["hostIdentity"]["result"],
            version=report["hostIdentity"]["version"], loginLimits=report["loginLimits"]["result"])
        return True

    # ------------------------------------------------------------------ Slurm usage (controller)

    def usage_collector(self) -> usage.UsageCollector:
        if self._usage is None:
            self._usage = usage.UsageCollector(
                self.config.cluster, None,
                state_path=os.path.join(self.config.under_root(self.config.state_dir), usage.STATE_FILE),
                sacct_cmd=self.config.sacct_cmd, agent_version=__version__, clock=self.clock, log=log,
                partition_reader=self.read_partition_groups)
        if self._usage.instance_id is None:  # asked again until known (IMDS may not answer at boot)
            self._usage.instance_id = usage.reporting_instance_id(self.config, log=log)
        return self._usage

    def read_partition_groups(self) -> usage.PartitionGroups:
        """Partitions -> instance groups however the cluster was provisioned (cluster_layout.py)."""
        describe = describe_groups_with(lambda: self.session, self.config)
        return usage.layout_partition_groups(*read_layout(self.config, describe, for_partitions=True))

    def usage_switched_off(self) -> bool:
        """The stack's switch (UserSpendEnabled): "off" means collect nothing. A read that fails
        collects anyway: a window sent for nothing costs less than one lost."""
        name = user_holds.user_spend_parameter(self.config.cluster)
        try:
            response = self._call("ssm", "GetParameters", "get_parameters", Names=[name])
        except AWS_ERRORS as error:
            log("usage-switch-unread", reason=aws_reason("ssm:GetParameters", error))
            return False
        off = any(p.get("Name") == name and p.get("Value") == user_holds.USER_SPEND_OFF
                  for p in response.get("Parameters", []))
        if off or "usage-switch" in self._last_logged:  # on is the usual case: logged only as a change back
            self._log_once("usage-switch", "usage-switch", {"collect": not off, "parameter": name})
        return off

    def usage_tick(self) -> UsageOutcome:
        """Collect the due windows and send each; a window not sent is collected again next time."""
        self._calls = collections.Counter()
        outcome = UsageOutcome()
        if self.usage_switched_off():
            outcome.switched_off = True
            outcome.api_calls = dict(self._calls)
            return outcome

        def ship(parts: list) -> bool:
            sent = self._send_usage(parts)
            outcome.windows_sent += int(sent)
            return sent

        # The stack's word, in this agent's own enroll answer, that a replaced key's windows were voided.
        recollect = self.proof.state.get("recollectFrom") if self.proof is not None else None
        outcome.reports = self.usage_collector().run_once(ship, recollect)
        for report in outcome.reports:
            log("usage-collected", windowStart=report["windowStart"], final=report["final"],
                status=report["status"], reason=report["reason"], records=len(report["records"]),
                skipped=report["skipped"], sacctSeconds=report["sacctSeconds"])
        outcome.api_calls = dict(self._calls)
        return outcome

    def _send_usage(self, parts: list) -> bool:
        """All parts of one window, in as few PutEvents calls as EventBridge's limits allow."""
        batches: list = []
        batch_bytes = 0
        for part in parts:
            part = self._signed_controller_report(part)
            if part is None:
                log("usage-not-sent", windowStart=parts[0]["windowStart"], reason="this agent's key is not enrolled yet")
                return False
            entry = {"Source": contract.REPORT_SOURCE, "DetailType": contract.USAGE_DETAIL_TYPE,
                     "Detail": usage.encoded(part), "EventBusName": self.config.report_bus}
            size = sum(len(entry[key].encode("utf-8")) for key in ("Source", "DetailType", "Detail"))
            if not batches or len(batches[-1]) == PUT_EVENTS_MAX_ENTRIES or batch_bytes + size > PUT_EVENTS_MAX_BYTES:
                batches.append([])
                batch_bytes = 0
            batches[-1].append(entry)
            batch_bytes += size
        window = parts[0]["windowStart"]
        for batch in batches:
            try:
                response = self._call("events", "PutEvents", "put_events", Entries=batch)
            except AWS_ERRORS as error:
                log("usage-not-sent", windowStart=window, reason=aws_reason("events:PutEvents", error))
                return False
            if response.get("FailedEntryCount"):
                failed = [entry for entry in response.get("Entries") or [] if entry.get("ErrorCode")] or [{}]
                log("usage-not-sent", windowStart=window,
                    reason=short("events:PutEvents: {}".format(failed[0].get("ErrorCode", "entry failed"))))
                return False
        return True

    def _signed_controller_report(self, detail: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        if self.proof is None:
            return detail
        try:
            ip = self.identity().ip
        except IdentityError as error:
            log("identity-failed", reason=short(str(error)))
            return None
        return self.signed(detail, detail.get("instanceId"), ip)

    # ------------------------------------------------------------------ Slurm holds (controller)

    def slurm_holds(self) -> Optional[slurm_holds.SlurmHolds]:
        if self._holds is None:
            sacct = usage.find_sacct(self.config.sacct_cmd)
            if sacct is None:
                return None
            self._holds = slurm_holds.SlurmHolds(
                os.path.join(self.config.under_root(self.config.state_dir), slurm_holds.STATE_FILE),
                os.path.dirname(sacct), log=log)
        return self._holds

    def holds_tick(self) -> Optional[Dict[str, Any]]:
        """Poll the holds parameter, converge Slurm to it, report when the outcome changed (or heartbeat)."""
        self._calls = collections.Counter()
        holds = self.slurm_holds()
        if holds is None:
            return None
        name = contract.instruction_marker_parameter(user_holds.user_holds_parameter(self.config.cluster))
        try:
            response = self._call("ssm", "GetParameters", "get_parameters", Names=[name])
        except AWS_ERRORS as error:
            log("holds-poll-failed", reason=aws_reason("ssm:GetParameters", error))
            return None
        found = [p for p in response.get("Parameters", []) if p.get("Name") == name]
        try:
            # Only a list this agent fetched with its key counts; the marker just says when to fetch.
            document = self._user_holds.current(found[0]["Value"] if found else None)
        except fetch_client.FetchFailed as error:
            # Not fetched: change no hold this pass (a failed fetch must neither hold nor lift anyone).
            self._log_once("fetch:holds", "fetch-failed", {"item": "userHolds", "reason": short(str(error))})
            return None
        now = self.clock()
        body = holds.converge(document, now)
        imds = self.imds_section(now)
        # A change of the probe's answer is a change to report, like a change of the holds applied.
        sent = body if imds is None else dict(body, imds=imds)
        digest = hashlib.sha256(json.dumps(sent, sort_keys=True).encode("utf-8")).hexdigest()
        sent_at = float(holds.state.get("lastReportAt") or 0)
        if digest == holds.state.get("lastReportDigest") and now - sent_at < self.config.heartbeat_seconds:
            return body
        instance_id = self.usage_collector().instance_id
        if instance_id is None:
            return body
        report = dict(sent, format=user_holds.HOLDS_REPORT_FORMAT, cluster=self.config.cluster,
                      instanceId=instance_id, agentVersion=__version__,
                      reportedAt=datetime.datetime.fromtimestamp(now, datetime.timezone.utc)
                      .strftime("%Y-%m-%dT%H:%M:%SZ"))
        report = self._signed_controller_report(report)
        if report is None:
            log("holds-report-not-sent", reason="this agent's key is not enrolled yet")
            return body
        entry = {"Source": contract.REPORT_SOURCE, "DetailType": user_holds.HOLDS_DETAIL_TYPE,
                 "Detail": json.dumps(report, sort_keys=True, separators=(",", ":")),
                 "EventBusName": self.config.report_bus}
        try:
            response = self._call("events", "PutEvents", "put_events", Entries=[entry])
        except AWS_ERRORS as error:
            log("holds-report-not-sent", reason=aws_reason("events:PutEvents", error))
            return body
        if response.get("FailedEntryCount"):
            log("holds-report-not-sent", reason="events:PutEvents: entry failed")
            return body
        log("holds-report-sent", version=body["version"], enforced=body["enforced"],
            held=[u["user"] for u in body["users"] if u["state"] == user_holds.HELD],
            failed=[u["user"] for u in body["users"] if u["state"] != user_holds.HELD])
        holds.state["lastReportDigest"], holds.state["lastReportAt"] = digest, now
        holds.save()
        return body
