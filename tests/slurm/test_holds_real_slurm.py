"""Budget holds against a real slurmctld + slurmdbd with association limits enforced.

The controller agent's SlurmHolds converges Slurm to a holds document as the stack publishes it;
these tests read what users see: squeue's state and reason for their jobs, and sacctmgr's limits.
"""

from __future__ import annotations

import time

import pytest
from conftest import SACCTMGR, TOOLS, running_slurm

from hpops_core.node_channel import user_holds
from hpops_node_agent import slurm_holds

pytestmark = pytest.mark.realslurm

ALICE, BOB, CAROL = "hpholds-alice", "hpholds-bob", "hpholds-carol"
SQUEUE = "/usr/bin/squeue"
SCANCEL = "/usr/bin/scancel"
FUTURE = "2099-01-01T00:00:00Z"


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    with running_slurm(tmp_path_factory.mktemp("slurm-holds"), (ALICE, BOB, CAROL), "real Slurm hold tests",
                       TOOLS + (SQUEUE, SCANCEL), enforce="associations,limits") as cluster:
        yield cluster


@pytest.fixture
def agent(slurm, tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    return slurm_holds.SlurmHolds(str(tmp_path / "state" / slurm_holds.STATE_FILE), "/usr/bin")


def document(*users: str, expires: str = FUTURE, dry_run: bool = False) -> str:
    return user_holds.canonical_json(user_holds.desired_document("2026-11", expires, dry_run, list(users)))


def limits(slurm, user: str) -> dict[str, str]:
    out = slurm.run(SACCTMGR, "-nP", "show", "assoc", "where", "user=" + user,
                    "format=GrpJobs,MaxJobs,MaxSubmitJobs").stdout.strip()
    return dict(zip(("GrpJobs", "MaxJobs", "MaxSubmitJobs"), out.split("|")))


def job(slurm, job_id: str) -> tuple[str, str]:
    out = slurm.run(SQUEUE, "-h", "-j", job_id, "-o", "%T|%r", check=False).stdout.strip()
    state, _, reason = out.partition("|")
    return state or "GONE", reason


def wait_job(slurm, job_id: str, want, timeout: float = 40) -> tuple[str, str]:
    return slurm.wait_for("job {} to be {}".format(job_id, want), lambda: (lambda s: s if want(s) else None)(
        job(slurm, job_id)), timeout=timeout, interval=0.25)


def started(status: tuple[str, str]) -> bool:
    return status[0] in ("RUNNING", "COMPLETING", "COMPLETED", "GONE")


def held(status: tuple[str, str]) -> bool:
    return status[0] == "PENDING" and status[1] in user_holds.HOLD_REASONS


def by_user(report: dict) -> dict[str, dict]:
    return {row["user"]: row for row in report["users"]}


def test_held_users_jobs_pend_with_the_holds_reason_others_run_and_release_starts_them(slurm, agent):
    slurm.run(SACCTMGR, "-i", "modify", "user", "where", "name=" + CAROL, "set", "GrpJobs=3", "MaxSubmitJobs=7")
    slurm.run(SACCTMGR, "-i", "modify", "user", "where", "name=" + ALICE, "set", "MaxJobs=5")  # an admin's own
    carol_before = limits(slurm, CAROL)

    began = time.monotonic()
    report = agent.converge(document(ALICE), time.time())
    assert report["enforced"] is True and report["enforceReason"].startswith("AccountingStorageEnforce = ")
    assert by_user(report)[ALICE]["state"] == "held", report
    alice_job = slurm.submit(ALICE, "-n1", "--wrap=sleep 1")
    status = wait_job(slurm, alice_job, held)
    hold_seconds = time.monotonic() - began
    bob_job = slurm.submit(BOB, "-n1", "--wrap=sleep 20")
    wait_job(slurm, bob_job, started)
    # Still pending with the hold's reason after bob started: nothing but the hold keeps it waiting.
    time.sleep(3)
    assert held(job(slurm, alice_job)), job(slurm, alice_job)
    print("\nsqueue shows alice's job: {}|{} ({:.1f} s from converge)".format(*status, hold_seconds))

    began = time.monotonic()
    report = agent.converge(document(), time.time())
    assert report["users"] == []
    wait_job(slurm, alice_job, started)
    print("release -> alice's job started in {:.1f} s".format(time.monotonic() - began))
    assert limits(slurm, ALICE)["MaxJobs"] == "5" and limits(slurm, ALICE)["GrpJobs"] == ""
    assert limits(slurm, CAROL) == carol_before == {"GrpJobs": "3", "MaxJobs": "", "MaxSubmitJobs": "7"}
    slurm.run(SCANCEL, bob_job, check=False)


def test_a_hold_removed_by_hand_is_put_back_on_the_next_poll(slurm, agent):
    agent.converge(document(ALICE), time.time())
    assert limits(slurm, ALICE)["GrpJobs"] == "0"
    slurm.run(SACCTMGR, "-i", "modify", "user", "where", "name=" + ALICE, "set", "GrpJobs=-1", "MaxJobs=-1")
    assert limits(slurm, ALICE)["GrpJobs"] == ""
    report = agent.converge(document(ALICE), time.time())
    assert by_user(report)[ALICE]["state"] == "held"
    assert limits(slurm, ALICE)["GrpJobs"] == "0" and limits(slurm, ALICE)["MaxJobs"] == "0"
    alice_job = slurm.submit(ALICE, "-n1", "--wrap=sleep 1")
    wait_job(slurm, alice_job, held)
    # The administrator's removal said "no limit": that, not the earlier MaxJobs=5, is what a lift restores.
    agent.converge(document(), time.time())
    wait_job(slurm, alice_job, started)
    assert limits(slurm, ALICE)["GrpJobs"] == "" and limits(slurm, ALICE)["MaxJobs"] == ""


def test_the_months_turn_lifts_the_hold_even_with_no_new_document(slurm, agent):
    now = time.time()
    turn = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now + 60))
    agent.converge(document(ALICE, expires=turn), now)
    alice_job = slurm.submit(ALICE, "-n1", "--wrap=sleep 1")
    wait_job(slurm, alice_job, held)
    agent.converge(document(ALICE, expires=turn), now + 61)  # the same document, read after the turn
    wait_job(slurm, alice_job, started)
    assert limits(slurm, ALICE)["GrpJobs"] == ""


def test_an_administrators_zero_is_not_hpops_to_lift(slurm, agent):
    slurm.run(SACCTMGR, "-i", "modify", "user", "where", "name=" + CAROL, "set", "GrpJobs=0")
    agent.converge(document(CAROL), time.time())
    agent.converge(document(), time.time())
    assert limits(slurm, CAROL)["GrpJobs"] == "0"  # carol's administrator said 0; it stays
    assert limits(slurm, CAROL)["MaxJobs"] == ""  # what hpops set on her, it lifted
    slurm.run(SACCTMGR, "-i", "modify", "user", "where", "name=" + CAROL, "set", "GrpJobs=3")


def test_dry_run_and_refused_documents_change_nothing(slurm, agent):
    report = agent.converge(document(ALICE, dry_run=True), time.time())
    assert report["users"] == [] and limits(slurm, ALICE)["GrpJobs"] == ""
    agent.converge(document(ALICE), time.time())
    forged = document(ALICE).replace(ALICE, BOB)  # version no longer matches: refused
    report = agent.converge(forged, time.time())
    assert report["version"] is None and by_user(report)[ALICE]["state"] == "failed"
    assert limits(slurm, ALICE)["GrpJobs"] == "0" and limits(slurm, BOB)["GrpJobs"] == ""
    agent.converge(document(), time.time())
    assert limits(slurm, ALICE)["GrpJobs"] == ""


def test_without_limits_in_accounting_storage_enforce_the_report_says_the_hold_cannot_apply(slurm, agent):
    slurm.conf.write_text(slurm.conf.read_text().replace("AccountingStorageEnforce=associations,limits",
                                                         "AccountingStorageEnforce=associations"))
    slurm.stop("slurmctld")
    slurm.run("/usr/sbin/slurmctld")
    slurm.wait_for("slurmctld", lambda: slurm.run("/usr/bin/scontrol", "ping", check=False).returncode == 0)
    report = agent.converge(document(ALICE), time.time())
    assert report["enforced"] is False
    assert "AccountingStorageEnforce = associations" in report["enforceReason"]
    row = by_user(report)[ALICE]
    assert row["state"] == "failed" and "cannot apply" in row["reason"], row
    alice_job = slurm.submit(ALICE, "-n1", "--wrap=sleep 1")
    wait_job(slurm, alice_job, started)  # what the report warns of: Slurm ignores the limit
    agent.converge(document(), time.time())
    assert limits(slurm, ALICE)["GrpJobs"] == ""
