"""The twin world: template.yaml's resources provisioned in moto, plus what moto lacks.

    with TwinWorld() as world:
        world.publish(world.sim.replace_node(...))   # HyperPod emits events; EventBridge routes them
        world.settle()                                # wait for every execution to finish
        assert world.target_ips() == world.login_truth()

What is real here: the ASL file (moto's Step Functions interpreter), the Lambda handlers (run
in-process, see lambda_dispatch.py), the AWS APIs they call (moto), the rule patterns (matched by
moto's EventBridge rule matcher). What the twin adds: HyperPod node IPs and lifecycle (hyperpod_sim.py)
and EventBridge delivery to Step Functions, which moto does not do.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import os
import re
import threading
import time
import traceback
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable
from unittest import mock

import boto3
import yaml
from moto import mock_aws
from moto.elbv2.models import ELBv2Backend
from moto.events.exceptions import ValidationException as EventsValidationException
from moto.events.models import EventPattern, EventsBackend
from moto.stepfunctions.models import StateMachine as MotoStateMachine
from moto.stepfunctions.parser.asl.component.state.choice.comparison.comparison_operator_type import (
    ComparisonOperatorType,
)
from moto.stepfunctions.parser.asl.component.state.choice.comparison.comparison_variable import ComparisonVariable
from moto.stepfunctions.parser.asl.component.state.choice.comparison.variable import NoSuchVariable
from moto.stepfunctions.parser.asl.component.state.exec.state_task import lambda_eval_utils
from moto.stepfunctions.parser.asl.parse.asl_parser import AmazonStateLanguageParser
from moto.stepfunctions.parser.asl.utils.json_path import NoSuchJsonPathError
from moto.stepfunctions.parser.asl.parse.preprocessor import Preprocessor
from moto.stepfunctions.parser.backend.execution_worker import ExecutionWorker

from hpops.event_files import EVENT_LIMIT_BYTES, entry_of, put_events_entry_size
from hpops_core.common import clients as hpops_clients
from hpops_core.host_identity import certificates, verifier
from hpops_core.host_identity.keys import HostCA, HostKeyBundle, fingerprint, generate_ca
from hpops_core.host_identity.operator import install_canonical_bundle, install_certificate_authority
from hpops_twin import identity_documents
from hpops_twin.budget_twin import BudgetTwin
from hpops_twin.hyperpod_sim import HyperPodSimulator
from hpops_twin.deployer_iam import Names, service_role_arn
from hpops_twin.dynamodb_transactions import item_copies_in_transactions
from hpops_twin.iam.enforce import IamEnforcer, acting_as
from hpops_twin.stack_deploy import SERVICE_ROLE_NAME, SamDeploy
from hpops_twin.node_hosts import AgentSettings, NodeHosts, canonical_bundle, ssh_keygen
from hpops_twin.service_models import sessions_share_models
from hpops_twin.ssm_sessions import SessionManagerTwin
from hpops_twin.lambda_dispatch import FunctionBinding, LambdaDispatcher
from hpops_twin.template_model import Resolver, TemplateModel

REGION = "us-east-1"
ACCOUNT_ID = "123456789012"
# The account a HyperPod node's identity document names: not the customer's (its instances run in a
# service account; which one is UNCONFIRMED), so the product must not require the stack's.
HYPERPOD_SERVICE_ACCOUNT_ID = "210987654321"
STACK_NAME = "hpops-twin"
CLUSTER_EXECUTION_ROLE = "hyperpod-exec"

# Resource types that have no runtime behaviour the twin needs (IAM, alarms, policies, layers).
NOT_PROVISIONED = {
    "AWS::Serverless::LayerVersion",  # hpops_core is importable in-process
    "AWS::CloudWatch::Alarm",
    "AWS::CloudWatch::Dashboard",  # what operators look at; nothing in the twin reads it
    "AWS::SQS::QueuePolicy",
    "AWS::SNS::Subscription",
    "AWS::SNS::TopicPolicy",
    "AWS::IAM::Policy",
    "AWS::IAM::ManagedPolicy",  # moto does not enforce IAM; the twin does (iam/), from the template itself
    "AWS::KMS::Alias",
}


# What a twin's build says as it reaches each stage of the stack's creation (TwinWorld's progress).
STAGES = {"AWS::DynamoDB::Table": "CloudFormation: table, queues, topics, keys, buses, load balancer",
          "AWS::Serverless::Function": "CloudFormation: the Lambda functions and their rules",
          "AWS::Serverless::StateMachine": "CloudFormation: the state machines (moto parses each ASL file)"}

# moto 5.2.1 checks deregistration_delay with range(0, 3600) and so rejects 3600, which AWS accepts.
MOTO_PARAMETER_WORKAROUNDS = {"DeregistrationDelaySeconds": "3599"}
# A new stack's session limits start in dry run (template.yaml); a twin that shows or tests enforcement
# passes this, the one step docs/session-limits.md tells an operator to take.
ENFORCING = {"SessionLimitsDryRun": "false"}


def _clone_state_machine_without_history(machine: Any, memo: dict) -> Any:
    """moto deep-copies the state machine at every StartExecution, including its past executions,
    whose workers hold locks that cannot be copied: the second execution of a machine then fails.
    The copy only needs the machine's definition and settings, so leave the history out."""
    clone = copy.copy(machine)
    for name, value in vars(machine).items():
        setattr(clone, name, [] if name == "executions" else copy.deepcopy(value, memo))
    return clone


class OneParseAtATime:
    """moto parses an execution's definition on the execution's own thread, and its Preprocessor
    keeps the query-language scope stack in a class attribute shared by every parse
    (moto/stepfunctions/parser/asl/parse/preprocessor.py, `_query_language_per_scope`). Two parses
    at once see each other's scopes: one can find the stack non-empty, then empty a moment later,
    and die with IndexError, leaving its execution RUNNING for ever. Parses here take turns."""

    def __init__(self) -> None:
        self._turn = threading.Lock()
        self._count = threading.Lock()
        self.waiting = 0  # parses waiting for their turn (lets a test stage two parses at once)
        self._parsed: dict[str, Any] = {}

    def parse(self, definition: str) -> Any:
        with self._count:
            self.waiting += 1
        try:
            self._turn.acquire()
        finally:
            with self._count:
                self.waiting -= 1
        try:
            # Parsing the sync's definition takes ~0.3 s; taking turns would then stagger the
            # executions of a burst by that much each, which a real burst is not. The parsed
            # program is stateless (each execution evaluates it in its own Environment).
            if definition not in self._parsed:
                self._parsed[definition] = _REAL_ASL_PARSE(definition)
            return self._parsed[definition]
        finally:
            # A parse that raised mid-way leaves its scopes behind; the next one would inherit them.
            Preprocessor._query_language_per_scope.clear()
            self._turn.release()


_REAL_ASL_PARSE = AmazonStateLanguageParser.parse
ASL_PARSING = OneParseAtATime()  # one per process: the shared scope stack is per process


class StuckExecutionError(TimeoutError):
    """An execution that will not finish: moto's interpreter thread died, or it ran past the bound."""

    def __init__(self, execution_arn: str, last_state: str | None, elapsed: float, bound: float, crash: str | None):
        self.execution_arn, self.last_state, self.elapsed, self.bound, self.crash = execution_arn, last_state, elapsed, bound, crash
        where = f"last state {last_state!r}" if last_state else "no state entered"
        if crash:
            reason = f"moto's interpreter thread died after {elapsed:.1f}s ({where}): {crash}"
        else:
            reason = f"still RUNNING after the {bound:g}s bound ({where})"
        super().__init__(f"execution {execution_arn.rsplit(':', 1)[-1]} ({execution_arn}) is stuck: {reason}")


_REAL_CREATE_LOAD_BALANCER = ELBv2Backend.create_load_balancer


def _one_lambda_client_per_session() -> Callable[..., Any]:
    """moto's Step Functions makes a new boto3 client for every Lambda task it runs (a tenth of its CPU
    in a twin: the client's models, endpoint and TLS context). Clients are thread-safe and the caller's
    principal is per thread (iam/enforce.py), so the tasks share one per default session and Region."""
    made = lambda_eval_utils.boto_client_for
    clients: dict[tuple[int, str, str], tuple[Any, Any]] = {}
    lock = threading.Lock()

    def boto_client_for(region: str, service: str, state_credentials: Any = None) -> Any:
        session = boto3.DEFAULT_SESSION  # kept below, so its id names no other session while cached
        key = (id(session), region, service)
        with lock:
            if key not in clients:
                clients[key] = (session, made(region=region, service=service, state_credentials=state_credentials))
            return clients[key][1]

    return boto_client_for


@functools.lru_cache(maxsize=8)
def _public_fingerprints(secret_string: str) -> dict[str, str]:
    """The fingerprints of a host key bundle's secret: loading its RSA key costs a tenth of a second,
    and every step's check reads the same secret until a rotation."""
    return HostKeyBundle.from_secret_json(secret_string).public_fingerprints()


def _load_balancer_arn_of_its_type(backend: ELBv2Backend, *args: Any, **kwargs: Any) -> Any:
    """moto names every load balancer loadbalancer/app/...; AWS names a Network Load Balancer
    loadbalancer/net/..., and IAM policies name it so (its listeners follow: listener/net/...)."""
    balancer = _REAL_CREATE_LOAD_BALANCER(backend, *args, **kwargs)
    if balancer.type == "network" and ":loadbalancer/app/" in balancer.arn:
        old = balancer.arn
        balancer.arn = old.replace(":loadbalancer/app/", ":loadbalancer/net/")
        backend.load_balancers[balancer.arn] = backend.load_balancers.pop(old)
    return balancer


def _choice_rule_as_strict_as_aws(rule: Any, env: Any) -> None:
    """On AWS a Choice rule whose Variable path is absent fails the execution with States.Runtime
    (only IsPresent may look at an absent path); moto's interpreter quietly takes the rule as false,
    which would let an ASL bug pass every twin test."""
    rule.variable.eval(env)
    if isinstance(env.stack[-1], NoSuchVariable) and rule.comparison_function.operator_type != ComparisonOperatorType.IsPresent:
        # moto turns this into States.Runtime for the state, as it does for any missing path.
        raise NoSuchJsonPathError(json_path=rule.variable.string_sampler.literal_value, data=env.states.get_input())
    rule.comparison_function.eval(env)


class ExecutionEnds:
    """Each execution's end, as its interpreter thread leaves (moto sets the final status just before):
    wait() sleeps until then instead of polling DescribeExecution, which cost CPU the interpreter needs."""

    def __init__(self) -> None:
        self._ended: dict[str, threading.Event] = {}
        self._lock = threading.Lock()

    def of(self, execution_arn: str) -> threading.Event:
        with self._lock:
            return self._ended.setdefault(execution_arn, threading.Event())


def _recording_interpreter_crashes(crashes: dict[str, str], ends: ExecutionEnds):
    real = ExecutionWorker._execution_logic

    def execution_logic(worker: ExecutionWorker) -> None:
        arn = worker._evaluation_details.execution_details.arn
        try:
            real(worker)
        except Exception as error:  # re-raised: the thread still dies as before, but wait() knows why
            crashes[arn] = f"{type(error).__name__}: {error}"
            raise
        finally:
            ends.of(arn).set()

    return execution_logic


# EventBridge takes PutEvents entries (and requests) under 256 KB; the sizing is the CLI's, so
# `hpops twin send` and the twin's delivery refuse the same events.
PUT_EVENTS_ENTRY_LIMIT = EVENT_LIMIT_BYTES


def refusal(event: dict, account_id: str = ACCOUNT_ID, region: str = REGION) -> dict | None:
    """Why EventBridge would not deliver this event to the rules of a twin in this account and
    region, as a failed PutEvents result entry ({"ErrorCode", "ErrorMessage"}), or None when it would."""
    size = put_events_entry_size(entry_of(event))
    if size >= PUT_EVENTS_ENTRY_LIMIT:
        return {"ErrorCode": "InvalidArgument",
                "ErrorMessage": f"entry size {size:,} bytes; EventBridge takes entries under {PUT_EVENTS_ENTRY_LIMIT:,} (256 KB)"}
    # An AWS service event reaches only the buses of the account and region it happened in.
    if event.get("account", account_id) != account_id:
        return {"ErrorCode": "InvalidAccountIdException",
                "ErrorMessage": f"event for account {event['account']}; this twin is account {account_id}"}
    if event.get("region", region) != region:
        return {"ErrorCode": "InvalidArgument",
                "ErrorMessage": f"event from region {event['region']}; this twin is region {region}"}
    return None


@dataclass
class ExecutionResult:
    arn: str
    name: str
    status: str
    error: str | None
    cause: str | None
    input: dict
    output: dict | None

    @property
    def end_state(self) -> str | None:
        return (self.output or {}).get("_end_state")


@dataclass
class PutEventsOutcome:
    entries: list[dict] = field(default_factory=list)  # one per event, in order, as PutEvents returns them
    started: list[str] = field(default_factory=list)  # execution ARNs the delivered events started

    @property
    def failed_entry_count(self) -> int:
        return sum(1 for e in self.entries if "ErrorCode" in e)


@dataclass
class RouteRecord:
    rule: str
    event_id: str | None
    execution_arn: str


@dataclass
class ApiCallCounter:
    """Counts the AWS calls our Lambda code makes (boto3's default session), by service.operation."""

    calls: Counter = field(default_factory=Counter)
    by_function: dict[str, Counter] = field(default_factory=dict)  # logical-ish function name -> calls
    enabled: bool = True
    current_function: Any = lambda: None

    def __call__(self, event_name: str, **_: Any) -> None:
        if self.enabled:
            _, service, operation = event_name.split(".", 2)
            if service != "lambda":  # Step Functions invoking our functions: not a call our code makes
                self.calls[f"{service}.{operation}"] += 1
                function = self.current_function() or "(outside a handler)"
                self.by_function.setdefault(function, Counter())[f"{service}.{operation}"] += 1

    def reset(self) -> None:
        self.calls.clear()
        self.by_function.clear()

    def calls_of(self, function_names: set[str]) -> Counter:
        """Calls made by the named functions only (physical names end with the logical id)."""
        total: Counter = Counter()
        for function, calls in self.by_function.items():
            if any(function.endswith(name) for name in function_names):
                total.update(calls)
        return total

    def by_service(self) -> Counter:
        totals: Counter = Counter()
        for key, count in self.calls.items():
            totals[key.split(".", 1)[0]] += count
        return totals


class HarnessSession(boto3.session.Session):
    """The harness's own session (its polling and inspection are not our code's calls): one client
    per service and region, made on first use, as the twin and its tests ask for them hundreds of
    times per twin and a client takes longer to make than most calls take to answer."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._clients: dict[tuple[str, str | None], Any] = {}
        self._clients_lock = threading.Lock()

    def client(self, service_name: str, region_name: str | None = None, **settings: Any) -> Any:
        if settings:  # a client set up differently (credentials, endpoint, config) is made for the caller
            return super().client(service_name, region_name=region_name, **settings)
        with self._clients_lock:
            key = (service_name, region_name)
            if key not in self._clients:
                self._clients[key] = super().client(service_name, region_name=region_name)
            return self._clients[key]


def _delivering_put_events(world: TwinWorld):
    real_put_events = EventsBackend.put_events

    def put_events(backend: EventsBackend, events: list[dict]) -> list[dict]:
        # moto has no size limit; EventBridge refuses the whole request when its entries add up
        # to more than 256 KB (so also when one entry alone does).
        if sum(put_events_entry_size(e) for e in events) >= PUT_EVENTS_ENTRY_LIMIT:
            raise EventsValidationException("Total size of the entries in the request is over the limit.")
        entries = real_put_events(backend, events)
        for event, entry in zip(events, entries):
            if "EventId" in entry:
                world.deliver_to_functions(event.get("EventBusName") or "default", event)
        return entries

    return put_events


class TwinWorld:
    def __init__(
        self,
        cluster_name: str = "ml-research",
        login_group: str = "login",
        cluster_id: str | None = None,  # last segment of the cluster ARN; by default derived from the name
        login_count: int = 3,
        worker_group: str = "gpu",
        worker_count: int = 8,
        # More instance groups: {name: (instance type, count)}, e.g. the Slurm controller group
        # ("controller-machine", the ControllerGroupName default) whose node's usage reports count.
        extra_groups: dict[str, tuple[str, int]] | None = None,
        template: TemplateModel | None = None,
        parameters: dict[str, str] | None = None,  # stack parameter overrides, as `sam deploy --parameter-overrides`
        # The account's Session Manager preferences: (Run As on?, default user), or None when they
        # were never saved (Run As off: on HyperPod every shell is root's). The twin's users carry
        # SSMSessionRunAs tags, so by default Run As is on.
        session_preferences: tuple[bool, str] | None = (True, ""),
        # The account and region the twin plays (`hpops twin send` takes them from the events it replays).
        account_id: str = ACCOUNT_ID,
        region: str = REGION,
        # Change a principal's policies before enforcement uses them: (principal, {name: document}).
        iam_policy_edit: Any = None,
        # False: the cluster's nodes were created before on_create.sh had the install line (no agents).
        agents_installed: bool = True,
        # The nodes' IMDS serves signed instance identity documents (UNCONFIRMED on HyperPod: False plays
        # a cluster where it does not), naming this account (HyperPod's service account: UNCONFIRMED).
        identity_documents: bool = True,
        document_account_id: str = HYPERPOD_SERVICE_ACCOUNT_ID,
        # Told what the build is doing as it goes (the demo says it, so a slow machine is never silent).
        progress: Callable[[str], None] | None = None,
    ):
        if not re.fullmatch(r"[0-9]{12}", account_id) or not re.fullmatch(r"[a-z]{2}(-[a-z]+)+-[0-9]", region):
            raise ValueError(f"account {account_id!r} and region {region!r}: expected 12 digits and a region name")
        self.account_id = account_id
        self.region = region
        # EventBridge stamps each event with when it was put; a test on a simulated clock sets this.
        self.event_clock: Callable[[], datetime] | None = None
        self.parameter_overrides = dict(parameters or {})
        self.session_preferences = session_preferences
        self.cluster_name = cluster_name
        self.login_group = login_group
        self.cluster_id = cluster_id
        self.login_count = login_count
        self.worker_group = worker_group
        self.worker_count = worker_count
        self.extra_groups = dict(extra_groups or {})
        self.template = template or TemplateModel()
        self.dispatcher = LambdaDispatcher()
        self.iam_policy_edit = iam_policy_edit
        self.agents_installed = agents_installed
        self.progress = progress or (lambda _: None)
        self.identity_documents = identity_documents
        self.document_account_id = document_account_id
        self.counter = ApiCallCounter(current_function=lambda: self.dispatcher.current_function)
        self.routes: list[RouteRecord] = []
        self.rules: dict[str, dict] = {}  # event source name -> {"kind", "pattern"|"input", "state_machine"}
        self._compiled_rules: list[tuple[str, EventPattern, str]] | None = None
        self._sfn: Any = None
        self.state_machine_arns: dict[str, str] = {}
        self.function_rules: dict[str, dict] = {}  # rule name -> {"pattern", "bus", "function", "dlq"}
        self.function_schedules: dict[str, dict] = {}  # rule name -> {"schedule", "function", "logical_id"}
        self.delivery_failures: list[dict] = []  # events a function target rejected (sent to the DLQ)
        self.agent_errors: list[str] = []  # tracebacks of node agent ticks that raised
        self.refused: list[tuple[dict, dict]] = []  # (event, failed PutEvents entry) not delivered
        self.interpreter_crashes: dict[str, str] = {}  # execution ARN -> why moto's interpreter thread died
        self.execution_ends = ExecutionEnds()
        self._stack: list[Any] = []
        self.stack_name = STACK_NAME
        # What CloudFormation would delete, newest first: (what, how), as each resource is created.
        self._undo: list[tuple[str, Callable[[], Any]]] = []
        self.retained: list[str] = []  # logical ids a deletion left in the account (their DeletionPolicy)
        self._check_identity()

    @property
    def deployer_names(self) -> Names:
        """The names the deployer's and the service role's policies are filled with (docs/deployer-role.json)."""
        return Names(self.stack_name, self.region, self.account_id, CLUSTER_EXECUTION_ROLE,
                     service_role_arn(self.account_id, self.stack_name, SERVICE_ROLE_NAME))

    def _check_identity(self) -> None:
        """The cluster's name, id and login group become stack parameters: CloudFormation would
        refuse values outside the template's AllowedPattern, and so does the twin, before starting."""
        arn_of_id = f"arn:aws:sagemaker:{self.region}:{self.account_id}:cluster/{self.cluster_id}"
        values = {"ClusterName": self.cluster_name, "LoginGroupName": self.login_group}
        if self.cluster_id is not None:
            values["ClusterArn"] = arn_of_id
        for name, value in values.items():
            pattern = self.template.raw["Parameters"][name].get("AllowedPattern")
            if pattern and not re.fullmatch(pattern, value):
                raise ValueError(f"{name} {value!r} does not match the template's AllowedPattern {pattern}")

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> TwinWorld:
        env = mock.patch.dict(os.environ, {
            "AWS_DEFAULT_REGION": self.region, "AWS_REGION": self.region, "MOTO_ACCOUNT_ID": self.account_id,
            "AWS_ACCESS_KEY_ID": "twin", "AWS_SECRET_ACCESS_KEY": "twin", "AWS_SESSION_TOKEN": "twin",
            # moto's EC2 would otherwise make thousands of public AMIs, volumes and snapshots per twin; none is used.
            "MOTO_EC2_LOAD_DEFAULT_AMIS": "false",
        })
        env.start()
        self._stack.append(env)
        shared_models = sessions_share_models()  # every session below parses botocore's models once per process
        shared_models.start()
        self._stack.append(shared_models)
        clone_fix = mock.patch.object(MotoStateMachine, "__deepcopy__", _clone_state_machine_without_history, create=True)
        clone_fix.start()
        self._stack.append(clone_fix)
        for fix in (*item_copies_in_transactions(),
                    mock.patch.object(lambda_eval_utils, "boto_client_for", _one_lambda_client_per_session()),
                    mock.patch.object(AmazonStateLanguageParser, "parse", staticmethod(ASL_PARSING.parse)),
                    mock.patch.object(ELBv2Backend, "create_load_balancer", _load_balancer_arn_of_its_type),
                    mock.patch.object(ExecutionWorker, "_execution_logic", _recording_interpreter_crashes(self.interpreter_crashes, self.execution_ends)),
                    mock.patch.object(ComparisonVariable, "_eval_body", _choice_rule_as_strict_as_aws)):
            fix.start()
            self._stack.append(fix)
        # The product trusts the twin's instance identity signer for this Region, as it trusts AWS's.
        documents = identity_documents.trusted(self.region)
        documents.__enter__()
        self._stack.append(documents)
        aws = mock_aws(config={"stepfunctions": {"execute_state_machine": True}})
        aws.start()
        self._stack.append(aws)
        dispatch = self.dispatcher.installed()
        dispatch.__enter__()
        self._stack.append(dispatch)
        # Our code's clients come from boto3's default session; count their calls from here on.
        boto3.setup_default_session(region_name=self.region)
        boto3.DEFAULT_SESSION.events.register("before-call", self.counter)
        hpops_clients.reset_clients()
        # The harness has its own session so its own calls (polling, inspection) are not counted.
        self.aws = HarnessSession(region_name=self.region)
        self.sim = HyperPodSimulator(self.region, self.account_id, clock=lambda: datetime.now(timezone.utc))
        self.dispatcher.base_environment = {"POWERTOOLS_TRACE_DISABLED": "true", "POWERTOOLS_DEV": "false"}
        self.hosts = NodeHosts(
            node_by_instance=self._node_by_instance, node_by_ip=self._node_by_ip,
            running_login_nodes=lambda: [n for n in self.sim.nodes(self.cluster_name, self.login_group) if n.status == "Running"],
            agent_settings=lambda: AgentSettings(cluster=self.cluster_name, region=self.region,
                                                 report_bus=self.output("NodeReportBusName"), login_group=self.login_group,
                                                 node_channel=self.output("NodeChannelFunctionName")),
            exclusive=self.dispatcher.environment_lock,
            identity_document=lambda node: (identity_documents.served(node, self.document_account_id)
                                            if self.identity_documents else None),
        )
        # The node agent polls at least once between two reads of its report by a state machine.
        self.dispatcher.before_invoke.append(self._agent_polls_before_its_report_is_read)
        bus_delivery = mock.patch.object(EventsBackend, "put_events", _delivering_put_events(self))
        bus_delivery.start()
        self._stack.append(bus_delivery)
        hosts = self.hosts.installed()
        hosts.__enter__()
        self._stack.append(hosts)
        self.sessions = SessionManagerTwin(self)  # Session Manager APIs and users (ssm_sessions.py)
        sessions = self.sessions.installed()
        sessions.__enter__()
        self._stack.append(sessions)
        # Every request of a function, state machine, rule or agent is checked as IAM would (iam/).
        self.iam = IamEnforcer(self, self.iam_policy_edit)
        enforcement = self.iam.installed()
        enforcement.__enter__()
        self._stack.append(enforcement)
        try:
            self.progress("`sam deploy` of template.yaml into the twin's account (through CloudFormation's service role)")
            self._provision()
        except BaseException:  # a failed deploy (e.g. denied): undo the mocks started above, then say why
            self.__exit__(None, None, None)
            raise
        self.budget = BudgetTwin.install(self)  # budget guard: UpdateBudget, CE cost, alert inboxes
        self.notification_log: list[dict] = []
        sqs = self.aws.client("sqs")
        self._alert_queue = sqs.create_queue(QueueName="twin-alert-observer")["QueueUrl"]
        queue_arn = sqs.get_queue_attributes(QueueUrl=self._alert_queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        self.aws.client("sns").subscribe(TopicArn=self.output("AlertTopicArn"), Protocol="sqs", Endpoint=queue_arn)
        if self.resolver.parameters["HostIdentityMode"] == "keys":
            self.install_canonical_host_keys(canonical_bundle())
        elif self.resolver.parameters["HostIdentityMode"] == "certificate":
            self.install_host_certificate_authority(generate_ca())
        # The cluster existed before the stack: its lifecycle scripts already installed the agents,
        # which have reported once. Measurements start after that.
        self.hosts.lifecycle_installs_agent = self.agents_installed
        self.progress("the node agents' first runs: each enrolls its key and reports")
        self.hosts.ensure_agents()
        self.counter.reset()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.wait_for_all(timeout=30, raise_on_timeout=False)
        hpops_clients.reset_clients()
        boto3.DEFAULT_SESSION = None
        for item in reversed(self._stack):
            if hasattr(item, "__exit__") and not hasattr(item, "stop"):
                item.__exit__(None, None, None)
            else:
                item.stop()
        self._stack.clear()

    # ------------------------------------------------------------------ provisioning from template.yaml
    def save_session_preferences(self, run_as_enabled: bool, default_user: str = "") -> None:
        """What saving Session Manager preferences in the console does: the account's
        SSM-SessionManagerRunShell document, whose inputs decide Run As."""
        content = {
            "schemaVersion": "1.0",
            "description": "Document to hold regional settings for Session Manager",
            "sessionType": "Standard_Stream",
            "inputs": {"s3BucketName": "", "cloudWatchLogGroupName": "", "runAsEnabled": run_as_enabled,
                       "runAsDefaultUser": default_user, "idleSessionTimeout": "20"},
        }
        self.aws.client("ssm").create_document(Name="SSM-SessionManagerRunShell", Content=json.dumps(content),
                                               DocumentType="Session", DocumentFormat="JSON")

    def _provision(self) -> None:
        if self.session_preferences is not None:
            self.save_session_preferences(*self.session_preferences)
        self.sim.create_cluster(self.cluster_name, {
            self.login_group: ("ml.m5.4xlarge", self.login_count),
            self.worker_group: ("ml.p5.48xlarge", self.worker_count),
        } | self.extra_groups)
        cluster = self.sim.cluster(self.cluster_name)
        if self.cluster_id is not None:  # the simulator derives an id from the name; a replayed event names its own
            cluster.arn = f"{cluster.arn.rsplit('/', 1)[0]}/{self.cluster_id}"
        self.cluster_id = cluster.arn.rsplit("/", 1)[-1]
        ec2 = self.aws.client("ec2")
        vpc_id = ec2.create_vpc(CidrBlock="10.1.0.0/16")["Vpc"]["VpcId"]
        subnets = [
            ec2.create_subnet(VpcId=vpc_id, CidrBlock=f"10.1.{i}.0/24", AvailabilityZone=f"{self.region}{az}")["Subnet"]["SubnetId"]
            for i, az in enumerate("ab")
        ]
        parameters = self.template.parameter_defaults() | {
            "ClusterName": self.cluster_name,
            "ClusterArn": self.sim.cluster(self.cluster_name).arn,
            "LoginGroupName": self.login_group,
            "VpcId": vpc_id,
            "SubnetIds": ",".join(subnets),
            "ClusterExecutionRoleName": CLUSTER_EXECUTION_ROLE,
            "VerifierSubnetIds": ",".join(subnets),
            # Agents poll right before each read of their report (node_hosts.py): no need to wait.
            "NodeReportPollSeconds": "0",
        } | MOTO_PARAMETER_WORKAROUNDS | self.parameter_overrides
        if ssh_keygen() is None:
            print("twin: ssh-keygen (OpenSSH client) not found: host identity checks are off in this twin")
            parameters["HostIdentityMode"] = "off"
        self.resolver = Resolver(self.template.raw, parameters, self.region, self.account_id, STACK_NAME)
        # `sam deploy --role-arn`: the deployer's change set, the resources made by CloudFormation's service
        # role (docs/deployer-role.json), a failed creation rolled back by it (a missing action fails here).
        self.stack = SamDeploy(self)
        self.stack.create()

    def create_stack_resources(self) -> None:
        """CloudFormation creating the stack's resources, in dependency order (the caller acts as the role)."""
        for logical_id in self.template.of_type("AWS::Serverless::LayerVersion"):  # functions' Layers name them
            self._record(logical_id, f"arn:aws:lambda:{self.region}:{self.account_id}:layer:{self._physical_name(logical_id)}:1")
        order = [
            "AWS::DynamoDB::Table", "AWS::SQS::Queue", "AWS::SNS::Topic", "AWS::Logs::LogGroup",
            "AWS::KMS::Key", "AWS::SecretsManager::Secret", "AWS::Events::EventBus", "AWS::EC2::SecurityGroup",
            "AWS::ElasticLoadBalancingV2::LoadBalancer", "AWS::ElasticLoadBalancingV2::TargetGroup",
            "AWS::ElasticLoadBalancingV2::Listener", "AWS::SSM::Parameter", "AWS::Serverless::Function",
            "AWS::Serverless::StateMachine",
        ]
        unknown = {r["Type"] for r in self.template.resources.values()} - set(order) - NOT_PROVISIONED
        if unknown:
            raise NotImplementedError(f"the twin does not know how to provision {sorted(unknown)}")
        # A function that names a state machine (e.g. to release the lease of an ended sync) is
        # created after the state machines, as CloudFormation's dependency order would.
        machines = set(self.template.of_type("AWS::Serverless::StateMachine"))
        waits_for_machines = {
            logical_id for logical_id, resource in self.template.of_type("AWS::Serverless::Function").items()
            if any(json.dumps({"Ref": m}) in json.dumps(resource) for m in machines)
        }
        queue = [(t, logical_id, resource) for t in order for logical_id, resource in self.template.of_type(t).items()
                 if logical_id not in waits_for_machines]
        queue += [("AWS::Serverless::Function", logical_id, self.template.resources[logical_id])
                  for logical_id in sorted(waits_for_machines)]
        said = set()
        for resource_type, logical_id, resource in queue:
            if "Condition" in resource and not self.resolver.condition(resource["Condition"]):
                continue
            if resource_type in STAGES and resource_type not in said:
                said.add(resource_type)
                self.progress(STAGES[resource_type])
            getattr(self, "_provision_" + resource_type.split("::")[-1])(logical_id, self.resolver.resolve(resource.get("Properties", {})))

    def update_stack_resources(self) -> None:
        """CloudFormation updating the stack for new code: each function's code and configuration, each
        state machine's definition (the caller acts as the service role)."""
        lambda_client, sfn = self.aws.client("lambda"), self.aws.client("stepfunctions")
        for logical_id, spec in self.template.functions().items():
            name = self.resolver.physical_ids.get(logical_id)
            if name is None:  # a function a condition left out
                continue
            binding = self.dispatcher.bindings[name]
            lambda_client.update_function_configuration(FunctionName=name, Role=self._twin_role(),
                                                        Environment={"Variables": dict(binding.environment)})
            lambda_client.update_function_code(FunctionName=name, **self.stack.code(spec.code_uri))
        for logical_id, arn in self.state_machine_arns.items():
            sfn.update_state_machine(stateMachineArn=arn, definition=self._definition(logical_id),
                                     roleArn=self._twin_role())

    def update_parameters(self, overrides: dict[str, str]) -> None:
        """`sam deploy --parameter-overrides` on the running stack: every function's environment and every
        role's policies resolved with the new values, then the update (stack_deploy.SamDeploy.update).
        A change that would add, remove or reconfigure another resource is refused (the twin does not
        replay such an update): NotImplementedError naming the resources."""
        def others() -> dict[str, Any]:
            """Every other resource: made or not (its condition), and its properties if made."""
            skipped = NOT_PROVISIONED | {"AWS::Serverless::Function", "AWS::Serverless::StateMachine"}
            found = {}
            for logical_id, resource in self.template.resources.items():
                if resource["Type"] not in skipped:
                    made = self.resolver.condition(resource["Condition"]) if "Condition" in resource else True
                    found[logical_id] = self.resolver.resolve(resource.get("Properties", {})) if made else None
            return found

        before, previous = others(), dict(self.resolver.parameters)
        self.resolver.parameters.update(overrides)
        changed = sorted(logical_id for logical_id, resolved in others().items() if resolved != before[logical_id])
        if changed:
            self.resolver.parameters.clear()
            self.resolver.parameters.update(previous)
            raise NotImplementedError(f"the twin updates functions and policies only; this update changes {changed}")
        self.parameter_overrides.update(overrides)
        for logical_id in self.template.functions():
            name = self.resolver.physical_ids.get(logical_id)
            if name is not None:
                self.dispatcher.bindings[name].environment = {
                    k: str(v) for k, v in self.resolver.resolve(self.template.function_environment(logical_id)).items()}
        self.iam.forget_policies()
        self.stack.update()

    def delete_stack_resources(self, rollback: bool = False) -> None:
        """CloudFormation deleting what it made, newest first (a deletion, or with ``rollback`` a failed
        creation's rollback; the caller acts as the service role). A resource whose DeletionPolicy is Retain,
        or RetainExceptOnCreate outside the rollback of its creation, stays in the account (`retained`)."""
        while self._undo:
            logical_id, delete = self._undo.pop()
            policy = self.template.resources.get(logical_id, {}).get("DeletionPolicy")
            if policy == "Retain" or (policy == "RetainExceptOnCreate" and not rollback):
                self.retained.append(logical_id)
                continue
            delete()
        self.routes.clear()  # the executions ended with their state machines
        self.state_machine_arns.clear()

    def _made(self, what: str, delete: Callable[[], Any]) -> None:
        self._undo.append((what, delete))

    def _physical_name(self, logical_id: str, limit: int = 64) -> str:
        return f"{STACK_NAME}-{logical_id}"[:limit]

    def _provision_Table(self, logical_id: str, props: dict) -> None:
        name = self._physical_name(logical_id)
        table = self.aws.client("dynamodb").create_table(
            TableName=name, KeySchema=props["KeySchema"], AttributeDefinitions=props["AttributeDefinitions"],
            BillingMode=props.get("BillingMode", "PAY_PER_REQUEST"),
        )["TableDescription"]
        self._made(logical_id, lambda: self.aws.client("dynamodb").delete_table(TableName=name))
        if "TimeToLiveSpecification" in props:
            self.aws.client("dynamodb").update_time_to_live(TableName=name, TimeToLiveSpecification=props["TimeToLiveSpecification"])
        self._record(logical_id, name, Arn=table["TableArn"])

    def _provision_Key(self, logical_id: str, props: dict) -> None:
        policy = {"Policy": json.dumps(props["KeyPolicy"])} if props.get("KeyPolicy") else {}
        key = self.aws.client("kms").create_key(Description=props.get("Description", ""), **policy)["KeyMetadata"]
        self._made(logical_id, lambda: self.aws.client("kms").schedule_key_deletion(KeyId=key["KeyId"], PendingWindowInDays=7))
        self._record(logical_id, key["KeyId"], Arn=key["Arn"])

    def _provision_Secret(self, logical_id: str, props: dict) -> None:
        secret = self.aws.client("secretsmanager").create_secret(
            Name=self._physical_name(logical_id), SecretString=props["SecretString"], KmsKeyId=props.get("KmsKeyId", ""),
        )
        self._made(logical_id, lambda: self.aws.client("secretsmanager").delete_secret(
            SecretId=secret["ARN"], ForceDeleteWithoutRecovery=True))
        self._record(logical_id, secret["ARN"])

    def _provision_EventBus(self, logical_id: str, props: dict) -> None:
        arn = self.aws.client("events").create_event_bus(Name=props["Name"])["EventBusArn"]
        self._made(logical_id, lambda: self.aws.client("events").delete_event_bus(Name=props["Name"]))
        self._record(logical_id, props["Name"], Arn=arn, Name=props["Name"])

    def _provision_SecurityGroup(self, logical_id: str, props: dict) -> None:
        ec2 = self.aws.client("ec2")
        group = ec2.create_security_group(
            GroupName=self._physical_name(logical_id), Description=props["GroupDescription"], VpcId=props["VpcId"])
        self._made(logical_id, lambda: self.aws.client("ec2").delete_security_group(GroupId=group["GroupId"]))
        for key, authorize in (("SecurityGroupIngress", ec2.authorize_security_group_ingress),
                               ("SecurityGroupEgress", ec2.authorize_security_group_egress)):
            for rule in props.get(key, []):
                authorize(GroupId=group["GroupId"], IpPermissions=[{
                    "IpProtocol": rule["IpProtocol"], "FromPort": int(rule["FromPort"]), "ToPort": int(rule["ToPort"]),
                    "IpRanges": [{"CidrIp": rule["CidrIp"], "Description": rule.get("Description", "")}]}])
        self._record(logical_id, group["GroupId"], GroupId=group["GroupId"])

    def _provision_Queue(self, logical_id: str, props: dict) -> None:
        sqs = self.aws.client("sqs")
        url = sqs.create_queue(QueueName=self._physical_name(logical_id, 80))["QueueUrl"]
        self._made(logical_id, lambda: self.aws.client("sqs").delete_queue(QueueUrl=url))
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        self._record(logical_id, url, Arn=arn, QueueName=url.rsplit("/", 1)[-1])

    def _provision_Topic(self, logical_id: str, props: dict) -> None:
        arn = self.aws.client("sns").create_topic(Name=self._physical_name(logical_id, 256))["TopicArn"]
        self._made(logical_id, lambda: self.aws.client("sns").delete_topic(TopicArn=arn))
        self._record(logical_id, arn, TopicName=arn.rsplit(":", 1)[-1])

    def _provision_Parameter(self, logical_id: str, props: dict) -> None:
        self.aws.client("ssm").put_parameter(Name=props["Name"], Value=props["Value"], Type=props["Type"])
        self._made(logical_id, lambda: self.aws.client("ssm").delete_parameter(Name=props["Name"]))
        self._record(logical_id, props["Name"])

    def _provision_LogGroup(self, logical_id: str, props: dict) -> None:
        name = self._physical_name(logical_id, 512)  # CloudFormation's generated name: <stack>-<LogicalId>-...
        logs = self.aws.client("logs")
        logs.create_log_group(logGroupName=name)
        self._made(logical_id, lambda: self.aws.client("logs").delete_log_group(logGroupName=name))
        if "RetentionInDays" in props:
            logs.put_retention_policy(logGroupName=name, retentionInDays=int(props["RetentionInDays"]))
        self._record(logical_id, name, Arn=f"arn:aws:logs:{self.region}:{self.account_id}:log-group:{name}:*")

    def _provision_LoadBalancer(self, logical_id: str, props: dict) -> None:
        lb = self.aws.client("elbv2").create_load_balancer(
            Name=self._physical_name(logical_id, 32).rstrip("-"), Subnets=props["Subnets"],
            Scheme=props.get("Scheme", "internal"), Type=props.get("Type", "network"),
            SecurityGroups=props.get("SecurityGroups", []),
        )["LoadBalancers"][0]
        self._made(logical_id, lambda: self.aws.client("elbv2").delete_load_balancer(LoadBalancerArn=lb["LoadBalancerArn"]))
        self._record(logical_id, lb["LoadBalancerArn"], DNSName=lb["DNSName"])

    def _provision_TargetGroup(self, logical_id: str, props: dict) -> None:
        elbv2 = self.aws.client("elbv2")
        keys = ("Protocol", "Port", "VpcId", "TargetType", "HealthCheckProtocol", "HealthCheckIntervalSeconds",
                "HealthyThresholdCount", "UnhealthyThresholdCount")
        arguments = {k: props[k] for k in keys if k in props}
        for number in ("Port", "HealthCheckIntervalSeconds", "HealthyThresholdCount", "UnhealthyThresholdCount"):
            if number in arguments:
                arguments[number] = int(arguments[number])
        tg = elbv2.create_target_group(Name=self._physical_name(logical_id, 32).rstrip("-"), **arguments)["TargetGroups"][0]
        self._made(logical_id, lambda: self.aws.client("elbv2").delete_target_group(TargetGroupArn=tg["TargetGroupArn"]))
        if props.get("TargetGroupAttributes"):
            elbv2.modify_target_group_attributes(
                TargetGroupArn=tg["TargetGroupArn"],
                Attributes=[{"Key": a["Key"], "Value": str(a["Value"])} for a in props["TargetGroupAttributes"]],
            )
        self._record(logical_id, tg["TargetGroupArn"])

    def _provision_Listener(self, logical_id: str, props: dict) -> None:
        listener = self.aws.client("elbv2").create_listener(
            LoadBalancerArn=props["LoadBalancerArn"], Protocol=props["Protocol"], Port=int(props["Port"]),
            DefaultActions=props["DefaultActions"],
        )["Listeners"][0]
        self._made(logical_id, lambda: self.aws.client("elbv2").delete_listener(ListenerArn=listener["ListenerArn"]))
        if props.get("ListenerAttributes"):
            self.aws.client("elbv2").modify_listener_attributes(
                ListenerArn=listener["ListenerArn"],
                Attributes=[{"Key": a["Key"], "Value": str(a["Value"])} for a in props["ListenerAttributes"]])
        self._record(logical_id, listener["ListenerArn"])

    def _twin_role(self) -> str:
        iam = self.aws.client("iam")
        name = "hpops-twin-execution"
        try:
            return iam.get_role(RoleName=name)["Role"]["Arn"]
        except iam.exceptions.NoSuchEntityException:
            trust = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": {"Service": ["lambda.amazonaws.com", "states.amazonaws.com"]}, "Action": "sts:AssumeRole"}]}
            arn = iam.create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps(trust))["Role"]["Arn"]
            self._made(name, lambda: self.aws.client("iam").delete_role(RoleName=name))
            return arn

    def _provision_Function(self, logical_id: str, props: dict) -> None:
        spec = self.template.functions()[logical_id]
        environment = {k: str(v) for k, v in self.resolver.resolve(self.template.function_environment(logical_id)).items()}
        name = self._physical_name(logical_id)
        # The package sam uploaded (the twin's runs in-process: lambda_dispatch.py).
        function = self.aws.client("lambda").create_function(
            FunctionName=name, Runtime=self.template.globals.get("Function", {}).get("Runtime", "python3.11"),
            Role=self._twin_role(), Handler=spec.handler, Code=self.stack.code(spec.code_uri),
            Environment={"Variables": environment},
        )
        self._made(logical_id, lambda: self.aws.client("lambda").delete_function(FunctionName=name))
        self.dispatcher.bind(FunctionBinding(name=name, code_uri=spec.code_uri, handler=spec.handler, environment=environment))
        self._record(logical_id, name, Arn=function["FunctionArn"])
        for source in spec.events:
            if source.kind == "Schedule":
                props = self.resolver.resolve(source.properties)
                rule_name = self._physical_name(f"{logical_id}{source.name}")
                rule_arn = self.aws.client("events").put_rule(Name=rule_name, ScheduleExpression=props["Schedule"])["RuleArn"]
                self._made(rule_name, self._rule_deletion(rule_name, "default"))
                self._record(f"{logical_id}{source.name}", rule_name, Arn=rule_arn)
                self.function_schedules[source.name] = {"schedule": props["Schedule"], "function": name,
                                                        "logical_id": f"{logical_id}{source.name}"}
                continue
            if source.kind != "EventBridgeRule":
                raise NotImplementedError(f"function event source type {source.kind}")
            props = self.resolver.resolve(source.properties)
            rule_arn = self.aws.client("events").put_rule(Name=self._physical_name(f"{logical_id}{source.name}"),
                                                          EventBusName=props.get("EventBusName", "default"),
                                                          EventPattern=json.dumps(props["Pattern"]))["RuleArn"]
            self._made(f"{logical_id}{source.name}", self._rule_deletion(self._physical_name(f"{logical_id}{source.name}"),
                                                                         props.get("EventBusName", "default")))
            self._record(f"{logical_id}{source.name}", self._physical_name(f"{logical_id}{source.name}"), Arn=rule_arn)
            self.function_rules[source.name] = {"pattern": props["Pattern"], "bus": props.get("EventBusName", "default"),
                                                "function": name, "dlq": props.get("DeadLetterConfig", {}).get("Arn"),
                                                "logical_id": f"{logical_id}{source.name}", "target": logical_id}

    def _rule_deletion(self, name: str, bus: str) -> Callable[[], Any]:
        return lambda: self.aws.client("events").delete_rule(Name=name, EventBusName=bus)

    def _definition(self, logical_id: str) -> str:
        spec = self.template.state_machines()[logical_id]
        definition = spec.definition_path.read_text(encoding="utf-8")
        for key, value in self.resolver.resolve(spec.substitutions).items():
            definition = definition.replace("${" + key + "}", str(value))
        return definition

    def _provision_StateMachine(self, logical_id: str, props: dict) -> None:
        spec = self.template.state_machines()[logical_id]
        arn = self.aws.client("stepfunctions").create_state_machine(
            name=self._physical_name(logical_id, 80), definition=self._definition(logical_id),
            roleArn=self._twin_role(), type=props.get("Type", "STANDARD"),
        )["stateMachineArn"]
        self._made(logical_id, lambda: self.aws.client("stepfunctions").delete_state_machine(stateMachineArn=arn))
        self.state_machine_arns[logical_id] = arn
        self._record(logical_id, arn, Name=arn.rsplit(":", 1)[-1])
        events = self.aws.client("events")
        for source in spec.events:
            props = self.resolver.resolve(source.properties)
            rule_name = self._physical_name(f"{logical_id}{source.name}")
            if source.kind == "EventBridgeRule":
                rule_arn = events.put_rule(Name=rule_name, EventPattern=json.dumps(props["Pattern"]))["RuleArn"]
                self.rules[source.name] = {"kind": source.kind, "pattern": props["Pattern"], "state_machine": arn,
                                           "logical_id": f"{logical_id}{source.name}", "target": logical_id}
            elif source.kind in ("Schedule", "ScheduleV2"):
                schedule = props.get("Schedule") or props.get("ScheduleExpression")
                state = props.get("State", "ENABLED")
                rule_arn = events.put_rule(Name=rule_name, ScheduleExpression=schedule, State=state)["RuleArn"]
                self.rules[source.name] = {"kind": source.kind, "schedule": schedule, "enabled": state == "ENABLED",
                                           "input": json.loads(props.get("Input", "{}")), "state_machine": arn,
                                           "logical_id": f"{logical_id}{source.name}"}
            else:
                raise NotImplementedError(f"event source type {source.kind}")
            self._made(rule_name, self._rule_deletion(rule_name, "default"))
            self._record(f"{logical_id}{source.name}", rule_name, Arn=rule_arn)

    def _record(self, logical_id: str, ref: str, **attributes: str) -> None:
        self.resolver.physical_ids[logical_id] = ref
        for name, value in attributes.items():
            self.resolver.attributes[(logical_id, name)] = value

    # ------------------------------------------------------------------ EventBridge, as the twin plays it
    def output(self, name: str) -> Any:
        """A stack output, resolved from template.yaml's Outputs. KeyError for one its Condition leaves out
        (the host CA's in keys mode), as DescribeStacks would not list it."""
        spec = self.template.raw["Outputs"][name]
        if "Condition" in spec and not self.resolver.condition(spec["Condition"]):
            raise KeyError(f"the stack has no output {name}: its condition {spec['Condition']} is false")
        return self.resolver.resolve(spec["Value"])

    def publish(self, events: list[dict]) -> list[str]:
        """PutEvents: start one execution per (event, matching rule), as EventBridge would.
        Events EventBridge would refuse start nothing (see put_events, and `refused`)."""
        return self.put_events(events).started

    def put_events(self, events: list[dict]) -> PutEventsOutcome:
        """Like publish, with PutEvents' result entries: {"EventId"} for a delivered event,
        {"ErrorCode", "ErrorMessage"} for one EventBridge would refuse."""
        outcome = PutEventsOutcome()
        for event in events:
            failed = refusal(event, self.account_id, self.region)
            outcome.entries.append(failed or {"EventId": event.get("id") or str(uuid.uuid4())})
            if failed:
                self.refused.append((event, failed))
                continue
            for name, pattern, state_machine in self._event_rules():
                if pattern.matches_event(event):
                    outcome.started.append(self._start(state_machine, event, name, event.get("id")))
        return outcome

    def deliver_batch(self, events: list[dict]) -> list[tuple[dict, list[str]]]:
        """put_events for a burst that really arrives at once: Lambda invocations wait until the whole
        batch is delivered (the dispatcher's lock); otherwise the executions already started compete
        with the delivery for this process's CPU and 20 events take about two seconds to start.
        Returns each event with the executions it started."""
        with self.dispatcher.environment_lock:
            return [(event, self.put_events([event]).started) for event in events]

    def _event_rules(self) -> list[tuple[str, EventPattern, str]]:
        """The template's EventBridge rules, compiled once (moto's TestEventPattern API is a stub;
        its rule matcher, used for its own targets, is real)."""
        if self._compiled_rules is None:
            self._compiled_rules = [(name, EventPattern.load(json.dumps(rule["pattern"])), rule["state_machine"])
                                    for name, rule in self.rules.items() if rule["kind"] == "EventBridgeRule"]
        return self._compiled_rules

    def run_schedule(self, name: str = "Sweep") -> str:
        rule = self.rules[name]
        if not rule["enabled"]:
            raise RuntimeError(f"schedule {name} is disabled in this deployment")
        return self._start(rule["state_machine"], rule["input"], name, None)

    def run_function_schedule(self, name: str) -> Any:
        """EventBridge firing a scheduled rule whose target is a function (asynchronous invocation):
        its result, or the error that Lambda's retries would end in the dead-letter queue with."""
        rule = self.function_schedules[name]
        event = {"version": "0", "id": str(uuid.uuid4()), "detail-type": "Scheduled Event", "source": "aws.events",
                 "account": self.account_id, "region": self.region, "detail": {},
                 "time": (self.event_clock or (lambda: datetime.now(timezone.utc)))().isoformat(),
                 "resources": [self.resolver.attributes[(rule["logical_id"], "Arn")]]}
        record = self.dispatcher.invoke(rule["function"], event)
        if record.error_type:
            self.delivery_failures.append({"function": rule["function"], "error": record.error_type,
                                           "message": record.error_message})
            # Lambda's own retries of an asynchronous invocation end in the function's DeadLetterQueue, sent with its role.
            with acting_as(f"function:{rule['logical_id'][:-len(name)]}"):
                self.aws.client("sqs").send_message(QueueUrl=self.output("EventDeliveryDLQUrl"), MessageBody=json.dumps(event))
            raise RuntimeError(f"{rule['function']} failed: {record.error_type}: {record.error_message}")
        return record.result

    def start_repair(self, dry_run: bool = False, cluster: str | None = None) -> str:
        arn = self.output("LoginNodeSyncStateMachineArn")
        payload = {"cluster": cluster or self.cluster_name, "mode": "repair", "dryRun": dry_run}
        return self._start(arn, payload, "manual", None)

    def start_raw(self, payload: Any) -> str:
        """Start an execution with any input, as someone with states:StartExecution could."""
        return self._start(self.output("LoginNodeSyncStateMachineArn"), payload, "manual", None)

    def _start(self, state_machine_arn: str, payload: Any, rule: str, event_id: str | None) -> str:
        self.hosts.ensure_agents()  # HyperPod ran on_create on every node it provisioned
        # EventBridge names executions with a fresh UUID; moto would otherwise reuse "None".
        if self._sfn is None:  # one client: a burst starts 20 executions within a second
            self._sfn = self.aws.client("stepfunctions")
        rule_id = self.rules[rule].get("logical_id") if rule in self.rules else None
        with acting_as(f"rule:{rule_id}") if rule_id else contextlib.nullcontext():
            arn = self._sfn.start_execution(
                stateMachineArn=state_machine_arn, name=str(uuid.uuid4()), input=json.dumps(payload)
            )["executionArn"]
        self.routes.append(RouteRecord(rule=rule, event_id=event_id, execution_arn=arn))
        return arn

    def _agent_polls_before_its_report_is_read(self, function_name: str, event: Any) -> None:
        if function_name.endswith("CheckNodeReportFunction") and isinstance(event, dict):
            try:
                self.hosts.tick(str(event.get("instanceId")))
            except Exception:  # a crashing agent must not look like a failing Lambda: keep it for the test
                self.agent_errors.append(traceback.format_exc())

    def deliver_to_functions(self, bus: str, entry: dict) -> None:
        """EventBridge delivering one PutEvents entry to the function targets whose rule matches."""
        event = {"version": "0", "id": str(uuid.uuid4()), "detail-type": entry.get("DetailType"),
                 "source": entry.get("Source"), "account": self.account_id, "time": (self.event_clock or (lambda: datetime.now(timezone.utc)))().isoformat(),
                 "region": self.region, "resources": entry.get("Resources", []), "detail": json.loads(entry.get("Detail") or "{}")}
        for rule in self.function_rules.values():
            if rule["bus"] == bus and EventPattern.load(json.dumps(rule["pattern"])).matches_event(event):
                record = self.dispatcher.invoke(rule["function"], event)
                if record.error_type:
                    # Lambda's async retries end in the function's dead-letter queue (EventDeliveryDLQ).
                    self.delivery_failures.append({"function": rule["function"], "error": record.error_type,
                                                   "message": record.error_message})
                    if rule["dlq"]:
                        with acting_as(f"events.amazonaws.com@{self.resolver.attributes[(rule['logical_id'], 'Arn')]}"):
                            self.aws.client("sqs").send_message(QueueUrl=self.output("EventDeliveryDLQUrl"),
                                                                MessageBody=json.dumps(event))

    def agents_poll(self) -> None:
        """Time passes on the login nodes: each node agent polls once (30 s on a real cluster)."""
        self.hosts.tick_all()

    # ------------------------------------------------------------------ observation
    def wait(self, execution_arns: list[str], timeout: float = 60) -> list[ExecutionResult]:
        """The executions' results once each has ended. Raises StuckExecutionError, naming the
        execution and its last state, as soon as moto's interpreter thread for one has died, or
        when `timeout` seconds (a bound far above a normal run) have passed."""
        sfn = self.aws.client("stepfunctions")
        began = time.monotonic()
        results = []
        for arn in execution_arns:
            while True:
                # While it runs, look at moto's execution object: a DescribeExecution every few
                # milliseconds (request parsing, IAM's check) would take the CPU the execution needs.
                if not self._still_running(arn):
                    described = sfn.describe_execution(executionArn=arn)
                    if described["status"] != "RUNNING":
                        break
                crash = self.interpreter_crashes.get(arn)
                elapsed = time.monotonic() - began
                if crash or elapsed > timeout:
                    raise StuckExecutionError(arn, self.last_state(arn), elapsed, timeout, crash)
                # Woken as the interpreter thread ends; the bound only covers an end that slips past it.
                self.execution_ends.of(arn).wait(0.25)
            results.append(ExecutionResult(
                arn=arn, name=arn.rsplit(":", 1)[-1], status=described["status"],
                error=described.get("error"), cause=described.get("cause"),
                input=json.loads(described.get("input", "null") or "null"),
                output=json.loads(described["output"]) if described.get("output") else None,
            ))
        return results

    def _still_running(self, execution_arn: str) -> bool:
        from moto.stepfunctions.parser.models import stepfunctions_parser_backends

        backend = stepfunctions_parser_backends[self.account_id][self.region]
        machine_arn = ":".join(execution_arn.split(":")[:-1]).replace(":execution:", ":stateMachine:")
        for machine in backend.state_machines:
            if machine.arn == machine_arn:
                execution = next((e for e in machine.executions if e.exec_arn == execution_arn), None)
                return execution is not None and execution.exec_status is not None and execution.status == "RUNNING"
        return False

    def wait_for_all(self, timeout: float = 60, raise_on_timeout: bool = True) -> list[ExecutionResult]:
        try:
            return self.wait([r.execution_arn for r in self.routes], timeout)
        except TimeoutError:
            if raise_on_timeout:
                raise
            return []

    def history(self, execution_arn: str) -> list[dict]:
        pages = self.aws.client("stepfunctions").get_paginator("get_execution_history").paginate(executionArn=execution_arn)
        return [e for page in pages for e in page["events"]]

    def last_state(self, execution_arn: str) -> str | None:
        """The state the execution entered last, from its history (None before the first)."""
        entered = [e for e in self.history(execution_arn) if e["type"].endswith("StateEntered")]
        return entered[-1]["stateEnteredEventDetails"]["name"] if entered else None

    def state_transitions(self, execution_arn: str) -> int:
        return sum(1 for e in self.history(execution_arn) if e["type"].endswith("StateEntered"))

    def target_group_arn(self) -> str:
        return self.output("TargetGroupArn")

    def targets(self) -> list[dict]:
        described = self.aws.client("elbv2").describe_target_health(TargetGroupArn=self.target_group_arn())
        return [
            {"ip": d["Target"]["Id"], "port": d["Target"]["Port"], "state": d["TargetHealth"]["State"]}
            for d in described["TargetHealthDescriptions"]
        ]

    def target_ips(self) -> list[str]:
        return sorted(t["ip"] for t in self.targets() if t["state"] != "draining")

    def login_truth(self) -> list[str]:
        """The IPs that should be registered: Running login nodes (straight from the simulator)
        that, when host identity checks are on, present the canonical host keys."""
        running = [n for n in self.sim.nodes(self.cluster_name, self.login_group) if n.status == "Running"]
        if self.resolver.parameters["HostIdentityMode"] == "keys":
            canonical = self.canonical_fingerprints()
            running = [n for n in running if self.presented_fingerprints(n.instance_id) == canonical]
        elif self.resolver.parameters["HostIdentityMode"] == "certificate":
            running = [n for n in running if self.certificate_verdict(n.instance_id).acceptable]
        return sorted(n.ip for n in running)

    def notifications(self) -> list[dict]:
        """Messages published to the stack's AlertTopic (read from a queue subscribed at start)."""
        sqs = self.aws.client("sqs")
        messages = []
        while batch := sqs.receive_message(QueueUrl=self._alert_queue, MaxNumberOfMessages=10).get("Messages", []):
            for message in batch:
                body = json.loads(message["Body"])
                messages.append({"subject": body.get("Subject"), "message": body.get("Message")})
                sqs.delete_message(QueueUrl=self._alert_queue, ReceiptHandle=message["ReceiptHandle"])
        self.notification_log.extend(messages)
        return messages

    def converged(self) -> bool:
        return self.target_ips() == self.login_truth()

    def deregister_by_hand(self, ip: str) -> None:
        """Someone 'fixes' the target group in the console."""
        self.aws.client("elbv2").deregister_targets(TargetGroupArn=self.target_group_arn(), Targets=[{"Id": ip, "Port": 22}])

    # ------------------------------------------------------------------ host identity
    def _node_by_instance(self, instance_id: str):
        return self.sim.cluster(self.cluster_name).nodes.get(instance_id)

    def _node_by_ip(self, ip: str):
        return next((n for n in self.sim.nodes(self.cluster_name) if n.ip == ip), None)

    def install_canonical_host_keys(self, bundle) -> dict[str, str]:
        """What the operator's `hpops host-keys generate|adopt|rotate` does."""
        return install_canonical_bundle(
            self.aws.client("secretsmanager"), self.aws.client("dynamodb"), self.output("HostIdentitySecretArn"),
            self.resolver.physical_ids["SyncStateTable"], self.cluster_name, bundle,
        )

    def canonical_fingerprints(self) -> dict[str, str]:
        secret = self.aws.client("secretsmanager").get_secret_value(SecretId=self.output("HostIdentitySecretArn"))
        return dict(_public_fingerprints(secret["SecretString"]))

    def presented_fingerprints(self, instance_id: str) -> dict[str, str]:
        """What the node's sshd presents (read from its key files)."""
        node = self._node_by_instance(instance_id)
        return {t: fingerprint(line) for t, line in self.hosts.presented_public_keys(node.ip, 22).items()}

    # certificate mode
    def install_host_certificate_authority(self, ca: HostCA) -> str:
        """What the operator's `hpops host-keys ca-generate` does."""
        self.host_ca = ca
        return install_certificate_authority(
            self.aws.client("secretsmanager"), self.aws.client("dynamodb"), self.output("HostCertificateAuthoritySecretArn"),
            self.resolver.physical_ids["SyncStateTable"], self.cluster_name, ca,
        )

    def certificate_policy(self) -> certificates.CertificatePolicy:
        env = self.resolver.resolve(self.template.function_environment("SignHostCertificatesFunction"))
        return certificates.CertificatePolicy.from_strings(
            env["HOST_CERTIFICATE_PRINCIPALS"], int(env["HOST_CERTIFICATE_VALIDITY_DAYS"]), int(env["HOST_CERTIFICATE_RENEW_DAYS"]))

    def certificate_verdict(self, instance_id: str, now: datetime | None = None) -> verifier.VerificationResult:
        """Would a user with only the CA's @cert-authority line accept what this node presents?"""
        node = self._node_by_instance(instance_id)
        return certificates.verify_node_certificates(
            node.ip, 22, self.host_ca.fingerprint(), self.certificate_policy(), now or datetime.now(timezone.utc),
            self.hosts.presented_public_keys, self.hosts.presented_host_certificate,
        )

    def lease_item(self) -> dict | None:
        table = self.resolver.physical_ids["SyncStateTable"]
        item = self.aws.client("dynamodb").get_item(
            TableName=table, Key={"pk": {"S": f"cluster#{self.cluster_name}"}, "sk": {"S": "sync-lease"}}
        ).get("Item")
        return item
