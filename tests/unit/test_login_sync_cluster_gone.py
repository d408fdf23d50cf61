"""A deleted cluster: SageMaker answers ResourceNotFound, and the login group reads as gone, not as an error.

Stubbed SageMaker responses (botocore Stubber on our own client), so each answer is exactly the
error code botocore's model gives ListClusterNodes / DescribeClusterNode.
"""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError
from botocore.stub import Stubber

from hpops_core.cluster import login_group as login_nodes
from hpops_core.common import clients
from hpops_core.login_sync.target_plan import LoginNode

CLUSTER, GROUP = "ml-research", "login"


@pytest.fixture
def sagemaker(monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "unit")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "unit")
    clients.reset_clients()
    with Stubber(clients.client("sagemaker")) as stubber:
        yield stubber
        stubber.assert_no_pending_responses()
    clients.reset_clients()


def summary(instance_id: str, status: str = "Running") -> dict:
    return {"InstanceGroupName": GROUP, "InstanceId": instance_id, "InstanceType": "ml.m5.4xlarge",
            "LaunchTime": "2026-01-01T00:00:00Z", "InstanceStatus": {"Status": status}}


def test_a_deleted_cluster_lists_no_login_node_and_says_it_is_gone(sagemaker):
    sagemaker.add_client_error("list_cluster_nodes", "ResourceNotFound", "Cluster ml-research not found")

    listing = login_nodes.resolve_login_group(CLUSTER, GROUP, {"i-0123456789abcdef0": "10.1.0.11"})

    assert listing.nodes == () and listing.ip_cache == {}
    assert listing.cluster_status == "NotFound"

    # Only "not found" means gone: any other refusal still fails the sync (and drains nothing).
    sagemaker.add_client_error("list_cluster_nodes", "AccessDeniedException", "not authorized")
    with pytest.raises(ClientError, match="AccessDeniedException"):
        login_nodes.resolve_login_group(CLUSTER, GROUP, {})


def test_a_node_gone_between_listing_and_describing_serves_nothing(sagemaker):
    kept, vanished = "i-0123456789abcdef0", "i-0fedcba9876543210"
    sagemaker.add_response("list_cluster_nodes", {"ClusterNodeSummaries": [summary(kept), summary(vanished)]})
    sagemaker.add_client_error("describe_cluster_node", "ResourceNotFound", "node not found",
                               expected_params={"ClusterName": CLUSTER, "NodeId": vanished})

    listing = login_nodes.resolve_login_group(CLUSTER, GROUP, {kept: "10.1.0.11"})

    assert listing.nodes == (LoginNode(kept, "Running", "10.1.0.11"), LoginNode(vanished, "NotFound", None))
    assert listing.ip_cache == {kept: "10.1.0.11"} and listing.cluster_status is None
