"""`hpops`: the operator's command line.

    hpops demo [--json FILE]                 the whole story in the local twin
    hpops twin send EVENT.json [...] [--cluster NAME --cluster-id ID --login-group GROUP]
                                             run saved events through the twin
    hpops status  --stack-name S | --twin    target group vs login nodes, recent executions
    hpops repair  --stack-name S | --twin [--dry-run]
    hpops bench [--json FILE]                API calls, state transitions, times (the twin)
    hpops host-keys generate|adopt|rotate|show --stack-name S   the canonical SSH host keys (keys mode)
    hpops host-keys ca-generate|ca-show --stack-name S         the host certificate CA (certificate mode)
    hpops lifecycle --stack-name S [--out DIR] [--no-vendor]  the node agent bundle for on_create.sh
    hpops cost --stack-name S | --twin [--json | --csv]      per-user spend this month (Slurm accounting)
    hpops cost subscribe --stack-name S USER EMAIL            e-mail USER's own spend alerts to EMAIL

`status` and `repair` talk to a real deployment through the stack's outputs and parameters
(your usual AWS credentials); with `--twin` they run against a fresh local twin instead.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
import time
from collections.abc import Mapping
from typing import Any

import boto3
from botocore.exceptions import BotoCoreError, ClientError

from hpops.output import cost_exit_status, describe_result, print_cost, print_targets


def _twin(command: str, args: argparse.Namespace) -> int:
    """Run a twin command; the twin is part of the development install only."""
    try:
        from hpops_twin import commands
    except ImportError as error:
        print(f"hpops {command}: the local twin is not installed ({error.name} missing). It comes with the "
              "development install: `make demo` in a clone of the repository, or pip install -e ./twin")
        return 2
    return getattr(commands, command)(args)


def _stack(stack_name: str, region: str | None) -> tuple[dict[str, str], dict[str, str], Any]:
    session = boto3.session.Session(region_name=region)
    stack = session.client("cloudformation").describe_stacks(StackName=stack_name)["Stacks"][0]
    outputs = {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}
    parameters = {p["ParameterKey"]: p.get("ParameterValue", "") for p in stack.get("Parameters", [])}
    return outputs, parameters, session


def cmd_status(args: argparse.Namespace) -> int:
    if args.twin:
        return _twin("status", args)
    outputs, parameters, session = _stack(args.stack_name, args.region)
    elbv2, sfn, sagemaker = session.client("elbv2"), session.client("stepfunctions"), session.client("sagemaker")
    health = elbv2.describe_target_health(TargetGroupArn=outputs["TargetGroupArn"])["TargetHealthDescriptions"]
    targets = [{"ip": d["Target"]["Id"], "port": d["Target"].get("Port"), "state": d["TargetHealth"]["State"]} for d in health]
    group = parameters.get("LoginGroupName", "login")
    pages = sagemaker.get_paginator("list_cluster_nodes").paginate(ClusterName=parameters["ClusterName"], InstanceGroupNameContains=group)
    running = [s for p in pages for s in p["ClusterNodeSummaries"]
               if s["InstanceGroupName"] == group and s["InstanceStatus"]["Status"] == "Running"]
    truth = sorted(sagemaker.describe_cluster_node(ClusterName=parameters["ClusterName"], NodeId=s["InstanceId"])["NodeDetails"]["PrivatePrimaryIp"] for s in running)
    print_targets(targets, truth)
    print("\nrecent executions:")
    for execution in sfn.list_executions(stateMachineArn=outputs["LoginNodeSyncStateMachineArn"], maxResults=10)["executions"]:
        print(f"  {execution['startDate']:%Y-%m-%d %H:%M:%S}  {execution['status']:<10} {execution['name']}")
    return 0


def cmd_repair(args: argparse.Namespace) -> int:
    if args.twin:
        return _twin("repair", args)
    outputs, parameters, session = _stack(args.stack_name, args.region)
    sfn = session.client("stepfunctions")
    payload = {"cluster": parameters["ClusterName"], "mode": "repair", "dryRun": args.dry_run}
    arn = sfn.start_execution(stateMachineArn=outputs["LoginNodeSyncStateMachineArn"], input=json.dumps(payload))["executionArn"]
    print(f"started {arn}")
    deadline = time.monotonic() + args.timeout
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


def cmd_host_keys(args: argparse.Namespace) -> int:
    """Generate, adopt or rotate the canonical host keys (an explicit operator action)."""
    from pathlib import Path

    from hpops_core.host_identity.keys import HostIdentityError, adopt_bundle, generate_bundle
    from hpops_core.host_identity.operator import install_canonical_bundle

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
    if args.action == "adopt":
        if not args.from_dir:
            print("adopt needs --from-dir: a copy of a login node's /etc/ssh/ssh_host_*_key files")
            return 2
        files = {p.name: p.read_bytes() for p in Path(args.from_dir).glob("ssh_host_*_key")}
        try:
            bundle = adopt_bundle(files)
        except HostIdentityError as error:  # its messages name files and key types, never key material
            print(f"hpops host-keys adopt: {error} (in {args.from_dir})")
            return 1
    else:  # generate, rotate
        bundle = generate_bundle()
    fingerprints = install_canonical_bundle(
        session.client("secretsmanager"), session.client("dynamodb"), outputs["HostIdentitySecretArn"],
        outputs["SyncStateTableName"], parameters["ClusterName"], bundle,
    )
    print("canonical host keys installed; users should trust:")
    for line in bundle.known_hosts_lines(outputs.get("LoadBalancerDnsName", "<load-balancer-dns-name>")):
        print("  " + line)
    for key_type, value in fingerprints.items():
        print(f"{key_type:<22} {value}")
    if args.action == "rotate":
        print("now run: hpops repair --stack-name", args.stack_name,
              "(publishes the new keys; every login node's agent applies them and is re-verified)")
    return 0


def _host_ca(args: argparse.Namespace, outputs: dict, parameters: dict, session: Any) -> int:
    """Certificate mode: create (or rotate) the CA, or print the line users trust."""
    from hpops_core.host_identity.identity_record import read_expected
    from hpops_core.host_identity.keys import generate_ca
    from hpops_core.host_identity.operator import install_certificate_authority

    table, cluster = outputs["SyncStateTableName"], parameters["ClusterName"]
    if args.action == "ca-generate":
        ca = generate_ca()
        install_certificate_authority(session.client("secretsmanager"), session.client("dynamodb"),
                                      outputs["HostCertificateAuthoritySecretArn"], table, cluster, ca)
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
    print(f"  @cert-authority {host},{parameters.get('HostCertificatePrincipals') or '<your-alias>'} {public_line}")
    return 0


def cmd_lifecycle(args: argparse.Namespace) -> int:
    """Write the node agent bundle, configured from the stack's outputs, for the lifecycle S3 prefix."""
    from pathlib import Path

    from hpops_node_agent.bundle import build_bundle

    if args.stack_name:
        outputs, parameters, session = _stack(args.stack_name, args.region)
        cluster, bus, region = parameters["ClusterName"], outputs["NodeReportBusName"], session.region_name
    elif args.cluster and args.report_bus and args.region:
        cluster, bus, region = args.cluster, args.report_bus, args.region
    else:
        print("lifecycle needs --stack-name, or --cluster, --report-bus and --region")
        return 2
    folder = build_bundle(Path(args.out), cluster, region, bus, vendor=not args.no_vendor)
    print(f"wrote {folder}")
    print(f"copy it next to on_create.sh:  aws s3 sync {folder} s3://<lifecycle-bucket>/<prefix>/hpops/")
    print("and add this line to on_create.sh (after sshd is configured):  bash ./hpops/install.sh")
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


def _one_line(error: BaseException) -> str:
    if isinstance(error, ClientError):
        details = error.response.get("Error", {})
        text = f"{error.operation_name}: {details.get('Code', 'error')}: {details.get('Message', '')}"
    else:
        text = f"{type(error).__name__}: {error}"
    return " ".join(text.split())[:300]


def spend_function_environment(session: Any, stack_name: str) -> dict[str, str]:
    """The deployed CheckUserSpendFunction's environment variables (CloudFormation -> Lambda)."""
    resource = session.client("cloudformation").describe_stack_resource(StackName=stack_name, LogicalResourceId=SPEND_FUNCTION)
    name = resource["StackResourceDetail"]["PhysicalResourceId"]
    configuration = session.client("lambda").get_function_configuration(FunctionName=name)
    return dict((configuration.get("Environment") or {}).get("Variables") or {})


def user_spend_document(env: Mapping[str, str], region: str, now: dt.datetime, *, sagemaker: Any, ce: Any,
                        pricing: Any, dynamodb: Any) -> dict[str, Any]:
    """This month's spend per user as of ``now``, computed as CheckUserSpend computes it.

    ``env``: the function's environment; ``region``: the stack's (Lambda adds AWS_REGION itself, so
    it is not among the function's variables). Returns report_document's JSON plus ``findings``: the users at
    or over a threshold (what the hourly check alerts on, once each)."""
    from hpops_core.budget_guard import spend_check
    from hpops_core.budget_guard.config import UserSpendConfig
    from hpops_core.budget_guard.guard import observe_cluster
    from hpops_core.budget_guard.user_spend import decide_user_alerts, report_document

    config = UserSpendConfig.from_env(dict(env) | {"AWS_REGION": region})
    observed = observe_cluster(sagemaker, config.cluster_name)
    report = spend_check.gather_report(config, observed, now, ce=ce, pricing=pricing, dynamodb=dynamodb)
    document = report_document(report, config.thresholds)
    if observed.get("ClusterStatus") == "NotFound":
        document["warnings"].append({"name": "ClusterNotFound", "reason": (
            f"DescribeCluster does not find {config.cluster_name}: no instance type is known, so nothing is priced")})
    document["findings"] = [alert.summary for alert in decide_user_alerts(report, config.thresholds, set())]
    return document


def cmd_cost(args: argparse.Namespace) -> int:
    """Exit 0: every user below their thresholds; 1: someone at or over one, or a warning; 2: can't tell."""
    if getattr(args, "cost_command", None) == "subscribe":
        return _cost_subscribe(args)
    if args.twin:
        return _twin("cost", args)
    if not args.stack_name:
        print("hpops cost: give --stack-name S (or --twin)")
        return 2
    now = _utc_now()
    if args.month is not None and args.month != f"{now:%Y-%m}":
        shape = "" if MONTH_RE.fullmatch(args.month) else " (YYYY-MM)"
        print(f"hpops cost: --month {args.month}{shape}: {MONTH_HELP} ({now:%Y-%m})")
        return 2
    from hpops_core.budget_guard.aws_budgets import ce_client
    from hpops_core.budget_guard.pricing import pricing_client
    from hpops_core.common.errors import HpopsError

    try:
        session = boto3.session.Session(region_name=args.region)
        if not session.region_name:
            print("hpops cost: no region: pass --region, or set AWS_REGION or a profile's region")
            return 2
        env = spend_function_environment(session, args.stack_name)
        document = user_spend_document(env, session.region_name, now, sagemaker=session.client("sagemaker"),
                                       ce=ce_client(session), pricing=pricing_client(session),
                                       dynamodb=session.client("dynamodb"))
    except (ClientError, BotoCoreError, HpopsError) as error:
        print(f"hpops cost: {_one_line(error)}")
        return 2
    print_cost(document, "json" if args.json else "csv" if args.csv else "table")
    return cost_exit_status(document)


def _cost_subscribe(args: argparse.Namespace) -> int:
    from hpops_core.common.validation import InvalidValue, check_posix_user, shown

    if not args.stack_name:
        print("hpops cost subscribe: give --stack-name S")
        return 2
    try:
        check_posix_user(args.user, "USER")
    except InvalidValue as error:
        print(f"hpops cost subscribe: {error}")
        return 2
    if not EMAIL_RE.fullmatch(args.email):
        print(f"hpops cost subscribe: EMAIL {shown(args.email)} is not an e-mail address")
        return 2
    try:
        outputs, _, session = _stack(args.stack_name, args.region)
        topic = outputs.get("UserSpendAlertTopicArn")
        if not topic:
            print(f"hpops cost subscribe: stack {args.stack_name} has no output UserSpendAlertTopicArn "
                  "(deployed before per-user spend alerts: update the stack)")
            return 2
        policy = {"user": [args.user]}
        arn = session.client("sns").subscribe(
            TopicArn=topic, Protocol="email", Endpoint=args.email, ReturnSubscriptionArn=True,
            Attributes={"FilterPolicy": json.dumps(policy), "FilterPolicyScope": "MessageAttributes"},
        )["SubscriptionArn"]
    except (ClientError, BotoCoreError) as error:
        print(f"hpops cost subscribe: {_one_line(error)}")
        return 2
    print(f"subscribed {args.email} to {args.user}'s spend alerts: {arn}")
    print(f"  filter policy {json.dumps(policy)}: only alerts about {args.user} reach this address")
    print(f"AWS has e-mailed {args.email} a confirmation link; nothing is delivered until {args.user} opens it and")
    print("clicks \"Confirm subscription\" (until then the subscription shows as PendingConfirmation).")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hpops", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="play the whole story in the local twin")
    demo.add_argument("--json", metavar="FILE", help="write the steps and their outcome here")
    demo.set_defaults(func=lambda a: _twin("demo", a))

    twin = commands.add_parser("twin", help="the local twin")
    twin_commands = twin.add_subparsers(dest="twin_command", required=True)
    send = twin_commands.add_parser("send", help="run saved events (events/*.json) through the twin")
    send.add_argument("events", nargs="+", metavar="EVENT.json")
    send.add_argument("--cluster", default="ml-research", help="twin cluster name (the saved events use ml-research)")
    send.add_argument("--cluster-id", help="twin cluster id, the last segment of its ARN (default: derived from the name)")
    send.add_argument("--login-group", default="login", help="the twin cluster's login instance group (default login)")
    send.set_defaults(func=lambda a: _twin("send", a))

    for name, func, text in (("status", cmd_status, "target group vs Running login nodes"),
                             ("repair", cmd_repair, "start a manual repair execution")):
        sub = commands.add_parser(name, help=text)
        where = sub.add_mutually_exclusive_group(required=True)
        where.add_argument("--stack-name", help="the deployed stack")
        where.add_argument("--twin", action="store_true", help="use a fresh local twin (development install)")
        sub.add_argument("--region")
        if name == "repair":
            sub.add_argument("--dry-run", action="store_true", help="report the plan, change nothing")
            sub.add_argument("--timeout", type=float, default=300)
        sub.set_defaults(func=func)

    keys = commands.add_parser("host-keys", help="host identity: generate | adopt | rotate | show | ca-generate | ca-show")
    keys.add_argument("action", choices=("generate", "adopt", "rotate", "show", "ca-generate", "ca-show"))
    keys.add_argument("--stack-name", required=True)
    keys.add_argument("--region")
    keys.add_argument("--from-dir", help="adopt: folder holding a login node's ssh_host_*_key files")
    keys.set_defaults(func=cmd_host_keys)

    lifecycle = commands.add_parser("lifecycle", help="write the node agent bundle for the cluster's lifecycle scripts")
    lifecycle.add_argument("--stack-name", help="read cluster, region and report bus from this stack")
    lifecycle.add_argument("--region")
    lifecycle.add_argument("--cluster", help="without a stack: the HyperPod cluster name")
    lifecycle.add_argument("--report-bus", help="without a stack: the stack's NodeReportBusName output")
    lifecycle.add_argument("--out", default="dist/lifecycle", help="folder to write (default dist/lifecycle)")
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
    where.add_argument("--stack-name", help="the deployed stack")
    where.add_argument("--twin", action="store_true", help="a demo month in a fresh local twin (development install)")
    cost.add_argument("--region")
    cost.add_argument("--month", metavar="YYYY-MM", help=MONTH_HELP)
    form = cost.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="the report as JSON (money as strings)")
    form.add_argument("--csv", action="store_true", help="one row per user, then idle, other and cluster")
    cost.set_defaults(func=cmd_cost, cost_command=None)
    cost_commands = cost.add_subparsers(dest="cost_command", metavar="[subscribe]")
    subscribe = cost_commands.add_parser(
        "subscribe", help="e-mail USER's own spend alerts to EMAIL (SNS filter policy on the user)")
    # SUPPRESS: `hpops cost --stack-name S subscribe ...` works too (the value set before `subscribe` stays).
    subscribe.add_argument("--stack-name", default=argparse.SUPPRESS)
    subscribe.add_argument("--region", default=argparse.SUPPRESS)
    subscribe.add_argument("user", metavar="USER", help="the POSIX user whose alerts to send")
    subscribe.add_argument("email", metavar="EMAIL")

    bench = commands.add_parser("bench", help="API calls, state transitions and times in the twin")
    bench.add_argument("--json", metavar="FILE")
    bench.set_defaults(func=lambda a: _twin("bench", a))
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
