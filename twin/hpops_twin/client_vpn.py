"""AWS Client VPN's read APIs, which moto lacks, answered from endpoints a test or the doctor's
account sets up: DescribeClientVpnEndpoints, DescribeClientVpnTargetNetworks and
DescribeClientVpnAuthorizationRules, as the EC2 API reference shapes them (an unknown endpoint id is
InvalidClientVpnEndpointId.NotFound). IAM is enforced before these answer, like any other call.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from unittest import mock

from moto.core.responses import ActionResult
from moto.ec2.exceptions import EC2ClientError
from moto.ec2.responses import EC2Response


@dataclass
class ClientVpnEndpoint:
    endpoint_id: str
    vpc_id: str
    associated_subnets: list[str]  # subnet ids of its target networks
    authorized_cidrs: list[str]  # active authorization rules, for all users
    security_group_ids: list[str] = field(default_factory=list)
    client_cidr: str = "172.16.0.0/22"


_ENDPOINTS: dict[str, ClientVpnEndpoint] = {}


def _endpoint(response: EC2Response) -> ClientVpnEndpoint:
    endpoint_id = response._get_param("ClientVpnEndpointId")
    if endpoint_id not in _ENDPOINTS:
        raise EC2ClientError("InvalidClientVpnEndpointId.NotFound", f"The Client VPN endpoint ID '{endpoint_id}' does not exist")
    return _ENDPOINTS[endpoint_id]


def _describe_endpoints(self: EC2Response) -> ActionResult:
    return ActionResult({"ClientVpnEndpoints": [
        {"ClientVpnEndpointId": e.endpoint_id, "VpcId": e.vpc_id, "SecurityGroupIds": e.security_group_ids,
         "ClientCidrBlock": e.client_cidr, "Status": {"Code": "available"}, "TransportProtocol": "udp",
         "SplitTunnel": True} for e in _ENDPOINTS.values()]})


def _describe_target_networks(self: EC2Response) -> ActionResult:
    endpoint = _endpoint(self)
    return ActionResult({"ClientVpnTargetNetworks": [
        {"AssociationId": f"cvpn-assoc-{n:017x}", "VpcId": endpoint.vpc_id, "TargetNetworkId": subnet,
         "ClientVpnEndpointId": endpoint.endpoint_id, "Status": {"Code": "associated"},
         "SecurityGroups": endpoint.security_group_ids} for n, subnet in enumerate(endpoint.associated_subnets)]})


def _describe_authorization_rules(self: EC2Response) -> ActionResult:
    endpoint = _endpoint(self)
    return ActionResult({"AuthorizationRules": [
        {"ClientVpnEndpointId": endpoint.endpoint_id, "DestinationCidr": cidr, "AccessAll": True,
         "Status": {"Code": "active"}} for cidr in endpoint.authorized_cidrs]})


@contextmanager
def client_vpn_answered(*endpoints: ClientVpnEndpoint) -> Iterator[dict[str, ClientVpnEndpoint]]:
    """Inside the block, EC2 answers the three Client VPN reads with these endpoints (changeable in place)."""
    _ENDPOINTS.clear()
    _ENDPOINTS.update({e.endpoint_id: e for e in endpoints})
    patches = [mock.patch.object(EC2Response, name, function, create=True) for name, function in (
        ("describe_client_vpn_endpoints", _describe_endpoints),
        ("describe_client_vpn_target_networks", _describe_target_networks),
        ("describe_client_vpn_authorization_rules", _describe_authorization_rules))]
    for patch in patches:
        patch.start()
    try:
        yield _ENDPOINTS
    finally:
        for patch in reversed(patches):
            patch.stop()
        _ENDPOINTS.clear()
