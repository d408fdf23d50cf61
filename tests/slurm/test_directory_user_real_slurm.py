"""A directory user (``user@domain``, as SSSD/realmd name them) in a real Slurm: associated, counted
in usage from sacct, held by the controller agent and released, like any other user.

The account is made with ``useradd --badname`` (Debian's NAME_REGEX refuses '@'; SSSD serves such
names without useradd).
"""

from __future__ import annotations

import subprocess
import time

import pytest
from conftest import SACCTMGR, TOOLS, running_slurm

from hpops_core.node_channel import user_holds
from hpops_node_agent import slurm_holds, usage

pytestmark = pytest.mark.realslurm

DIRECTORY, BOB = "hpdir@example.edu", "hpdir-bob"
SQUEUE = "/usr/bin/squeue"


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    created = subprocess.run(["/usr/sbin/useradd", "--badname", "--no-create-home", "--shell", "/usr/sbin/nologin",
                              DIRECTORY], capture_output=True, text=True).returncode == 0
    try:
        with running_slurm(tmp_path_factory.mktemp("slurm-directory"), (DIRECTORY, BOB),
                           "real Slurm directory-user tests", TOOLS + (SQUEUE,),
                           enforce="associations,limits,qos") as cluster:
            yield cluster
    finally:
        if created:
            subprocess.run(["/usr/sbin/userdel", DIRECTORY], capture_output=True)


def job_state(slurm, job_id: str) -> tuple[str, str]:
    out = slurm.run(SQUEUE, "-h", "-j", job_id, "-o", "%T|%r", check=False).stdout.strip()
    state, _, reason = out.partition("|")
    return state or "GONE", reason


def test_a_directory_user_is_counted_held_and_released(slurm, tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    start = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() - 60))
    finished = slurm.submit(DIRECTORY, "-n1", "--wrap=sleep 1")
    slurm.wait_for("the directory user's job in accounting", lambda: any(
        line[0] == finished and line[-1] == "COMPLETED" for line in slurm.sacct_lines(start, "--format=JobID,State")),
        timeout=40, interval=0.5)
    rows = slurm.sacct_lines(start, "--format=" + ",".join(usage.SACCT_FIELDS))
    jobs = [usage.parse_line("|".join(row)) for row in rows]
    assert [j.user for j in jobs if j is not None] == [DIRECTORY]  # sacct spells the name as SSSD does

    holds = slurm_holds.SlurmHolds(str(tmp_path / slurm_holds.STATE_FILE), "/usr/bin")
    document = user_holds.canonical_json(user_holds.desired_document("2026-11", "2099-01-01T00:00:00Z", False,
                                                                     [DIRECTORY]))
    report = holds.converge(document, time.time())
    assert [(row["user"], row["state"]) for row in report["users"]] == [(DIRECTORY, "held")], report
    pending = slurm.submit(DIRECTORY, "-n1", "--wrap=sleep 1")
    state = slurm.wait_for("the held job to pend", lambda: (lambda s: s if s[0] == "PENDING" and s[1] in
                                                             user_holds.HOLD_REASONS else None)(job_state(slurm, pending)),
                           timeout=30, interval=0.25)
    bob = slurm.submit(BOB, "-n1", "--wrap=sleep 1")
    slurm.wait_for("bob's job to run", lambda: job_state(slurm, bob)[0] in ("RUNNING", "COMPLETING", "GONE"),
                   timeout=30, interval=0.25)
    assert job_state(slurm, pending) == state

    report = holds.converge(user_holds.canonical_json(user_holds.desired_document(
        "2026-11", "2099-01-01T00:00:00Z", False, [])), time.time())
    assert report["users"] == []
    slurm.wait_for("the released job to run", lambda: job_state(slurm, pending)[0] in ("RUNNING", "COMPLETING", "GONE"),
                   timeout=40, interval=0.25)
    limits = slurm.run(SACCTMGR, "-nP", "show", "assoc", "where", "user=" + DIRECTORY,
                       "format=GrpJobs,MaxJobs,QOS,DefaultQOS")
    assert limits.stdout.strip() == "||normal|"  # the QOS it inherited before the hold
