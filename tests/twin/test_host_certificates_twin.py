"""Certificate mode: every login node keeps its own host keys and presents certificates from one CA.

Per node: the node agent reports its public keys -> SignHostCertificates certifies the ones the
verifier saw at the node's IP into the node's parameter -> the agent installs them -> the verifier
checks what it presents.
Asserts what users see: whether a client trusting only the CA accepts the node, which keys the
node presents, and whether it is in the target group.
"""

import json
import re
from datetime import datetime, timedelta, timezone

import pytest

from hpops_core.host_identity.keys import certify_host_keys, generate_ca
from hpops_twin.world import TwinWorld

CERT_MODE = {"HostIdentityMode": "certificate", "HostCertificatePrincipals": "login.hpc.example.edu"}


@pytest.fixture
def cert_world():
    with TwinWorld(parameters=CERT_MODE) as world:
        yield world


def login_nodes(world):
    return sorted(world.sim.nodes(world.cluster_name, world.login_group), key=lambda n: n.ip)


def succeeded(world, arns):
    results = world.wait(arns, timeout=180)
    bad = [(r.error, r.cause) for r in results if r.status != "SUCCEEDED"]
    assert not bad, bad
    assert not world.agent_errors, world.agent_errors[0]
    return results


def certificate_parameters(world):
    ssm = world.aws.client("ssm")
    return ssm.get_parameters_by_path(Path=f"/hpops/{world.cluster_name}/host-certificates", Recursive=True)["Parameters"]


def invocations(world, function):
    return [i for i in world.dispatcher.invocations if i.function.endswith(function)]


def installed_certificate_lines(world, node):
    ssh = world.hosts.root(node.instance_id) / "etc" / "ssh"
    return {path.name: path.read_text().strip() for path in sorted(ssh.glob("ssh_host_*_key-cert.pub"))}


def set_certificates(world, node, ca, valid_for, principals=None):
    """Replace the node's installed certificates (as if time had passed, or someone signed by hand)."""
    ssh = world.hosts.root(node.instance_id) / "etc" / "ssh"
    lines = {name: (ssh / f"ssh_host_{name}_key.pub").read_text().strip() for name in ("ed25519", "ecdsa", "rsa")}
    now = datetime.now(timezone.utc)
    names = principals or world.certificate_policy().principals_for(node.ip)
    bundle = certify_host_keys(ca, lines, names, "by-hand", now - timedelta(days=1), now + valid_for)
    for name, cert in bundle.certificates.items():
        (ssh / f"ssh_host_{name}_key-cert.pub").write_text(cert + "\n")


def test_every_login_node_keeps_its_own_keys_and_presents_certificates_from_the_one_ca(cert_world):
    world = cert_world
    nodes = login_nodes(world)
    own_keys = {n.instance_id: world.presented_fingerprints(n.instance_id) for n in nodes}
    assert not any(world.certificate_verdict(n.instance_id).acceptable for n in nodes)

    succeeded(world, [world.run_schedule()])

    assert world.target_ips() == sorted(n.ip for n in nodes)
    for node in nodes:
        assert world.presented_fingerprints(node.instance_id) == own_keys[node.instance_id], "host keys unchanged"
        verdict = world.certificate_verdict(node.instance_id)
        assert verdict.ok, verdict.reason
        assert len(installed_certificate_lines(world, node)) == 3
    # Users trust one line; the certificate names the load balancer, the alias and the node itself.
    certificate = world.hosts.presented_host_certificate(nodes[0].ip, 22, "ssh-ed25519")
    assert certificate.ca_fingerprint == world.host_ca.fingerprint()
    assert world.output("LoadBalancerDnsName") in certificate.principals
    assert {"login.hpc.example.edu", nodes[0].ip} <= set(certificate.principals)
    assert certificate.key_id == f"hpops:{world.cluster_name}/{nodes[0].instance_id}"
    assert timedelta(days=29) < certificate.valid_before - datetime.now(timezone.utc) <= timedelta(days=30)
    # One signature per node, certifying the keys its agent reported; nothing left behind.
    assert len(invocations(world, "SignHostCertificatesFunction")) == len(nodes)
    for sign in invocations(world, "SignHostCertificatesFunction"):
        assert sign.result["signed"] and sign.event["seen"] == own_keys[sign.event["instanceId"]]
    assert certificate_parameters(world) == []
    assert world.notifications() == []


def test_replaced_node_is_certified_then_verified_then_registered(cert_world):
    world = cert_world
    succeeded(world, [world.run_schedule()])
    victim = login_nodes(world)[0]
    world.counter.reset()
    succeeded(world, world.publish(world.sim.replace_node(world.cluster_name, victim.instance_id)))
    new = next(n for n in login_nodes(world) if n.status == "Pending")
    succeeded(world, world.publish(world.sim.finish_provisioning(world.cluster_name)))

    assert new.ip in world.target_ips() and victim.ip not in world.target_ips()
    assert world.certificate_verdict(new.instance_id).ok
    signed = [i.event["instanceId"] for i in invocations(world, "SignHostCertificatesFunction")[-1:]]
    assert signed == [new.instance_id], "only the new node is certified"
    reports = [i.event["detail"] for i in invocations(world, "RecordNodeReportFunction")
               if i.event["detail"]["instanceId"] == new.instance_id]
    assert reports[0]["hostIdentity"]["publicKeys"], "first the node reports its own public keys"
    signed = invocations(world, "SignHostCertificatesFunction")[-1].result["certificateDigest"]
    assert reports[-1]["hostIdentity"]["result"] == "changed" and reports[-1]["hostIdentity"]["certificateDigest"] == signed


def test_without_a_ca_new_nodes_stay_out_and_the_notification_says_what_to_run():
    with TwinWorld(parameters=CERT_MODE) as world:
        world.aws.client("secretsmanager").put_secret_value(
            SecretId=world.output("HostCertificateAuthoritySecretArn"),
            SecretString='{"format": "hpops.host-ca.v1", "uninitialized": true}',
        )
        world.aws.client("dynamodb").update_item(
            TableName=world.resolver.physical_ids["SyncStateTable"],
            Key={"pk": {"S": f"cluster#{world.cluster_name}"}, "sk": {"S": "sync-lease"}},
            UpdateExpression="REMOVE hostIdentity",
        )
        result = succeeded(world, [world.run_schedule()])[0]
        assert world.target_ips() == []
        rejected = result.output["changes"]["rejected"]
        assert len(rejected) == 3 and all("ca-generate" in r["reason"] for r in rejected)
        assert "ca-generate" in world.notifications()[0]["message"]
        assert certificate_parameters(world) == []


def test_daily_check_renews_a_certificate_close_to_expiry(cert_world):
    world = cert_world
    succeeded(world, [world.run_schedule()])
    node = login_nodes(world)[1]
    set_certificates(world, node, world.host_ca, valid_for=timedelta(days=3))
    assert world.certificate_verdict(node.instance_id).acceptable
    assert not world.certificate_verdict(node.instance_id).ok, "renewal due (10 days before expiry)"

    result = succeeded(world, [world.run_schedule("CertificateRenewal")])[0]

    assert result.output["request"]["trigger"] == "daily host certificate check"
    assert world.certificate_verdict(node.instance_id).ok
    certificate = world.hosts.presented_host_certificate(node.ip, 22, "ssh-ed25519")
    assert certificate.valid_before - datetime.now(timezone.utc) > timedelta(days=29)
    assert len(world.target_ips()) == 3


def test_failed_renewal_keeps_a_still_valid_node_serving_and_raises_the_alarm(cert_world):
    world = cert_world
    succeeded(world, [world.run_schedule()])
    world.notifications()
    node = login_nodes(world)[0]
    set_certificates(world, node, world.host_ca, valid_for=timedelta(days=3))
    world.hosts.stopped.add(node.instance_id)  # its node agent is down today

    succeeded(world, [world.run_schedule("CertificateRenewal")])

    assert node.ip in world.target_ips(), "its certificate is valid for 3 more days"
    message = world.notifications()[0]["message"]
    assert node.instance_id in message and "could not get renewed host certificates" in message
    gate_logs = "".join(i.logs for i in invocations(world, "GateTargetChangesFunction")).replace(" ", "")
    assert '"HostCertificateRenewalFailed":[1.0]' in gate_logs or '"HostCertificateRenewalFailed":1.0' in gate_logs


def test_daily_check_takes_out_a_node_with_a_foreign_certificate_that_cannot_be_fixed(cert_world):
    world = cert_world
    succeeded(world, [world.run_schedule()])
    node = login_nodes(world)[2]
    set_certificates(world, node, generate_ca(), valid_for=timedelta(days=30))  # someone else's CA
    world.hosts.stopped.add(node.instance_id)

    succeeded(world, [world.run_schedule("CertificateRenewal")])

    assert node.ip not in world.target_ips()
    assert len(world.target_ips()) == 2


def test_daily_check_fixes_a_node_whose_certificate_lacks_a_new_alias(cert_world):
    world = cert_world
    succeeded(world, [world.run_schedule()])
    node = login_nodes(world)[0]
    set_certificates(world, node, world.host_ca, valid_for=timedelta(days=30), principals=[node.ip])
    assert "lacks principal" in world.certificate_verdict(node.instance_id).reason

    succeeded(world, [world.run_schedule("CertificateRenewal")])

    assert world.certificate_verdict(node.instance_id).ok
    assert node.ip in world.target_ips()


def test_ca_private_key_never_leaves_its_secret(cert_world):
    world = cert_world
    succeeded(world, [world.run_schedule()])
    succeeded(world, [world.start_repair()])
    secret = world.aws.client("secretsmanager").get_secret_value(SecretId=world.output("HostCertificateAuthoritySecretArn"))
    body = json.loads(secret["SecretString"])["private"]
    fragments = [line[:40] for line in body.splitlines() if re.fullmatch(r"[A-Za-z0-9+/=]{60,}", line)]
    assert fragments

    history = json.dumps([world.history(r.execution_arn) for r in world.routes], default=str)
    logs = "".join(i.logs for i in world.dispatcher.invocations)
    lambda_io = json.dumps([[i.event, i.result] for i in world.dispatcher.invocations], default=str)
    parameters = json.dumps(world.aws.client("ssm").get_parameters_by_path(Path="/hpops", Recursive=True)["Parameters"], default=str)
    reports = json.dumps([i.event for i in invocations(world, "RecordNodeReportFunction")])
    notes = json.dumps(world.notification_log + world.notifications())
    for where, text in {"Step Functions history": history, "Lambda logs": logs, "Lambda input/output": lambda_io,
                        "SSM parameters": parameters, "node reports": reports, "notifications": notes}.items():
        assert not [f for f in fragments if f in text], f"CA private key material in {where}"


def test_a_keys_mode_stack_has_no_ca_secret_and_its_signer_cannot_read_one(world):
    """Keys mode (the default) creates no CA secret ($0.40 a month nothing would read) and no output naming one."""
    secrets = world.aws.client("secretsmanager").list_secrets()["SecretList"]
    assert [s["ARN"] for s in secrets] == [world.output("HostIdentitySecretArn")]
    with pytest.raises(KeyError, match="HostCertificateAuthoritySecretArn"):
        world.output("HostCertificateAuthoritySecretArn")
    env = world.resolver.resolve(world.template.function_environment("SignHostCertificatesFunction"))
    assert env["HOST_CA_SECRET_ARN"] == ""
    actions = json.dumps(world.iam.policies()["function:SignHostCertificatesFunction"])
    assert "secretsmanager:GetSecretValue" not in actions and "kms:Decrypt" not in actions


def test_a_certificate_mode_stack_keeps_its_ca_secret_and_its_signer_reads_only_that(cert_world):
    arn = cert_world.output("HostCertificateAuthoritySecretArn")
    names = {s["ARN"] for s in cert_world.aws.client("secretsmanager").list_secrets()["SecretList"]}
    assert names == {arn, cert_world.output("HostIdentitySecretArn")}
    env = cert_world.resolver.resolve(cert_world.template.function_environment("SignHostCertificatesFunction"))
    assert env["HOST_CA_SECRET_ARN"] == arn
    actions = json.dumps(cert_world.iam.policies()["function:SignHostCertificatesFunction"])
    assert "secretsmanager:GetSecretValue" in actions and arn in actions


def test_deleting_a_certificate_mode_stack_keeps_the_ca_users_trust(cert_world):
    """`sam delete` (as a parameter change leaving certificate mode would) keeps the CA's secret, CA inside."""
    world = cert_world
    world.install_host_certificate_authority(generate_ca())
    ca_arn, keys_arn = world.output("HostCertificateAuthoritySecretArn"), world.output("HostIdentitySecretArn")
    stored = world.aws.client("secretsmanager").get_secret_value(SecretId=ca_arn)["SecretString"]
    world.stack.delete()
    assert world.retained == ["HostCertificateAuthoritySecret"]
    secrets = world.aws.client("secretsmanager")
    assert secrets.get_secret_value(SecretId=ca_arn)["SecretString"] == stored
    assert [s["ARN"] for s in secrets.list_secrets()["SecretList"]] == [ca_arn]  # the host keys' secret went
    assert keys_arn != ca_arn


def test_renewal_schedule_is_off_in_keys_mode(world):
    assert world.rules["CertificateRenewal"]["enabled"] is False
    with pytest.raises(RuntimeError, match="disabled"):
        world.run_schedule("CertificateRenewal")


def test_renewal_schedule_is_on_in_certificate_mode(cert_world):
    assert cert_world.rules["CertificateRenewal"]["enabled"] is True
