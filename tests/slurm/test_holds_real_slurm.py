"""Budget holds against a real slurmctld + slurmdbd, whatever QOS the site runs.

The controller agent's SlurmHolds converges Slurm to a holds document as the stack publishes it;
these tests read what users see: squeue's state, reason and QOS for their jobs, sbatch's answer,
and sacctmgr's QOS list and default of their associations.
"""

from __future__ import annotations

import os
import time

import pytest
from conftest import PARTITION, SACCTMGR, SBATCH, TOOLS, running_slurm

from hpops_core.node_channel import user_holds
from hpops_node_agent import slurm_holds

pytestmark = pytest.mark.realslurm

ALICE, BOB, CAROL, DAVE = "hpholds-alice", "hpholds-bob", "hpholds-carol", "hpholds-dave"
SQUEUE = "/usr/bin/squeue"
SCANCEL = "/usr/bin/scancel"
SCONTROL = "/usr/bin/scontrol"
FUTURE = "2099-01-01T00:00:00Z"
ENFORCE = "associations,limits,qos"
SITE_QOS_LIMITS = ("MaxJobsPerUser=10", "GrpJobs=50")  # common at universities; overrides association limits
QOS_PARTITION = "qospart"


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    with running_slurm(tmp_path_factory.mktemp("slurm-holds"), (ALICE, BOB, CAROL, DAVE), "real Slurm hold tests",
                       TOOLS + (SQUEUE, SCANCEL, SCONTROL), enforce=ENFORCE) as cluster:
        cluster.run(SACCTMGR, "-i", "add", "qos", "partq", *SITE_QOS_LIMITS)
        cluster.run(SACCTMGR, "-i", "add", "qos", "highq")
        cluster.run(SACCTMGR, "-i", "add", "qos", "lowq")
        cluster.run(SACCTMGR, "-i", "modify", "account", "where", "name=research", "set", "QOS=normal,highq")
        cluster.run(SCONTROL, "create", "PartitionName=" + QOS_PARTITION, "Nodes=" + cluster.host, "QOS=partq")
        yield cluster


@pytest.fixture
def agent(slurm, tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    return slurm_holds.SlurmHolds(str(tmp_path / "state" / slurm_holds.STATE_FILE), "/usr/bin")


def document(*users: str, expires: str = FUTURE, dry_run: bool = False) -> str:
    return user_holds.canonical_json(user_holds.desired_document("2026-11", expires, dry_run, list(users)))


def submit(slurm, user: str, *options: str, partition: str = PARTITION, check: bool = True):
    result = slurm.run(SBATCH, "--parsable", "--uid=" + user, "--chdir=/tmp", "--output=/dev/null",
                       "--partition=" + partition, *options, check=check)
    return result.stdout.strip().split(";")[0] if check else result


def qos_of(slurm, user: str) -> tuple[str, str]:
    out = slurm.run(SACCTMGR, "-nP", "show", "assoc", "where", "user=" + user, "format=QOS,DefaultQOS").stdout
    qos, _, default = out.strip().partition("|")
    return ",".join(sorted(qos.split(","))), default


def job(slurm, job_id: str) -> tuple[str, str, str]:
    out = slurm.run(SQUEUE, "-h", "-j", job_id, "-o", "%T|%r|%q", check=False).stdout.strip()
    state, reason, qos = (out.split("|") + ["", "", ""])[:3]
    return state or "GONE", reason, qos


def wait_job(slurm, job_id: str, want, timeout: float = 40):
    return slurm.wait_for("job {} to be {}".format(job_id, want.__name__), lambda: (lambda s: s if want(s) else None)(
        job(slurm, job_id)), timeout=timeout, interval=0.25)


def started(status) -> bool:
    return status[0] in ("RUNNING", "COMPLETING", "COMPLETED", "GONE")


def pending(status) -> bool:
    return status[0] == "PENDING"


def held(status) -> bool:
    return status[0] == "PENDING" and status[1] in user_holds.HOLD_REASONS and status[2] == slurm_holds.HOLD_QOS


def by_user(report: dict) -> dict[str, dict]:
    return {row["user"]: row for row in report["users"]}


def fill_node(slurm, partition: str = PARTITION) -> str:
    """bob takes every CPU, so jobs submitted now pend (Resources) until it is cancelled."""
    blocker = submit(slurm, BOB, "-n", str(slurm.cpus), "--wrap=sleep 300", partition=partition)
    wait_job(slurm, blocker, started)
    return blocker


SITES = {
    "no QOS limits": (lambda slurm: None, PARTITION),
    "a default QOS with MaxJobsPerUser and GrpJobs": (
        lambda slurm: slurm.run(SACCTMGR, "-i", "modify", "qos", "where", "name=normal", "set", *SITE_QOS_LIMITS),
        PARTITION),
    "a partition QOS with both": (lambda slurm: None, QOS_PARTITION),
}


@pytest.mark.parametrize("site", list(SITES))
def test_a_held_users_new_and_pending_jobs_pend_bobs_run_and_no_qos_escapes(slurm, agent, site):
    configure, partition = SITES[site]
    configure(slurm)
    before = qos_of(slurm, ALICE)
    try:
        blocker = fill_node(slurm, partition)
        earlier = submit(slurm, ALICE, "-n1", "--wrap=sleep 1", partition=partition)
        wait_job(slurm, earlier, pending)

        report = agent.converge(document(ALICE), time.time())
        assert report["enforced"] is True, report
        assert by_user(report)[ALICE]["state"] == "held", report
        wait_job(slurm, earlier, held)  # the reason shows at the scheduler's next pass
        later = submit(slurm, ALICE, "-n1", "--wrap=sleep 1", partition=partition)
        escape = submit(slurm, ALICE, "-n1", "--qos=normal", "--wrap=sleep 1", partition=partition, check=False)
        assert escape.returncode != 0 and "Invalid qos specification" in escape.stderr, escape

        slurm.run(SCANCEL, blocker)
        bob_job = submit(slurm, BOB, "-n1", "--wrap=sleep 30", partition=partition)
        wait_job(slurm, bob_job, started)
        # bob's later job ran on the freed node; alice's, older, still wait for the hold alone.
        assert held(job(slurm, earlier)) and held(job(slurm, later)), (job(slurm, earlier), job(slurm, later))
        assert qos_of(slurm, BOB) == before  # bob's associations untouched

        report = agent.converge(document(), time.time())
        assert report["users"] == [], report
        assert qos_of(slurm, ALICE) == before
        wait_job(slurm, earlier, started)
        wait_job(slurm, later, started)
        slurm.run(SCANCEL, bob_job, check=False)
    finally:
        slurm.run(SACCTMGR, "-i", "modify", "qos", "where", "name=normal", "set", "MaxJobsPerUser=-1", "GrpJobs=-1")


def test_a_lift_restores_each_qos_list_default_and_pending_jobs_qos_exactly(slurm, agent):
    # alice's QOS list and default are her own; carol inherits the account's (normal,highq, no default).
    slurm.run(SACCTMGR, "-i", "modify", "user", "where", "name=" + ALICE, "set", "QOS=highq", "DefaultQOS=highq")
    alice_before, carol_before = qos_of(slurm, ALICE), qos_of(slurm, CAROL)
    blocker = fill_node(slurm)
    jobs = {submit(slurm, ALICE, "-n1", "--wrap=sleep 1"): "highq",
            submit(slurm, CAROL, "-n1", "--qos=highq", "--wrap=sleep 1"): "highq",
            submit(slurm, CAROL, "-n1", "--qos=normal", "--wrap=sleep 1"): "normal"}
    assert {job_id: job(slurm, job_id)[2] for job_id in jobs} == jobs

    report = agent.converge(document(ALICE, CAROL), time.time())
    assert {user: row["state"] for user, row in by_user(report).items()} == {ALICE: "held", CAROL: "held"}, report
    for job_id in jobs:
        wait_job(slurm, job_id, held)
    assert qos_of(slurm, ALICE) == qos_of(slurm, CAROL) == (slurm_holds.HOLD_QOS, slurm_holds.HOLD_QOS)
    assert job(slurm, submit(slurm, CAROL, "-n1", "--wrap=sleep 1"))[2] == slurm_holds.HOLD_QOS

    report = agent.converge(document(), time.time())
    assert report["users"] == [], report
    assert qos_of(slurm, ALICE) == alice_before and qos_of(slurm, CAROL) == carol_before
    # Still pending behind bob: each is back in the QOS it had (carol's new one in her default).
    assert {job_id: job(slurm, job_id)[2] for job_id in jobs} == jobs
    # carol inherits again: the account's next change reaches her, alice keeps her own.
    slurm.run(SACCTMGR, "-i", "modify", "account", "where", "name=research", "set", "QOS=normal")
    try:
        assert qos_of(slurm, CAROL) == ("normal", "") and qos_of(slurm, ALICE) == alice_before
    finally:
        slurm.run(SACCTMGR, "-i", "modify", "account", "where", "name=research", "set", "QOS=normal,highq")
        slurm.run(SACCTMGR, "-i", "modify", "user", "where", "name=" + ALICE, "set", "QOS=", "DefaultQOS=-1")
    slurm.run(SCANCEL, blocker)
    for job_id in jobs:
        wait_job(slurm, job_id, started)


def own_qos(slurm, user: str) -> tuple[str, str]:
    """What the association sets itself (WOPLimits WithRawQOSLevel): "" inherits, "+x"/"-x" are deltas."""
    out = slurm.run(SACCTMGR, "-nP", "show", "assoc", "WOPLimits", "WithRawQOSLevel", "where", "user=" + user,
                    "format=QOS,DefaultQOS").stdout
    qos, _, default = out.strip().partition("|")
    return qos, default


# Each user's own QOS setting under account research (QOS normal,highq): a list equal to the account's,
# a += delta, a -= delta, nothing (inherits).
LAYOUTS = {ALICE: ("QOS=highq,normal",), BOB: ("QOS+=lowq",), CAROL: ("QOS-=highq",), DAVE: ()}


def test_a_lift_gives_each_association_back_exactly_what_it_set_itself(slurm, agent):
    for user, sets in LAYOUTS.items():
        if sets:
            slurm.run(SACCTMGR, "-i", "modify", "user", "where", "name=" + user, "set", *sets)
    own = {user: own_qos(slurm, user) for user in LAYOUTS}
    effective = {user: qos_of(slurm, user) for user in LAYOUTS}
    assert own == {ALICE: ("highq,normal", ""), BOB: ("+lowq", ""), CAROL: ("-highq", ""), DAVE: ("", "")}
    try:
        report = agent.converge(document(*LAYOUTS), time.time())
        assert {row["user"]: row["state"] for row in report["users"]} == dict.fromkeys(LAYOUTS, "held"), report
        assert {user: own_qos(slurm, user) for user in LAYOUTS} == dict.fromkeys(
            LAYOUTS, (slurm_holds.HOLD_QOS, slurm_holds.HOLD_QOS))

        report = agent.converge(document(), time.time())
        assert report["users"] == [], report
        assert {user: own_qos(slurm, user) for user in LAYOUTS} == own
        assert {user: qos_of(slurm, user) for user in LAYOUTS} == effective
        # The account's next changes reach each user as before the hold: alice keeps her own list, bob
        # adds lowq to the account's, carol drops highq from it, dave takes it as it is.
        slurm.run(SACCTMGR, "-i", "modify", "account", "where", "name=research", "set", "QOS=normal")
        assert {user: qos_of(slurm, user)[0] for user in LAYOUTS} == {
            ALICE: "highq,normal", BOB: "lowq,normal", CAROL: "normal", DAVE: "normal"}
        slurm.run(SACCTMGR, "-i", "modify", "account", "where", "name=research", "set", "QOS=highq,lowq,normal")
        assert {user: qos_of(slurm, user)[0] for user in LAYOUTS} == {
            ALICE: "highq,normal", BOB: "highq,lowq,normal", CAROL: "lowq,normal", DAVE: "highq,lowq,normal"}
    finally:
        slurm.run(SACCTMGR, "-i", "modify", "account", "where", "name=research", "set", "QOS=normal,highq")
        for user in LAYOUTS:
            slurm.run(SACCTMGR, "-i", "modify", "user", "where", "name=" + user, "set", "QOS=", "DefaultQOS=-1")


def test_a_job_that_starts_while_held_is_reported_with_the_change_slurm_logged(slurm, agent):
    report = agent.converge(document(ALICE), time.time())
    assert by_user(report)[ALICE]["state"] == "held", report
    escaped = submit(slurm, ALICE, "-n1", "--wrap=sleep 60")
    try:
        wait_job(slurm, escaped, held)
        # An administrator lifts the hold QOS's limits by hand: the held job starts.
        slurm.run(SACCTMGR, "-i", "modify", "qos", "where", "name=" + slurm_holds.HOLD_QOS, "set",
                  "MaxJobsPerUser=-1", "GrpJobs=-1")
        wait_job(slurm, escaped, started)

        report = agent.converge(document(ALICE), time.time())
        row = by_user(report)[ALICE]
        assert row["state"] == "failed" and row["reason"].startswith(f"job(s) {escaped} of {ALICE} started"), row
        assert "QOS {} modified by root".format(slurm_holds.HOLD_QOS) in row["reason"], row
        assert "max_jobs_per_user" in row["reason"], row
        # The hold QOS is put back: her next job waits; the report keeps naming the one that ran.
        later = submit(slurm, ALICE, "-n1", "--wrap=sleep 1")
        wait_job(slurm, later, held)
        row = by_user(agent.converge(document(ALICE), time.time()))[ALICE]
        assert row["state"] == "failed" and row["reason"].startswith(f"job(s) {escaped} of {ALICE} started"), row
    finally:
        slurm.run(SCANCEL, escaped, check=False)
        agent.converge(document(), time.time())


def test_with_the_state_file_lost_the_lift_restores_from_slurm_itself(slurm, agent, tmp_path, monkeypatch):
    slurm.run(SACCTMGR, "-i", "modify", "user", "where", "name=" + ALICE, "set", "QOS=highq", "DefaultQOS=highq")
    before = qos_of(slurm, ALICE)
    agent.converge(document(ALICE), time.time())
    assert qos_of(slurm, ALICE) == (slurm_holds.HOLD_QOS, slurm_holds.HOLD_QOS)
    os.remove(agent.state_path)
    fresh = slurm_holds.SlurmHolds(agent.state_path, "/usr/bin")  # a reinstalled agent, no state
    report = fresh.converge(document(ALICE), time.time())
    assert by_user(report)[ALICE]["state"] == "held" and "unknown" not in by_user(report)[ALICE]["reason"]
    report = fresh.converge(document(), time.time())
    assert report["users"] == [] and qos_of(slurm, ALICE) == before
    slurm.run(SACCTMGR, "-i", "modify", "user", "where", "name=" + ALICE, "set", "QOS=", "DefaultQOS=-1")


def test_a_hold_removed_by_hand_is_put_back_and_an_administrators_change_is_what_a_lift_restores(slurm, agent):
    agent.converge(document(ALICE), time.time())
    slurm.run(SACCTMGR, "-i", "modify", "user", "where", "name=" + ALICE, "set", "QOS=normal", "DefaultQOS=normal")
    report = agent.converge(document(ALICE), time.time())
    assert by_user(report)[ALICE]["state"] == "held"
    assert qos_of(slurm, ALICE) == (slurm_holds.HOLD_QOS, slurm_holds.HOLD_QOS)
    alice_job = submit(slurm, ALICE, "-n1", "--wrap=sleep 1")
    wait_job(slurm, alice_job, held)
    agent.converge(document(), time.time())
    wait_job(slurm, alice_job, started)
    assert qos_of(slurm, ALICE) == ("normal", "normal")
    slurm.run(SACCTMGR, "-i", "modify", "user", "where", "name=" + ALICE, "set", "QOS=", "DefaultQOS=-1")


def test_the_months_turn_dry_runs_and_refused_documents(slurm, agent):
    before = qos_of(slurm, ALICE)
    report = agent.converge(document(ALICE, dry_run=True), time.time())
    assert report["users"] == [] and qos_of(slurm, ALICE) == before
    turn = (int(time.time()) // 3600 + 2) * 3600  # the month's end, as the document names it
    month_end = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(turn))
    agent.converge(document(ALICE, expires=month_end), time.time())
    forged = document(ALICE).replace(ALICE, BOB)  # version no longer matches: refused, nothing changes
    report = agent.converge(forged, time.time())
    assert report["version"] is None and by_user(report)[ALICE]["state"] == "failed"
    assert qos_of(slurm, ALICE)[0] == slurm_holds.HOLD_QOS and qos_of(slurm, BOB) == before
    agent.converge(document(ALICE, expires=month_end), turn)  # the same document, read after the month turned
    assert qos_of(slurm, ALICE) == before


def test_without_qos_in_accounting_storage_enforce_the_report_says_the_hold_cannot_apply(slurm, agent):
    def restart(enforce: str) -> None:
        text = slurm.conf.read_text()
        slurm.conf.write_text(text.replace("AccountingStorageEnforce=" + slurm.enforce,
                                           "AccountingStorageEnforce=" + enforce))
        slurm.enforce = enforce
        slurm.stop("slurmctld")
        slurm.run("/usr/sbin/slurmctld")
        slurm.wait_for("slurmctld", lambda: slurm.run(SCONTROL, "ping", check=False).returncode == 0)
        slurm.run(SCONTROL, "create", "PartitionName=" + QOS_PARTITION, "Nodes=" + slurm.host, "QOS=partq",
                  check=False)

    restart("associations,limits")
    try:
        report = agent.converge(document(ALICE), time.time())
        assert report["enforced"] is False and "lacks qos" in report["enforceReason"], report
        row = by_user(report)[ALICE]
        assert row["state"] == "failed" and "cannot apply" in row["reason"] and "qos" in row["reason"], row
        escaped = submit(slurm, ALICE, "-n1", "--qos=normal", "--wrap=sleep 1")
        wait_job(slurm, escaped, started)  # what the report warns of
        agent.converge(document(), time.time())
        assert qos_of(slurm, ALICE)[0] != slurm_holds.HOLD_QOS
    finally:
        restart(ENFORCE)
