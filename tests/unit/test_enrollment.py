"""Enrollment decisions, report refusals, the usage capacity bound and the gate's enrollment rule (pure)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from hpops_core.budget_guard.usage_capacity import UsageExceedsCapacityError, check_capacity
from hpops_core.budget_guard.usage_reports import UsageRecord, UsageReport
from hpops_core.host_identity.gate import gate_registrations
from hpops_core.node_channel.enrollment import (
    Approval,
    Enrollment,
    MalformedNodeChannelRequest,
    NotEnrolledError,
    Statement,
    decide_enrollment,
    parse_statement,
)
from hpops_core.node_channel.report_proof import ReportRoleError, check_signed_report, unsigned_event

NOW = datetime(2026, 11, 26, 12, 0, tzinfo=timezone.utc)
KEY = "ssh-ed25519 " + "A" * 68
ID = "i-0123456789abcdef0"
WINDOW = timedelta(minutes=60)


def node(group="login", launched=NOW - timedelta(minutes=5), ip="10.1.0.11", status="Running"):
    return {"InstanceGroupName": group, "PrivatePrimaryIp": ip, "LaunchTime": launched,
            "InstanceStatus": {"Status": status}}


def statement(**changes):
    values = dict(cluster="ml", instance_id=ID, ip="10.1.0.11", public_key=KEY, issued_at=NOW, nonce="n" * 24,
                  identity_document=None)
    return Statement(**(values | changes))


def enrolled(fingerprint="SHA256:old", via="window", status="enrolled"):
    return Enrollment("ml", ID, KEY, fingerprint, "login", "login", "10.1.0.11", status, "2026-11-26T11:56:00Z", via)


NOT_IN_CLUSTER = "not in cluster"


def decide(st=None, fingerprint="SHA256:new", aws=None, existing=None, approval=None):
    aws = None if aws == NOT_IN_CLUSTER else aws or node()
    return decide_enrollment(st or statement(), fingerprint, aws, existing, approval, NOW,
                             "ml", "login", "controller-machine", WINDOW)


@pytest.mark.parametrize("aws,st,why", [
    (None, statement(cluster="other"), "this stack manages ml"),
    (None, statement(issued_at=NOW - timedelta(minutes=10)), "more than 300 s"),
    (NOT_IN_CLUSTER, None, "not a node of cluster"),
    (node(group="gpu"), None, "only the login and controller groups"),
    (node(status="ShuttingDown"), None, "not Running or Pending"),
    (node(ip="10.1.0.99"), None, "AWS says 10.1.0.99"),
    (None, statement(identity_document={"document": {"instanceId": "i-0ffffffffffffffff", "privateIp": "10.1.0.11"}}),
     "identity document"),
])
def test_what_aws_does_not_back_is_refused(aws, st, why):
    decision = decide(st=st, aws=aws)
    assert decision.outcome == "refuse" and why in decision.reason


def test_inside_the_window_first_presenter_wins_and_the_role_is_the_groups():
    decision = decide(aws=node(group="controller-machine"))
    assert decision.outcome == "enroll" and decision.record.role == "controller" and decision.record.via == "window"
    assert decide(fingerprint="SHA256:old", existing=enrolled()).outcome == "already"


def test_a_second_key_contests_a_new_node_but_not_a_serving_one():
    assert decide(existing=enrolled()).outcome == "contest"
    assert decide(aws=node(launched=NOW - timedelta(hours=3)), existing=enrolled()).outcome == "conflict"
    assert decide(existing=enrolled(via="approval")).outcome == "conflict", "an approved key is not raced"
    assert decide(fingerprint="SHA256:old", existing=enrolled(status="contested")).outcome == "conflict"


def test_outside_the_window_only_an_approval_for_exactly_this_key_enrolls():
    old = node(launched=NOW - timedelta(days=30))
    assert decide(aws=old).outcome == "await-approval"
    assert decide(aws=old, approval=Approval(ID, "SHA256:other", "")).outcome == "await-approval"
    decision = decide(aws=old, approval=Approval(ID, "SHA256:new", ""), existing=enrolled(status="contested"))
    assert decision.outcome == "re-enroll" and decision.record.via == "approval"


@pytest.mark.parametrize("bad", [None, [], {"cluster": "ml"}, {"cluster": "ml", "instanceId": ID, "ip": "10.1.0.11",
                                 "agentPublicKey": "ssh-rsa AAAA", "issuedAt": "2026-11-26T12:00:00Z", "nonce": "n" * 24}])
def test_malformed_statements_are_refused_by_name(bad):
    with pytest.raises(MalformedNodeChannelRequest):
        parse_statement(bad)


def test_reports_need_an_uncontested_enrollment_of_their_role():
    detail = {"instanceId": ID, "sequence": 5, "proof": "x"}
    with pytest.raises(NotEnrolledError):
        check_signed_report(detail, None, "ml", ID, "login", NOW, [])
    with pytest.raises(NotEnrolledError):
        check_signed_report(detail, enrolled(status="contested"), "ml", ID, "login", NOW, [])
    with pytest.raises(ReportRoleError):
        check_signed_report(detail, enrolled(), "ml", ID, "controller", NOW, [])
    stripped, sequence = unsigned_event({"detail": detail, "source": "hpops.node"})
    assert stripped["detail"] == {"instanceId": ID} and sequence == 5 and detail["proof"] == "x"


def usage(node_seconds, groups=None):
    record = UsageRecord("bob", "gpu", node_seconds, 0, 0, 1)
    return UsageReport("ml", ID, "2026-11-26T10:00:00Z", "2026-11-26T11:00:00Z", True, "ok", "", "2026-11-26T11:00:05Z",
                       (record,), groups or {}, 1, 1)


def test_usage_beyond_what_the_partitions_group_could_run_is_refused():
    aws = [{"InstanceGroupName": "gpu-nodes", "CurrentCount": 2, "TargetCount": 4,
            "SlurmConfig": {"NodeType": "Compute", "PartitionNames": ["gpu"]}},
           {"InstanceGroupName": "cpu-nodes", "CurrentCount": 100, "TargetCount": 100}]
    assert check_capacity(usage(4 * 3600), aws) == "DescribeCluster SlurmConfig"
    with pytest.raises(UsageExceedsCapacityError, match="group gpu-nodes"):
        check_capacity(usage(4 * 3600 + 1, {"gpu": "cpu-nodes"}), aws)  # AWS's map, not the report's
    plain = [{k: v for k, v in g.items() if k != "SlurmConfig"} for g in aws]
    assert check_capacity(usage(100 * 3600, {"gpu": "cpu-nodes"}), plain) == "the signed controller report"
    with pytest.raises(UsageExceedsCapacityError, match="whole cluster"):
        check_capacity(usage(104 * 3600 + 1), plain)


def test_the_gate_admits_only_enrolled_uncontested_nodes_and_keeps_upgraded_ones():
    plan = {"register": ["10.0.0.1", "10.0.0.2", "10.0.0.3"], "keep": ["10.0.0.8", "10.0.0.9"], "deregister": []}
    verdicts = [{"ip": f"10.0.0.{n}", "instanceId": f"i-{n}", "ok": True, "reason": "ok"} for n in (1, 2, 3)]
    gated = gate_registrations(plan, verdicts, repair=False, enrollments={"i-1": "enrolled", "i-2": "contested"},
                               contested_ips={"10.0.0.9"})
    assert gated.register == ("10.0.0.1",)
    assert gated.deregister == ("10.0.0.9",), "a contested serving node leaves; an unenrolled one (10.0.0.8) stays"
    assert {r["instanceId"] for r in gated.rejected} >= {"i-2", "i-3"}


def test_the_kept_out_reason_names_the_enrollment_state_and_its_fix_not_only_the_agent():
    """A node whose agent cannot enroll (launched long before its install, contested, approval pending)
    fails verification for want of the keys: the alert says why and what to do, enrollment first."""
    from hpops_core.host_identity.acknowledgement import NO_AGENT_HINT
    from hpops_core.node_channel.contract import READ_AGENT_FINGERPRINT

    plan = {"register": ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"], "keep": [], "deregister": []}
    verdicts = [{"ip": f"10.0.0.{n}", "instanceId": f"i-{n}", "ok": False, "reason": NO_AGENT_HINT} for n in (1, 2, 3)]
    verdicts.append({"ip": "10.0.0.4", "instanceId": "i-4", "ok": False, "reason": "presents other host keys"})
    gated = gate_registrations(plan, verdicts, repair=False, enrollments={"i-2": "contested", "i-4": "enrolled"},
                               approvals={"i-3": "SHA256:" + "b" * 43})
    why = {r["instanceId"]: r["reason"] for r in gated.rejected}
    assert gated.register == ()
    assert why["i-1"].startswith("i-1's agent has not enrolled its key: a node launched more than EnrollmentWindowMinutes")
    assert "`hpops adopt --stack-name <stack>`" in why["i-1"] and READ_AGENT_FINGERPRINT in why["i-1"]
    assert why["i-1"].endswith(f"(and so: {NO_AGENT_HINT})")
    assert why["i-2"].startswith("i-2's enrollment is contested") and "--node i-2 --fingerprint SHA256:..." in why["i-2"]
    assert why["i-3"].startswith(f"i-3's agent has not enrolled its key yet; an approval for SHA256:{'b' * 43} waits")
    assert why["i-4"] == "presents other host keys"  # enrolled: the verifier's reason alone
