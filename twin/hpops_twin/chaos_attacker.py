"""`make chaos` part 4: a cluster user holding only the node role (the twin's "agent" principal, IAM
enforced) and none of the agent's files tries to act as a node. Each attack must be refused with a
named error (and counted where an alarm watches it) and change nothing: no report stored, no
session ended, nobody charged or held, every node still admitted. One attack goes further: the
enrolled controller's own key (a compromised or buggy controller agent) sending a usage window in
parts, each within what the cluster could run and over it together.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from hpops_core.node_channel import proof_format
from hpops_node_agent import agent_key
from hpops_twin import identity_documents
from hpops_twin.attacker import Attacker, far_future, iso
from hpops_twin.faults import ChaosTransport
from hpops_twin.user_spend_twin import CONTROLLER_GROUP, ControllerNode
from hpops_twin.world import TwinWorld

REPORT = "HyperPod Login Node Report"
USAGE = "HyperPod Slurm Usage Report"
HOLDS = "HyperPod Slurm Holds Report"


@dataclass
class Attack:
    what: str
    expect: str
    error: str | None
    mutating: dict
    survived: bool


def _stored(world: TwinWorld) -> dict:
    """Everything a forged report or enrollment could change: reports, usage, holds, enrollments."""
    table = world.resolver.physical_ids["SyncStateTable"]
    items = {}
    for kind in ("node-report", "enroll", "usage"):
        pages = world.aws.client("dynamodb").get_paginator("scan").paginate(
            TableName=table, FilterExpression="begins_with(pk, :kind)", ExpressionAttributeValues={":kind": {"S": kind}})
        items[kind] = sorted(json.dumps(i, sort_keys=True) for page in pages for i in page["Items"])
    return items


def _last_error(world: TwinWorld, before: int) -> str | None:
    runs = world.dispatcher.invocations[before:]
    return next((r.error_type for r in reversed(runs) if r.error_type), None)


def attacks(world: TwinWorld, attacker: Attacker) -> list[tuple]:
    """(what, expected error, run -> observed error name[, prepare: what happened before, not the attack])."""
    nodes = sorted((n for n in world.sim.nodes(world.cluster_name, world.login_group) if n.status == "Running"),
                   key=lambda n: n.ip)
    victim, other = nodes[0], nodes[1]
    controller = world.sim.nodes(world.cluster_name, "controller-machine")
    worker = next(n for n in world.sim.nodes(world.cluster_name) if n.instance_group_name not in
                  (world.login_group, "controller-machine"))
    now = dt.datetime.now(dt.timezone.utc)
    stamp = now.isoformat(timespec="seconds")
    table = world.resolver.physical_ids["SyncStateTable"]
    base = {"format": "hpops.node.report.v1", "cluster": world.cluster_name, "instanceId": victim.instance_id,
            "ip": victim.ip, "role": "login", "agentVersion": "1.0.0", "reportedAt": stamp, "trigger": "change"}

    def sessions(user: str, count: int) -> dict:
        return {"list": [{"handle": f"5eed0b07:{pid}:{pid * 10}", "user": user, "path": "ssh", "tty": True,
                          "startedAt": "2026-01-01T08:00:00Z"} for pid in range(100, 100 + count)]}

    # The controller's id (a world without a controller group: an id nobody enrolled, as a new controller's).
    controller_id = controller[0].instance_id if controller else "i-0c0ffee0c0ffee0c0"
    controller_node = None
    if controller:  # its real agent, enrolled by its first usage report (no jobs: nothing charged)
        controller_node = ControllerNode(world, controller_id, [], {"gpu": world.worker_group})
        controller_node.run_agent(dt.datetime.now(dt.timezone.utc))
    window = iso((now - dt.timedelta(hours=2)).replace(minute=0, second=0, microsecond=0))
    window_end = iso((now - dt.timedelta(hours=1)).replace(minute=0, second=0, microsecond=0))
    usage = {"format": "hpops.node.usage.v1", "cluster": world.cluster_name, "instanceId": controller_id,
             "agentVersion": "1.0.0", "windowStart": window, "windowEnd": window_end, "final": True, "status": "ok",
             "reason": "", "collectedAt": window_end, "partitionGroups": {}, "part": 1, "parts": 1,
             "records": [{"key": f"{world.cluster_name}/{window}/bob/gpu", "user": "bob", "partition": "gpu",
                          "nodeSeconds": 3_600_000, "cpuSeconds": 0, "gpuSeconds": 0, "jobs": 1}]}
    future = usage | {"windowStart": "2099-01-01T00:00:00Z", "windowEnd": "2099-01-01T01:00:00Z",
                      "collectedAt": "2099-01-01T01:00:00Z", "records": []}
    # A window in two parts, each just within the gpu group's capacity (its nodes x one hour).
    capacity = len(world.sim.nodes(world.cluster_name, world.worker_group)) * 3600
    split = usage | {"partitionGroups": {"gpu": world.worker_group}, "parts": 2,
                     "records": [dict(usage["records"][0], nodeSeconds=capacity - 60)]}
    halves = [split | {"part": 1}, split | {"part": 2, "records": [dict(split["records"][0], user="carol",
                                                                      key=f"{world.cluster_name}/{window}/carol/gpu")]}]

    def controller_part(number: int) -> Callable[[], str | None]:
        def run() -> str | None:
            before = len(world.dispatcher.invocations)
            # Signed by the controller's enrolled key, sent with the node role (the report bus takes any node's).
            attacker.put_report(USAGE, controller_node.agent.proof.sign_report(halves[number - 1]), sign=False)
            return _last_error(world, before)
        return run

    holds = {"format": "hpops.node.user-holds-report.v1", "cluster": world.cluster_name, "instanceId": controller_id,
             "agentVersion": "1.0.0", "reportedAt": far_future(), "version": "0123456789abcdef", "enforced": True,
             "enforceReason": "", "users": []}

    def event(detail_type: str, detail: dict, sign: bool = True) -> Callable[[], str | None]:
        def run() -> str | None:
            before = len(world.dispatcher.invocations)
            attacker.put_report(detail_type, detail, sign=sign)
            return _last_error(world, before)
        return run

    captured: list[dict] = []

    def genuine_reports() -> None:
        # A genuine signed report the attacker got hold of (an older one, sessions hidden), then the
        # agent's newer report, delivered and kept.
        agent = world.hosts.agents[victim.instance_id]
        stored = json.loads(world.aws.client("dynamodb").get_item(TableName=table, Key={
            "pk": {"S": f"node-report#{world.cluster_name}"}, "sk": {"S": f"node-report#{victim.instance_id}"}})["Item"]["report"]["S"])
        stored.pop("receivedAt", None)
        captured.append(agent.proof.sign_report(stored | {"reportedAt": stamp, "sessions": {"list": []}}))
        newer = agent.proof.sign_report(stored | {"reportedAt": stamp})
        world.aws.client("events").put_events(Entries=[{
            "Source": "hpops.node", "DetailType": REPORT, "Detail": json.dumps(newer),
            "EventBusName": world.output("NodeReportBusName")}])

    def replay() -> str | None:
        before = len(world.dispatcher.invocations)
        attacker.put_report(REPORT, captured[0], sign=False)  # the attacker's copy, byte for byte
        return _last_error(world, before)

    def enroll(instance: Any, ip: str | None = None, launched_hours_ago: float | None = None) -> Callable[[], str | None]:
        def run() -> str | None:
            if launched_hours_ago is not None:
                instance.launch_time = dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=launched_hours_ago)
            return attacker.enroll(instance.instance_id, ip or instance.ip).get("error")
        return run

    # A new login node and a new controller come up; the attacker, on another node, names each first
    # (the race: not the attack measured, which is what that key can then do).
    raced: dict[str, Any] = {}

    def race_new_nodes() -> None:
        if raced:
            return
        world.hosts.lifecycle_installs_agent = False
        groups = [(world.login_group, "login")] + ([(CONTROLLER_GROUP, "controller")] if controller else [])
        for group, role in groups:
            before = {n.instance_id for n in world.sim.nodes(world.cluster_name, group)}
            world.sim.scale_group(world.cluster_name, group, len(before) + 1)
            world.sim.finish_provisioning(world.cluster_name)
            raced[role] = next(n for n in world.sim.nodes(world.cluster_name, group) if n.instance_id not in before)
            attacker.enroll(raced[role].instance_id, raced[role].ip)

    def raced_fetch() -> str | None:
        return attacker.fetch(raced["login"].instance_id, ["hostKeys"]).get("error")

    def raced_report() -> str | None:
        node = raced["login"]
        return event(REPORT, base | {"instanceId": node.instance_id, "ip": node.ip, "sessions": sessions("bob", 2)})()

    def raced_controller_usage() -> str | None:
        return event(USAGE, usage | {"instanceId": raced["controller"].instance_id})()

    def pinned_sequence() -> str | None:
        # Signed by an enrolled key (one that won a race, or a buggy agent): the sequence would pin the node.
        before = len(world.dispatcher.invocations)
        agent = world.hosts.agents[victim.instance_id]
        signed = dict(base | {"sessions": {"list": []}}, sequence=2**63 - 1)
        signed["proof"] = agent_key.sign(agent.proof.key_path, proof_format.namespace("report", world.cluster_name),
                                         proof_format.canonical(signed))
        attacker.put_report(REPORT, signed, sign=False)
        return _last_error(world, before)

    def own_document_for_another() -> str | None:
        return attacker.enroll(raced["login"].instance_id, raced["login"].ip,
                               document=identity_documents.served(other, world.document_account_id)).get("error")

    def forged_document() -> str | None:
        # The attacker's own node's document, edited to name the raced node: AWS's signature no longer holds.
        node = raced["login"]
        forged = identity_documents.served(other, world.document_account_id)
        forged["document"] = forged["document"].replace(other.instance_id, node.instance_id).replace(other.ip, node.ip)
        return attacker.enroll(node.instance_id, node.ip, document=forged).get("error")

    def victim_is_new() -> None:
        victim.launch_time = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=3)

    def contest_flood() -> str | None:
        # Twenty keys against a working node inside its window: none contests it, none costs a SageMaker call.
        describes = world.counter.calls["sagemaker.DescribeClusterNode"]
        errors = {Attacker(world).enroll(victim.instance_id, victim.ip).get("error") for _ in range(20)}
        if world.counter.calls["sagemaker.DescribeClusterNode"] != describes:
            return "DescribeClusterNodePerAttempt"
        return errors.pop() if len(errors) == 1 else f"mixed {sorted(map(str, errors))}"

    def from_the_node_itself() -> str | None:
        return attacker.enroll(victim.instance_id, victim.ip,
                               document=identity_documents.served(victim, world.document_account_id)).get("error")

    def refusal_echo() -> str | None:
        # The raced node (the attacker's own key, so AWS is asked) claimed at the victim's IP: the refusal
        # must not say where the node really is.
        node = raced["login"]
        answer = attacker.enroll(node.instance_id, victim.ip)
        leaked = [value for value in (node.ip, "Running") if value in answer.get("message", "")]
        return f"leaks {leaked}" if leaked else answer.get("error")

    def borrowed_statement() -> str | None:
        # The victim agent's public key in the statement, signed with the attacker's key.
        statement = {"cluster": world.cluster_name, "instanceId": victim.instance_id, "ip": victim.ip,
                     "agentPublicKey": world.hosts.agents[victim.instance_id].proof.public_key(),
                     "issuedAt": iso(dt.datetime.now(dt.timezone.utc)), "nonce": "n" * 24}
        return attacker.invoke({"action": "enroll", "statement": statement,
                                "proof": attacker.sign({"statement": statement}, "enroll")}).get("error")

    return [
        ("login report for another node inventing 2 sessions for bob (own key)", "NodeProofKeyMismatchError",
         event(REPORT, base | {"sessions": sessions("bob", 2)})),
        ("login report for another node hiding alice's sessions (own key)", "NodeProofKeyMismatchError",
         event(REPORT, base | {"instanceId": other.instance_id, "ip": other.ip, "sessions": {"list": []}})),
        ("login report with made-up host keys before signing (role only, unsigned)", "NodeProofMalformedError",
         event(REPORT, base | {"hostIdentity": {"mode": "certificate", "result": "waiting", "publicKeys": {
             "ed25519": "ssh-ed25519 " + "A" * 68}}}, sign=False)),
        ("usage report from the controller charging bob 1,000 node-hours (own key)",
         "NotEnrolledError" if not controller else "NodeProofKeyMismatchError", event(USAGE, usage)),
        ("empty final usage window dated 2099 (own key)",
         "NotEnrolledError" if not controller else "NodeProofKeyMismatchError", event(USAGE, future)),
        ("holds report from the controller dated 2099 (unsigned)",
         "NotEnrolledError" if not controller else "NodeProofMalformedError", event(HOLDS, holds, sign=False)),
        ("usage report for a login node's id (its own enrolled role is login)", "ReportRoleError",
         event(USAGE, usage | {"instanceId": other.instance_id})),
        ("replay of an older genuine signed report of the victim's agent", "ReportReplayError", replay, genuine_reports),
        ("second enrollment for an enrolled node, launched hours ago", "EnrollmentConflictError",
         enroll(victim, launched_hours_ago=5)),
        ("enrollment for a node that never enrolled, launched hours ago", "EnrollmentRefusedError",
         enroll(worker)),
        ("enrollment for a proven node claiming another node's IP (refused before AWS is asked)",
         "EnrollmentConflictError", enroll(other, ip=victim.ip)),
        ("enrollment naming the victim agent's public key, signed with the attacker's", "NodeProofKeyMismatchError",
         borrowed_statement),
        ("unknown NodeChannel action", "MalformedNodeChannelRequest",
         lambda: attacker.invoke({"action": "become-root"}).get("error")),
        ("host keys for a new login node the attacker's key raced (from another node)", "FetchRefusedError",
         raced_fetch, race_new_nodes),
        ("sessions report for the raced new login node", "UnprovenEnrollmentError", raced_report),
        ("report signed by an enrolled key with sequence 2^63-1 (pinning the node's reports)", "ReportFromFutureError",
         pinned_sequence),
        ("enrollment for the raced node with the attacker's own node's identity document", "EnrollmentRefusedError",
         own_document_for_another),
        ("enrollment with an identity document edited to name the raced node", "IdentityDocumentRefusedError",
         forged_document),
        ("20 keys contesting a working node inside its window", "EnrollmentConflictError", contest_flood,
         victim_is_new),
        ("enrollment from the victim node itself, its own document, after its agent", "EnrollmentConflictError",
         from_the_node_itself),
        ("refusal of a claimed IP, read for AWS's record of the node", "EnrollmentRefusedError", refusal_echo),
    ] + ([
        ("usage report for a new controller the attacker's key raced", "UnprovenEnrollmentError",
         raced_controller_usage),
    ] if controller else []) + ([
        ("usage window part 2 of 2 within capacity alone, over it with part 1 (the enrolled controller's own key)",
         "UsageExceedsCapacityError", controller_part(2), lambda: controller_part(1)()),
    ] if controller_node is not None else [])


def part_attacker(progress: Callable[[str], None] = lambda _: None) -> dict:
    began = time.perf_counter()
    outcomes: list[Attack] = []
    findings: list[str] = []
    # A Slurm controller group, its agent enrolled: the attacks on its reports meet a real enrollment.
    with TwinWorld(extra_groups={CONTROLLER_GROUP: ("ml.m5.xlarge", 1)}) as world, \
            ChaosTransport(world).installed() as chaos:
        result = world.wait([world.run_schedule()], timeout=120)[0]
        if result.status != "SUCCEEDED":
            findings.append(f"the first sync did not succeed: {result.error}")
        attacker = Attacker(world)
        admitted = world.target_ips()
        for what, expect, run, *prepare in attacks(world, attacker):
            for step in prepare:
                step()
            stored = _stored(world)
            since = chaos.mark()
            observed = run()
            # What the stack's functions changed (a conditional write that was refused changed nothing). The
            # team told of the attempt (the AlertTopic message and its once-an-hour record) is the alarm, not a change.
            mutating = dict(Counter(f"{c.service}.{c.operation}" for c in chaos.mutations(since)
                                    if c.ok and c.sender.startswith("lambda:") and not _alarm(world, c)))
            changed = _stored(world) != stored
            survived = observed == expect and not mutating and not changed
            outcomes.append(Attack(what, expect, observed, mutating, survived))
            progress(f"{'ok  ' if survived else 'MISS'} attacker: {what} -> {observed}")
            if not survived:
                findings.append(f"{what}: expected {expect}, observed {observed}; mutating calls {mutating or 'none'}; "
                                f"stored items changed: {changed}")
        if world.target_ips() != admitted:
            findings.append(f"the target group changed: {admitted} -> {world.target_ips()}")
        restore = controller_race_restored(world, attacker)
        progress(f"{'ok  ' if not restore['findings'] else 'MISS'} attacker: {restore['what']}")
        findings += restore["findings"]
    return {"part": "4 attacker with the node role", "tried": len(outcomes), "survived": sum(o.survived for o in outcomes),
            "side_effects": sum(sum(o.mutating.values()) for o in outcomes),
            "seconds": round(time.perf_counter() - began, 1), "findings": findings,
            "attacks": [asdict(o) for o in outcomes], "restore": restore, "ok": not findings}


def controller_race_restored(world: TwinWorld, attacker: Attacker) -> dict:
    """The controller race lost, then the operator's approval: a new controller's id enrolled by the
    attacker and left uncontested past its window (its real agent came late), a usage window charging
    bob 1,000 node-hours kept on its word; the operator approves the real agent's key. That window must
    count for nothing from the approval on, and the real agent must be told to re-collect from it and
    send it again under its own key."""
    from hpops.enrollments import ReplacedKeyUsageRequired, approve
    from hpops_core.budget_guard import usage_store
    from hpops_core.node_channel.enrollment import DISCARD

    findings: list[str] = []
    table, dynamodb = world.resolver.physical_ids["SyncStateTable"], world.aws.client("dynamodb")
    before = {n.instance_id for n in world.sim.nodes(world.cluster_name, CONTROLLER_GROUP)}
    world.sim.scale_group(world.cluster_name, CONTROLLER_GROUP, len(before) + 1)
    world.sim.finish_provisioning(world.cluster_name)
    node = next(n for n in world.sim.nodes(world.cluster_name, CONTROLLER_GROUP) if n.instance_id not in before)
    attacker.enroll(node.instance_id, node.ip)
    dynamodb.update_item(TableName=table, Key={"pk": {"S": f"enroll#{world.cluster_name}"},
                                               "sk": {"S": f"node#{node.instance_id}"}},
                         UpdateExpression="SET windowEndsAt = :past", ExpressionAttributeValues={":past": {"S": iso(
                             dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=1))}})
    now = dt.datetime.now(dt.timezone.utc)
    start, end = (now - dt.timedelta(hours=2)).replace(minute=0, second=0, microsecond=0), \
        (now - dt.timedelta(hours=1)).replace(minute=0, second=0, microsecond=0)
    window, month = iso(start), f"{start:%Y-%m}"
    attacker.put_report(USAGE, {
        "format": "hpops.node.usage.v1", "cluster": world.cluster_name, "instanceId": node.instance_id,
        "agentVersion": "1.0.0", "windowStart": window, "windowEnd": iso(end), "final": True, "status": "ok",
        "reason": "", "collectedAt": iso(end), "partitionGroups": {"gpu": world.worker_group}, "part": 1, "parts": 1,
        "records": [{"key": f"{world.cluster_name}/{window}/bob/gpu", "user": "bob", "partition": "gpu",
                     "nodeSeconds": 3600, "cpuSeconds": 0, "gpuSeconds": 0, "jobs": 1}]})

    def bob_charged() -> bool:
        return any(r.user == "bob" for w in usage_store.month_usage(table, world.cluster_name, month, dynamodb)
                   if w.window_start == window for r in w.records)

    if not bob_charged():
        findings.append("the proven impostor's usage window was not kept: the scenario did not happen")
    real = ControllerNode(world, node.instance_id, [], {"gpu": world.worker_group})
    try:  # enrolled by its window alone: the approval must not guess whose its windows were
        approve(dynamodb, world.aws.client("sagemaker"), table, world.cluster_name, world.login_group,
                CONTROLLER_GROUP, node.instance_id, real.agent.proof.fingerprint())
        findings.append("the approval guessed what becomes of a key enrolled by its window alone")
    except ReplacedKeyUsageRequired:
        pass
    approve(dynamodb, world.aws.client("sagemaker"), table, world.cluster_name, world.login_group, CONTROLLER_GROUP,
            node.instance_id, real.agent.proof.fingerprint(), DISCARD)
    if not real.agent.proof.ensure_enrolled(node.instance_id, node.ip, force=True):
        findings.append(f"the approved real key did not enroll: {real.agent.proof.state.get('refusal')}")
    if real.agent.proof.state.get("recollectFrom") != window:
        findings.append(f"the real agent was told to re-collect from {real.agent.proof.state.get('recollectFrom')}, "
                        f"not from the impostor's first window {window}")
    if bob_charged():
        findings.append("after the approval the impostor's window still charges bob")
    real.run_agent(now)
    kept = [w for w in usage_store.month_usage(table, world.cluster_name, month, dynamodb) if w.window_start == window]
    if not kept or any(r.user == "bob" for r in kept[0].records):
        findings.append("the real agent's re-collected window did not replace the impostor's")
    return {"what": "controller race lost past the window, then approved: the impostor's window voided, "
                    "re-collected by the real agent", "window": window, "findings": findings}


def _alarm(world: Any, call: Any) -> bool:
    """The AlertTopic publish telling the team of an attempt, and the record that keeps it to once an hour."""
    if (call.service, call.operation) == ("sns", "Publish"):
        return call.params.get("TopicArn") == world.output("AlertTopicArn")
    if (call.service, call.operation) == ("dynamodb", "PutItem"):
        return str(call.params.get("Item", {}).get("pk", {}).get("S", "")).startswith("notice#")
    return False
