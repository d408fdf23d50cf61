"""The demo's session-limit steps: alice opens three Session Manager sessions against a
limit of two; the StartSession events reach the SessionLimits state machine through the
template's CloudTrail rule, the newest session is ended, and the AlertTopic hears about it.
Then bob, with two SSH logins on two login nodes, opens a Session Manager shell: one limit over
both paths, so the shell is his third session and ends.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from hpops_twin.ssh_logins import SshLogins

if TYPE_CHECKING:
    from hpops_twin.demo import Demo
    from hpops_twin.ssm_sessions import StartedSession


def session_limit_steps(demo: Demo) -> None:
    world = demo.world
    sessions = world.sessions
    limit = int(world.resolver.parameters["MaxSessionsPerUser"])
    role = sessions.user_role("alice")
    demo.say(f"session limits: {limit} concurrent Session Manager sessions per POSIX user on the login nodes; "
             f"alice's role {role.rsplit('/', 1)[-1]} is tagged SSMSessionRunAs=alice")
    opened: list[StartedSession] = []
    alerts_before = len(sessions.alerts())

    def alice_opens_three_sessions() -> list[str]:
        executions = []
        for _ in range(limit + 1):
            started = sessions.start_session("alice")
            opened.append(started)
            demo.say(f"        alice: aws ssm start-session --target {started.target} -> {started.session_id}")
            arns = world.publish([started.event])  # CloudTrail -> EventBridge -> SessionLimits
            world.wait(arns, timeout=120)  # one after the other, as a person opens sessions
            executions += arns
        return executions

    def newest_ended_and_alice_told() -> bool:
        store = sessions.store
        newest = opened[-1].session_id
        alerts = sessions.alerts()[alerts_before:]
        return (
            store.terminated_by_api() == [newest]
            and all(store.status(s.session_id) == "Connected" for s in opened[:-1])
            and len(alerts) == 1
            and "alice" in alerts[0]["subject"]
            and f"User alice: limit {limit}" in alerts[0]["message"]
            and newest in alerts[0]["message"]
        )

    demo.step(f"alice opens {limit + 1} sessions (limit {limit})", alice_opens_three_sessions,
              "the newest ends; the alert names alice, the limit and the session", newest_ended_and_alice_told,
              targets=False)
    for started in opened:
        demo.say(f"          {started.session_id} on {started.instance_id}: {sessions.store.status(started.session_id)}")
    for alert in sessions.alerts()[alerts_before:]:
        for line in alert["message"].split("\n--- details (JSON) ---")[0].splitlines():
            if line.startswith(("User ", "  - ")):
                demo.say(f"          alert: {line.strip()}")
    ssh_and_session_manager_steps(demo, limit)


def ssh_and_session_manager_steps(demo: Demo, limit: int) -> None:
    world = demo.world
    sessions = world.sessions
    nodes = sorted(n.instance_id for n in world.sim.nodes(world.cluster_name, world.login_group) if n.status == "Running")
    shell: list[StartedSession] = []

    def bob_logs_in_with_ssh_then_opens_a_shell() -> list[str]:
        now = time.time()
        with SshLogins(world).installed() as logins:
            for index in range(limit):
                login = logins.open("bob", nodes[index % len(nodes)], now - 60 * (limit - index), tty=index == 0)
                demo.say(f"        bob: ssh{'' if login.tty else ' -N'} login-nodes -> {login.instance_id} "
                         f"(session {login.handle})")
            world.agents_poll()  # each node reports its SSH logins with its next poll
            shell.append(sessions.start_session("bob"))
            demo.say(f"        bob: aws ssm start-session --target {shell[0].target} -> {shell[0].session_id}")
            arns = world.publish([shell[0].event])
            world.wait(arns, timeout=120)
        world.agents_poll()  # the nodes' next reports list no SSH logins: the twin's stand-in is gone
        return arns

    def the_shell_ended_as_bobs_third_session() -> bool:
        return sessions.store.status(shell[0].session_id) != "Connected" and \
            shell[0].session_id in sessions.store.terminated_by_api()

    demo.step(f"bob: {limit} SSH logins on two login nodes, then a Session Manager shell (limit {limit})",
              bob_logs_in_with_ssh_then_opens_a_shell,
              "SSH and Session Manager count together: the shell is bob's third session and ends",
              the_shell_ended_as_bobs_third_session, targets=False)
