"""Budget holds in the twin: the controller's real agent against Slurm accounting's association limits.

``FakeSlurmLimits`` stands in for subprocess.run in the agent's SlurmHolds: it answers the
sacctmgr and scontrol commands the agent runs, over an in-memory association table, the way the
real ones answer (tests/slurm/test_holds_real_slurm.py shows those against slurmctld + slurmdbd:
the pending reason, the read-back, the restore of -1 to empty). The twin checks the flow (sweep ->
parameter -> agent -> Slurm limits -> report -> status and alerts), not Slurm's scheduler.
"""

from __future__ import annotations

import datetime as dt
import os
import types
from typing import Any, Iterable

TWIN_SLURM_CLUSTER = "twin"
# The demo month's stack with holds on: alice's limit is below what she spent by Nov 20; bob is over
# the default but exempt; carol is under it.
HOLD_PARAMETERS = {"UserMonthlyBudgetUsd": "5000", "UserBudgetOverrides": "alice=50000", "UserBudgetAction": "hold",
                   "UserBudgetExemptUsers": "bob"}
OPERATOR = "arn:aws:iam::123456789012:user/research-computing-director"


def holds_world() -> Any:
    """The user spend chapter's cluster and month, deployed with HOLD_PARAMETERS."""
    from hpops_twin import user_spend_demo as chapter
    from hpops_twin.world import TwinWorld

    extra = {name: spec for name, spec in chapter.GROUPS.items() if name not in ("login", "gpu")}
    return TwinWorld(login_group="login", login_count=chapter.GROUPS["login"][1], worker_group="gpu",
                     worker_count=chapter.GROUPS["gpu"][1], extra_groups=extra,
                     parameters=dict(chapter.PARAMETERS, **HOLD_PARAMETERS))


class FakeSlurmLimits:
    def __init__(self, users: Iterable[str], enforce: str = "associations,limits"):
        self.enforce = enforce
        self.associations = {user: {"id": str(index + 2), "account": "research", "GrpJobs": "", "MaxJobs": ""}
                             for index, user in enumerate(users)}
        self.modifications: list[list[str]] = []

    @staticmethod
    def _answer(code: int = 0, out: str = "", err: str = "") -> Any:
        return types.SimpleNamespace(returncode=code, stdout=out.encode(), stderr=err.encode())

    def __call__(self, command: list[str], **_: Any) -> Any:
        program, args = os.path.basename(command[0]), command[1:]
        if program == "scontrol" and args == ["show", "config"]:
            return self._answer(out=f"ClusterName             = {TWIN_SLURM_CLUSTER}\n"
                                    f"AccountingStorageEnforce = {self.enforce}\n")
        if program != "sacctmgr":
            raise AssertionError(f"not a command the twin's Slurm answers: {command}")
        end = args.index("set") if "set" in args else len(args)
        where = dict(arg.split("=", 1) for arg in args[args.index("where") + 1:end] if "=" in arg)
        if args[:3] == ["-nP", "show", "assoc"]:
            row = self.associations.get(where.get("user", ""))
            if row is None:
                return self._answer()
            fields = [row["id"], TWIN_SLURM_CLUSTER, row["account"], where["user"], "", row["GrpJobs"], row["MaxJobs"]]
            return self._answer(out="|".join(fields) + "\n")
        if args[:3] == ["-i", "modify", "user"]:
            row = self.associations.get(where.get("name", ""))
            if row is None:
                return self._answer(1, " Nothing modified\n")
            self.modifications.append(list(args))
            for setting in args[args.index("set") + 1:]:
                name, value = setting.split("=", 1)
                row[name] = "" if value == "-1" else value
            return self._answer(out=" Modified user associations...\n")
        raise AssertionError(f"not a sacctmgr command the twin answers: {command}")

    def limits(self, user: str) -> tuple[str, str]:
        row = self.associations[user]
        return row["GrpJobs"], row["MaxJobs"]

    def squeue(self, user: str) -> str:
        """What `squeue -o %T|%r` shows for a one-node job of ``user``'s: Slurm pends a job whose
        association allows no running job (GrpJobs=0 first), and starts it once the limit is gone;
        tests/slurm/test_holds_real_slurm.py shows both against the real slurmctld."""
        grp_jobs, max_jobs = self.limits(user)
        if grp_jobs == "0":
            return "PENDING|AssocGrpJobsLimit"
        return "PENDING|AssocMaxJobsLimit" if max_jobs == "0" else "RUNNING|None"


def attach(controller: Any, users: Iterable[str], enforce: str = "associations,limits") -> FakeSlurmLimits:
    """The controller node's agent holds users in ``FakeSlurmLimits`` (returned)."""
    fake = FakeSlurmLimits(users, enforce)
    holds = controller.agent.slurm_holds()
    if holds is None:
        raise RuntimeError("the twin's controller has no sacct, so its agent has no Slurm to hold users in")
    holds.run = fake
    return fake


def run_holds(controller: Any, when: dt.datetime) -> dict | None:
    """One holds poll of the controller's agent at ``when``: read the parameter, converge, report."""
    controller.now = when.timestamp()
    with controller.world.dispatcher.environment_lock:  # as node_hosts: a node is not a Lambda's environment
        return controller.agent.holds_tick()


