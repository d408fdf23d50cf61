"""`hpops adopt`: put the node agent on nodes that already run, without re-imaging them, and admit them.

HyperPod runs on_create.sh once, when it creates a node. Nodes created before the install line was
in it get the agent otherwise only from UpdateClusterSoftware, which re-images them (users lose their
sessions and local files). Adopt works on each Running node of the login and controller groups
through Session Manager, the one way AWS offers into a HyperPod node (SendCommand does not reach
them; they are not the account's managed instances), in two non-interactive sessions:

    aws ssm start-session --target sagemaker-cluster:<cluster-id>_<group>-<instance-id> \
        --document-name AWS-StartNonInteractiveCommand --parameters command=[<command>]

1. install: copy the bundle from the group's lifecycle prefix (where step 5 of the README's Deploy put
   it), run install.sh as on_create.sh would, and print the agent key's fingerprint, read as root on
   that instance (AWS authenticates the session's target: the key read is that node's);
2. adopt records the operator's approval of exactly that instance and fingerprint (the node was
   launched long before its enrollment window), then asks the agent to enroll now (`enroll`).

A repair then verifies and admits the login nodes. Adopt exits non-zero unless every node it touched
is admitted (a login node: enrolled and in the target group; the controller: enrolled), naming for
each one what is left and the command for it. Nothing else on the node changes, so open SSH and
Session Manager sessions keep running; no node is ever re-imaged or restarted by this.

UNCONFIRMED: that HyperPod targets accept AWS-StartNonInteractiveCommand (AWS documents interactive
sessions to them); that the session's user may sudo (with Run As on, it is the operator's POSIX user);
that the nodes' AWS CLI and role can read the lifecycle bucket (HyperPod's own lifecycle download
needs that read). When a session is refused, `--print` shows each node's commands to run in a shell.
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
# What the agent's `enroll` prints (node/hpops_node_agent/__main__.py).
ENROLL_MARK = "hpops enroll:"
# The installed agent, as install.sh runs it.
ENROLL_COMMAND = ("sudo bash -c 'p=/usr/bin/python3; [ -x \"$p\" ] || p=python3; "
                  "PYTHONPATH=/opt/hpops-node-agent/lib:/opt/hpops-node-agent \"$p\" -m hpops_node_agent "
                  "--config /etc/hpops/node-agent.json enroll'")
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
    status: str  # adopted | failed | skipped | planned
    detail: str
    fingerprint: str | None = None  # the agent key's, read as root on the node and approved


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


Approve = Callable[[Adoption, str], None]


def adopt(adoptions: Sequence[Adoption], run: Runner, approve: Approve) -> list[Outcome]:
    """Each node in turn (a failure on one does not stop the others): install, approve the key it printed,
    enroll now. ``approve(adoption, fingerprint)`` records the operator's approval (raises on failure)."""
    outcomes = []
    for adoption in adoptions:
        if adoption.skip:
            outcomes.append(Outcome(adoption, "skipped", adoption.skip))
            continue
        status, output = run(adoption.target, adoption.command)
        said = [line.strip() for line in output.splitlines() if line.strip().startswith("hpops install:")]
        found = _FINGERPRINT.search(output)
        if status != 0:
            outcomes.append(Outcome(adoption, "failed", f"install exit {status}: {_last(said, output)}"))
            continue
        if found is None:
            outcomes.append(Outcome(adoption, "failed", f"installed, but no agent key was read ({_last(said, output)})"))
            continue
        fingerprint = found.group(1)
        try:
            approve(adoption, fingerprint)
        except Exception as error:  # the CLI's own error or AWS's: this node is left, the next one goes on
            outcomes.append(Outcome(adoption, "failed", f"installed; approving its key failed: {error}", fingerprint))
            continue
        status, output = run(adoption.target, ENROLL_COMMAND)
        enrolled = [line.strip() for line in output.splitlines() if line.strip().startswith(ENROLL_MARK)]
        if status != 0:
            outcomes.append(Outcome(adoption, "failed", f"installed, key approved; enroll exit {status}: "
                                                        f"{_last(enrolled, output)}", fingerprint))
            continue
        outcomes.append(Outcome(adoption, "adopted", f"installed; {_last(enrolled, output)}", fingerprint))
    return outcomes


def _last(marked: list[str], output: str) -> str:
    return (marked or [line.strip() for line in output.splitlines() if line.strip()] or ["no output"])[-1][:300]


@dataclass(frozen=True)
class Admission:
    """Whether a node adopt touched is admitted now, and if not, what is left and the command for it."""

    instance_id: str
    group: str
    admitted: bool
    left: str = ""
    command: str = ""


def admissions(outcomes: Sequence[Outcome], enrollments: Mapping[str, Any], target_ips: set[str], login_group: str,
               stack_name: str, repaired: bool) -> list[Admission]:
    """Pure. ``enrollments``: instance id -> enrollment_store's Enrollment; ``target_ips``: the IPs registered
    in the target group after the repair; ``repaired``: the repair succeeded."""
    result = []
    for outcome in outcomes:
        a = outcome.adoption
        record = enrollments.get(a.instance_id)
        if outcome.status == "failed":
            result.append(Admission(a.instance_id, a.group, False, outcome.detail,
                                    f"hpops adopt --stack-name {stack_name} --print (run its commands on the node)"))
        elif record is None or not record.usable:
            state = "not enrolled" if record is None else f"enrollment {record.status}"
            # Adopt again: it reads the key as root on the node, approves it and enrolls it.
            result.append(Admission(a.instance_id, a.group, False, state, f"hpops adopt --stack-name {stack_name}"))
        elif a.group == login_group and record.ip not in target_ips:
            why = "not in the target group" + ("" if repaired else " (the repair did not succeed)")
            result.append(Admission(a.instance_id, a.group, False, why,
                                    f"hpops repair --stack-name {stack_name}, then hpops doctor --stack-name {stack_name}"))
        else:
            result.append(Admission(a.instance_id, a.group, True))
    return result


def admission_lines(admitted: Sequence[Admission]) -> list[str]:
    left = [a for a in admitted if not a.admitted]
    lines = [f"{len(admitted) - len(left)} of {len(admitted)} node(s) admitted"]
    lines += [f"left     {a.group}/{a.instance_id}: {a.left}; run: {a.command}" for a in left]
    return lines


def outcome_lines(outcomes: Sequence[Outcome]) -> list[str]:
    lines = []
    for o in outcomes:
        key = f"; agent key {o.fingerprint}" if o.fingerprint else ""
        lines.append(f"{o.status:<8} {o.adoption.group}/{o.adoption.instance_id}: {o.detail}{key}")
    return lines
