"""The demo's session-limit step: alice opens three Session Manager sessions against a
limit of two; the StartSession events reach the SessionLimits state machine through the
template's CloudTrail rule, the newest session is ended, and the AlertTopic hears about it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

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
              "the newest ends; the alert names alice, the limit and the session", newest_ended_and_alice_told)
    for started in opened:
        demo.say(f"          {started.session_id} on {started.instance_id}: {sessions.store.status(started.session_id)}")
    for alert in sessions.alerts()[alerts_before:]:
        for line in alert["message"].split("\n--- details (JSON) ---")[0].splitlines():
            if line.startswith(("User ", "  - ")):
                demo.say(f"          alert: {line.strip()}")
