"""`make bench`, session limits: what a sweep and a StartSession event cost.

The account holds 10,000 active Session Manager sessions of 500 users (each user has their own
role, tagged SSMSessionRunAs=<user>): 2 login-node sessions per user (at the default limit),
one more for 10 of them (over), and the rest on the cluster's worker nodes. Counts are exact (the
twin counts every AWS call our Lambda code makes); seconds are this machine's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from hpops_twin.world import ENFORCING, TwinWorld

USERS = 500
SESSIONS = 10_000
LOGIN_PER_USER = 2
OVER_LIMIT_USERS = 10


@dataclass
class SessionRow:
    scenario: str
    active_sessions: int
    calls: dict
    total_calls: int
    ended: int
    execution_seconds: float
    lambda_seconds: float


def _measure(world: TwinWorld, scenario: str, start) -> SessionRow:
    active = len(world.sessions.store.active())
    world.counter.reset()
    invocations = len(world.dispatcher.invocations)
    began = time.perf_counter()
    arns = start()
    results = world.wait(arns, timeout=600)
    seconds = time.perf_counter() - began
    failed = [(r.error, r.cause) for r in results if r.status != "SUCCEEDED"]
    if failed:
        raise RuntimeError(f"{scenario}: {failed}")
    report = results[0].output["enforcement"]["report"]
    lambda_seconds = sum(i.seconds for i in world.dispatcher.invocations[invocations:])
    calls = dict(sorted(world.counter.calls.items()))
    return SessionRow(scenario, active, calls, sum(calls.values()), report["endedCount"],
                      seconds, lambda_seconds)


def session_limits_rows() -> list[SessionRow]:
    rows = []
    with TwinWorld(parameters=ENFORCING) as world:
        sessions = world.sessions
        small = sessions.start_session("early-bird")
        rows.append(_measure(world, "StartSession, user under limit (1 session in account)",
                             lambda: world.publish([small.event])))

        elsewhere = (SESSIONS - USERS * LOGIN_PER_USER - OVER_LIMIT_USERS - 1) // USERS
        for number in range(USERS):
            user = f"u{number:03d}"
            sessions.add_sessions(user, LOGIN_PER_USER + (number < OVER_LIMIT_USERS))
            sessions.add_sessions(user, elsewhere, group=world.worker_group)
        remainder = SESSIONS - len(sessions.store.active())
        sessions.add_sessions("u499", remainder, group=world.worker_group)

        rows.append(_measure(world, "sweep, cold run-as tag cache", lambda: [sessions.sweep()]))
        rows.append(_measure(world, "sweep, warm tag cache (< 5 min later)", lambda: [sessions.sweep()]))
        newcomer = sessions.start_session("newcomer")
        rows.append(_measure(world, "StartSession, user under limit", lambda: world.publish([newcomer.event])))
        over = sessions.start_session("u100")  # u100 already has its 2 login sessions
        rows.append(_measure(world, "StartSession, user over limit (1 ended)", lambda: world.publish([over.event])))
    return rows


def render(rows: list[SessionRow]) -> str:
    header = f"{'session limits':<54} {'active':>6} {'calls':>5} {'ended':>5} {'exec s':>6} {'λ s':>5}  calls"
    lines = [header, "-" * len(header)]
    for r in rows:
        calls = ", ".join(f"{k.split('.', 1)[1]}={v}" for k, v in r.calls.items())
        lines.append(f"{r.scenario:<54} {r.active_sessions:>6} {r.total_calls:>5} {r.ended:>5} "
                     f"{r.execution_seconds:6.2f} {r.lambda_seconds:5.2f}  {calls}")
    return "\n".join(lines)


def session_limits_section() -> tuple[list[SessionRow], dict[str, bool]]:
    """Run, print the table, and return the rows and the targets for run_bench's verdicts."""
    rows = session_limits_rows()
    print()
    print(render(rows), flush=True)
    by_name = {r.scenario: r for r in rows}
    under = [r for r in rows if r.scenario.startswith("StartSession, user under limit")]
    cold, warm = by_name["sweep, cold run-as tag cache"], by_name["sweep, warm tag cache (< 5 min later)"]
    pages = -(-SESSIONS // 200)
    verdicts = {
        "session limits: StartSession under the limit <= 3 calls, at 1 and 10,000 sessions": all(r.total_calls <= 3 for r in under),
        f"session limits: sweep of {SESSIONS:,} sessions ends exactly the {OVER_LIMIT_USERS} excess": cold.ended == OVER_LIMIT_USERS,
        f"session limits: warm sweep = {pages} DescribeSessions pages, no IAM": warm.calls.get("ssm.DescribeSessions") == pages
        and not any(k.startswith("iam.") for k in warm.calls),
    }
    return rows, verdicts
