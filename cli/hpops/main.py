"""`hpops`: the operator's command line.

    hpops demo [--json FILE]                 the whole story in the local twin
    hpops twin send EVENT.json [...] [--cluster NAME --cluster-id ID --login-group GROUP]
                                             run saved events through the twin
    hpops status  --stack-name S [--json] | --twin
                                             one screen: targets vs login nodes, host identity per node,
                                             last executions, alarms, sessions and spend; exit 1 on a problem
    hpops repair  --stack-name S | --twin [--dry-run]
    hpops bench [--json FILE]                API calls, state transitions, times (the twin)
    hpops host-keys generate|adopt|rotate|show --stack-name S   the canonical SSH host keys (keys mode)
    hpops host-keys ca-generate|ca-show --stack-name S         the host certificate CA (certificate mode)
    hpops lifecycle --stack-name S [--out DIR] [--no-vendor] [--patch on_create.sh]
                                             the node agent bundle, and the line that installs it
    hpops adopt --stack-name S [--print]     the agent on running login and controller nodes, no re-imaging
    hpops cost --stack-name S | --twin [--json | --csv]      per-user spend this month (Slurm accounting)
    hpops cost subscribe --stack-name S USER EMAIL            e-mail USER's own spend alerts to EMAIL
    hpops doctor --stack-name S | --cluster NAME --region R | --twin [--json]
                                             what the account or cluster lacks, one line per check
    hpops cost release --stack-name S USER --reason TEXT      let a held USER's jobs start again this month
    hpops node enrollments|approve-enrollment --stack-name S [--node ID --fingerprint SHA256:...]
                                             which agent key speaks for each node; approve one
    hpops iam-policy --stack-name S [--role operator | --role administrator] [--lifecycle-bucket B]
                                             the least-privilege IAM policy (JSON) for these commands on S

`status` and `repair` talk to a real deployment through the stack's outputs and parameters
(your usual AWS credentials); with `--twin` they run against a fresh local twin instead.
A problem the command cannot get past (no region or credentials, an unknown stack, access denied,
a missing or malformed file) is one line naming it and the fix, and exit status 2.
Exit status, every command: 0 all is well; 1 it found a problem and named it (status, doctor, cost,
repair's failed execution); 2 it could not tell or could not start.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shlex
import sys
import time
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import boto3
from botocore.exceptions import BotoCoreError, ClientError

from hpops.errors import EXIT_USAGE, CliError, NotCertificateMode, explain
from hpops.event_files import load_event_files
from hpops.node_reports import read_node_reports
from hpops.output import cost_exit_status, describe_result, print_cost, print_status, status_document, top_spenders
from hpops_core.node_channel.contract import READ_AGENT_FINGERPRINT
from hpops_core.node_channel.enrollment import KEEP, REPLACED_KEY_USAGE
from hpops_core.node_channel.login_slots import host_patterns
from hpops_core.common.errors import HpopsError

TWIN_ENTRY_POINTS = "hpops.twin"  # group twin/pyproject.toml registers its commands module in


def _twin(command: str, args: argparse.Namespace) -> int:
    """Run a twin command; the twin is part of the development install only. The twin registers its
    commands as an entry point, so the CLI finds them without importing the twin (which imports the CLI)."""
    try:
        [entry] = entry_points(group=TWIN_ENTRY_POINTS, name="commands")
        commands = entry.load()
    except (ValueError, ImportError) as error:
        missing = getattr(error, "name", None) or f"its {TWIN_ENTRY_POINTS} entry point"
        raise CliError(f"the local twin is not installed ({missing} missing): it comes with the development "
                       "install, `make demo` in a clone of the repository, or pip install -e ./twin") from None
    return getattr(commands, command)(args)


class StackValues(dict):
    """A stack's outputs or parameters; a missing one is a CliError naming it, not a KeyError."""

    def __init__(self, values: Mapping[str, str], stack_name: str, kind: str) -> None:
        super().__init__(values)
        self.stack_name, self.kind = stack_name, kind

    def __missing__(self, name: str) -> str:
        raise CliError(f"stack {self.stack_name} has no {self.kind} {name}: is it an hpops stack? "
                       "If so, update it with this version's template.yaml")


def _session(region: str | None) -> Any:
    return boto3.session.Session(region_name=region)


def _stack(stack_name: str, region: str | None) -> tuple[StackValues, StackValues, Any]:
    session = _session(region)
    stack = session.client("cloudformation").describe_stacks(StackName=stack_name)["Stacks"][0]
    outputs = StackValues({o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}, stack_name, "output")
    parameters = StackValues({p["ParameterKey"]: p.get("ParameterValue", "") for p in stack.get("Parameters", [])},
                             stack_name, "parameter")
    return outputs, parameters, session


def _output_file(path: str | None, option: str) -> None:
    """Refuse an output path that cannot be written before a long run, not after it."""
    if path is None:
        return
    target = Path(path)
    folder = target.parent
    if target.is_dir():
        raise CliError(f"{option} {path}: is a folder: give a file name")
    if not folder.is_dir():
        raise CliError(f"{option} {path}: folder {folder} does not exist: create it, or choose another path")
    if not os.access(folder, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise CliError(f"{option} {path}: not writable: choose a path you can write")


def _output_folder(path: str, option: str) -> None:
    """A folder to create (with its parents) or replace: the nearest existing part must be a writable folder."""
    existing = Path(path)
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise CliError(f"{option} {path}: {existing} is a file, not a folder: choose another path")
    if not os.access(existing, os.W_OK):
        raise CliError(f"{option} {path}: {existing} is not writable: choose a path you can write")


def cmd_twin_send(args: argparse.Namespace) -> int:
    # Files, JSON and shapes are checked here, before the twin starts. Sizes are not: the twin
    # refuses an oversized event itself, per event, the way PutEvents does (and goes on with the rest).
    load_event_files(args.events, size_limit=None)
    return _twin("send", args)


def _twin_with_output(command: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        _output_file(args.json, "--json")
        return _twin(command, args)
    return run


def cmd_status(args: argparse.Namespace) -> int:
    """Exit 0: targets in sync and no alarm in ALARM; 1: out of sync or an alarm in ALARM; 2: can't tell."""
    if args.twin:
        if args.json:
            raise CliError("--json needs --stack-name (the twin's status is text only)")
        return _twin("status", args)
    from hpops_core.host_identity.identity_record import read_expected
    from hpops_core.session_limits.cluster_sessions import session_spread

    now = _utc_now()
    outputs, parameters, session = _stack(args.stack_name, args.region)
    # Every output status needs, before the first call: a stack of another shape fails here, naming it.
    target_group, table = outputs["TargetGroupArn"], outputs["SyncStateTableName"]
    machines = {"LoginNodeSync": outputs["LoginNodeSyncStateMachineArn"],
                "SessionLimits": outputs.get("SessionLimitsStateMachineArn"),
                "BudgetGuard": outputs.get("BudgetGuardStateMachineArn")}
    cluster, group = parameters["ClusterName"], parameters.get("LoginGroupName", "login")
    login_nodes = _running_login_nodes(session.client("sagemaker"), cluster, group)
    dynamodb, sfn = session.client("dynamodb"), session.client("stepfunctions")
    reports = read_node_reports(dynamodb, table, cluster)
    document = status_document(
        stack=args.stack_name, region=session.region_name, cluster=cluster, login_group=group, now=now,
        targets=_target_health(session.client("elbv2"), target_group), login_nodes=login_nodes,
        reports=reports, published=read_expected(dynamodb, table, cluster),
        executions={name: _last_execution(sfn, arn) if arn else "absent" for name, arn in machines.items()},
        alarms=_stack_alarms(session, args.stack_name), dashboard=outputs.get("DashboardName"),
        sessions=_optional(lambda: _active_sessions(session.client("ssm"), group, login_nodes), session.region_name),
        spend=_optional(lambda: top_spenders(_spend_document(session, args.stack_name, now)), session.region_name),
    )
    running_reports = {n["instanceId"]: reports[n["instanceId"]] for n in login_nodes if reports.get(n["instanceId"])}
    document["loginSessions"] = _login_sessions(parameters, running_reports)
    document["spread"] = session_spread(running_reports, [n["instanceId"] for n in login_nodes])
    document["admission"] = _admission(dynamodb, table, cluster, parameters.get("LoadAwareAdmission", "off"), now)
    document["enrollment"] = _enrollment(dynamodb, table, cluster)
    print_status(document, as_json=args.json)
    return document["exitStatus"]


def _admission(dynamodb: Any, table: str, cluster: str, mode: str, now: dt.datetime) -> dict:
    """Load-aware admission's record: which login nodes are out of rotation for new connections, and why.
    A stack from before the parameter, or with it off, has none to read."""
    from hpops_core.common.state_table import admission_partition
    from hpops_core.login_sync.admission import AdmissionState
    from hpops_core.login_sync.config import ADMISSION_RECORD_MAX_AGE_SECONDS

    if mode == "off":
        return {"mode": "off"}
    item = dynamodb.get_item(TableName=table, Key={"pk": {"S": admission_partition(cluster)},
                                                   "sk": {"S": "login-admission"}}).get("Item")
    state = AdmissionState.from_json(json.loads(item["state"]["S"])) if item else AdmissionState()
    age = int(now.timestamp()) - state.decided_at if item else None
    return {"mode": mode, "lastRunSecondsAgo": age,
            "stale": age is None or age > ADMISSION_RECORD_MAX_AGE_SECONDS,
            "out": [{"instanceId": i, "ip": o.ip, "since": _iso(o.since), "reason": o.reason}
                    for i, o in sorted(state.out.items())]}


def _enrollment(dynamodb: Any, table: str, cluster: str) -> dict:
    """How the agents' keys were won: with AWS's signed instance identity document, or without (IMDS not
    serving it: the first key inside the window is trusted, as before documents), and which are contested."""
    from hpops_core.node_channel import enrollment_store

    records, _, documents = enrollment_store.read_enrollments(table, cluster, dynamodb=dynamodb)
    return {"nodes": len(records), "documentsSeen": documents,
            "byHow": {how: sum(1 for r in records if r.via == how) for how in ("document", "approval", "window")},
            "contested": [{"instanceId": r.instance_id, "keys": 1 + len(r.contested_by)}
                          for r in sorted(records, key=lambda r: r.instance_id) if not r.usable]}


def _iso(epoch: int) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _login_sessions(parameters: Mapping[str, str], reports: Mapping[str, Mapping]) -> dict:
    """Per user, SSH and Session Manager sessions the Running login nodes report, against the limit."""
    from hpops_core.session_limits.cluster_sessions import sessions_by_user

    overrides = json.loads(parameters.get("SessionLimitOverrides") or "{}")
    exempt = [u.strip() for u in (parameters.get("SessionExemptUsers") or "").split(",") if u.strip()]
    view = sessions_by_user(reports, int(parameters.get("MaxSessionsPerUser") or 2), overrides, exempt)
    # A stack from before the parameter existed enforced: only "true" means a dry run.
    return view | {"dryRun": parameters.get("SessionLimitsDryRun") == "true"}


def _target_health(elbv2: Any, target_group_arn: str) -> list[dict]:
    health = elbv2.describe_target_health(TargetGroupArn=target_group_arn)["TargetHealthDescriptions"]
    return [{"ip": d["Target"]["Id"], "port": d["Target"].get("Port"), "state": d["TargetHealth"]["State"],
             "reason": d["TargetHealth"].get("Reason")} for d in health]


def _running_login_nodes(sagemaker: Any, cluster: str, group: str) -> list[dict]:
    """The login group's Running nodes with their private IPs (the group name filter is a substring match)."""
    pages = sagemaker.get_paginator("list_cluster_nodes").paginate(ClusterName=cluster, InstanceGroupNameContains=group)
    running = [s["InstanceId"] for p in pages for s in p["ClusterNodeSummaries"]
               if s["InstanceGroupName"] == group and s["InstanceStatus"]["Status"] == "Running"]
    return [{"instanceId": node, "ip": sagemaker.describe_cluster_node(ClusterName=cluster, NodeId=node)
             ["NodeDetails"]["PrivatePrimaryIp"]} for node in running]


def _last_execution(sfn: Any, state_machine_arn: str) -> dict | None:
    executions = sfn.list_executions(stateMachineArn=state_machine_arn, maxResults=1)["executions"]
    return executions[0] if executions else None


def _stack_alarms(session: Any, stack_name: str) -> list[dict]:
    """The stack's own CloudWatch alarms with their state. ListStackResources, not DescribeStackResources:
    the latter returns only a stack's first 100 resources, and SAM expands this template past that."""
    pages = session.client("cloudformation").get_paginator("list_stack_resources").paginate(StackName=stack_name)
    names = [r["PhysicalResourceId"] for page in pages for r in page["StackResourceSummaries"]
             if r["ResourceType"] == "AWS::CloudWatch::Alarm" and r.get("PhysicalResourceId")]
    cloudwatch, alarms = session.client("cloudwatch"), []
    for start in range(0, len(names), 100):  # DescribeAlarms takes at most 100 names
        for page in cloudwatch.get_paginator("describe_alarms").paginate(AlarmNames=names[start:start + 100]):
            alarms += page["MetricAlarms"]
    return alarms


def _active_sessions(ssm: Any, group: str, login_nodes: list[dict]) -> dict:
    """Active Session Manager sessions on the Running login nodes, per IAM principal. The run-as user
    needs the account's Run As preferences and the principals' tags (what SessionLimits resolves);
    the principal's session or user name is what DescribeSessions itself tells."""
    from collections import Counter

    from hpops_core.session_limits.identity import principal_name
    from hpops_core.session_limits.targets import parse_target

    nodes, counts = {n["instanceId"] for n in login_nodes}, Counter()
    for page in ssm.get_paginator("describe_sessions").paginate(State="Active"):
        for record in page["Sessions"]:
            parsed = parse_target(record.get("Target"))
            if parsed and parsed[1] == group and parsed[2] in nodes:
                owner = str(record.get("Owner") or "")
                counts[principal_name(owner) or owner or "unknown"] += 1
    return {"available": True, "active": sum(counts.values()), "groupedBy": "IAM principal",
            "topUsers": [{"user": user, "sessions": n} for user, n in sorted(counts.items(), key=lambda c: (-c[1], c[0]))[:5]],
            "runAs": _run_as_state(ssm)}


def _run_as_state(ssm: Any) -> str:
    """What the account's Session Manager preferences mean for the limits (Run As off: nothing applies)."""
    from hpops_core.session_limits.session_api import Boto3SessionDirectory

    return Boto3SessionDirectory(ssm).run_as_preferences().describe()


def _optional(section: Callable[[], dict], region: str | None) -> dict:
    """A section status can show without (sessions, spend): its failure is its one-line reason."""
    try:
        return section()
    # NotImplementedError: what an AWS stand-in (moto) raises for an API it lacks, DescribeSessions among them.
    except (ClientError, BotoCoreError, HpopsError, NotImplementedError) as error:
        return {"available": False, "reason": explain(error, region)}


def cmd_repair(args: argparse.Namespace) -> int:
    if args.twin:
        return _twin("repair", args)
    outputs, parameters, session = _stack(args.stack_name, args.region)
    return _run_repair(session, outputs, parameters, dry_run=args.dry_run, timeout=args.timeout)


def _run_repair(session: Any, outputs: Mapping[str, str], parameters: Mapping[str, str], *, dry_run: bool,
                timeout: float) -> int:
    sfn = session.client("stepfunctions")
    payload = {"cluster": parameters["ClusterName"], "mode": "repair", "dryRun": dry_run}
    arn = sfn.start_execution(stateMachineArn=outputs["LoginNodeSyncStateMachineArn"], input=json.dumps(payload))["executionArn"]
    print(f"started {arn}")
    deadline = time.monotonic() + timeout
    while (described := sfn.describe_execution(executionArn=arn))["status"] == "RUNNING":
        if time.monotonic() > deadline:
            print("still running; follow it in the Step Functions console")
            return 2
        time.sleep(2)
    describe_result({
        # `name` is optional in DescribeExecution's output model; the ARN always ends in it.
        "name": described.get("name") or arn.rsplit(":", 1)[-1],
        "status": described["status"], "error": described.get("error"),
        "cause": described.get("cause"), "output": json.loads(described.get("output") or "null"),
    })
    return 0 if described["status"] == "SUCCEEDED" else 1


def adopt_stack(session: Any, stack_name: str, outputs: Mapping[str, str], parameters: Mapping[str, str],
                run: Callable[[str, str], tuple[int, str]], now: dt.datetime, *, dry_run: bool = False,
                replaced_key_usage: str | None = None) -> list:
    """`hpops adopt` after its arguments: plan from the cluster and the agents' reports, then on each node to
    adopt install, approve the key read there as root, and enroll, with ``run`` (Session Manager; the twin's
    in tests). ``dry_run``: the plan only. ``replaced_key_usage``: what becomes of the usage windows of a
    controller key the read key replaces; by default kept (a re-imaged controller: its old key was its own)
    unless that key was contested (enrollments.replaced_key_usage)."""
    from hpops import adopt as adoption
    from hpops.enrollments import replaced_key_usage as usage_of_replaced
    from hpops_core.node_channel import enrollment_store
    from hpops_node_agent import __version__ as agent_version

    cluster_name = parameters["ClusterName"]
    groups = [parameters.get("LoginGroupName") or "login", parameters.get("ControllerGroupName") or "controller-machine"]
    sagemaker = session.client("sagemaker")
    dynamodb = session.client("dynamodb")
    cluster = sagemaker.describe_cluster(ClusterName=cluster_name)
    nodes = [s for page in sagemaker.get_paginator("list_cluster_nodes").paginate(ClusterName=cluster_name)
             for s in page["ClusterNodeSummaries"]]
    reports = read_node_reports(dynamodb, outputs["SyncStateTableName"], cluster_name)
    plan = adoption.plan(cluster, nodes, groups, reports, agent_version, now)
    if dry_run:
        return [adoption.Outcome(a, "skipped" if a.skip else "planned", a.skip or a.target) for a in plan]

    standing = {r.instance_id: r for r in enrollment_store.list_enrollments(outputs["SyncStateTableName"], cluster_name,
                                                                            dynamodb=dynamodb)[0]}

    def approve(adopted: Any, fingerprint: str) -> None:
        # Read as root on that very instance, through a session AWS authenticated: the operator's approval.
        moment = time.time()
        existing = standing.get(adopted.instance_id)
        role = "controller" if adopted.group == groups[1] else "login"
        chosen, _ = usage_of_replaced(existing, fingerprint, role, replaced_key_usage, default=KEEP)
        enrollment_store.put_approval(outputs["SyncStateTableName"], cluster_name, adopted.instance_id, fingerprint,
                                      dt.datetime.fromtimestamp(moment, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                                      int(moment), dynamodb=dynamodb, replaced_key_usage=chosen,
                                      replacing=existing.fingerprint if chosen else "")

    return adoption.adopt(plan, run, approve)


def adopt_admissions(session: Any, stack_name: str, outputs: Mapping[str, str], parameters: Mapping[str, str],
                     outcomes: list, repaired: bool) -> list:
    """After adopt's repair: which touched nodes are admitted (enrolled; login nodes in the target group)."""
    from hpops import adopt as adoption
    from hpops_core.node_channel import enrollment_store

    records, _ = enrollment_store.list_enrollments(outputs["SyncStateTableName"], parameters["ClusterName"],
                                                   dynamodb=session.client("dynamodb"))
    registered = {t["ip"] for t in _target_health(session.client("elbv2"), outputs["TargetGroupArn"])
                  if t["state"] not in ("draining", "unused")}
    return adoption.admissions([o for o in outcomes if o.status != "planned"], {r.instance_id: r for r in records},
                               registered, parameters.get("LoginGroupName") or "login", stack_name, repaired)


def cmd_adopt(args: argparse.Namespace) -> int:
    """Exit 0: every node adopt touched is admitted (enrolled; login nodes in the target group); 1 otherwise,
    with what is left and the command for it."""
    from hpops import adopt as adoption

    outputs, parameters, session = _stack(args.stack_name, args.region)
    run = adoption.session_runner(session.region_name)
    outcomes = adopt_stack(session, args.stack_name, outputs, parameters, run, _utc_now(), dry_run=args.print,
                           replaced_key_usage=args.replaced_key_usage)
    if args.print:
        for outcome in outcomes:
            a = outcome.adoption
            print(f"# {a.group}/{a.instance_id}" + (f": skipped, {a.skip}" if a.skip else ""))
            if not a.skip:
                for command in (a.command, adoption.ENROLL_COMMAND):
                    print(f"aws ssm start-session --region {session.region_name} --target {a.target} --document-name "
                          f"{adoption.DOCUMENT} --parameters {shlex.quote(json.dumps({'command': [command]}))}")
                print(f"# between the two: hpops node approve-enrollment --stack-name {args.stack_name} --node "
                      f"{a.instance_id} --fingerprint <the SHA256 the first one printed>")
        return 0
    for line in adoption.outcome_lines(outcomes):
        print(line)
    repaired = True
    if any(o.status == "adopted" for o in outcomes):
        print("a repair verifies the adopted login nodes and admits them:")
        repaired = _run_repair(session, outputs, parameters, dry_run=False, timeout=args.timeout) == 0
    admitted = adopt_admissions(session, args.stack_name, outputs, parameters, outcomes, repaired)
    for line in adoption.admission_lines(admitted):
        print(line)
    return 0 if all(a.admitted for a in admitted) else 1


def cmd_host_keys(args: argparse.Namespace) -> int:
    """Generate, adopt or rotate the canonical host keys (an explicit operator action)."""
    from hpops_core.host_identity.keys import generate_bundle
    from hpops_core.host_identity.operator import install_canonical_bundle

    # adopt reads the files first: nothing on AWS changes for a folder that cannot be adopted.
    bundle = _adopt_from(args.from_dir) if args.action == "adopt" else None
    outputs, parameters, session = _stack(args.stack_name, args.region)
    if args.action.startswith("ca-"):
        return _host_ca(args, outputs, parameters, session)
    if args.action == "show":
        from hpops_core.host_identity.identity_record import read_expected

        expected = read_expected(session.client("dynamodb"), outputs["SyncStateTableName"], parameters["ClusterName"]) or {}
        if expected.get("mode") == "certificate":
            print("this cluster's host identity is a certificate authority; run: hpops host-keys ca-show --stack-name",
                  args.stack_name)
            return 1
        if not expected.get("fingerprints"):
            print("no canonical host keys published; run: hpops host-keys generate (or adopt) --stack-name",
                  args.stack_name)
            return 1
        for key_type, value in expected["fingerprints"].items():
            print(f"{key_type:<22} {value}")
        return 0
    bundle = bundle or generate_bundle()  # generate, rotate
    fingerprints = install_canonical_bundle(
        session.client("secretsmanager"), session.client("dynamodb"), outputs["HostIdentitySecretArn"],
        outputs["SyncStateTableName"], parameters["ClusterName"], bundle,
    )
    print("canonical host keys installed; users should trust:")
    host = outputs.get("LoadBalancerDnsName", "<load-balancer-dns-name>")
    for line in bundle.known_hosts_lines(host_patterns(host, int(parameters.get("LoginNodeSlots") or 0))):
        print("  " + line)
    for key_type, value in fingerprints.items():
        print(f"{key_type:<22} {value}")
    if args.action == "rotate":
        print("now run: hpops repair --stack-name", args.stack_name,
              "(publishes the new keys; every login node's agent applies them and is re-verified)")
    return 0


def _adopt_from(folder: str | None) -> Any:
    from hpops_core.host_identity.keys import HostIdentityError, adopt_bundle

    fix = "copy a login node's /etc/ssh/ssh_host_{ed25519,ecdsa,rsa}_key files into a folder and pass it"
    if not folder:
        raise CliError(f"adopt needs --from-dir: {fix}")
    if not Path(folder).is_dir():
        raise CliError(f"--from-dir {folder}: {'not a folder' if Path(folder).exists() else 'no such folder'}: {fix}")
    files = {}
    for path in sorted(Path(folder).glob("ssh_host_*_key")):
        try:
            files[path.name] = path.read_bytes()
        except OSError as error:
            raise CliError(f"{path}: cannot read it ({error.strerror or type(error).__name__}): "
                           "copy it readable (sudo cp, then chown it to you)") from None
    try:
        return adopt_bundle(files)
    except HostIdentityError as error:  # its messages name files and key types, never key material
        raise CliError(f"{error} (in {folder}): {fix}") from None


def _host_ca(args: argparse.Namespace, outputs: dict, parameters: dict, session: Any) -> int:
    """Certificate mode: create (or rotate) the CA, or print the line users trust."""
    from hpops_core.host_identity.identity_record import read_expected
    from hpops_core.host_identity.keys import generate_ca
    from hpops_core.host_identity.operator import install_certificate_authority

    ca_secret = outputs.get("HostCertificateAuthoritySecretArn")
    if not ca_secret:  # keys mode creates no CA secret
        raise NotCertificateMode(args.stack_name)
    table, cluster = outputs["SyncStateTableName"], parameters["ClusterName"]
    if args.action == "ca-generate":
        ca = generate_ca()
        install_certificate_authority(session.client("secretsmanager"), session.client("dynamodb"),
                                      ca_secret, table, cluster, ca)
        public_line, fingerprint = ca.public_line, ca.fingerprint()
        print("host certificate CA installed. A repair certifies every login node: hpops repair --stack-name",
              args.stack_name)
    else:
        record = read_expected(session.client("dynamodb"), table, cluster) or {}
        if record.get("mode") != "certificate":
            print("no host certificate CA published; run: hpops host-keys ca-generate --stack-name", args.stack_name)
            return 1
        public_line, fingerprint = record["caPublic"], record["caFingerprint"]
    host = outputs.get("LoadBalancerDnsName", "<load-balancer-dns-name>")
    print(f"CA fingerprint {fingerprint}\nusers add this one line to ~/.ssh/known_hosts:")
    slots = int(parameters.get("LoginNodeSlots") or 0)
    print(f"  @cert-authority {host_patterns(host, slots)},{parameters.get('HostCertificatePrincipals') or '<your-alias>'} "
          f"{public_line}")
    return 0


def cmd_lifecycle(args: argparse.Namespace) -> int:
    """Write the node agent bundle, configured from the stack's outputs, for the lifecycle S3 prefix;
    with --patch, put the install line into an on_create.sh."""
    from hpops_node_agent.bundle import build_bundle

    from . import lifecycle_script

    wants_bundle = bool(args.stack_name or args.cluster or args.report_bus)
    if args.patch and not wants_bundle:
        return _patch_on_create(args.patch)
    _output_folder(args.out, "--out")
    imds = {}
    channel = args.node_channel
    if args.stack_name:
        outputs, parameters, session = _stack(args.stack_name, args.region)
        cluster, bus, region = parameters["ClusterName"], outputs["NodeReportBusName"], session.region_name
        channel = outputs["NodeChannelFunctionName"]
        # An older stack has neither parameter: the lockdown stays off.
        imds = {"imds_lockdown": parameters.get("ImdsLockdown") or "off",
                "imds_allowed_groups": parameters.get("ImdsAllowedGroups") or ""}
    elif args.cluster and args.report_bus and args.region:
        cluster, bus, region = args.cluster, args.report_bus, args.region
    else:
        raise CliError("give --stack-name S, or all of --cluster, --report-bus and --region (or only --patch FILE)")
    try:
        folder = build_bundle(Path(args.out), cluster, region, bus, vendor=not args.no_vendor, node_channel=channel,
                              **imds)
    except ValueError as error:  # a cluster name or region the agent would refuse
        raise CliError(f"{error} ({cluster!r}, {region!r}): give the HyperPod cluster's name and region") from None
    print(f"wrote {folder}")
    print(f"copy it next to on_create.sh:  aws s3 sync {folder} s3://<lifecycle-bucket>/<prefix>/hpops/")
    if args.patch:
        return _patch_on_create(args.patch)
    print("and add two lines to on_create.sh. First, right after its #! line, before anything sets up users "
          "(the agent enrolls its key before any user can reach a new node):")
    print(f"  {lifecycle_script.ENROLL_LINE}")
    print("then, after the Slurm setup (AWS's reference script runs it in lifecycle_script.py) and before the "
          "script's final exit (a line after it never runs):")
    print(f"  {lifecycle_script.INSTALL_LINE}")
    print("or let hpops put them there:  hpops lifecycle --patch on_create.sh")
    return 0


def _patch_on_create(path: str) -> int:
    from . import lifecycle_script

    script = Path(path)
    try:
        text = script.read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise CliError(f"cannot read {path}: {getattr(error, 'strerror', None) or error}") from None
    try:
        patched, what = lifecycle_script.patch(text)
    except lifecycle_script.LifecycleScriptError as error:
        raise CliError(f"{path}: {error}") from None
    if patched != text:
        mode = script.stat().st_mode
        temporary = script.with_name(script.name + ".hpops-tmp")
        temporary.write_text(patched)
        temporary.chmod(mode)
        temporary.replace(script)
    print(f"{path}: {what}")
    return 0


# ---------------------------------------------------------------------------- cost

# The hourly check's own function: its environment is the report's configuration (limits,
# thresholds, rate overrides, table, cluster), so `hpops cost` and the alerts never disagree.
SPEND_FUNCTION = "CheckUserSpendFunction"
MONTH_RE = re.compile(r"[0-9]{4}-(0[1-9]|1[0-2])")
# Enough to catch a swapped or truncated argument; SNS checks the address itself.
EMAIL_RE = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s]+")
MONTH_HELP = ("only the current UTC month (the default): a closed month cannot be priced correctly yet, the "
              "cluster's cost would count its last day from the nodes up today")


def _utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def spend_function_environment(session: Any, stack_name: str) -> dict[str, str]:
    """The deployed CheckUserSpendFunction's environment variables (CloudFormation -> Lambda)."""
    try:
        resource = session.client("cloudformation").describe_stack_resource(StackName=stack_name,
                                                                             LogicalResourceId=SPEND_FUNCTION)
    except ClientError as error:
        if "Resource " + SPEND_FUNCTION + " does not exist" not in str(error):
            raise
        raise CliError(f"stack {stack_name} has no {SPEND_FUNCTION}: it was deployed with UserSpendEnabled=false "
                       "(the cluster budget only) or before per-user spend; update it with UserSpendEnabled=true "
                       "for per-user figures") from None
    name = resource["StackResourceDetail"]["PhysicalResourceId"]
    configuration = session.client("lambda").get_function_configuration(FunctionName=name)
    return dict((configuration.get("Environment") or {}).get("Variables") or {})


def user_spend_document(env: Mapping[str, str], region: str, now: dt.datetime, *, sagemaker: Any, ce: Any,
                        pricing: Any, dynamodb: Any, fresh: bool = False) -> dict[str, Any]:
    """This month's spend per user as of ``now``, computed as CheckUserSpend computes it.

    ``env``: the function's environment; ``region``: the stack's (Lambda adds AWS_REGION itself, so
    it is not among the function's variables). Returns report_document's JSON plus ``findings``: the users at
    or over a threshold (what the hourly check alerts on, once each)."""
    from hpops_core.budget_guard import hold_state, spend_check
    from hpops_core.budget_guard.config import UserSpendConfig
    from hpops_core.budget_guard.guard import observe_cluster
    from hpops_core.budget_guard.user_spend import decide_user_alerts, report_document

    config = UserSpendConfig.from_env(dict(env) | {"AWS_REGION": region})
    observed = observe_cluster(sagemaker, config.cluster_name)
    report, cost_explorer = spend_check.gather_report(config, observed, now, ce=ce, pricing=pricing,
                                                      dynamodb=dynamodb, fresh=fresh, keep=False)
    document = report_document(report, config.thresholds)
    document["costExplorer"] = cost_explorer.as_dict()
    if observed.get("ClusterStatus") == "NotFound":
        document["warnings"].append({"name": "ClusterNotFound", "reason": (
            f"DescribeCluster does not find {config.cluster_name}: no instance type is known, so nothing is priced")})
    document["findings"] = [alert.summary for alert in decide_user_alerts(report, config.thresholds, set())]
    document["holds"] = hold_state.holds_view(config, report, now, dynamodb)
    return document


def cmd_cost(args: argparse.Namespace) -> int:
    """Exit 0: every user below their thresholds; 1: someone at or over one, or a warning; 2: can't tell."""
    if getattr(args, "cost_command", None) == "subscribe":
        return _cost_subscribe(args)
    if getattr(args, "cost_command", None) == "release":
        return _cost_release(args)
    if args.twin:
        return _twin("cost", args)
    if not args.stack_name:
        raise CliError("give --stack-name S (or --twin)")
    now = _utc_now()
    if args.month is not None and args.month != f"{now:%Y-%m}":
        shape = "" if MONTH_RE.fullmatch(args.month) else " (YYYY-MM)"
        raise CliError(f"--month {args.month}{shape}: {MONTH_HELP} ({now:%Y-%m})")
    document = _spend_document(_session(args.region), args.stack_name, now, fresh=args.fresh)
    print_cost(document, "json" if args.json else "csv" if args.csv else "table")
    return cost_exit_status(document)


def _spend_document(session: Any, stack_name: str, now: dt.datetime, fresh: bool = False) -> dict[str, Any]:
    """`hpops cost`'s document for the deployed stack (also the spend lines of `hpops status`)."""
    from hpops_core.budget_guard.aws_budgets import ce_client
    from hpops_core.budget_guard.pricing import pricing_client

    env = spend_function_environment(session, stack_name)
    return user_spend_document(env, session.region_name, now, sagemaker=session.client("sagemaker"),
                               ce=ce_client(session), pricing=pricing_client(session),
                               dynamodb=session.client("dynamodb"), fresh=fresh)


def _stack_and_user(args: argparse.Namespace) -> None:
    """`cost subscribe` and `cost release`: a stack named, and USER a POSIX user name."""
    from hpops_core.common.validation import InvalidValue, check_posix_user

    if not args.stack_name:
        raise CliError("give --stack-name S")
    try:
        check_posix_user(args.user, "USER")
    except InvalidValue as error:
        raise CliError(str(error)) from None


def _cost_subscribe(args: argparse.Namespace) -> int:
    from hpops_core.common.validation import shown

    _stack_and_user(args)
    if not EMAIL_RE.fullmatch(args.email):
        raise CliError(f"EMAIL {shown(args.email)} is not an e-mail address")
    outputs, _, session = _stack(args.stack_name, args.region)
    topic = outputs.get("UserSpendAlertTopicArn")
    if not topic:
        raise CliError(f"stack {args.stack_name} has no output UserSpendAlertTopicArn "
                       "(deployed before per-user spend alerts: update the stack)")
    policy = {"user": [args.user]}
    arn = session.client("sns").subscribe(
        TopicArn=topic, Protocol="email", Endpoint=args.email, ReturnSubscriptionArn=True,
        Attributes={"FilterPolicy": json.dumps(policy), "FilterPolicyScope": "MessageAttributes"},
    )["SubscriptionArn"]
    print(f"subscribed {args.email} to {args.user}'s spend alerts: {arn}")
    print(f"  filter policy {json.dumps(policy)}: only alerts about {args.user} reach this address")
    print(f"AWS has e-mailed {args.email} a confirmation link; nothing is delivered until {args.user} opens it and")
    print("clicks \"Confirm subscription\" (until then the subscription shows as PendingConfirmation).")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    """Exit 0: every check OK; 1: a check found a problem; 2: a check could not tell, or could not start."""
    if args.twin:
        return _twin("doctor", args)
    from hpops.doctor import StackView, Target, physical_ids, print_doctor, run_doctor, target_of_stack

    if args.stack_name:
        outputs, parameters, session = _stack(args.stack_name, args.region)
        stack = StackView(args.stack_name, outputs, parameters, physical_ids(session, args.stack_name))
        target = target_of_stack(stack, session.region_name)
    elif args.cluster and (session := _session(args.region)).region_name:
        target = Target(args.cluster, session.region_name, args.login_group, args.controller_group, ssh_port=22)
    else:
        raise CliError("give --stack-name S, or --cluster NAME and --region R (or AWS_REGION) before a deploy, or --twin")
    return print_doctor(target, run_doctor(session, target, _utc_now()), args.json)


RELEASE_REASON_MAX = 300


def release_user(dynamodb: Any, table: str, cluster: str, user: str, reason: str, by: str, now: dt.datetime) -> Any:
    """Record an operator's release of ``user`` for the rest of this month: the next sweep lifts the hold."""
    from hpops_core.budget_guard.hold_state import put_release
    from hpops_core.budget_guard.holds import Release

    release = Release(user, f"{now:%Y-%m}", by, reason, now.strftime("%Y-%m-%dT%H:%M:%SZ"))
    put_release(table, release, cluster, now, dynamodb)
    return release


def _cost_release(args: argparse.Namespace) -> int:
    _stack_and_user(args)
    reason = " ".join(args.reason.split())
    if not reason or len(reason) > RELEASE_REASON_MAX or not reason.isprintable():
        raise CliError(f"--reason must be 1 to {RELEASE_REASON_MAX} printable characters: it is kept with the "
                       "release and shown by `hpops cost`")
    outputs, parameters, session = _stack(args.stack_name, args.region)
    by = session.client("sts").get_caller_identity()["Arn"]
    now = _utc_now()
    release = release_user(session.client("dynamodb"), outputs["SyncStateTableName"], parameters["ClusterName"],
                           args.user, reason, by, now)
    sweep = session.client("stepfunctions").start_execution(
        stateMachineArn=outputs["BudgetGuardStateMachineArn"],
        input=json.dumps({"cluster": parameters["ClusterName"], "mode": "sweep"}))["executionArn"]
    print(f"released {args.user} for the rest of {release.month} (by {by}: {reason})")
    print(f"a budget sweep lifts the hold now: {sweep}")
    print("the controller's agent restores their Slurm limits within one poll; `hpops cost` shows the release")
    return 0


def cmd_node(args: argparse.Namespace) -> int:
    """Enrollment of the node agents' keys: list them, or approve one key for one instance."""
    from . import enrollments

    outputs, parameters, session = _stack(args.stack_name, args.region)
    table, cluster = outputs["SyncStateTableName"], parameters["ClusterName"]
    dynamodb = session.client("dynamodb")
    if args.node_command == "approve-enrollment":
        print(enrollments.approve(dynamodb, session.client("sagemaker"), table, cluster, parameters["LoginGroupName"],
                                  parameters["ControllerGroupName"], args.node, args.fingerprint,
                                  args.replaced_key_usage))
        return 0
    for line in enrollments.listing(dynamodb, table, cluster):
        print(line)
    return 0


def cmd_iam_policy(args: argparse.Namespace) -> int:
    """Print one job's policy for the stack; what it leaves out (outputs the stack lacks) goes to stderr."""
    from hpops.operator_permissions import operator_policy, policy_json

    session = _session(args.region)
    cloudformation = session.client("cloudformation")
    stack = cloudformation.describe_stacks(StackName=args.stack_name)["Stacks"][0]
    outputs = {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}
    parameters = {p["ParameterKey"]: p.get("ParameterValue", "") for p in stack.get("Parameters", [])}
    resources = {r["LogicalResourceId"]: r["PhysicalResourceId"]
                 for page in cloudformation.get_paginator("list_stack_resources").paginate(StackName=args.stack_name)
                 for r in page["StackResourceSummaries"] if r.get("PhysicalResourceId")}
    document, notes = operator_policy(stack["StackId"], outputs, parameters, resources, args.lifecycle_bucket,
                                      role=args.role)
    print(policy_json(document))
    for note in notes:
        print(note, file=sys.stderr)
    return 0


# Where --region and --stack-name come from when not given (region_of below; boto3 for the rest).
REGION_HELP = "AWS region (default: AWS_REGION, else AWS_DEFAULT_REGION, else your AWS profile's region)"
STACK_HELP = "the deployed stack's name (as in sam deploy; no default: the stack's outputs and parameters are read from it)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hpops", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="play the whole story in the local twin")
    demo.add_argument("--json", metavar="FILE", help="write the steps and their outcome here")
    demo.set_defaults(func=_twin_with_output("demo"))

    twin = commands.add_parser("twin", help="the local twin")
    twin_commands = twin.add_subparsers(dest="twin_command", required=True)
    send = twin_commands.add_parser("send", help="run saved events (events/*.json) through the twin")
    send.add_argument("events", nargs="+", metavar="EVENT.json")
    send.add_argument("--cluster", default="ml-research", help="twin cluster name (the saved events use ml-research)")
    send.add_argument("--cluster-id", help="twin cluster id, the last segment of its ARN (default: derived from the name)")
    send.add_argument("--login-group", default="login", help="the twin cluster's login instance group (default login)")
    send.add_argument("--parameter", action="append", metavar="NAME=VALUE",
                      help="a template.yaml parameter of the twin's stack (repeatable), as sam deploy --parameter-overrides")
    send.set_defaults(func=cmd_twin_send)

    for name, func, text in (("status", cmd_status, "target group vs Running login nodes"),
                             ("repair", cmd_repair, "start a manual repair execution")):
        sub = commands.add_parser(name, help=text)
        where = sub.add_mutually_exclusive_group(required=True)
        where.add_argument("--stack-name", help=STACK_HELP)
        where.add_argument("--twin", action="store_true", help="use a fresh local twin (development install)")
        sub.add_argument("--region", help=REGION_HELP)
        if name == "status":
            sub.add_argument("--json", action="store_true", help="the same as one JSON document")
        if name == "repair":
            sub.add_argument("--dry-run", action="store_true", help="report the plan, change nothing")
            sub.add_argument("--timeout", type=float, default=300)
        sub.set_defaults(func=func)

    keys = commands.add_parser("host-keys", help="host identity: generate | adopt | rotate | show | ca-generate | ca-show")
    keys.add_argument("action", choices=("generate", "adopt", "rotate", "show", "ca-generate", "ca-show"))
    keys.add_argument("--stack-name", required=True, help=STACK_HELP)
    keys.add_argument("--region", help=REGION_HELP)
    keys.add_argument("--from-dir", help="adopt: folder holding a login node's ssh_host_*_key files")
    keys.set_defaults(func=cmd_host_keys)

    adopt = commands.add_parser("adopt", help="install the node agent on running login and controller nodes "
                                "(Session Manager; no re-imaging), then repair")
    adopt.add_argument("--stack-name", required=True, help=STACK_HELP)
    adopt.add_argument("--region", help=REGION_HELP)
    adopt.add_argument("--print", action="store_true", help="print each node's start-session command, run nothing")
    adopt.add_argument("--timeout", type=float, default=600, help="seconds to wait for the repair (default 600)")
    adopt.add_argument("--replaced-key-usage", choices=REPLACED_KEY_USAGE,
                       help="a controller whose agent key changed (re-imaged, key lost): keep the usage windows its "
                            "old key sent (the default, unless that key was contested) or discard them (voided, "
                            "re-collected from Slurm accounting)")
    adopt.set_defaults(func=cmd_adopt)

    lifecycle = commands.add_parser("lifecycle", help="write the node agent bundle for the cluster's lifecycle scripts")
    lifecycle.add_argument("--stack-name", help=STACK_HELP + "; without it: --cluster, --report-bus and --node-channel")
    lifecycle.add_argument("--region", help=REGION_HELP)
    lifecycle.add_argument("--cluster", help="without a stack: the HyperPod cluster name")
    lifecycle.add_argument("--report-bus", help="without a stack: the stack's NodeReportBusName output")
    lifecycle.add_argument("--node-channel", help="without a stack: the stack's NodeChannelFunctionName output "
                                                  "(where agents enroll their key)")
    lifecycle.add_argument("--out", default="dist/lifecycle", help="folder to write (default dist/lifecycle)")
    lifecycle.add_argument("--patch", metavar="ON_CREATE_SH",
                           help="put the install line into this on_create.sh, before its final exit")
    lifecycle.add_argument("--no-vendor", action="store_true",
                           help="do not bundle boto3 (the nodes' python3 must already have boto3 >= 1.28)")
    lifecycle.set_defaults(func=cmd_lifecycle)

    cost = commands.add_parser(
        "cost", help="per-user spend this month from Slurm accounting; `cost subscribe` e-mails a user their alerts",
        description="Per-user spend this month: node-hours, GPU-hours and jobs from the controller's Slurm "
                    "accounting, priced per instance type (billed, list or override rate), with the idle and other "
                    "lines that add up to the cluster's cost. Configured by the deployed CheckUserSpendFunction. "
                    "Exit 0: every user below their thresholds; 1: a user at or over a threshold, or a warning; "
                    "2: usage or setup error.")
    where = cost.add_mutually_exclusive_group()
    where.add_argument("--stack-name", help=STACK_HELP)
    where.add_argument("--twin", action="store_true", help="a demo month in a fresh local twin (development install)")
    cost.add_argument("--region", help=REGION_HELP)
    cost.add_argument("--month", metavar="YYYY-MM", help=MONTH_HELP)
    cost.add_argument("--fresh", action="store_true",
                      help="ask Cost Explorer now ($0.01) instead of using the answer the hourly sweep kept (up to "
                           "CostExplorerMaxAgeHours old); the report says which it used and how old it is")
    form = cost.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="the report as JSON (money as strings)")
    form.add_argument("--csv", action="store_true", help="one row per user, then idle, other and cluster")
    cost.set_defaults(func=cmd_cost, cost_command=None)
    cost_commands = cost.add_subparsers(dest="cost_command", metavar="[subscribe | release]")
    subscribe = cost_commands.add_parser(
        "subscribe", help="e-mail USER's own spend alerts to EMAIL (SNS filter policy on the user)")
    # SUPPRESS: `hpops cost --stack-name S subscribe ...` works too (the value set before `subscribe` stays).
    subscribe.add_argument("--stack-name", default=argparse.SUPPRESS, help=STACK_HELP)
    subscribe.add_argument("--region", default=argparse.SUPPRESS, help=REGION_HELP)
    subscribe.add_argument("user", metavar="USER", help="the POSIX user whose alerts to send")
    subscribe.add_argument("email", metavar="EMAIL")
    release = cost_commands.add_parser(
        "release", help="let USER's jobs start again this month though they are over their limit (UserBudgetAction hold)")
    release.add_argument("--stack-name", default=argparse.SUPPRESS, help=STACK_HELP)
    release.add_argument("--region", default=argparse.SUPPRESS, help=REGION_HELP)
    release.add_argument("user", metavar="USER", help="the POSIX user to release")
    release.add_argument("--reason", required=True, help="why (kept with who released them, shown by hpops cost)")

    from hpops.doctor import NEEDS_STACK
    from hpops.doctor_checks import CHECK_HELP, CHECKS

    doctor = commands.add_parser(
        "doctor", help="what the account or cluster lacks for hpops: one line per check, OK or the problem and its fix",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="One line per check (the network and lifecycle checks: one per login and controller group), OK "
                    "or the problem and the command that fixes it:\n\n" + "\n".join(
                        f"  {name:<20}{CHECK_HELP[name]}{'' if name in NEEDS_STACK else ' [before a deploy too: --cluster]'}"
                        for name in CHECKS)
                    + "\n\nExit 0: all OK (NOTE lines included); 1: a problem; 2: a check could not tell (and none "
                    "found a problem), or usage or setup error.")
    where = doctor.add_mutually_exclusive_group()
    where.add_argument("--stack-name", help=STACK_HELP + "; every check")
    where.add_argument("--cluster", help="before a deploy: the HyperPod cluster (the checks that need no stack)")
    where.add_argument("--twin", action="store_true", help="a fresh local twin (development install)")
    doctor.add_argument("--region", help=REGION_HELP)
    doctor.add_argument("--login-group", help="with --cluster: the login instance group (default: the one whose "
                        "SlurmConfig.NodeType is Login, else login)")
    doctor.add_argument("--controller-group", help="with --cluster: the Slurm controller instance group (default: "
                        "the one whose SlurmConfig.NodeType is Controller, else controller-machine)")
    doctor.add_argument("--json", action="store_true", help="the checks as one JSON document")
    doctor.set_defaults(func=cmd_doctor)

    node = commands.add_parser("node", help="node agents' enrolled keys: enrollments | approve-enrollment")
    node_commands = node.add_subparsers(dest="node_command", required=True)
    listed = node_commands.add_parser("enrollments", help="which agent key speaks for each node, and pending approvals")
    approval = node_commands.add_parser(
        "approve-enrollment", help="let one instance's agent enroll exactly this key (upgrade, lost key, contested)")
    approval.add_argument("--node", required=True, metavar="INSTANCE_ID")
    approval.add_argument("--fingerprint", required=True, metavar="SHA256:...",
                          help=f"what `{READ_AGENT_FINGERPRINT}` prints on that node (Session Manager, as root); "
                               "`hpops adopt` prints it for every node it installs")
    approval.add_argument("--replaced-key-usage", choices=REPLACED_KEY_USAGE, metavar="keep|discard",
                          help="a controller only: whether the usage windows of the key this replaces were the "
                               "node's own (keep: re-image, lost key) or not (discard: voided, re-collected from "
                               "Slurm accounting). Default: keep when that key was proven (document or approval), "
                               "discard when contested; required when it was enrolled by window alone")
    for sub in (listed, approval):
        sub.add_argument("--stack-name", required=True, help=STACK_HELP)
        sub.add_argument("--region", help=REGION_HELP)
        sub.set_defaults(func=cmd_node)

    iam_policy = commands.add_parser(
        "iam-policy", help="the least-privilege IAM policy one job's commands need on a stack (JSON)",
        description="Prints one IAM policy document, naming the stack's resources, for one job: --role operator "
                    "(read-only: status, doctor, cost, lifecycle, host-keys show|ca-show, node enrollments) or "
                    "--role administrator (what changes things: repair, host-keys generate|adopt|rotate|ca-generate, "
                    "adopt, node approve-enrollment, cost subscribe|release). Each fits a managed policy. A wildcard "
                    "resource only where the action has none; its statement's Sid says why.")
    iam_policy.add_argument("--stack-name", required=True, help=STACK_HELP)
    iam_policy.add_argument("--region", help=REGION_HELP)
    iam_policy.add_argument("--role", choices=("operator", "administrator"), default="operator",
                            help="whose policy: the read-only operator's (default) or the administrator's")
    iam_policy.add_argument("--lifecycle-bucket", action="append", default=[], metavar="BUCKET",
                            help="the S3 bucket of the cluster's lifecycle scripts, which doctor reads (repeatable; "
                                 "without it doctor's S3 reads are on *)")
    iam_policy.set_defaults(func=cmd_iam_policy)

    bench = commands.add_parser("bench", help="API calls, state transitions and times in the twin")
    bench.add_argument("--json", metavar="FILE")
    bench.set_defaults(func=_twin_with_output("bench"))
    return parser


def _label(args: argparse.Namespace) -> str:
    """`hpops cost subscribe`, `hpops host-keys adopt`, `hpops twin send`: what an error line starts with."""
    words = ["hpops", args.command]
    for name in ("twin_command", "action", "cost_command", "node_command"):
        if getattr(args, name, None):
            words.append(getattr(args, name))
    return " ".join(words)


def _region(args: argparse.Namespace) -> str | None:
    """Where the command looked, for an error line (None when no region is configured at all)."""
    try:
        return getattr(args, "region", None) or boto3.session.Session().region_name
    except BotoCoreError:  # a broken profile: the error line already says so
        return None


def region_of(given: str | None, env: Mapping[str, str]) -> str | None:
    """The region as the AWS CLI picks it: --region, then AWS_REGION, then (None here) what boto3 reads
    itself: AWS_DEFAULT_REGION, then the profile's. boto3 does not read AWS_REGION, the AWS CLI v2 does."""
    return given or env.get("AWS_REGION") or None


def main(argv: list[str] | None = None) -> int:
    """Exit status: the command's, or 2 with one line (stdout) when it could not get past a problem."""
    args = build_parser().parse_args(argv)
    if hasattr(args, "region"):
        args.region = region_of(args.region, os.environ)
    try:
        return args.func(args)
    except BrokenPipeError:  # `hpops status | head`: the reader left; nothing left to say
        raise
    except (CliError, ClientError, BotoCoreError, HpopsError, OSError) as error:
        print(f"{_label(args)}: {explain(error, _region(args))}")
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
