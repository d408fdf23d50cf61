"""The controller agent's holds poll: what it reports and when (the Slurm side is tests/slurm's)."""

from __future__ import annotations

import json
import os

from hpops_core.node_channel import contract, user_holds
from hpops_node_agent.agent import NodeAgent
from hpops_node_agent.config import AgentConfig
from hpops_twin.holds_twin import FREE, HELD, FakeSlurmLimits

CLUSTER, INSTANCE_ID = "ml-research", "i-0123456789abcdef0"


def instructions_marker(version: int) -> str:
    return json.dumps({"format": contract.INSTRUCTION_MARKER_FORMAT, "version": version})


class FakeAws:
    """The holds list as the stack keeps it: private, its version in the public marker the agent polls;
    ``fetch`` is NodeChannel's answer to the enrolled agent (the function itself: the twin)."""

    def __init__(self) -> None:
        self._value: str | None = None
        self.version = 0
        self.sent: list[dict] = []

    @property
    def value(self) -> str | None:
        return self._value

    @value.setter
    def value(self, text: str | None) -> None:
        self._value, self.version = text, self.version + 1

    def client(self, service: str, **_: object) -> "FakeAws":
        return self

    def get_parameters(self, Names: list[str]) -> dict:
        assert Names == [contract.instruction_marker_parameter(user_holds.user_holds_parameter(CLUSTER))]
        marker = instructions_marker(self.version)
        return {"Parameters": [{"Name": Names[0], "Value": marker}] if self._value is not None else []}

    def fetch(self, item: str) -> dict:
        assert item == "userHolds"
        return {"value": self._value, "version": self.version}

    def put_events(self, Entries: list[dict]) -> dict:
        self.sent += [json.loads(entry["Detail"]) for entry in Entries]
        return {"FailedEntryCount": 0}


def agent_with_slurm(tmp_path, imds_probe=None):
    sacct = tmp_path / "bin" / "sacct"
    sacct.parent.mkdir()
    sacct.write_text("#!/bin/sh\nexit 99\n")
    sacct.chmod(0o755)
    config = AgentConfig.from_dict({"cluster": CLUSTER, "region": "us-east-1", "reportBus": "bus", "role": "controller",
                                    "instanceId": INSTANCE_ID, "root": str(tmp_path), "sacctCmd": str(sacct),
                                    **({"imdsProbe": "169.254.169.254"} if imds_probe else {})})
    aws, now = FakeAws(), [1_800_000_000.0]
    agent = NodeAgent(config, aws, clock=lambda: now[0], **({"imds_probe": imds_probe} if imds_probe else {}))
    agent._fetch = aws.fetch
    slurm = FakeSlurmLimits(["alice", "bob"])
    agent.slurm_holds().run = slurm
    return agent, aws, slurm, now


def document(*users: str) -> str:
    return user_holds.canonical_json(user_holds.desired_document("2027-01", "2027-02-01T00:00:00Z", False, list(users)))


def test_the_agent_reports_a_hold_once_then_on_heartbeat_and_lifts_when_the_parameter_goes(tmp_path):
    agent, aws, slurm, now = agent_with_slurm(tmp_path)
    aws.value = document("alice")
    agent.holds_tick()
    assert slurm.limits("alice") == HELD and slurm.limits("bob") == FREE
    [report] = aws.sent
    assert report["instanceId"] == INSTANCE_ID and report["enforced"] is True
    assert report["users"] == [{"user": "alice", "state": "held", "reason": report["users"][0]["reason"]}]
    agent.holds_tick()
    assert len(aws.sent) == 1  # nothing changed, heartbeat not due
    now[0] += agent.config.heartbeat_seconds
    agent.holds_tick()
    assert len(aws.sent) == 2
    aws.value = None  # the stack (or its parameter) is gone: no one is desired held
    agent.holds_tick()
    assert slurm.limits("alice") == FREE and aws.sent[-1]["users"] == []


def test_a_document_the_stack_did_not_write_keeps_the_holds_and_says_so(tmp_path):
    agent, aws, slurm, _ = agent_with_slurm(tmp_path)
    aws.value = document("alice")
    agent.holds_tick()
    aws.value = document("alice").replace('"alice"', '"bob"')
    agent.holds_tick()
    assert slurm.limits("alice") == HELD and slurm.limits("bob") == FREE
    assert aws.sent[-1]["version"] is None and aws.sent[-1]["users"][0]["state"] == "failed"


def test_pending_jobs_move_to_the_hold_qos_and_back_to_the_qos_each_had(tmp_path):
    agent, aws, slurm, _ = agent_with_slurm(tmp_path)
    slurm.associations["alice"].update(qos="high,normal", defaultQos="high")
    own, chosen = slurm.submit("alice"), slurm.submit("alice")
    slurm.jobs[chosen]["qos"] = "normal"  # submitted with --qos=normal
    aws.value = document("alice")
    agent.holds_tick()
    assert slurm.limits("alice") == HELD and {job["qos"] for job in slurm.jobs.values()} == {HELD[0]}
    during = slurm.submit("alice")  # sbatch during the hold: the hold QOS is her default
    aws.value = document()
    agent.holds_tick()
    assert slurm.limits("alice") == ("high,normal", "high")
    assert {j: slurm.jobs[j]["qos"] for j in (own, chosen, during)} == {own: "high", chosen: "normal", during: "high"}


def test_inherited_qos_is_inherited_again_and_lost_records_are_reported_not_guessed(tmp_path):
    agent, aws, slurm, _ = agent_with_slurm(tmp_path)
    aws.value = document("alice", "bob")
    agent.holds_tick()
    aws.value = document("bob")
    agent.holds_tick()
    assert slurm.associations["alice"]["qos"] is None and slurm.limits("alice") == FREE  # inherits again
    # Both records lost (state file and the hold QOS's Description): bob's previous QOS is unknown.
    slurm.qos[HELD[0]]["Description"] = "edited by hand"
    os.remove(agent.slurm_holds().state_path)
    agent._holds = None  # a reinstalled agent
    agent.slurm_holds().run = slurm
    aws.value = document()
    agent.holds_tick()
    assert slurm.limits("bob") == HELD
    [row] = aws.sent[-1]["users"]
    assert row["user"] == "bob" and row["state"] == "failed" and "unknown" in row["reason"]


def test_root_is_never_held_even_when_a_document_names_it(tmp_path):
    agent, aws, slurm, _ = agent_with_slurm(tmp_path)
    slurm.associations["root"] = dict(slurm.associations["alice"], id="9")
    holds = agent.slurm_holds()
    state, reason = holds._hold("root", None, True, "", 0)
    assert state == "failed" and "never held" in reason and slurm.modifications == []


def test_a_hold_an_earlier_version_set_is_lifted_by_its_own_rule(tmp_path):
    agent, aws, slurm, _ = agent_with_slurm(tmp_path)
    holds = agent.slurm_holds()
    holds.state = {"users": {"alice": {"since": 1, "associations": {
        "2": {"account": "research", "partition": "", "GrpJobs": "", "MaxJobs": "5"}}}}}
    slurm.associations["alice"].update(GrpJobs="0", MaxJobs="0")
    aws.value = document("alice")
    agent.holds_tick()  # still over: held in the hold QOS too, the old record kept
    assert slurm.limits("alice") == HELD
    aws.value = document()
    agent.holds_tick()
    row = slurm.associations["alice"]
    assert (row["GrpJobs"], row["MaxJobs"]) == ("", "5") and slurm.limits("alice") == FREE
    assert holds.state["users"] == {}


def test_the_controller_probes_imds_once_per_heartbeat_and_its_holds_report_carries_the_answer(tmp_path):
    from hpops_core.budget_guard.hold_reports import parse_holds_event

    probes: list[str] = []
    answer = ["reachable"]

    def probe(address: str) -> tuple:  # imds_guard.probe connects as nobody: its answer, without the network
        probes.append(address)
        return answer[0], f"nobody connected to {address}:80"

    agent, aws, _, now = agent_with_slurm(tmp_path, probe)
    aws.value = document("alice")
    for _ in range(3):  # polls within one heartbeat: one probe
        agent.holds_tick()
        now[0] += 60
    assert probes == ["169.254.169.254"]
    [report] = aws.sent
    assert report["imds"] == {"nonRoot": "reachable", "lockdown": "off", "reason": "nobody connected to 169.254.169.254:80"}
    # What the stack keeps: the same section, through its own parser (the signed fields stay as sent).
    event = {"source": contract.REPORT_SOURCE, "detail-type": user_holds.HOLDS_DETAIL_TYPE, "detail": report}
    assert parse_holds_event(event)["imds"] == report["imds"]

    answer[0] = "blocked"  # the site closed IMDS to users on the controller
    now[0] += agent.config.heartbeat_seconds
    agent.holds_tick()
    assert len(probes) == 2 and aws.sent[-1]["imds"]["nonRoot"] == "blocked"


def test_a_controller_without_an_imds_probe_configured_reports_no_imds_section(tmp_path):
    agent, aws, _, _ = agent_with_slurm(tmp_path)
    aws.value = document("alice")
    agent.holds_tick()
    assert "imds" not in aws.sent[-1]


def test_each_own_qos_setting_is_written_back_as_slurm_stores_it():
    from hpops_node_agent.slurm_holds import restore_steps
    assert restore_steps("", "") == [{"QOS": "", "DefaultQOS": "-1"}]  # inherits both again
    assert restore_steps(None, None) == [{"QOS": "", "DefaultQOS": "-1"}]  # a record of an earlier version
    assert restore_steps("highq,normal", "highq") == [{"QOS": "highq,normal", "DefaultQOS": "highq"}]
    # A delta onto the hold's own list would only edit that list: the list is cleared first.
    assert restore_steps("+lowq,-highq", "") == [{"QOS": "", "DefaultQOS": "-1"}, {"QOS": "+lowq,-highq",
                                                                                   "DefaultQOS": "-1"}]


def test_only_jobs_that_ran_after_the_hold_count_as_escaped():
    from hpops_node_agent.slurm_holds import slurm_time, started_jobs
    held_at = 1_800_000_000.0
    before, after = slurm_time(held_at - 60), slurm_time(held_at + 60)
    squeue = "\n".join([f"11|RUNNING|{before}|5:00",  # ran before the hold: not the hold's business
                        f"12|RUNNING|{after}|0:59", f"13|COMPLETED|{after}|0:02",
                        f"14|CANCELLED|{after}|0:00",  # cancelled while pending: never ran
                        f"15|CANCELLED|{after}|0:10", f"16|PENDING|{after}|0:00", "garbage"])
    assert started_jobs(squeue, held_at) == ["12", "13", "15"]


def test_the_change_named_is_the_first_after_hpops_latest_hold():
    from hpops_node_agent.slurm_holds import first_change
    log = [
        "2026-11-28T15:29:50|admin|Modify Associations|(id_assoc=4)|qos=',2,'",  # before the hold: not it
        "2026-11-28T15:29:52|root|Modify QOS|(name='hpopshold')|description='hpops budget hold...'",
        "2026-11-28T15:29:53|root|Modify Associations|(id_assoc=4)|def_qos_id=5, qos=',5,', delta_qos=''",
        "2026-11-28T15:29:54|admin|Modify Associations|(id_assoc=9)|qos=',1,'",  # someone else's association
        "2026-11-28T15:29:55|admin|Modify Associations|(id_assoc=4)|def_qos_id=1, qos=',1,', delta_qos=''",
        "2026-11-28T15:29:56|admin|Modify QOS|(name='hpopshold')|max_jobs_per_user=NULL"]
    assert first_change("\n".join(log), ["4"], "5") == (
        "association id_assoc=4 modified by admin at 2026-11-28T15:29:55: def_qos_id=1, qos=',1,', delta_qos=''")
    assert first_change("\n".join(log[1:3]), ["4"], "5") is None
