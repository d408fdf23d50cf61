"""Enrollment decisions, report refusals, the usage capacity bound and the gate's enrollment rule (pure)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from hpops_core.budget_guard.usage_capacity import UsageExceedsCapacityError, check_capacity
from hpops_core.budget_guard.usage_reports import UsageRecord, UsageReport
from hpops_core.host_identity.gate import gate_registrations
from hpops_core.node_channel.enrollment import (
    Approval,
    Enrollment,
    IdentityDocument,
    MalformedNodeChannelRequest,
    NotEnrolledError,
    Statement,
    decide_enrollment,
    parse_statement,
    precheck,
)
from hpops_core.node_channel import report_proof
from hpops_core.node_channel.report_proof import (
    ReportFromFutureError,
    ReportRoleError,
    UnprovenEnrollmentError,
    check_signed_report,
    unsigned_event,
)

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


def enrolled(fingerprint="SHA256:old", via="window", status="enrolled", window_ends_at="2026-11-26T12:55:00Z",
             contested_by=(), expect_document=False):
    return Enrollment("ml", ID, KEY, fingerprint, "login", "login", "10.1.0.11", status, "2026-11-26T11:56:00Z", via,
                      contested_by, window_ends_at, expect_document)


def document(instance_id=ID, region="us-east-1", ip="10.1.0.11", pending=NOW - timedelta(minutes=5)):
    """What instance_identity.verify returns for a document whose AWS signature verified."""
    return IdentityDocument(instance_id, region, "210987654321", ip, pending)


NOT_IN_CLUSTER = "not in cluster"


def decide(st=None, fingerprint="SHA256:new", aws=None, existing=None, approval=None, doc=None, seen=False):
    aws = None if aws == NOT_IN_CLUSTER else aws or node()
    return decide_enrollment(st or statement(), fingerprint, aws, existing, approval, NOW,
                             "ml", "login", "controller-machine", WINDOW, doc, "us-east-1", seen)


@pytest.mark.parametrize("aws,st,doc,why", [
    (None, statement(cluster="other"), None, "this stack manages ml"),
    (None, statement(issued_at=NOW - timedelta(minutes=10)), None, "more than 300 s"),
    (NOT_IN_CLUSTER, None, None, "not a node of cluster"),
    (node(group="gpu"), None, None, "not in the login or controller group"),
    (node(status="ShuttingDown"), None, None, "not Running or Pending"),
    (node(ip="10.1.0.99"), None, None, "not at the IP the statement claims"),
    (None, None, document(instance_id="i-0ffffffffffffffff"), "another instance's"),
    (None, None, document(region="eu-west-1"), "another Region"),
    (None, None, document(ip="10.1.0.12"), "another IP"),
    (None, None, document(pending=NOW - timedelta(days=2)), "pending time"),
])
def test_what_aws_does_not_back_is_refused_and_the_refusal_teaches_nothing_of_aws_s_record(aws, st, doc, why):
    decision = decide(st=st, aws=aws, doc=doc)
    assert decision.outcome == "refuse" and why in decision.reason
    assert "10.1.0.99" not in decision.reason and "gpu" not in decision.reason and "ShuttingDown" not in decision.reason


def test_inside_the_window_first_presenter_wins_and_the_role_is_the_groups():
    decision = decide(aws=node(group="controller-machine"))
    assert decision.outcome == "enroll" and decision.record.role == "controller" and decision.record.via == "window"
    assert decision.record.window_ends_at == "2026-11-26T12:55:00Z" and not decision.record.expect_document
    assert not decision.record.proven(NOW) and decision.record.proven(NOW + timedelta(minutes=55))
    assert decide(fingerprint="SHA256:old", existing=enrolled()).outcome == "already"
    verified = decide(doc=document())
    assert verified.outcome == "enroll" and verified.record.via == "document" and verified.record.proven(NOW)


def test_a_verified_document_beats_an_unverified_key_and_is_never_raced_itself():
    displaced = decide(existing=enrolled(), doc=document())
    assert displaced.outcome == "displace" and displaced.resets and displaced.record.fingerprint == "SHA256:new"
    settled = decide(fingerprint="SHA256:old", existing=enrolled(status="contested"), doc=document())
    assert settled.outcome == "displace" and settled.record.usable, "the raced node's own agent settles the contest"
    for proven in (enrolled(via="document"), enrolled(via="approval")):
        assert decide(existing=proven).outcome == "conflict"
        assert decide(existing=proven, doc=document()).outcome == "conflict", "first verified presenter wins"
    late = node(launched=NOW - timedelta(hours=3))
    assert decide(aws=late, existing=enrolled(window_ends_at="2026-11-26T10:00:00Z"), doc=document(
        pending=NOW - timedelta(hours=3))).outcome == "conflict", "after the window the enrolled key stands"


def test_an_unverified_second_key_contests_a_new_node_a_bounded_number_of_times():
    assert decide(existing=enrolled()).outcome == "contest"
    full = enrolled(status="contested", contested_by=tuple(f"SHA256:{n}" for n in range(5)))
    assert decide(existing=full).outcome == "conflict", "a flood of keys adds no contest record"
    assert decide(fingerprint="SHA256:1", existing=enrolled(contested_by=("SHA256:1",))).outcome == "conflict"
    assert decide(fingerprint="SHA256:old", existing=enrolled(status="contested")).outcome == "conflict"


def test_a_proven_enrollment_refuses_another_key_before_aws_is_asked():
    early = precheck(statement(), "SHA256:new", enrolled(via="document"), None, NOW)
    assert early is not None and early.outcome == "conflict"
    assert precheck(statement(), "SHA256:new", enrolled(), None, NOW) is None, "an unverified one may still be raced"
    assert precheck(statement(), "SHA256:new", enrolled(via="document"), Approval(ID, "SHA256:new", ""), NOW) is None


def test_outside_the_window_only_an_approval_for_exactly_this_key_enrolls():
    old = node(launched=NOW - timedelta(days=30))
    assert decide(aws=old).outcome == "await-approval"
    assert decide(aws=old, doc=document(pending=NOW - timedelta(days=30))).outcome == "await-approval"
    assert decide(aws=old, approval=Approval(ID, "SHA256:other", "")).outcome == "await-approval"
    decision = decide(aws=old, approval=Approval(ID, "SHA256:new", ""), existing=enrolled(status="contested"))
    assert decision.outcome == "re-enroll" and decision.record.via == "approval" and decision.resets


def test_reports_count_from_a_proven_key_and_login_reports_also_where_no_document_was_ever_seen():
    raced = enrolled(expect_document=True)
    assert not raced.counts_reports(NOW) and raced.counts_reports(NOW + timedelta(hours=1))
    assert enrolled().counts_reports(NOW) and not enrolled().proven(NOW), "a cluster without documents, as before"
    assert enrolled(window_ends_at="").proven(NOW), "enrolled before windows were recorded: as it was"


@pytest.mark.parametrize("bad", [None, [], {"cluster": "ml"}, {"cluster": "ml", "instanceId": ID, "ip": "10.1.0.11",
                                 "agentPublicKey": "ssh-rsa AAAA", "issuedAt": "2026-11-26T12:00:00Z", "nonce": "n" * 24}])
def test_malformed_statements_are_refused_by_name(bad):
    with pytest.raises(MalformedNodeChannelRequest):
        parse_statement(bad)


def test_reports_need_an_uncontested_enrollment_of_their_role_and_weight_needs_a_proven_one():
    detail = {"instanceId": ID, "sequence": 5, "proof": "x"}
    with pytest.raises(NotEnrolledError):
        check_signed_report(detail, None, "ml", ID, "login", NOW, [])
    with pytest.raises(NotEnrolledError):
        check_signed_report(detail, enrolled(status="contested"), "ml", ID, "login", NOW, [])
    with pytest.raises(ReportRoleError):
        check_signed_report(detail, enrolled(via="document"), "ml", ID, "controller", NOW, [])
    controller = replace(enrolled(), role="controller")
    with pytest.raises(UnprovenEnrollmentError):  # a key that raced a new controller charges nobody
        check_signed_report(detail, controller, "ml", ID, "controller", NOW, [])
    with pytest.raises(UnprovenEnrollmentError):
        check_signed_report(detail, enrolled(expect_document=True), "ml", ID, "login", NOW, [])
    stripped, sequence = unsigned_event({"detail": detail, "source": "hpops.node"})
    assert stripped["detail"] == {"instanceId": ID} and sequence == 5 and detail["proof"] == "x"


def test_a_sequence_ahead_of_the_clock_is_refused_so_it_cannot_pin_the_agent_s_reports(monkeypatch):
    monkeypatch.setattr(report_proof.node_proof, "verify_body", lambda *args: None)  # the signature is not the point
    now_us = int(NOW.timestamp()) * 1_000_000
    for pinned in (2**63 - 1, now_us + 121 * 1_000_000):
        with pytest.raises(ReportFromFutureError):
            check_signed_report({"sequence": pinned, "proof": "x"}, enrolled(), "ml", ID, "login", NOW, [])
    assert check_signed_report({"sequence": now_us, "proof": "x"}, enrolled(), "ml", ID, "login", NOW, []) == now_us


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


def test_the_gate_admits_only_enrolled_uncontested_nodes_and_never_takes_a_serving_one_out():
    plan = {"register": ["10.0.0.1", "10.0.0.2", "10.0.0.3"], "keep": ["10.0.0.8", "10.0.0.9"], "deregister": []}
    verdicts = [{"ip": f"10.0.0.{n}", "instanceId": f"i-{n}", "ok": True, "reason": "ok"} for n in (1, 2, 3)]
    gated = gate_registrations(plan, verdicts, repair=False,
                               enrollments={"i-1": "enrolled", "i-2": "contested", "i-9": "contested"})
    assert gated.register == ("10.0.0.1",)
    assert gated.deregister == (), "a contested serving node (10.0.0.9) and an unenrolled one (10.0.0.8) stay"
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


def test_what_an_approval_does_with_a_replaced_controller_keys_usage_follows_what_the_stack_knows():
    """Proven (document, approval): the node's own, kept. Contested: never counted, discarded, even under
    adopt's keep. Enrolled by window alone: the operator's word, or adopt's keep (it read the new key as
    root on a re-imaged node); approve-enrollment refuses to guess. Login nodes and the same key: no usage."""
    from hpops.enrollments import ReplacedKeyUsageRequired, replaced_key_usage

    new = "SHA256:" + "n" * 43
    standing = Enrollment("lab", "i-0123456789abcdef0", "ssh-ed25519 " + "A" * 68, "SHA256:" + "s" * 43,
                          "controller-machine", "controller", "10.1.0.9", "enrolled", "2026-11-01T00:00:00Z", "window")
    assert replaced_key_usage(replace(standing, via="document"), new, "controller", None)[0] == "keep"
    assert replaced_key_usage(replace(standing, via="approval"), new, "controller", None)[0] == "keep"
    assert replaced_key_usage(replace(standing, status="contested"), new, "controller", None, default="keep")[0] == "discard"
    assert replaced_key_usage(standing, new, "controller", None, default="keep")[0] == "keep"
    assert replaced_key_usage(standing, new, "controller", "discard")[0] == "discard"
    with pytest.raises(ReplacedKeyUsageRequired, match="--replaced-key-usage discard"):
        replaced_key_usage(standing, new, "controller", None)
    assert replaced_key_usage(standing, new, "login", None)[0] == ""
    assert replaced_key_usage(standing, standing.fingerprint, "controller", None)[0] == ""
    assert replaced_key_usage(None, new, "controller", None)[0] == ""
