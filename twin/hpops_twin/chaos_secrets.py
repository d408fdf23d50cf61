"""`make chaos` part 5: a cluster user holding only the node role (the twin's "agent" principal, IAM
enforced) and none of the agent's files goes after secrets and other nodes' instructions: the host
private keys, another login node's end-session list, the controller's holds list, NodeChannel
`fetch` without the agent's key, a captured request replayed or sent late. Each must be refused with
a named error, hand the user nothing secret, and change nothing.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError

from hpops_core.common.state_table import user_holds_partition
from hpops_core.node_channel import contract, proof_format, user_holds, user_holds_store
from hpops_node_agent import agent_key, fetch_client
from hpops_twin.faults import is_mutating
from hpops_twin.iam.enforce import acting_as
from hpops_twin.world import TwinWorld

NODE_PRINCIPAL = "agent"
SECRET_USERS = ("alice-secret-user", "bob-secret-user")  # names only the instructions hold


@dataclass
class SecretAttack:
    what: str
    expect: str
    error: str | None
    leaked: list
    mutating: dict
    survived: bool


class NodeRoleUser:
    """A user on a node: the node role's credentials and a key of their own, nothing of the agent's."""

    def __init__(self, world: TwinWorld) -> None:
        self.world = world
        self.key = str(Path(tempfile.mkdtemp(prefix="hpops-twin-user-")) / "key")
        agent_key.ensure_key(self.key)

    def aws(self, service: str, method: str, **kwargs: Any) -> tuple[str | None, str]:
        """(error code, what came back as text) of one call as the node role."""
        try:
            with acting_as(NODE_PRINCIPAL):
                answer = getattr(self.world.aws.client(service), method)(**kwargs)
        except ClientError as error:
            return error.response.get("Error", {}).get("Code"), str(error)
        return None, json.dumps(answer, default=str)

    def invoke(self, request: dict) -> tuple[str | None, str]:
        with acting_as(NODE_PRINCIPAL):
            response = self.world.aws.client("lambda").invoke(
                FunctionName=self.world.output("NodeChannelFunctionName"), Payload=json.dumps(request).encode())
        text = response["Payload"].read().decode()
        answer = json.loads(text)
        return (None if answer.get("ok") else answer.get("error")), text

    def signed_fetch(self, instance_id: str, what: list[str], key: str | None = None,
                     issued: dt.datetime | None = None) -> dict:
        request = fetch_client.fetch_request(self.world.cluster_name, instance_id, what,
                                             (issued or dt.datetime.now(dt.timezone.utc)).timestamp())
        proof = agent_key.sign(key or self.key, proof_format.namespace(proof_format.FETCH, self.world.cluster_name),
                               proof_format.canonical(request))
        return {"action": "fetch", "request": request, "proof": proof}


def _plant_instructions(world: TwinWorld, victim: str) -> list[str]:
    """What the stack would have written: an end-session list for one login node and a holds list, each
    with its public marker (instructions.py's layout); returns the strings nobody else may see."""
    from hpops_core.node_channel import instructions

    ssm = world.aws.client("ssm")

    def write(name: str, document: dict) -> None:
        version = ssm.put_parameter(Name=name, Value=json.dumps(document), Type="String", Overwrite=True)["Version"]
        ssm.put_parameter(Name=contract.instruction_marker_parameter(name), Type="String", Overwrite=True,
                          Value=instructions.marker_value(version))

    handle = "5eed0b07:4242:123456"
    end = {"format": contract.END_SESSIONS_FORMAT, "sessions": [{"handle": handle, "user": SECRET_USERS[0]}]}
    holds = {"format": user_holds.USER_HOLDS_FORMAT, "version": "0123456789abcdef", "month": "2026-11",
             "expiresAt": "2099-01-01T00:00:00Z", "dryRun": False, "users": [SECRET_USERS[1]]}
    write(contract.end_sessions_parameter(world.cluster_name, victim), end)
    user_holds_store.publish(world.resolver.physical_ids["SyncStateTable"], world.cluster_name, holds, "chaos",
                             dt.datetime.now(dt.timezone.utc), world.aws.client("dynamodb"))
    return [handle, *SECRET_USERS]


def _private_key_fragments(world: TwinWorld) -> list[str]:
    secret = world.aws.client("secretsmanager").get_secret_value(
        SecretId=world.output("HostIdentitySecretArn"))["SecretString"]
    keys = json.loads(secret).get("keys", {})
    return [line[:40] for key in keys.values() for line in key["private"].splitlines()
            if re.fullmatch(r"[A-Za-z0-9+/=]{60,}", line)]


def _stored(world: TwinWorld) -> tuple:
    """Everything an attack could change: the state table and the stack's parameters."""
    pages = world.aws.client("dynamodb").get_paginator("scan").paginate(
        TableName=world.resolver.physical_ids["SyncStateTable"])
    items = sorted(json.dumps(i, sort_keys=True) for page in pages for i in page["Items"])
    pages = world.aws.client("ssm").get_paginator("get_parameters_by_path").paginate(Path="/hpops", Recursive=True)
    parameters = sorted((p["Name"], p["Version"]) for page in pages for p in page["Parameters"])
    return items, parameters


def attacks(world: TwinWorld, user: NodeRoleUser) -> list[tuple[str, str, Callable[[], tuple[str | None, str]]]]:
    """(what, expected error, run -> (observed error, text the user got back))."""
    nodes = sorted((n for n in world.sim.nodes(world.cluster_name, world.login_group) if n.status == "Running"),
                   key=lambda n: n.ip)
    victim = nodes[0].instance_id
    worker = next(n for n in world.sim.nodes(world.cluster_name) if n.instance_group_name not in
                  (world.login_group, "controller-machine")).instance_id
    victim_key = world.hosts.agents[victim].proof.key_path
    end_name = contract.end_sessions_parameter(world.cluster_name, victim)
    table = world.resolver.physical_ids["SyncStateTable"]
    holds_key = {":pk": {"S": user_holds_partition(world.cluster_name)}}

    # A request the victim's agent really signed and used (now, before any attack), which the user
    # captures and sends again.
    genuine = user.signed_fetch(victim, ["endSessions"], key=victim_key)
    if user.invoke(genuine)[0] is not None:
        raise RuntimeError("the victim agent's own fetch was refused")

    return [
        ("read the host private keys with the node role (keys mode)", "AccessDeniedException",
         lambda: user.aws("secretsmanager", "get_secret_value", SecretId=world.output("HostIdentitySecretArn"))),
        ("read another login node's end-session instruction", "AccessDeniedException",
         lambda: user.aws("ssm", "get_parameters", Names=[end_name])),
        ("read the user-holds list", "AccessDeniedException",
         lambda: user.aws("dynamodb", "query", TableName=table, KeyConditionExpression="pk = :pk",
                          ExpressionAttributeValues=holds_key)),
        ("list every instruction by path", "AccessDeniedException",
         lambda: user.aws("ssm", "get_parameters_by_path", Path=contract.parameter_prefix(world.cluster_name)
                          + contract.INSTRUCTIONS, Recursive=True)),
        ("fetch the host keys for a login node, signed with the user's own key", "NodeProofKeyMismatchError",
         lambda: user.invoke(user.signed_fetch(victim, ["hostKeys"]))),
        ("fetch another node's end sessions with a made-up proof", "NodeProofMalformedError",
         lambda: user.invoke(dict(user.signed_fetch(victim, ["endSessions"]), proof="not a signature"))),
        ("fetch the holds list without any proof", "MalformedFetchRequest",
         lambda: user.invoke({"action": "fetch", "request": user.signed_fetch(victim, ["userHolds"])["request"]})),
        ("fetch for a compute node that never enrolled", "FetchRefusedError",
         lambda: user.invoke(user.signed_fetch(worker, ["hostKeys"]))),
        ("replay of the victim agent's captured fetch", "FetchReplayError", lambda: user.invoke(genuine)),
        ("the victim agent's genuine fetch, captured and sent 10 minutes late", "FetchRefusedError",
         lambda: user.invoke(user.signed_fetch(victim, ["endSessions"], key=victim_key,
                                               issued=dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=10)))),
        ("a login node's own key asking for the controller's holds list", "FetchRefusedError",
         lambda: user.invoke(user.signed_fetch(victim, ["userHolds"], key=victim_key))),
    ]


def part_secret_attacker(progress: Callable[[str], None] = lambda _: None) -> dict:
    began = time.perf_counter()
    outcomes: list[SecretAttack] = []
    findings: list[str] = []
    with TwinWorld() as world:
        result = world.wait([world.run_schedule()], timeout=120)[0]
        if result.status != "SUCCEEDED":
            findings.append(f"the first sync did not succeed: {result.error}")
        world.agents_poll()
        victim = sorted((n for n in world.sim.nodes(world.cluster_name, world.login_group) if n.status == "Running"),
                        key=lambda n: n.ip)[0].instance_id
        secrets = _plant_instructions(world, victim) + _private_key_fragments(world)
        user = NodeRoleUser(world)
        admitted = world.target_ips()
        for what, expect, run in attacks(world, user):
            before = _stored(world)
            world.counter.reset()
            observed, received = run()
            leaked = [s for s in secrets if s in received]
            mutating = {k: v for k, v in world.counter.calls.items() if is_mutating(k.split(".", 1)[1])}
            # The replay's one write is the nonce's conditional PutItem, refused by DynamoDB: allowed only
            # when the stored state shows it changed nothing.
            if expect == "FetchReplayError" and mutating == {"dynamodb.PutItem": 1}:
                mutating = {}
            changed = _stored(world) != before
            survived = observed == expect and not leaked and not mutating and not changed
            outcomes.append(SecretAttack(what, expect, observed, leaked, mutating, survived))
            progress(f"{'ok  ' if survived else 'MISS'} attacker (secrets): {what} -> {observed}")
            if not survived:
                findings.append(f"{what}: expected {expect}, observed {observed}; leaked {len(leaked)} secret "
                                f"string(s); mutating calls {mutating or 'none'}; stored state changed: {changed}")
        if world.target_ips() != admitted:
            findings.append(f"the target group changed: {admitted} -> {world.target_ips()}")
    return {"part": "5 attacker after secrets and instructions", "tried": len(outcomes),
            "survived": sum(o.survived for o in outcomes), "side_effects": sum(sum(o.mutating.values()) for o in outcomes),
            "seconds": round(time.perf_counter() - began, 1), "findings": findings,
            "attacks": [asdict(o) for o in outcomes], "ok": not findings}
