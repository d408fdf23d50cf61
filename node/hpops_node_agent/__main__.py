"""python3 -m hpops_node_agent [--config PATH] [--once] [--print-role]
python3 -m hpops_node_agent usage --once [--print [--since ISO-TIME]] [--config PATH]
python3 -m hpops_node_agent identity [--config PATH]
python3 -m hpops_node_agent enroll [--config PATH]

Kept to syntax old Pythons can parse, so that on an unsupported interpreter the user gets one
clear line (and exit 78, EX_CONFIG) instead of a traceback.

Login nodes run the host-identity/login-limits loop; the controller node runs the Slurm usage
loop (unless usageSeconds is 0); compute nodes have nothing to do.

`usage --once --print` prints the Slurm usage reports (a JSON list, one per hourly window from the
one holding --since, default now, to the current one) and touches neither AWS nor the agent's
state; `usage --once` collects the due windows and sends them, as one turn of the controller loop.

`identity` (as root) makes the agent's key if it is missing and prints its fingerprint: what the
operator approves with `hpops node approve-enrollment --fingerprint` (needs no boto3).

`enroll` (as root, login and controller nodes) makes the key if missing and enrolls it now, with the
instance identity document where IMDS serves it: what the lifecycle line runs first on a new node,
before users can log in, and what `hpops adopt` runs after approving the key. It prints one line
"hpops enroll: ..." and exits 0 when enrolled, 1 when refused.

Exit codes: 0 ok (also compute nodes, and --once with host identity unchanged, changed or
waiting; usage with every report's status "ok"); 1 --once and the host identity failed, or a
usage report's status is not "ok"; 78 configuration problem (Python, boto3, config file, node
identity).
"""

import sys

EX_CONFIG = 78
# What the bundled botocore needs (its Requires-Python; tests/node keep the two equal). install.sh
# checks the same version, written into it by the bundle builder.
MIN_PYTHON = (3, 10)
MIN_BOTO3 = (1, 28)


def fail(message):
    sys.stderr.write("hpops-node-agent: " + message + "\n")
    return EX_CONFIG


def parse_args(argv):
    import argparse

    parser = argparse.ArgumentParser(
        prog="hpops-node-agent",
        description="Keep this HyperPod node's SSH host identity and login limits as the hpops stack wants them "
                    "(login nodes); report per-user Slurm usage from accounting (the controller node).",
    )
    parser.add_argument("command", nargs="?", choices=("usage", "identity", "enroll"),
                        help="usage: Slurm usage from accounting (with --once); identity: the agent key's fingerprint; "
                             "enroll: enroll the agent key now")
    parser.add_argument("--config", default="/etc/hpops/node-agent.json", help="agent config file (JSON)")
    parser.add_argument("--once", action="store_true", help="run one poll/apply/report cycle and exit")
    parser.add_argument("--print-role", action="store_true",
                        help="print this node's role (login, controller, compute) and exit; needs boto3 only "
                             "where no provisioning_parameters.json names the groups (DescribeCluster)")
    parser.add_argument("--imds-lockdown", action="store_true",
                        help="apply the config's imdsLockdown (on: only root and imdsAllowedGroups reach IMDS; "
                             "off: remove the rules) and exit 0 whatever happens; needs no boto3")
    parser.add_argument("--print", dest="print_reports", action="store_true",
                        help="usage: print the reports as JSON instead of sending them; needs no boto3")
    parser.add_argument("--since", help="usage --print: first window is the one holding this UTC time "
                                        "(e.g. 2026-01-31T09:00:00); default: the current window")
    args = parser.parse_args(argv)
    if args.command == "usage" and not args.once:
        parser.error("usage needs --once (the controller's agent collects usage in its loop)")
    if args.command != "usage" and (args.print_reports or args.since):
        parser.error("--print and --since go with usage")
    if args.since and not args.print_reports:
        parser.error("--since goes with --print")
    if args.since:
        import datetime

        try:
            datetime.datetime.strptime(args.since.rstrip("Z"), "%Y-%m-%dT%H:%M:%S")
        except ValueError:
            parser.error("--since must look like 2026-01-31T09:00:00 (UTC)")
    return args


def print_usage(config, since):
    import datetime
    import json

    from . import usage

    now = datetime.datetime.now(datetime.timezone.utc).timestamp()
    start = now
    if since:  # checked by parse_args
        moment = datetime.datetime.strptime(since.rstrip("Z"), usage.TIME_FORMAT)
        start = moment.replace(tzinfo=datetime.timezone.utc).timestamp()
    collector = usage.UsageCollector(config.cluster, usage.reporting_instance_id(config), sacct_cmd=config.sacct_cmd,
                                   provisioning_path=config.provisioning_parameters)
    reports = collector.collect_range(start, now)
    sys.stdout.write(json.dumps(reports, indent=2, sort_keys=True) + "\n")
    return 0 if all(report["status"] == "ok" for report in reports) else 1


def imds_lockdown(config):
    """The installer's and the boot unit's step: never fails, so it never stops a node's provisioning."""
    from . import imds_guard

    if config.imds_lockdown == "on":
        result = imds_guard.apply_lockdown(config.imds_groups)
    else:
        result = imds_guard.remove_lockdown()
    print("IMDS lockdown {}: {}".format("applied" if result.applied else "not in place", result.reason))
    return 0


def print_identity(config):
    import os

    from . import agent_key, node_identity

    try:
        line = agent_key.ensure_key(os.path.join(config.under_root(config.state_dir), node_identity.KEY_FILE),
                                    config.ssh_keygen_cmd)
    except (agent_key.AgentKeyError, OSError) as error:
        return fail("agent key: " + str(error))
    sys.stdout.write(agent_key.fingerprint(line) + "\n")
    return 0


def boto3_problem():
    try:
        import boto3
    except ImportError:
        return ("boto3 is not importable by " + sys.executable + "; install the hpops bundle with its lib/ "
                "folder (PYTHONPATH=/opt/hpops-node-agent/lib:/opt/hpops-node-agent) or pip install 'boto3>=1.28'")
    try:
        version = tuple(int(part) for part in boto3.__version__.split(".")[:2])
    except ValueError:
        return None
    if version < MIN_BOTO3:
        return ("boto3 " + boto3.__version__ + " is too old (AWS_ENDPOINT_URL support needs >= 1.28); "
                "use the bundle's lib/ folder or pip install 'boto3>=1.28'")
    return None


def main(argv=None):
    if sys.version_info < MIN_PYTHON:
        wanted = "{}.{}".format(*MIN_PYTHON)
        return fail("needs Python " + wanted + " or newer (the bundled botocore does), found "
                    + sys.version.split()[0] + "; use the HyperPod Slurm AMI (Ubuntu 22.04, Python 3.10) "
                    "or install python3 >= " + wanted)
    args = parse_args(argv)

    import dataclasses

    from .config import ConfigError, load_config
    from .identity import IdentityError, describe_groups_with, resolve

    try:
        config = load_config(args.config)
    except ConfigError as error:
        return fail(str(error))
    if args.command == "usage" and args.print_reports:
        return print_usage(config, args.since)
    if args.command == "identity":
        return print_identity(config)
    if args.imds_lockdown:
        return imds_lockdown(config)
    def new_session():
        import boto3

        return boto3.session.Session()

    describe = describe_groups_with(new_session, config)
    try:
        role = resolve(config, need_instance_id=False, describe_groups=describe).role
        if args.print_role:
            print(role)
            return 0
        # The role is known now: the second lookup only finds the instance id (no layout read again).
        identity = resolve(dataclasses.replace(config, role=role)) if role == "login" else None
    except IdentityError as error:
        return fail(str(error))

    collects_usage = args.command == "usage" or (role == "controller" and config.usage_seconds)
    problem = boto3_problem()
    if problem and (role == "login" or collects_usage):
        return fail(problem)

    import threading

    from .agent import NodeAgent, log

    if args.command == "enroll":
        if role not in ("login", "controller"):
            print("hpops enroll: {} node: its agent does not enroll".format(role))
            return 0
        if problem:
            return fail(problem)
        import boto3

        from .agent import NodeAgent

        enrolled, what = NodeAgent(config, boto3.session.Session(), identity=identity).enroll_now()
        print("hpops enroll: " + what)
        return 0 if enrolled else 1
    if role != "login" and not collects_usage:
        log("idle", role=role, reason="compute node: nothing to do" if role == "compute"
            else "controller: Slurm usage collection is off (usageSeconds 0)")
        return 0

    import boto3

    agent = NodeAgent(config, boto3.session.Session(), identity=identity)
    if args.once and collects_usage:
        outcome = agent.usage_tick()
        sent_all = outcome.windows_sent == len(outcome.reports)
        return 0 if sent_all and all(report["status"] == "ok" for report in outcome.reports) else 1
    if args.once:
        outcome = agent.tick()
        if outcome.error or outcome.host_identity_result == "failed":
            return 1
        return 0

    import signal

    stop = threading.Event()

    def request_stop(signum, frame):
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    agent.run(stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
