"""Certificate mode's pure parts: the key report, the signing policy, and the verdict on what a node presents."""

import json
from datetime import datetime, timedelta, timezone

import pytest

from hpops_core.host_identity import certificates, keys, verifier
from hpops_core.node_channel import contract
from hpops_core.host_identity.certificates import (
    CertificatePolicy,
    CertificatePolicyError,
    NodeKeyReportInvalid,
    issue_certificates,
    keys_seen_on_network,
    judge_certificates,
    reported_public_keys,
)

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)
NODE_IP = "10.1.0.17"


@pytest.fixture(scope="module")
def ca():
    return keys.generate_ca()


@pytest.fixture(scope="module")
def node_keys():
    return keys.generate_bundle()


@pytest.fixture
def policy():
    return CertificatePolicy.from_strings("login-nlb.elb.amazonaws.com, login.hpc.example.edu,", 30, 10)


def public_lines(bundle):
    return {pair.name: pair.public_line for pair in bundle.pairs()}


def presented(bundle, ca, policy, now=NOW, principals=None, valid_for=timedelta(days=30)):
    """What a node with `bundle` and certificates from `ca` presents: plain keys + certificate facts."""
    issued = keys.certify_host_keys(ca, public_lines(bundle), principals or policy.principals_for(NODE_IP), "n",
                                    now - timedelta(minutes=5), now + valid_for)
    plain = {keys.KEY_TYPES[name]: line for name, line in public_lines(bundle).items()}
    certs = {keys.KEY_TYPES[name]: verifier._describe_certificate(cert, keys.KEY_TYPES[name], "node")
             for name, cert in issued.certificates.items()}
    return plain, certs


# --------------------------------------------------------------------------- the node's key report


def report(public_keys):
    """The node's latest report as the state table keeps it."""
    return {"hostIdentity": {"mode": "certificate", "result": "waiting", "publicKeys": public_keys}, "receivedAt": "x"}


def test_report_yields_exactly_the_reported_keys_without_comments(node_keys):
    lines = {name: line + " root@node" for name, line in public_lines(node_keys).items()}
    assert reported_public_keys(report(lines)) == public_lines(node_keys)


@pytest.mark.parametrize("output", [
    None,
    {},
    {"hostIdentity": {"mode": "keys", "result": "failed", "reason": "no host keys"}},
    report({}),
    report({"dsa": "ssh-dss AAAA"}),
    report({"ed25519": "ssh-ed25519 not-base64!"}),
    report({"ed25519": "ssh-ed25519 AAAA'; rm -rf / #"}),
    report({"ed25519": 42}),
])
def test_a_missing_or_hostile_report_is_named_and_signs_nothing(output):
    with pytest.raises(NodeKeyReportInvalid):
        reported_public_keys(output)


def test_a_key_reported_under_the_wrong_name_is_refused(node_keys):
    lines = public_lines(node_keys)
    with pytest.raises(NodeKeyReportInvalid, match="ed25519"):
        reported_public_keys(report({"ed25519": lines["rsa"]}))


def test_only_keys_the_verifier_saw_at_the_nodes_ip_are_certified(node_keys):
    lines = public_lines(node_keys)
    seen = {keys.KEY_TYPES[name]: keys.fingerprint(line) for name, line in lines.items()}
    assert keys_seen_on_network(lines, seen) == lines
    impostor = public_lines(keys.generate_bundle())
    with pytest.raises(NodeKeyReportInvalid, match="not the one presented"):
        keys_seen_on_network({"ed25519": impostor["ed25519"]}, seen)
    with pytest.raises(NodeKeyReportInvalid, match="saw no host keys"):
        keys_seen_on_network(lines, {})


# --------------------------------------------------------------------------- names and policy


def test_certificate_parameter_name_is_the_contracts_and_refuses_hostile_ids():
    assert contract.certificate_parameter("ml-research", "i-0abc1234") == "/hpops/ml-research/host-certificates/i-0abc1234"
    for bad in ("i-1/../../x", "i-1 x", "", "i-1'", "../i-1"):
        with pytest.raises(ValueError):
            contract.certificate_parameter("ml-research", bad)


def test_policy_needs_a_principal_and_a_renewal_window_inside_the_validity():
    with pytest.raises(CertificatePolicyError, match="principals"):
        CertificatePolicy.from_strings(" , ", 30, 10)
    with pytest.raises(CertificatePolicyError, match="renewal"):
        CertificatePolicy.from_strings("login", 10, 10)
    with pytest.raises(CertificatePolicyError, match="invalid"):
        CertificatePolicy.from_strings("login,evil host,$(x)", 30, 10)


def test_principals_are_the_shared_names_then_the_node_ip_without_duplicates(policy):
    assert policy.principals_for(NODE_IP) == ["login-nlb.elb.amazonaws.com", "login.hpc.example.edu", NODE_IP]


def test_issued_certificates_certify_the_node_keys_for_the_policy(ca, node_keys, policy):
    bundle = issue_certificates(ca, public_lines(node_keys), policy, "ml-research", "i-0abc", NODE_IP, NOW)
    assert set(bundle.certificates) == {"ed25519", "ecdsa", "rsa"}
    facts = verifier._describe_certificate(bundle.certificates["ed25519"], "ssh-ed25519", "node")
    assert facts.host_key_fingerprint == node_keys.public_fingerprints()["ssh-ed25519"]
    assert facts.ca_fingerprint == ca.fingerprint()
    assert facts.key_id == "hpops:ml-research/i-0abc"
    assert list(facts.principals) == policy.principals_for(NODE_IP)
    assert facts.valid_after == NOW - certificates.BACKDATE
    assert facts.valid_before == NOW + timedelta(days=30)


# --------------------------------------------------------------------------- the verdict


def test_a_node_with_good_certificates_for_every_key_passes(ca, node_keys, policy):
    plain, certs = presented(node_keys, ca, policy)
    result = judge_certificates(ca.fingerprint(), policy, NODE_IP, plain, certs, NOW)
    assert (result.ok, result.acceptable) == (True, True)
    assert "valid until 2026-12-22" in result.reason


def test_renewal_due_is_acceptable_but_not_ok(ca, node_keys, policy):
    plain, certs = presented(node_keys, ca, policy, valid_for=timedelta(days=9))
    result = judge_certificates(ca.fingerprint(), policy, NODE_IP, plain, certs, NOW)
    assert (result.ok, result.acceptable) == (False, True)
    assert "renewal due" in result.reason


@pytest.mark.parametrize("tamper, expected", [
    ("other_ca", "expected CA"),
    ("missing_principal", "lacks principal"),
    ("expired", "not valid now"),
    ("one_type_uncertified", "no certificate"),
    ("certificate_for_other_key", "certificate is for another key"),
])
def test_anything_a_client_would_refuse_fails_the_node(ca, node_keys, policy, tamper, expected):
    signer = keys.generate_ca() if tamper == "other_ca" else ca
    principals = ["login-nlb.elb.amazonaws.com"] if tamper == "missing_principal" else None
    now = NOW + timedelta(days=40) if tamper == "expired" else NOW
    plain, certs = presented(node_keys, signer, policy, principals=principals)
    if tamper == "one_type_uncertified":
        certs["ecdsa-sha2-nistp256"] = verifier.HostCertificateMissing("offers no ecdsa certificate")
    if tamper == "certificate_for_other_key":
        _, other = presented(keys.generate_bundle(), ca, policy)
        certs["ssh-ed25519"] = other["ssh-ed25519"]
    result = judge_certificates(ca.fingerprint(), policy, NODE_IP, plain, certs, now)
    assert (result.ok, result.acceptable) == (False, False)
    assert expected in result.reason


def test_a_node_presenting_no_keys_fails(ca, policy):
    result = judge_certificates(ca.fingerprint(), policy, NODE_IP, {}, {}, NOW)
    assert not result.ok and not result.acceptable


def test_unreachable_node_is_an_outage_not_a_verdict(ca, policy):
    def unreachable(*args, **kwargs):
        raise verifier.HostUnreachable("10.1.0.17:22: connect failed")

    with pytest.raises(verifier.HostUnreachable):
        certificates.verify_node_certificates(NODE_IP, 22, ca.fingerprint(), policy, NOW, unreachable, unreachable)


def test_verify_reads_one_certificate_per_presented_key_type(ca, node_keys, policy):
    plain, certs = presented(node_keys, ca, policy)
    asked = []

    def read_certificate(host, port, key_type, timeout):
        asked.append(key_type)
        return certs[key_type]

    result = certificates.verify_node_certificates(
        NODE_IP, 22, ca.fingerprint(), policy, NOW, lambda host, port, timeout: plain, read_certificate)
    assert result.ok and sorted(asked) == sorted(plain)
