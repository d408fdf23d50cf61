"""The node channel's stack side: desired-state documents, report validation, acknowledgement."""

import json

import boto3
import pytest
from moto import mock_aws

from hpops_core.common import clients
from hpops_core.node_channel import contract, desired_state
from hpops_core.host_identity.acknowledgement import NO_AGENT_HINT, judge_acknowledgement
from hpops_core.node_channel.reports import MalformedNodeReport, check_report_origin, parse_report_event

FP = "SHA256:" + "A" * 43
FP2 = "SHA256:" + "B" * 43
SECRET = "arn:aws:secretsmanager:us-east-1:123456789012:secret:hpops-host-keys-AbCdEf"
SINCE = "2026-11-23T08:00:00.000Z"


def report_event(**detail_changes):
    detail = {
        "format": contract.REPORT_FORMAT, "cluster": "ml-research", "instanceId": "i-0123456789abcdef0",
        "ip": "10.1.0.5", "role": "login", "agentVersion": "0.1.0", "reportedAt": "2026-11-23T08:00:01Z",
        "trigger": "change",
        "hostIdentity": {"mode": "keys", "version": "v2", "result": "changed", "reason": "installed",
                         "fingerprints": {"ssh-ed25519": FP}},
        "loginLimits": {"version": "abc", "result": "unchanged", "reason": ""},
    } | detail_changes
    return {"version": "0", "id": "x", "source": contract.REPORT_SOURCE, "detail-type": contract.REPORT_DETAIL_TYPE,
            "account": "123456789012", "time": "2026-11-23T08:00:01Z", "region": "us-east-1", "resources": [],
            "detail": detail}


# ------------------------------------------------------------------ desired state


def test_keys_document_names_the_secret_and_fingerprints_never_key_material():
    doc = desired_state.host_identity_document("keys", {"mode": "keys", "fingerprints": {"ssh-ed25519": FP}, "version": "v2"}, SECRET)
    assert doc == {"format": contract.HOST_IDENTITY_FORMAT, "mode": "keys", "version": "v2", "secretArn": SECRET,
                   "fingerprints": {"ssh-ed25519": FP}}


def test_without_a_published_identity_agents_are_told_to_wait():
    assert desired_state.host_identity_document("keys", None, SECRET)["version"] == "uninitialized"
    assert "secretArn" not in desired_state.host_identity_document("keys", None, SECRET)
    cert = desired_state.host_identity_document("certificate", {"mode": "certificate", "caFingerprint": FP, "version": "c1"}, SECRET)
    assert cert["caFingerprint"] == FP and "secretArn" not in cert


@mock_aws
def test_publishing_writes_only_when_the_document_changed(monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    clients.reset_clients()
    name = contract.host_identity_parameter("ml-research")
    doc = desired_state.host_identity_document("keys", {"mode": "keys", "fingerprints": {"ssh-ed25519": FP}, "version": "v1"}, SECRET)
    assert desired_state.publish_if_changed(name, doc, "test") is True
    assert desired_state.publish_if_changed(name, doc, "test") is False
    ssm = boto3.client("ssm", region_name="us-east-1")
    assert ssm.get_parameter(Name=name)["Parameter"]["Version"] == 1
    rotated = desired_state.host_identity_document("keys", {"mode": "keys", "fingerprints": {"ssh-ed25519": FP2}, "version": "v2"}, SECRET)
    assert desired_state.publish_if_changed(name, rotated, "test") is True
    stored = ssm.get_parameter(Name=name)["Parameter"]
    assert stored["Version"] == 2 and json.loads(stored["Value"])["fingerprints"] == {"ssh-ed25519": FP2}
    clients.reset_clients()


@pytest.mark.parametrize("cluster", ["", "a b", "../x", "x" * 64, "-lead"])
def test_parameter_names_come_only_from_valid_cluster_names(cluster):
    with pytest.raises(ValueError):
        contract.host_identity_parameter(cluster)


# ------------------------------------------------------------------ reports


def test_a_report_the_agent_sends_parses():
    report = parse_report_event(report_event())
    assert report.instanceId == "i-0123456789abcdef0" and report.hostIdentity.fingerprints == {"ssh-ed25519": FP}


@pytest.mark.parametrize("change", [
    {"instanceId": "i-123; rm -rf /"},
    {"ip": "10.1.0.5\nX-Injected: 1"},
    {"role": "admin"},
    {"hostIdentity": {"mode": "keys", "result": "changed", "privateKey": "-----BEGIN OPENSSH PRIVATE KEY-----"}},
    {"hostIdentity": {"mode": "keys", "result": "changed", "fingerprints": {"ssh-ed25519": "not a fingerprint"}}},
    {"hostIdentity": {"mode": "keys", "result": "changed", "reason": "x" * 301}},
    {"format": "hpops.node.report.v0"},
])
def test_malformed_reports_are_refused_by_name(change):
    with pytest.raises(MalformedNodeReport):
        parse_report_event(report_event(**change))


@pytest.mark.parametrize("event", [None, [], "text", 42, {"source": "aws.sagemaker"}])
def test_anything_else_is_a_malformed_report(event):
    with pytest.raises(MalformedNodeReport):
        parse_report_event(event)


def test_a_report_is_accepted_only_from_a_login_node_at_the_ip_aws_records():
    report = parse_report_event(report_event())
    node = {"InstanceGroupName": "login", "PrivatePrimaryIp": "10.1.0.5"}
    assert check_report_origin(report, "ml-research", "login", node).accepted
    assert not check_report_origin(report, "ml-research", "login", None).accepted
    assert "not login" in check_report_origin(report, "ml-research", "login", node | {"InstanceGroupName": "gpu"}).reason
    assert "AWS says" in check_report_origin(report, "ml-research", "login", node | {"PrivatePrimaryIp": "10.1.0.9"}).reason
    assert not check_report_origin(report, "other-cluster", "login", node).accepted


# ------------------------------------------------------------------ acknowledgement (pure)


def stored(identity, received="2026-11-23T08:00:05.000Z"):
    return {"hostIdentity": identity, "receivedAt": received}


def test_nothing_published_ends_the_wait_at_once_with_what_to_run():
    keys = judge_acknowledgement("keys", None, "install", None, None, SINCE)
    assert keys.finished and not keys.acknowledged and "hpops host-keys generate" in keys.reason
    ca = judge_acknowledgement("certificate", None, "collect", {"mode": "keys", "fingerprints": {"x": FP}}, None, SINCE)
    assert ca.finished and "ca-generate" in ca.reason


def test_no_report_means_keep_waiting_and_say_how_to_fix_it():
    verdict = judge_acknowledgement("keys", None, "install", {"mode": "keys", "fingerprints": {"ssh-ed25519": FP}}, None, SINCE)
    assert not verdict.acknowledged and not verdict.finished and verdict.reason == NO_AGENT_HINT


def test_keys_install_is_acknowledged_when_the_node_reports_the_canonical_fingerprints():
    expected = {"mode": "keys", "fingerprints": {"ssh-ed25519": FP}}
    assert judge_acknowledgement("keys", stored({"result": "changed", "fingerprints": {"ssh-ed25519": FP}}), "install", expected, None, SINCE).acknowledged
    other = judge_acknowledgement("keys", stored({"result": "unchanged", "fingerprints": {"ssh-ed25519": FP2}}), "install", expected, None, SINCE)
    assert not other.acknowledged and not other.finished


def test_a_failure_reported_after_the_wait_began_ends_it_with_the_nodes_reason():
    expected = {"mode": "keys", "fingerprints": {"ssh-ed25519": FP}}
    failed = {"result": "failed", "reason": "sshd -t rejected the configuration", "fingerprints": {"ssh-ed25519": FP2}}
    verdict = judge_acknowledgement("keys", stored(failed), "install", expected, None, SINCE)
    assert verdict.finished and not verdict.acknowledged and "sshd -t" in verdict.reason
    old = judge_acknowledgement("keys", stored(failed, received="2026-11-23T07:59:00.000Z"), "install", expected, None, SINCE)
    assert not old.finished, "a failure from before this wait says nothing about the current identity"


def test_certificate_phases():
    keys = {"ed25519": "ssh-ed25519 " + "A" * 68}
    expected = {"mode": "certificate", "caFingerprint": FP}
    collect = judge_acknowledgement("certificate", stored({"mode": "certificate", "result": "waiting", "publicKeys": keys}), "collect", expected, None, SINCE)
    assert collect.acknowledged
    assert not judge_acknowledgement("certificate", stored({"mode": "keys", "result": "unchanged"}), "collect", expected, None, SINCE).acknowledged
    signed = "0123456789abcdef"
    assert judge_acknowledgement("certificate", stored({"mode": "certificate", "result": "changed", "certificateVersion": 1,
                                                        "certificateDigest": signed}), "install", expected, signed, SINCE).acknowledged
    # SSM numbers a re-created parameter from 1 again: an old install with "version 1" is not this one
    stale = stored({"mode": "certificate", "result": "unchanged", "certificateVersion": 1, "certificateDigest": "fedcba9876543210"})
    assert not judge_acknowledgement("certificate", stale, "install", expected, signed, SINCE).finished


def test_the_saved_sample_report_is_one_the_stack_accepts(saved_event):
    report = parse_report_event(saved_event("node-report.json"))
    assert report.hostIdentity.result == "changed" and report.loginLimits.version == "3f0a9c1e5b7d2468"


@pytest.mark.parametrize("change", [
    {"unexpected": "field"},
    {"hostIdentity": {"mode": "certificate", "result": "changed", "certificateVersion": True}},
    {"hostIdentity": {"mode": "certificate", "result": "changed", "certificateVersion": 0}},
    {"hostIdentity": {"mode": "keys", "result": "changed", "publicKeys": {"dsa": "ssh-dss " + "A" * 60}}},
    {"hostIdentity": {"mode": "keys", "result": "changed", "fingerprints": None}},
    {"loginLimits": {"result": "changed", "reason": None}},
    {"reportedAt": 1732300000},
])
def test_fields_of_the_wrong_type_or_unknown_fields_are_refused_by_name(change):
    with pytest.raises(MalformedNodeReport) as refused:
        parse_report_event(report_event(**change))
    assert "invalid field(s)" in str(refused.value) and "ssh-dss" not in str(refused.value)


def test_the_stored_report_leaves_out_what_the_node_did_not_send():
    report = parse_report_event(report_event(hostIdentity={"mode": "keys", "result": "waiting", "version": None},
                                             loginLimits=None))
    stored = json.loads(report.to_json())
    assert stored["hostIdentity"] == {"mode": "keys", "result": "waiting", "reason": "", "fingerprints": {},
                                      "publicKeys": {}}
    assert "loginLimits" not in stored and stored["instanceId"] == "i-0123456789abcdef0"
