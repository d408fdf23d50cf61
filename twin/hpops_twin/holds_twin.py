"""Budget holds in the twin: the controller's real agent against Slurm accounting's QOS and associations.

``FakeSlurmLimits`` stands in for subprocess.run in the agent's SlurmHolds: it answers the
sacctmgr, squeue and scontrol commands the agent runs, over an in-memory association table, the way
the real ones answer (tests/slurm/test_holds_real_slurm.py shows those against slurmctld + slurmdbd:
the hold QOS, the pending reason, the read-back, the restore of the QOS list and default). The twin
checks the flow (sweep -> parameter -> agent -> Slurm's QOS -> report -> status and alerts), not
Slurm's scheduler.
"""

from __future__ import annotations

import datetime as dt
import os
import types
from typing import Any, Iterable

from hpops_node_agent import slurm_holds

TWIN_SLURM_CLUSTER = "twin"
# The demo month's stack with holds on: alice's limit is below what she spent by the sweeps; bob is over
# the default but exempt; carol is under it.
HOLD_PARAMETERS = {"UserMonthlyBudgetUsd": "3000", "UserBudgetOverrides": "alice=25000", "UserBudgetAction": "hold",
                   "UserBudgetExemptUsers": "bob"}
OPERATOR = "arn:aws:iam::123456789012:user/research-computing-director"


def published_holds(world: Any) -> dict:
    """The holds document as NodeChannel would answer it to the controller's agent (no users: none published)."""
    from hpops_core.node_channel import user_holds, user_holds_store

    answer = user_holds_store.read(world.resolver.physical_ids["SyncStateTable"], world.cluster_name,
                                   world.aws.client("dynamodb"))
    return user_holds.parse_document(answer["value"]) if answer else {"users": []}


def holds_world() -> Any:
    """The user spend chapter's cluster and month, deployed with HOLD_PARAMETERS."""
    from hpops_twin import user_spend_demo as chapter
    from hpops_twin.world import TwinWorld

    extra = {name: spec for name, spec in chapter.GROUPS.items() if name not in ("login", "gpu")}
    return TwinWorld(login_group="login", login_count=chapter.GROUPS["login"][1], worker_group="gpu",
                     worker_count=chapter.GROUPS["gpu"][1], extra_groups=extra,
                     parameters=dict(chapter.PARAMETERS, **HOLD_PARAMETERS))


# What limits() reads for a user: held in the hold QOS, or back to what the account gives them.
HELD = (slurm_holds.HOLD_QOS, slurm_holds.HOLD_QOS)
FREE = ("normal", "normal")


class FakeSlurmLimits:
    """sacctmgr, squeue and scontrol over an in-memory account association (QOS normal, DefaultQOS
    normal) and one association per user that inherits both (None) until set, plus pending jobs."""

    def __init__(self, users: Iterable[str], enforce: str = "associations,limits,qos"):
        self.enforce = enforce
        self.account = {"id": "1", "qos": "normal", "defaultQos": "normal"}
        self.associations = {user: {"id": str(index + 2), "account": "research", "qos": None, "defaultQos": None,
                                    "GrpJobs": "", "MaxJobs": ""} for index, user in enumerate(users)}
        self.qos: dict[str, dict[str, str]] = {}
        self.jobs: dict[str, dict[str, str]] = {}  # job id -> {user, qos}, pending
        self.modifications: list[list[str]] = []

    @staticmethod
    def _answer(code: int = 0, out: str = "", err: str = "") -> Any:
        return types.SimpleNamespace(returncode=code, stdout=out.encode(), stderr=err.encode())

    def effective(self, user: str) -> tuple[str, str]:
        row = self.associations[user]
        return (self.account["qos"] if row["qos"] is None else row["qos"],
                self.account["defaultQos"] if row["defaultQos"] is None else row["defaultQos"])

    def _assoc_line(self, user: str, own: bool = False) -> str:
        """One line of ``show assoc``; ``own`` (WOPLimits WithRawQOSLevel): what the association sets itself."""
        row = self.associations[user]
        qos, default = (row["qos"] or "", row["defaultQos"] or "") if own else self.effective(user)
        return "|".join([row["id"], self.account["id"], TWIN_SLURM_CLUSTER, row["account"], user, "", qos, default,
                         row["GrpJobs"], row["MaxJobs"]])

    def __call__(self, command: list[str], **_: Any) -> Any:
        program, args = os.path.basename(command[0]), command[1:]
        if program == "scontrol" and args == ["show", "config"]:
            return self._answer(out=f"ClusterName             = {TWIN_SLURM_CLUSTER}\n"
                                    f"AccountingStorageEnforce = {self.enforce}\n")
        if program == "scontrol" and args[0] == "update":
            qos = args[2].split("=", 1)[1]
            for job_id in args[1].split("=", 1)[1].split(","):
                self.jobs[job_id]["qos"] = qos
            return self._answer()
        if program == "squeue" and "all" in args:
            # Every job of the user, started or not: the twin's jobs are all pending (no scheduler).
            user = args[args.index("-u") + 1]
            return self._answer(out="".join(f"{job_id}|PENDING|N/A|0:00\n"
                                            for job_id, job in self.jobs.items() if job["user"] == user))
        if program == "squeue":
            user = args[args.index("-u") + 1]
            return self._answer(out="".join(f"{job_id}|{job['qos']}|research|batch\n"
                                            for job_id, job in self.jobs.items() if job["user"] == user))
        if program != "sacctmgr":
            raise AssertionError(f"not a command the twin's Slurm answers: {command}")
        end = args.index("set") if "set" in args else len(args)
        where = dict(arg.split("=", 1) for arg in args[args.index("where") + 1:end] if "=" in arg) \
            if "where" in args else {}
        sets = dict(arg.split("=", 1) for arg in args[end + 1:])
        if args[:3] == ["-nP", "show", "qos"]:
            row = self.qos.get(where["name"])
            return self._answer(out="" if row is None else "|".join(
                [where["name"], row["MaxJobsPerUser"], row["GrpJobs"], row["Flags"], row["Description"]]) + "\n")
        if args[:3] == ["-i", "add", "qos"]:
            self.qos[args[3]] = dict(arg.split("=", 1) for arg in args[4:])
            return self._answer(out=" Adding QOS(s)\n")
        if args[:3] == ["-i", "modify", "qos"]:
            self.qos[where["name"]].update({k: v.lower() if k == "Description" else v for k, v in sets.items()})
            return self._answer(out=" Modified qos...\n")
        if args[:3] == ["-nP", "show", "assoc"]:
            own = slurm_holds.OWN_VALUES[0] in args
            if "user" in where:
                users = [where["user"]] if where["user"] in self.associations else []
            elif "qos" in where:
                users = [u for u in self.associations if where["qos"] in self.effective(u)[0].split(",")]
            else:
                return self._answer(out="|".join([self.account["id"], "", TWIN_SLURM_CLUSTER, "research", "", "",
                                                  self.account["qos"], self.account["defaultQos"], "", ""]) + "\n")
            return self._answer(out="".join(self._assoc_line(user, own) + "\n" for user in users))
        if args[:3] == ["-i", "modify", "user"]:
            row = self.associations.get(where.get("name", ""))
            if row is None:
                return self._answer(1, " Nothing modified\n")
            self.modifications.append(list(args))
            for name, value in sets.items():
                key = {"QOS": "qos", "DefaultQOS": "defaultQos"}.get(name, name)
                row[key] = (None if value in ("", "-1") else value) if key in ("qos", "defaultQos") else \
                    ("" if value == "-1" else value)
            return self._answer(out=" Modified user associations...\n")
        raise AssertionError(f"not a sacctmgr command the twin answers: {command}")

    def submit(self, user: str) -> str:
        """A pending job of ``user`` in their default QOS."""
        job_id = str(100 + len(self.jobs))
        self.jobs[job_id] = {"user": user, "qos": self.effective(user)[1]}
        return job_id

    def limits(self, user: str) -> tuple[str, str]:
        """(QOS, DefaultQOS) the user's association reads: HELD or, unheld in the twin, FREE."""
        return self.effective(user)

    def squeue(self, job_id: str) -> str:
        """What `squeue -o %T|%r` shows for a pending job: held in the hold QOS (no job of it may run) it
        waits with the QOS's reason; back in its own QOS nothing holds it, and it starts (the twin has
        no scheduler: tests/slurm/test_holds_real_slurm.py shows both on the real slurmctld)."""
        if self.jobs[job_id]["qos"] == slurm_holds.HOLD_QOS:
            return "PENDING|QOSMaxJobsPerUserLimit"
        return "RUNNING|None"


def attach(controller: Any, users: Iterable[str], enforce: str = "associations,limits,qos") -> FakeSlurmLimits:
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


