"""Who is held in Slurm for being over their monthly dollar limit, and what changed. PURE: time is an input.

With ``UserBudgetAction=hold`` a user whose actual spend this month is at or over their limit is
held (their new and pending jobs wait; running jobs are never touched); a projected crossing only
warns. A hold ends when the month turns, when an override raises the limit above the spend, or when
an operator releases the user (``hpops cost release``: for the rest of the month, recorded with who
and why). Exempt users (``UserBudgetExemptUsers``) and root are never held.

``decide_holds`` gives one decision per user with a limit, each with its reason; ``transitions``
compares the decided holds with the previous sweep's and the controller agent's report, and gives
the state to keep and one alert per transition (held, released, could not apply).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hpops_core.budget_guard import BudgetGuardError
from hpops_core.budget_guard.projection import month_bounds
from hpops_core.budget_guard.user_spend import SpendReport, usd
from hpops_core.node_channel import user_holds

ACTIONS = ("alert", "hold")
NEVER_HELD = frozenset({"root"})
MAX_DECISION_ROWS = 200
HELD, RELEASED, NOT_APPLIED = "held", "released", "could not apply"


class HoldsTooLarge(BudgetGuardError):
    """More held users than NodeChannel's answer can carry to the controller's agent (user_holds_store)."""


@dataclass(frozen=True)
class HoldPolicy:
    action: str = "alert"
    dry_run: bool = False
    exempt: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Release:
    """An operator's release of one user for one month (``hpops cost release``)."""

    user: str
    month: str
    by: str
    reason: str
    at: str


@dataclass(frozen=True)
class HoldDecision:
    user: str
    hold: bool
    reason: str


def month_turn(now: dt.datetime) -> dt.datetime:
    return month_bounds(now)[1]


def ends_text(now: dt.datetime, stack: str = "S") -> str:
    return (f"it ends when the month turns ({month_turn(now):%Y-%m-%d %H:%M} UTC), when their limit is raised above "
            f"their spend, or with `hpops cost release --stack-name {stack} USER --reason TEXT`")


def decide_holds(report: SpendReport, policy: HoldPolicy, releases: Mapping[str, Release],
                 now: dt.datetime) -> list[HoldDecision]:
    """One decision per user with a limit, highest spend first."""
    decisions = []
    for spend in report.users:
        if spend.limit_usd is None:
            continue
        over = spend.usd >= spend.limit_usd
        of = f"spent {usd(spend.usd)} of their {usd(spend.limit_usd)} limit ({spend.limit_source}) in {report.month}"
        release = releases.get(spend.user)
        if spend.user in NEVER_HELD or spend.user in policy.exempt:
            hold, reason = False, f"{of}; exempt from holds"
        elif not over:
            projected = (f"; projected {usd(spend.projected_usd)} by month end: a projected crossing only warns"
                         if spend.projected_usd >= spend.limit_usd else "")
            hold, reason = False, f"{of}: under the limit{projected}"
        elif release is not None:
            hold, reason = False, (f"{of}; released for the rest of {report.month} by {release.by} at {release.at}: "
                                   f"{release.reason}")
        elif policy.action != "hold":
            hold, reason = False, f"{of}: over the limit; UserBudgetAction is {policy.action}, so alerts only"
        else:
            hold, reason = True, f"{of}: at or over the limit"
        decisions.append(HoldDecision(spend.user, hold, reason))
    return decisions


def held_users(decisions: Sequence[HoldDecision]) -> list[str]:
    return sorted(d.user for d in decisions if d.hold)


def holds_document(decisions: Sequence[HoldDecision], policy: HoldPolicy, now: dt.datetime) -> dict[str, Any]:
    """What the controller's agent fetches (user_holds_store): in a dry run no user (the agent lifts, never sets)."""
    start, end = month_bounds(now)
    return user_holds.desired_document(f"{start:%Y-%m}", end.strftime("%Y-%m-%dT%H:%M:%SZ"), policy.dry_run,
                                       held_users(decisions) if policy.action == "hold" else [])


def agent_states(report: Mapping[str, Any] | None, version: str) -> dict[str, tuple[str, str]] | None:
    """user -> (held|failed, reason) from the controller agent's report of ``version``; None when it
    has not reported that version yet (then nothing is judged)."""
    if not report or report.get("version") != version:
        return None
    return {row["user"]: (row["state"], row["reason"]) for row in report.get("users") or []}


def transitions(previous: Mapping[str, Mapping[str, str]], decisions: Sequence[HoldDecision], policy: HoldPolicy,
                agent: Mapping[str, tuple[str, str]] | None, now: dt.datetime, cluster: str,
                stack: str) -> tuple[dict[str, dict[str, str]], list[dict[str, Any]]]:
    """(the holds to remember, one alert per transition). ``previous``: user -> {state, since, reason}.

    held: the stack decided to hold a user it did not hold (or the agent now reports applied what it
    could not apply before); released: a held user is not held any more, with why; could not apply:
    the agent reports it could not hold the user (once, until it can)."""
    now_text = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    decided = {d.user: d for d in decisions}
    desired = set(held_users(decisions)) if policy.action == "hold" and not policy.dry_run else set()
    state: dict[str, dict[str, str]] = {}
    alerts: list[dict[str, Any]] = []

    def alert(user: str, what: str, text: str) -> None:
        summary = f"{user} {what} on {cluster}"
        alerts.append({"kind": "hold", "transition": what, "user": user, "cluster": cluster, "asOf": now_text,
                       "summary": summary[:200], "text": text})

    for user in sorted(desired):
        before = previous.get(user)
        reason = decided[user].reason
        applied = (agent or {}).get(user)
        if before is not None and applied is None:
            # The agent has not reported this document yet: nothing new is known about this user.
            state[user] = dict(before)
            continue
        failed = applied is not None and applied[0] == user_holds.FAILED
        if failed:
            state[user] = {"state": "failed", "since": (before or {}).get("since", now_text), "reason": applied[1]}
            if (before or {}).get("state") != "failed":
                alert(user, NOT_APPLIED, (
                    f"hpops decided to hold {user} ({reason}), but the controller could not apply it: {applied[1]}.\n"
                    f"Their jobs still start. Fix it on the controller; hpops tries again every poll."))
            continue
        state[user] = {"state": "held", "since": (before or {}).get("since", now_text), "reason": reason}
        if before is None or before.get("state") == "failed":
            alert(user, HELD, (
                f"{user} {reason}.\nTheir new and pending jobs wait in Slurm (QOS hpopshold, squeue reason "
                f"QOSGrpJobsLimit); running jobs keep running.\nThe hold ends: {ends_text(now, stack)}."))
    for user in sorted(set(previous) - desired):
        decision = decided.get(user)
        if previous[user].get("month", f"{now:%Y-%m}") != f"{now:%Y-%m}" or decision is None:
            why = f"the month turned ({now:%Y-%m} started)"
        elif policy.action != "hold":
            why = f"UserBudgetAction is {policy.action}"
        elif policy.dry_run:
            why = "UserBudgetHoldDryRun is true"
        else:
            why = decision.reason
        alert(user, RELEASED, f"{user} is no longer held: {why}.\nTheir pending jobs start as Slurm schedules them.")
    month = f"{now:%Y-%m}"
    return {user: dict(value, month=month) for user, value in state.items()}, alerts


def decision_rows(decisions: Sequence[HoldDecision]) -> list[dict[str, Any]]:
    return [{"user": d.user, "hold": d.hold, "reason": d.reason} for d in decisions[:MAX_DECISION_ROWS]]
