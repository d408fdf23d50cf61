"""`hpops adopt`: put the node agent on nodes that already run, without re-imaging them.

HyperPod runs on_create.sh once, when it creates a node. Nodes created before the install line was
in it get the agent otherwise only from UpdateClusterSoftware, which re-images them (users lose their
sessions and local files). Adopt runs the bundle's installer once on each Running node of the login
and controller groups, through Session Manager, the one way AWS offers into a HyperPod node
(SendCommand does not reach them; they are not the account's managed instances):

    aws ssm start-session --target sagemaker-cluster:<cluster-id>_<group>-<instance-id> \
        --document-name AWS-StartNonInteractiveCommand --parameters command=[<install command>]

The install command copies the bundle from the group's lifecycle prefix (where step 5 of the README's
Deploy put it) and runs install.sh, as on_create.sh would; nothing else on the node changes, so open
SSH and Session Manager sessions keep running. It then prints the agent's own key fingerprint, when
the agent has one, for an operator approval of nodes enrolled long after their launch (APPROVE).

UNCONFIRMED: that HyperPod targets accept AWS-StartNonInteractiveCommand (AWS documents interactive
sessions to them); that the session's user may sudo (with Run As on, it is the operator's POSIX user);
that the nodes' AWS CLI and role can read the lifecycle bucket (HyperPod's own lifecycle download
needs that read). When a session is refused, `--print` shows each node's command to run in a shell.

A node left without an agent is kept out of the target group (no report, nothing verified), named in
an alert and by `hpops doctor` (agent-reports); no node is ever re-imaged or restarted by this.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import shlex
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

DOCUMENT = "AWS-StartNonInteractiveCommand"
SESSION_TIMEOUT_SECONDS = 600
# Where the agent keeps its own key (node/hpops_node_agent/agent_key.py where node enrollment is in):
# adopt prints its fingerprint for an approval, and prints nothing on agents without one.
AGENT_KEY = "/var/lib/hpops-node-agent/agent-key.pub"
FINGERPRINT_MARK = "hpops-agent-key:"
_FINGERPRINT = re.compile(re.escape(FINGERPRINT_MARK) + r"\s+\d+\s+(SHA256:[A-Za-z0-9+/=]+)")
# An agent that reported this recently at this release's version is already installed: left alone.
REPORT_MAX_AGE = dt.timedelta(minutes=25)


@dataclass(frozen=True)
class Adoption:
    group: str
    instance_id: str
    target: str  # the Session Manager target
    command: str  # what runs on the node
    skip: str = ""  # why the node is left alone ("" to adopt it)


@dataclass(frozen=True)
class Outcome:
    adoption: Adoption
    status: str  # adopted | failed | skipped
    detail: str
    fingerprint: str | None = None  # the agent key's, for an enrollment approval


def target_of(cluster_id: str, group: str, instance_id: str) -> str:
    return f"sagemaker-cluster:{cluster_id}_{group}-{instance_id}"


def install_command(lifecycle_uri: str) -> str:
    """Copy the bundle (and provisioning_parameters.json, when the prefix has one) from the lifecycle
    prefix into a fresh folder and run install.sh as on_create.sh would, as root."""
    prefix = lifecycle_uri.rstrip("/") + "/"
    script = ('set -e; d=$(mktemp -d); '
              f'aws s3 cp --quiet --recursive {shlex.quote(prefix + "hpops")} "$d/hpops"; '
              f'aws s3 cp --quiet {shlex.quote(prefix + "provisioning_parameters.json")} "$d/" 2>/dev/null || true; '
              'HPOPS_REQUIRED=1 bash "$d/hpops/install.sh"; '
              f'ssh-keygen -lf {AGENT_KEY} 2>/dev/null | sed "s/^/{FINGERPRINT_MARK} /" || true')
    return f"sudo bash -c {shlex.quote(script)}"


def plan(cluster: Mapping[str, Any], nodes: Iterable[Mapping[str, Any]], groups: Sequence[str],
         reports: Mapping[str, Mapping[str, Any]], agent_version: str, now: dt.datetime) -> list[Adoption]:
    """Pure. ``cluster``: DescribeCluster; ``nodes``: ListClusterNodes summaries; ``groups``: the agent's
    groups (login, controller); ``reports``: instance id -> the agent's latest report (login nodes)."""
    cluster_id = cluster["ClusterArn"].rsplit("/", 1)[-1]
    lifecycle = {g["InstanceGroupName"]: (g.get("LifeCycleConfig") or {}).get("SourceS3Uri", "")
                 for g in cluster.get("InstanceGroups", [])}
    adoptions = []
    for node in sorted(nodes, key=lambda n: (n["InstanceGroupName"], n["InstanceId"])):
        group, instance = node["InstanceGroupName"], node["InstanceId"]
        if group not in groups or node["InstanceStatus"]["Status"] != "Running":
            continue
        report = reports.get(instance) or {}
        received = report.get("receivedAt")
        fresh = bool(received) and now - dt.datetime.fromisoformat(received.replace("Z", "+00:00")) <= REPORT_MAX_AGE
        skip = ""
        if fresh and report.get("agentVersion") == agent_version:
            skip = f"its agent {agent_version} reports"
        elif not lifecycle.get(group, "").startswith("s3://"):
            skip = f"group {group} has no LifeCycleConfig.SourceS3Uri to take the bundle from"
        adoptions.append(Adoption(group, instance, target_of(cluster_id, group, instance),
                                  install_command(lifecycle.get(group, "")), skip))
    return adoptions


Runner = Callable[[str, str], "tuple[int, str]"]


def session_runner(region: str, aws: str = "aws") -> Runner:
    """Runs a command on a node through the AWS CLI's start-session (it needs the Session Manager plugin:
    the data channel is a websocket the plugin speaks; boto3's StartSession alone runs nothing)."""
    def run(target: str, command: str) -> tuple[int, str]:
        argv = [aws, "ssm", "start-session", "--region", region, "--target", target, "--document-name", DOCUMENT,
                "--parameters", json.dumps({"command": [command]})]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=SESSION_TIMEOUT_SECONDS, check=False)
        except FileNotFoundError:
            return 127, f"{aws} not found: install the AWS CLI v2 and the Session Manager plugin"
        except subprocess.TimeoutExpired:
            return 124, f"no answer in {SESSION_TIMEOUT_SECONDS} s"
        return done.returncode, (done.stdout + done.stderr)
    return run


def adopt(adoptions: Sequence[Adoption], run: Runner) -> list[Outcome]:
    """Each node's install, one after the other (a failure on one does not stop the others)."""
    outcomes = []
    for adoption in adoptions:
        if adoption.skip:
            outcomes.append(Outcome(adoption, "skipped", adoption.skip))
            continue
        status, output = run(adoption.target, adoption.command)
        said = [line.strip() for line in output.splitlines() if line.strip().startswith("hpops install:")]
        found = _FINGERPRINT.search(output)
        if status != 0:
            tail = (said or [line for line in output.splitlines() if line.strip()] or ["no output"])[-1]
            outcomes.append(Outcome(adoption, "failed", f"exit {status}: {tail.strip()[:300]}"))
            continue
        outcomes.append(Outcome(adoption, "adopted", said[-1] if said else "installer ran",
                                found.group(1) if found else None))
    return outcomes


def outcome_lines(outcomes: Sequence[Outcome]) -> list[str]:
    lines = []
    for o in outcomes:
        key = f"; agent key {o.fingerprint}" if o.fingerprint else ""
        lines.append(f"{o.status:<8} {o.adoption.group}/{o.adoption.instance_id}: {o.detail}{key}")
    return lines
