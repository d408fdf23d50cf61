"""Per-user spend in the twin: the controller's node agent over a synthetic month of Slurm jobs.

What is real here: the node agent (NodeAgent.usage_tick: UsageCollector windows, parsing, clipping,
aggregation, reports, split_report, the PutEvents entries), the node-report bus rule and
RecordUsageReport (validation, the DescribeClusterNode controller check, the store), the
BudgetGuard machine's CheckUserSpend and PublishUserSpendAlert, and `hpops cost`'s own code.

What the twin adds:
  * sacct. The agent's collector runs the command it always runs; the answer comes from the
    generated jobs (``FakeSacct``), selected as sacct selects them without -s (eligible before
    the window ends, not ended before it starts) and shown as of the agent's clock (a job still
    allocated then has End Unknown, state RUNNING). No subprocess: a month is ~500 windows.
  * Time. The agent's clock is set per run; a sweep's "now" is its execution's start time, which
    moto stamps with the wall clock, so ``execution_clock`` sets that for the sweeps started in it.
  * Observers, as an operator would subscribe: an SQS queue on the UserSpendAlertTopic (every
    message, with its attributes), one queue per user with the filter policy `hpops cost subscribe`
    sets, and a rule on the default bus for the user spend events. The AlertTopic is already
    watched by world.budget.
"""

from __future__ import annotations

import datetime as dt
import json
import tempfile
import types
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import boto3
from moto.stepfunctions.parser import models as sfn_parser_models

from hpops_core.budget_guard.spend_check import USER_ALERT_DETAIL_TYPE, USER_ALERT_SOURCE, USER_ATTRIBUTE
from hpops_node_agent import usage
from hpops_twin import identity_documents
from hpops_node_agent.agent import NodeAgent, UsageOutcome
from hpops_node_agent.config import AgentConfig
from hpops_node_agent.imds_guard import IMDS_V4

UTC = dt.timezone.utc
CONTROLLER_GROUP = "controller-machine"  # template.yaml's ControllerGroupName default
SPEND_FUNCTION = "CheckUserSpendFunction"


# --------------------------------------------------------------------------- time


@contextmanager
def execution_clock(when: dt.datetime) -> Iterator[None]:
    """Executions started inside get ``when`` as their StartTime (a sweep's "now")."""

    class _Clock(dt.datetime):
        @classmethod
        def now(cls, tz: dt.tzinfo | None = None) -> dt.datetime:  # type: ignore[override]
            return when.astimezone(tz) if tz is not None else when.astimezone(UTC).replace(tzinfo=None)

    shim = types.SimpleNamespace(datetime=_Clock, timezone=dt.timezone)
    with mock.patch.object(sfn_parser_models, "datetime", shim):
        yield


def epoch(when: dt.datetime) -> int:
    return int(when.timestamp())


def sacct_time(seconds: int) -> str:
    return dt.datetime.fromtimestamp(seconds, UTC).strftime(usage.TIME_FORMAT)


# --------------------------------------------------------------------------- sacct


@dataclass(frozen=True)
class SlurmJob:
    """One allocation (sacct -X): eligible and started at ``start``, ends at ``end``."""

    job_id: int
    user: str
    partition: str
    nodes: int
    cpus: int  # the allocation's total (AllocTRES cpu=)
    gpus: int  # the allocation's total (AllocTRES gres/gpu=)
    start: int
    end: int

    def sacct_line(self, now: int) -> str:
        """The line `sacct --parsable2 --format=<usage.SACCT_FIELDS>` prints for this job at ``now``."""
        running = self.end > now
        gpus = f"gres/gpu={self.gpus}," if self.gpus else ""
        values = {
            "User": self.user, "JobID": str(self.job_id), "Partition": self.partition,
            "AllocNodes": str(self.nodes),
            "AllocTRES": f"billing={self.cpus},cpu={self.cpus},{gpus}mem={self.nodes * 64}G,node={self.nodes}",
            "ElapsedRaw": str(min(self.end, now) - self.start),
            "Start": sacct_time(self.start), "End": "Unknown" if running else sacct_time(self.end),
            "State": "RUNNING" if running else "COMPLETED",
        }
        # A KeyError here means usage.py asks sacct for a field this twin does not generate.
        return "|".join(values[name] for name in usage.SACCT_FIELDS)


class FakeSacct:
    """Stands in for subprocess.run in the agent's UsageCollector: answers its sacct command, and
    `scontrol show config` (the accounting settings the collector checks) as slurmctld would."""

    def __init__(self, jobs: Iterable[SlurmJob], clock: Callable[[], float]):
        self.jobs = list(jobs)
        self.clock = clock
        self.accounting_enabled = True
        self.calls = 0

    def _scontrol(self) -> Any:
        storage = "accounting_storage/slurmdbd" if self.accounting_enabled else "accounting_storage/none"
        text = (f"AccountingStorageType   = {storage}\n"
                "AccountingStorageTRES   = cpu,mem,energy,node,billing,fs/disk,vmem,pages,gres/gpu\n")
        return types.SimpleNamespace(returncode=0, stdout=text.encode(), stderr=b"")

    def __call__(self, command: list[str], **_: Any) -> Any:
        if command[0].endswith("/scontrol") and command[1:] == ["show", "config"]:
            return self._scontrol()
        self.calls += 1
        if not self.accounting_enabled:
            return types.SimpleNamespace(returncode=1, stdout=b"",
                                         stderr=b"sacct: error: Slurm accounting storage is disabled\n")
        expected = usage.sacct_command(command[0], 0, 1)[:-4]
        if command[:-4] != expected or command[-4] != "-S" or command[-2] != "-E":
            raise AssertionError(f"not the sacct command the twin answers: {command}")
        start = usage.parse_time(command[-3])
        until = usage.parse_time(command[-1])
        now = int(self.clock())
        lines = [job.sacct_line(now) for job in self.jobs
                 if job.start <= now and job.start < until and job.end >= start]
        return types.SimpleNamespace(returncode=0, stdout="".join(f"{line}\n" for line in lines).encode(), stderr=b"")


# --------------------------------------------------------------------------- the controller node


class ControllerNode:
    """A node of the cluster running the real node agent in the controller role, usage on.

    ``instance_id`` names the node the agent says it is (its config's instanceId): a login node's
    id makes it the impostor RecordUsageReport must refuse. ``imds``: what the agent's IMDS probe finds
    (imds_guard's answers; None: no probe configured, as before the controller probed)."""

    def __init__(self, world: Any, instance_id: str, jobs: Iterable[SlurmJob], partitions: dict[str, str],
                 imds: str | None = None):
        self.world = world
        self.instance_id = instance_id
        self.now = 0.0
        self.imds = imds
        files = tempfile.TemporaryDirectory(prefix="hpops-twin-controller-")
        world._stack.append(files)  # removed when the world ends
        self._dir = Path(files.name)
        sacct = self._dir / "opt" / "slurm" / "bin" / "sacct"
        sacct.parent.mkdir(parents=True)
        sacct.write_text("#!/bin/sh\nexit 99\n")  # never run: the collector's run is FakeSacct
        sacct.chmod(0o755)
        provisioning = self._dir / "provisioning_parameters.json"
        # The lifecycle scripts' file: which instance group serves each Slurm partition.
        provisioning.write_text(json.dumps({
            "version": "1.0.0", "workload_manager": "slurm", "controller_group": CONTROLLER_GROUP,
            "login_group": world.login_group,
            "worker_groups": [{"instance_group_name": g, "partition_name": p} for p, g in partitions.items()]}))
        node = world._node_by_instance(instance_id)
        # A login node's id: that node's own agent (its key, so enrolled as a login node) sending usage.
        login = node is not None and node.instance_group_name == world.login_group
        root = world.hosts.root(instance_id) if login else self._dir
        state_dir = root / "var" / "lib" / "hpops-node-agent" if login else self._dir / "state"
        config = AgentConfig.from_dict({
            "cluster": world.cluster_name, "region": world.aws.region_name,
            "reportBus": world.output("NodeReportBusName"), "root": str(root),
            "provisioningParameters": str(provisioning), "stateDir": str(state_dir),
            "instanceId": instance_id, "role": "controller", "sacctCmd": str(sacct),
            "nodeChannel": world.output("NodeChannelFunctionName"), "ip": node.ip if node is not None else "10.0.0.1",
            **({"imdsProbe": IMDS_V4} if imds is not None else {}),
        })
        # Its own session, as the node is its own process: its calls are not our Lambdas'.
        self._session = boto3.session.Session(region_name=world.aws.region_name)
        self._config = config
        self.sacct = FakeSacct(jobs, clock=lambda: self.now)
        self.agent = self._start_agent()

    def _start_agent(self) -> NodeAgent:
        # The twin has no IMDS: the probe answers what the node's iptables would let ``nobody`` reach.
        agent = NodeAgent(self._config, self._session, clock=lambda: self.now,
                          imds_probe=lambda address: (self.imds, f"twin: {address} {self.imds} for non-root"),
                          identity_document=self._identity_document)
        agent.usage_collector().run = self.sacct
        return agent

    def _identity_document(self) -> dict | None:
        """What this node's IMDS serves: its signed instance identity document (identity_documents.py)."""
        node = next((n for n in self.world.sim.nodes(self.world.cluster_name) if n.instance_id == self.instance_id), None)
        if node is None or not getattr(self.world, "identity_documents", False):
            return None
        return identity_documents.served(node, self.world.document_account_id)

    def restart(self) -> NodeAgent:
        """The agent's process restarted (systemd): same key and state files, nothing cached (the IMDS
        probe runs again at its first poll). Slurm doubles attached to the old one must be attached again."""
        self.agent = self._start_agent()
        return self.agent

    def run_agent(self, when: dt.datetime) -> UsageOutcome:
        """One usage run of the agent at ``when``: every due window collected and sent."""
        self.now = when.timestamp()
        with self.world.dispatcher.environment_lock:  # as node_hosts: a node is not a Lambda's environment
            return self.agent.usage_tick()


# --------------------------------------------------------------------------- observing and running


class UserSpendTwin:
    """Inboxes for the user spend alerts, the controller node, what RecordUsageReport kept, `hpops cost`."""

    def __init__(self, world: Any, users: Iterable[str] = ()):
        self.world = world
        self._events: list[dict] = []
        self._topic_messages: list[dict] = []
        self._user_messages: dict[str, list[dict]] = {}
        aws = world.aws
        sqs, sns = aws.client("sqs"), aws.client("sns")
        topic = world.output("UserSpendAlertTopicArn")

        def queue(name: str) -> tuple[str, str]:
            url = sqs.create_queue(QueueName=name)["QueueUrl"]
            return url, sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]

        self._topic_queue, arn = queue("twin-user-spend-topic")
        sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=arn)
        # What `hpops cost subscribe USER EMAIL` sets up, with a queue in place of the mailbox.
        self._user_queues = {}
        for user in users:
            self._user_queues[user], arn = queue(f"twin-user-spend-{user}")
            sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=arn,
                          Attributes={"FilterPolicy": json.dumps({USER_ATTRIBUTE: [user]}),
                                      "FilterPolicyScope": "MessageAttributes"})
        self._event_queue, arn = queue("twin-user-spend-events")
        events = aws.client("events")
        events.put_rule(Name="twin-user-spend-alerts", EventPattern=json.dumps(
            {"source": [USER_ALERT_SOURCE], "detail-type": [USER_ALERT_DETAIL_TYPE]}))
        events.put_targets(Rule="twin-user-spend-alerts", Targets=[{"Id": "inbox", "Arn": arn}])

    # ------------------------------------------------------------------ the controller
    def controller(self, jobs: Iterable[SlurmJob], partitions: dict[str, str], instance_id: str | None = None,
                   imds: str | None = None) -> ControllerNode:
        """The controller group's node with its agent (or, given ``instance_id``, any node's)."""
        if instance_id is None:
            [node] = self.world.sim.nodes(self.world.cluster_name, CONTROLLER_GROUP)
            instance_id = node.instance_id
        return ControllerNode(self.world, instance_id, jobs, partitions, imds)

    def stored_windows(self, month: str) -> int:
        """Window parts RecordUsageReport kept for ``month`` (YYYY-MM)."""
        table = self.world.resolver.physical_ids["SyncStateTable"]
        pages = self.world.aws.client("dynamodb").get_paginator("query").paginate(
            TableName=table, KeyConditionExpression="pk = :pk AND begins_with(sk, :window)", Select="COUNT",
            ExpressionAttributeValues={":pk": {"S": f"usage#{self.world.cluster_name}#{month}"},
                                       ":window": {"S": "window#"}})  # not the windows' running totals
        return sum(page["Count"] for page in pages)

    def rejected_reports(self) -> list[dict]:
        """Usage reports RecordUsageReport refused (EventBridge retries them, then the DLQ takes them)."""
        return [f for f in self.world.delivery_failures if f["function"].endswith("RecordUsageReportFunction")]

    # ------------------------------------------------------------------ inboxes
    def _drain(self, url: str) -> list[dict]:
        sqs = self.world.aws.client("sqs")
        bodies = []
        while messages := sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", []):
            for message in messages:
                bodies.append(json.loads(message["Body"]))
                sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
        return bodies

    def topic_messages(self) -> list[dict]:
        """Every SNS envelope the UserSpendAlertTopic delivered (MessageAttributes included)."""
        self._topic_messages.extend(self._drain(self._topic_queue))
        return list(self._topic_messages)

    def user_inbox(self, user: str) -> list[dict]:
        """What the subscription filtered on ``user`` received."""
        self._user_messages.setdefault(user, []).extend(self._drain(self._user_queues[user]))
        return list(self._user_messages[user])

    def platform_messages(self) -> list[dict]:
        """The user spend alerts on the AlertTopic (the platform team's)."""
        return [m for m in self.world.budget.sns_messages()
                if (m.get("MessageAttributes") or {}).get("kind", {}).get("Value") == "user-spend"]

    def alert_events(self) -> list[dict]:
        self._events.extend(self._drain(self._event_queue))
        return list(self._events)

    # ------------------------------------------------------------------ `hpops cost`
    def spend_environment(self) -> dict[str, str]:
        """The deployed CheckUserSpendFunction's environment (moto's Lambda), as `hpops cost` reads it."""
        name = self.world.resolver.physical_ids[SPEND_FUNCTION]
        configuration = self.world.aws.client("lambda").get_function_configuration(FunctionName=name)
        return configuration["Environment"]["Variables"]

    def cost_document(self, now: dt.datetime) -> dict[str, Any]:
        """`hpops cost`'s document as of ``now``: the CLI's own function, on the twin's account."""
        from hpops.main import user_spend_document
        from hpops_core.budget_guard.aws_budgets import ce_client
        from hpops_core.budget_guard.pricing import pricing_client

        aws = self.world.aws
        return user_spend_document(self.spend_environment(), aws.region_name, now, sagemaker=aws.client("sagemaker"),
                                   ce=ce_client(aws), pricing=pricing_client(aws), dynamodb=aws.client("dynamodb"))

