"""python3 -m hpops_node_agent [--config PATH] [--once] [--print-role]

Kept to syntax old Pythons can parse, so that on an unsupported interpreter the user gets one
clear line (and exit 78, EX_CONFIG) instead of a traceback.

Exit codes: 0 ok (also compute/controller nodes, and --once with host identity unchanged,
changed or waiting); 1 --once and the host identity failed; 78 configuration problem (Python,
boto3, config file, node identity).
"""

import sys

EX_CONFIG = 78
MIN_PYTHON = (3, 8)
MIN_BOTO3 = (1, 28)


def fail(message):
    sys.stderr.write("hpops-node-agent: " + message + "\n")
    return EX_CONFIG


def parse_args(argv):
    import argparse

    parser = argparse.ArgumentParser(
        prog="hpops-node-agent",
        description="Keep this HyperPod node's SSH host identity and login limits as the hpops stack wants them.",
    )
    parser.add_argument("--config", default="/etc/hpops/node-agent.json", help="agent config file (JSON)")
    parser.add_argument("--once", action="store_true", help="run one poll/apply/report cycle and exit")
    parser.add_argument("--print-role", action="store_true",
                        help="print this node's role (login, controller, compute) and exit; needs no boto3")
    return parser.parse_args(argv)


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
        return fail("needs Python 3.8 or newer, found " + sys.version.split()[0]
                    + "; install python3 >= 3.8 (the HyperPod DLAMI's /usr/bin/python3 is 3.10)")
    args = parse_args(argv)

    from .config import ConfigError, load_config
    from .identity import IdentityError, resolve

    try:
        config = load_config(args.config)
    except ConfigError as error:
        return fail(str(error))
    try:
        if args.print_role:
            print(resolve(config, need_instance_id=False).role)
            return 0
        role = resolve(config, need_instance_id=False).role
        identity = resolve(config) if role == "login" else None
    except IdentityError as error:
        return fail(str(error))

    problem = boto3_problem()
    if problem and role == "login":
        return fail(problem)

    import threading

    from .agent import NodeAgent, log

    if role != "login":
        log("idle", role=role, reason="compute node: nothing to do" if role == "compute"
            else "controller: no duties yet")
        return 0

    import boto3

    agent = NodeAgent(config, boto3.session.Session(), identity=identity)
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
