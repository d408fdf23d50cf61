"""The instance identity document's signature, checked as AWS documents it (verify-signature), with the
certificates kept in the product (identity_certificates.py)."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from hpops_core.node_channel import identity_certificates
from hpops_core.node_channel.enrollment import MalformedNodeChannelRequest, parse_statement
from hpops_core.node_channel.instance_identity import (
    IdentityDocumentRefusedError,
    NoCertificateForRegionError,
    verify,
)

# A real EC2 instance's document and base64 signature, as IMDS served them (us-east-1, February 2024;
# published as test data with the certificates it verifies against): AWS's signature, not ours.
AWS_DOCUMENT = """{
  "accountId" : "975050371289",
  "architecture" : "x86_64",
  "availabilityZone" : "us-east-1b",
  "billingProducts" : null,
  "devpayProductCodes" : null,
  "marketplaceProductCodes" : null,
  "imageId" : "ami-0c7217cdde317cfec",
  "instanceId" : "i-0b02d936754a6d637",
  "instanceType" : "t2.micro",
  "kernelId" : null,
  "pendingTime" : "2024-02-15T14:12:11Z",
  "privateIp" : "172.31.17.154",
  "ramdiskId" : null,
  "region" : "us-east-1",
  "version" : "2017-09-30"
}"""
AWS_SIGNATURE = """OQTgfPTsc7hXR+3OWP7dk7qY1S1RNGvVvoVPzn/WogAqJpGBtei2pSx3OfZ7F1PDMpClQswDcF9N
iZmPD09xyJSrSRwYvx8SFoBWzUXS1hd9T1ZxpqWtloe/k//YmK7h9f7rjuT3/CxDDCWrbsKp8F0N
ck+YPKGzD+dtxEm6g1g="""


def test_a_document_aws_signed_verifies_with_aws_s_published_certificate_for_its_region():
    document = verify(AWS_DOCUMENT, AWS_SIGNATURE)
    assert (document.instance_id, document.region, document.private_ip) == ("i-0b02d936754a6d637", "us-east-1",
                                                                            "172.31.17.154")
    assert document.pending_time == datetime(2024, 2, 15, 14, 12, 11, tzinfo=timezone.utc)
    assert document.account_id == "975050371289", "recorded, never required to be the stack's account"


@pytest.mark.parametrize("change", [
    lambda d: d.replace("i-0b02d936754a6d637", "i-0b02d936754a6d638"),  # another instance's id
    lambda d: d.replace("172.31.17.154", "172.31.17.155"),  # another IP
    lambda d: d + " ",  # one byte more: the signature covers the exact bytes served
])
def test_a_document_changed_by_one_byte_is_refused_by_name(change):
    with pytest.raises(IdentityDocumentRefusedError, match="does not verify"):
        verify(change(AWS_DOCUMENT), AWS_SIGNATURE)


def test_a_region_without_a_kept_certificate_is_a_named_refusal_naming_where_certificates_come_from():
    moved = AWS_DOCUMENT.replace('"us-east-1"', '"xx-moon-1"').replace('"us-east-1b"', '"xx-moon-1b"')
    with pytest.raises(NoCertificateForRegionError, match="xx-moon-1.*regions-certs"):
        verify(moved, AWS_SIGNATURE)


def test_the_table_holds_a_parseable_rsa_certificate_for_the_regions_hyperpod_runs_in():
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import rsa

    for region in ("us-east-1", "us-east-2", "us-west-2", "eu-west-1", "eu-central-1", "ap-northeast-1",
                   "ap-southeast-2", "eu-north-1", "ap-south-1", "sa-east-1"):
        certificate = x509.load_pem_x509_certificate(identity_certificates.RSA_CERTIFICATES[region].encode())
        assert isinstance(certificate.public_key(), rsa.RSAPublicKey), region
    assert identity_certificates.SOURCE.startswith("https://docs.aws.amazon.com/")


def test_every_certificate_checked_against_aws_page_still_holds_the_key_that_page_published():
    import hashlib

    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    checked = identity_certificates.CHECKED_AGAINST
    assert len(checked) >= 31 and set(checked) <= set(identity_certificates.RSA_CERTIFICATES)
    for region, (section, matched, page_key_sha256) in checked.items():
        certificate = x509.load_pem_x509_certificate(identity_certificates.RSA_CERTIFICATES[region].encode())
        key = certificate.public_key().public_bytes(serialization.Encoding.DER,
                                                    serialization.PublicFormat.SubjectPublicKeyInfo)
        assert hashlib.sha256(key).hexdigest() == page_key_sha256, (region, section)
        assert matched in ("certificate", "key")


@pytest.mark.parametrize("signature,error", [
    ("not base64!", MalformedNodeChannelRequest),
    ("QUJD", IdentityDocumentRefusedError),  # base64, but no signature of this document
])
def test_a_bad_signature_is_refused_by_name(signature, error):
    with pytest.raises(error):
        verify(AWS_DOCUMENT, signature)


def test_a_document_that_is_not_json_is_malformed():
    with pytest.raises(MalformedNodeChannelRequest):
        verify("<html>", AWS_SIGNATURE)
    with pytest.raises(MalformedNodeChannelRequest):
        verify(json.dumps({"instanceId": "i-1"}), AWS_SIGNATURE)


def test_the_statement_carries_the_document_as_served_or_the_old_parsed_form():
    base = {"cluster": "ml", "instanceId": "i-0b02d936754a6d637", "ip": "172.31.17.154",
             "agentPublicKey": "ssh-ed25519 " + "A" * 68, "issuedAt": "2026-11-26T12:00:00Z", "nonce": "n" * 24}
    assert parse_statement(base | {"identityDocument": {"document": AWS_DOCUMENT, "signature": AWS_SIGNATURE}})
    assert parse_statement(base | {"identityDocument": {"document": {"instanceId": "i-1"}}})
    for bad in ({"document": AWS_DOCUMENT}, {"document": "x" * 5000, "signature": "s"}, "text"):
        with pytest.raises(MalformedNodeChannelRequest):
            parse_statement(base | {"identityDocument": bad})
