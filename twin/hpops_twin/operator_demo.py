"""`make demo`'s operator chapter: the first commands an operator runs on AWS, on a twin account set up as
a working installation (doctor_twin.py): `hpops doctor`, `hpops status`, then a login node that came up
without the agent and `hpops adopt`, which installs it through Session Manager; the repair admits it."""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import warnings
from collections.abc import Callable

from hpops_twin.demo import Demo


def _printed(call: Callable[[], object]) -> tuple[object, list[str]]:
    """What a CLI printer writes to the terminal, as lines (the demo says them on its clock)."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        result = call()
    return result, buffer.getvalue().splitlines()


def run_doctor_chapter(main: Demo) -> None:
    """`hpops doctor` in a twin account set up around the stack as a working installation has it."""
    from hpops.doctor import print_doctor
    from hpops_twin.doctor_twin import DoctorAccount, doctor_world

    main.say("operator: `hpops doctor` on a fourth stack, in a twin account set up as a working installation "
             "(lifecycle bundle in S3, NodeAgentPolicy on the execution role, NAT route, Client VPN, CloudTrail, "
             "alarm e-mail, the controller's agent)")
    with warnings.catch_warnings(), doctor_world(progress=lambda text: main.say(f"        {text}")) as world:
        warnings.filterwarnings("ignore", message="No application metrics to publish")
        demo = Demo(world, main.out, main.started)
        with demo.heartbeat(lambda: "setting the account up around the stack"):
            account = DoctorAccount(world).prepare()
        demo.say("        $ hpops doctor")
        with demo.heartbeat(lambda: "hpops doctor checks"):
            findings = account.run()
        status, lines = _printed(lambda: print_doctor(account.target(), findings, False))
        for line in lines:
            demo.say(f"          {line}")
        demo.say(f"          (exit {status})")


def operator_steps(demo: Demo) -> None:
    """`hpops status`, then a login node that came up without the agent and `hpops adopt`, which installs it
    through Session Manager; the repair it starts admits the node."""
    import boto3

    from hpops.adopt import outcome_lines
    from hpops.main import adopt_stack
    from hpops.output import print_targets
    from hpops_twin.adopt_twin import TwinSessionRunner
    from hpops_twin.doctor_twin import DoctorAccount, _Outputs
    from hpops_twin.world import STACK_NAME

    world = demo.world

    def status_lines() -> None:
        _, printed = _printed(lambda: print_targets(world.targets(), world.login_truth()))
        demo.say("        $ hpops status")
        for line in printed:
            demo.say(f"          {line}")

    status_lines()
    sim, cluster = world.sim, world.cluster_name
    world.hosts.lifecycle_installs_agent = False  # an on_create.sh without the hpops line
    count = len([n for n in sim.nodes(cluster, world.login_group) if n.status == "Running"])
    world.wait(world.publish(sim.scale_group(cluster, world.login_group, count + 1)))
    late = next(n for n in sim.nodes(cluster, world.login_group) if n.status == "Pending")
    demo.step(f"operator: login node {late.instance_id} comes up from an on_create.sh without the hpops line",
              lambda: world.publish(sim.finish_provisioning(cluster)), "kept out: no agent vouches for it",
              lambda: late.ip not in world.target_ips(), drift_expected=True)
    status_lines()
    outcomes: list = []

    def adopt() -> list[str]:
        demo.say("        $ hpops adopt   (as the administrator role: installs the agent through Session Manager, then starts a repair)")
        with world.iam.operator(DoctorAccount(world).operator_policy("administrator")):
            session = boto3.session.Session(region_name=world.region)
            outcomes.extend(adopt_stack(session, STACK_NAME, _Outputs(world), dict(world.resolver.parameters),
                                        TwinSessionRunner(world), dt.datetime.now(dt.timezone.utc)))
            for line in outcome_lines(outcomes):
                demo.say(f"          {line}")
            return [world.start_repair()]

    demo.step("operator: `hpops adopt`, then the repair it starts", adopt, "every Running login node registered",
              lambda: late.ip in world.target_ips() and len(world.target_ips()) == count + 1
              and all(o.status in ("adopted", "skipped") for o in outcomes))
    world.hosts.lifecycle_installs_agent = True
    status_lines()
