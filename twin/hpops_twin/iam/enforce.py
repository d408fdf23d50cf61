"""IAM enforcement at the twin's boundary: every request our code sends is allowed or denied as IAM would.

Where: moto's in-process mock is botocore's `before-send` handler (BotocoreStubber); the same
place faults.py injects faults. `IamEnforcer` wraps it: a request from a principal (below) is
mapped to its IAM checks (operations.py), each decided against the principal's policies
(principals.py, from template.yaml); a denied request never reaches moto, and botocore gets the
service's own AccessDenied answer on the wire (per protocol), so retries, Step Functions'
Retry/Catch and the CLI's errors see what AWS would send.

Who is asking is a thread-local stack of principals, pushed where our code starts running: a
Lambda handler (the dispatcher), a node agent's tick, a state machine's execution (moto runs it
on its own threads, which inherit the stack of the thread that started them), a rule starting an
execution, EventBridge sending a failed event to the DLQ. Requests outside any principal are the
harness's own (building the world, looking at it) and are not checked. The operator CLI's tests
use `policy_enforced`: the policy `hpops iam-policy` prints, checked the same way.

Every decision is cached per (principal, action, resource, context): the suite makes thousands.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any
from unittest import mock
from urllib.parse import parse_qs, unquote, urlsplit

from botocore.awsrequest import AWSResponse
from moto.core.botocore_stubber import BotocoreStubber, MockRawResponse
from moto.stepfunctions.parser.backend.execution_worker import ExecutionWorker

from hpops_twin.iam.evaluate import Decision, TwinIamError, decide
from hpops_twin.iam.operations import Check, Lookup, checks
from hpops_twin.iam.principals import deployer_policies, principal_policies

# botocore service id -> (wire protocol, the AccessDenied error code that service sends)
PROTOCOLS: dict[str, tuple[str, str]] = {
    "elastic-load-balancing-v2": ("query", "AccessDenied"),
    "sns": ("query", "AuthorizationError"),
    "iam": ("query", "AccessDenied"),
    "cloudformation": ("query", "AccessDenied"),
    "cloudwatch": ("query", "AccessDenied"),
    "ec2": ("ec2", "UnauthorizedOperation"),
    "lambda": ("rest-json", "AccessDeniedException"),
    "sqs": ("json", "AccessDenied"),
    "s3": ("rest-xml", "AccessDenied"),
}
QUERY_NAMESPACES = {
    "elastic-load-balancing-v2": "http://elasticloadbalancing.amazonaws.com/doc/2015-12-01/",
    "sns": "http://sns.amazonaws.com/doc/2010-03-31/",
    "iam": "https://iam.amazonaws.com/doc/2010-05-08/",
    "cloudformation": "http://cloudformation.amazonaws.com/doc/2010-05-15/",
    "cloudwatch": "http://monitoring.amazonaws.com/doc/2010-08-01/",
}
EVENTS_SERVICE = "events.amazonaws.com"
OPERATOR = "operator"
DEPLOYER = "deployer"
SERVICE_ROLE = "cloudformation-service-role"


# Every enforcer of this process adds here: what a whole test run exercised and refused.
SUITE_EXERCISED: Counter = Counter()
SUITE_DENIALS: list = []


@dataclass(frozen=True)
class Denial:
    principal: str
    service: str
    operation: str
    action: str
    resource: str
    reason: str

    def __str__(self) -> str:
        return (f"AccessDenied: {self.principal} is not authorized to perform {self.action} on {self.resource} "
                f"({self.service} {self.operation}; {self.reason})")


def request_parameters(service: str, request: Any) -> dict:
    """The API parameters of a request as sent on the wire (JSON, query or Lambda's REST path)."""
    body = request.body
    text = body.decode("utf-8", errors="replace") if isinstance(body, bytes) else (body or "")
    if hasattr(body, "read"):
        text = ""
    params: dict = {}
    if text.startswith("{"):
        parsed = json.loads(text)
        params = parsed if isinstance(parsed, dict) else {}
    elif text:
        for key, values in parse_qs(text, keep_blank_values=True).items():
            head, _, rest = key.partition(".")
            if rest.startswith("member.") and rest.count(".") == 1:
                params.setdefault(head, []).append(values[0])  # Names.member.1 -> Names[0]
            else:
                params[key] = values[0]
    if service == "s3":
        return params | _s3_location(request.url)
    if service == "lambda":
        path = request.url.split("://", 1)[-1].split("/", 1)[-1].split("?", 1)[0]
        parts = [unquote(p) for p in path.split("/")]
        if "functions" in parts[:-1]:  # CreateFunction posts to .../functions and names it in the body
            params["FunctionName"] = parts[parts.index("functions") + 1]
    return params


def _s3_location(url: str) -> dict:
    """S3's Bucket and Key are in the URL: virtual-hosted (bucket.s3[.region].amazonaws.com/key) or path style."""
    parts = urlsplit(url)
    host, path = parts.hostname or "", unquote(parts.path).lstrip("/")
    if ".s3." in host:
        bucket, key = host.split(".s3.", 1)[0], path
    else:
        bucket, _, key = path.partition("/")
    return {"Bucket": bucket, "Key": key} if key else {"Bucket": bucket}


def denied_response(url: str, service: str, denial: Denial, method: str = "POST") -> AWSResponse:
    protocol, code = PROTOCOLS.get(service, ("json", "AccessDeniedException"))
    request_id = str(uuid.uuid4())
    message = (f"User: {denial.principal} is not authorized to perform: {denial.action} on resource: "
               f"{denial.resource} because {denial.reason}")
    if protocol == "query":
        body = (f'<ErrorResponse xmlns="{QUERY_NAMESPACES[service]}"><Error><Type>Sender</Type><Code>{code}</Code>'
                f"<Message>{message}</Message></Error><RequestId>{request_id}</RequestId></ErrorResponse>")
        headers = {"Content-Type": "text/xml", "x-amzn-RequestId": request_id}
    elif protocol == "rest-xml":
        # An answer to HEAD has no body: botocore sees a bare 403, as from S3.
        body = "" if method == "HEAD" else (f"<Error><Code>{code}</Code><Message>{message}</Message>"
                                            f"<RequestId>{request_id}</RequestId></Error>")
        headers = {"Content-Type": "application/xml", "x-amz-request-id": request_id}
    elif protocol == "ec2":
        body = (f"<Response><Errors><Error><Code>{code}</Code><Message>{message}</Message></Error></Errors>"
                f"<RequestID>{request_id}</RequestID></Response>")
        headers = {"Content-Type": "text/xml"}
    elif protocol == "rest-json":
        body = json.dumps({"Type": "User", "Message": message})
        headers = {"Content-Type": "application/json", "x-amzn-RequestId": request_id, "x-amzn-ErrorType": code}
    else:
        body = json.dumps({"__type": code, "message": message})
        headers = {"Content-Type": "application/x-amz-json-1.1", "x-amzn-RequestId": request_id,
                   "x-amzn-ErrorType": code, "x-amzn-query-error": f"{code};Sender"}
    return AWSResponse(url, 403 if protocol != "json" or service == "sqs" else 400, headers, MockRawResponse(body))


def caller_variables() -> dict[str, tuple[str, ...]]:
    """The policy variables of whoever the default credentials are (IAM's aws:username for an IAM user,
    aws:userid for every caller: an assumed role's is ROLEID:session-name)."""
    import boto3

    identity = boto3.client("sts").get_caller_identity()  # needs no permission
    found = {"aws:userid": (identity["UserId"],)}
    if ":user/" in identity["Arn"]:
        found["aws:username"] = (identity["Arn"].rsplit("/", 1)[-1],)
    return found


class _Principals(threading.local):
    def __init__(self) -> None:
        self.stack: list[str] = []


_SCOPE = _Principals()
_REAL_THREAD_START = threading.Thread.start
_REAL_BOOTSTRAP_INNER = threading.Thread._bootstrap_inner  # type: ignore[attr-defined]


def _start_inheriting(thread: threading.Thread) -> None:
    thread._iam_principals = list(_SCOPE.stack)  # type: ignore[attr-defined]
    _REAL_THREAD_START(thread)


def _bootstrap_inheriting(thread: threading.Thread) -> None:
    _SCOPE.stack = list(getattr(thread, "_iam_principals", []))
    _REAL_BOOTSTRAP_INNER(thread)


@contextmanager
def acting_as(principal: str) -> Iterator[None]:
    """Requests sent inside the block (and by threads it starts) are `principal`'s."""
    _SCOPE.stack.append(principal)
    try:
        yield
    finally:
        _SCOPE.stack.pop()


def current_principal() -> str | None:
    return _SCOPE.stack[-1] if _SCOPE.stack else None


class IamEnforcer:
    def __init__(self, world: Any, policy_edit: Callable[[str, dict[str, dict]], None] | None = None):
        self.world = world
        self.policy_edit = policy_edit  # tests: change a principal's policies before they are used
        self.exercised: Counter = Counter()  # (principal, action, resource) -> allowed requests
        self.denials: list[Denial] = []
        self.errors: list[str] = []  # requests the twin could not map or evaluate
        self._decisions: dict[tuple, Decision] = {}
        self._principals: dict[str, dict[str, dict]] | None = None
        self._deployer_policies: dict[str, dict[str, dict]] | None = None
        self._resource_policies: dict[str, dict] = {}
        self._boundaries: dict[str, dict[str, dict]] = {}
        self._log_groups: dict[str, str] = {}
        self.operator_variables: dict[str, tuple[str, ...]] = {}  # the operator's ${aws:username}, ${aws:userid}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ policies
    def policies(self) -> dict[str, dict[str, dict]]:
        with self._lock:
            if self._principals is None:
                grants = principal_policies(self.world.template, self.world.resolver, self.policy_edit)
                self._principals, self._resource_policies = grants.principals, grants.resource_policies
                self._boundaries, self._log_groups = grants.boundaries, grants.log_groups
            return self._principals

    def forget_policies(self) -> None:
        """The stack's parameters changed: read the roles' policies from the template again, and decide again."""
        with self._lock:
            self._principals = None
            self._decisions = {}

    def _deployer(self) -> dict[str, dict[str, dict]]:
        with self._lock:
            if self._deployer_policies is None:
                deployer, service_role = deployer_policies(self.world.deployer_names)
                found = {DEPLOYER: deployer, SERVICE_ROLE: service_role}
                if self.policy_edit is not None:
                    for principal, policies in found.items():
                        self.policy_edit(principal, policies)
                self._deployer_policies = found
            return self._deployer_policies

    def _lookup(self) -> Lookup:
        world = self.world

        def cluster_arn(name: str) -> str:
            if name.startswith("arn:"):
                return name
            try:
                return world.sim.cluster(name).arn
            except KeyError:  # deleted: the stack's cluster keeps the ARN its parameter names
                if name == world.cluster_name:
                    return world.resolver.parameters["ClusterArn"]
                return f"arn:aws:sagemaker:{world.resolver.region}:{world.resolver.account_id}:cluster/{name}"

        return moto_lookup(world.resolver.region, world.resolver.account_id, cluster_arn)

    def decide(self, principal: str, check: Check) -> Decision:
        key = (principal, check.action, check.resource, check.context)
        decision = self._decisions.get(key)
        if decision is None:
            # The deployer's and the service role's policies name no resource of the stack: they are read
            # before the stack exists.
            policies = self._deployer() if principal in (DEPLOYER, SERVICE_ROLE) else self.policies()
            context = dict(check.context) | (self.operator_variables if principal == OPERATOR else {})
            if principal == EVENTS_SERVICE or principal.startswith(EVENTS_SERVICE + "@"):
                source_arn = principal.partition("@")[2]
                context |= {"aws:sourcearn": (source_arn,), "aws:sourceaccount": (self.world.resolver.account_id,)}
                resource_policy = self._resource_policies.get(check.resource, {})
                decision = decide(resource_policy, check.action, check.resource, context, principal=EVENTS_SERVICE)
            elif principal not in policies:
                raise TwinIamError(f"principal {principal} has no policies in the expanded template")
            else:
                decision = decide(policies[principal], check.action, check.resource, context)
                boundary = self._boundaries.get(principal)
                if decision.allowed and boundary is not None:
                    # A permissions boundary caps what the role's policies grant: both must allow.
                    capped = decide(boundary, check.action, check.resource, context)
                    if not capped.allowed:
                        decision = Decision(False, f"the permissions boundary {next(iter(boundary))} does not allow it "
                                                   f"({capped.reason})")
            self._decisions[key] = decision
        return decision

    def authorize(self, principal: str, service: str, operation: str, params: dict) -> Denial | None:
        for check in checks(service, operation, params, self._lookup()):
            decision = self.decide(principal, check)
            if not decision.allowed:
                denial = Denial(principal, service, operation, check.action, check.resource, decision.reason)
                self.denials.append(denial)
                SUITE_DENIALS.append(denial)
                return denial
            self.exercised[(principal, check.action, check.resource)] += 1
            SUITE_EXERCISED[(principal, check.action, check.resource)] += 1
        return None

    def check_log_delivery(self, principal: str) -> None:
        """Lambda writes a function's logs with the function's role: CreateLogStream and PutLogEvents
        on a stream of its log group. Without them the function still runs and its logs are lost,
        so a refusal here is a denial on record, not an error of the invocation."""
        self.policies()
        group = self._log_groups[principal]
        stream = (f"arn:aws:logs:{self.world.resolver.region}:{self.world.resolver.account_id}:log-group:{group}"
                  f":log-stream:twin")
        for action in ("logs:CreateLogStream", "logs:PutLogEvents"):
            decision = self.decide(principal, Check(action, stream))
            if not decision.allowed:
                denial = Denial(principal, "lambda", "(log delivery)", action, stream, decision.reason)
                self.denials.append(denial)
                SUITE_DENIALS.append(denial)
            else:
                self.exercised[(principal, action, stream)] += 1
                SUITE_EXERCISED[(principal, action, stream)] += 1

    @contextmanager
    def operator(self, policy: dict) -> Iterator[list[Denial]]:
        """Requests sent inside the block are the operator CLI's, allowed only by `policy` (what
        `hpops iam-policy` prints for the twin's stack). Yields the denials made inside the block."""
        self.policies()
        variables = caller_variables()
        with self._lock:
            self.operator_variables = variables
            self._principals[OPERATOR] = {"HpopsOperator": policy}
            # A test may hand a narrower policy next time: decisions under the last one do not hold.
            self._decisions = {key: d for key, d in self._decisions.items() if key[0] != OPERATOR}
        start = len(self.denials)
        denials: list[Denial] = []
        try:
            with acting_as(OPERATOR):
                yield denials
        finally:
            denials += self.denials[start:]
            with self._lock:
                self._principals.pop(OPERATOR, None)

    def principals_covered(self) -> set[str]:
        return {principal for principal, _, _ in self.exercised}

    # ------------------------------------------------------------------ installation
    @contextmanager
    def installed(self) -> Iterator[IamEnforcer]:
        enforcer = self
        real_stubber_call = BotocoreStubber.__call__
        real_invoke = self.world.dispatcher.invoke
        real_tick = self.world.hosts.tick
        real_execution_logic = ExecutionWorker._execution_logic

        def stubber_call(stubber: BotocoreStubber, event_name: str, request: Any, **kwargs: Any) -> Any:
            principal = current_principal()
            if principal is None or not stubber.enabled:
                return real_stubber_call(stubber, event_name, request, **kwargs)
            _, service, operation = event_name.split(".", 2)
            try:
                denial = enforcer.authorize(principal, service, operation, request_parameters(service, request))
            except TwinIamError as error:
                enforcer.errors.append(f"{principal}: {error}")
                raise
            if denial is not None:
                return denied_response(request.url, service, denial, request.method)
            return real_stubber_call(stubber, event_name, request, **kwargs)

        def invoke(function_name: str, event: Any) -> Any:
            principal = f"function:{enforcer.logical_id(function_name)}"
            enforcer.check_log_delivery(principal)
            with acting_as(principal):
                return real_invoke(function_name, event)

        def tick(instance_id: str) -> Any:
            with acting_as("agent"):
                return real_tick(instance_id)

        def execution_logic(worker: ExecutionWorker) -> None:
            name = worker._evaluation_details.state_machine_details.arn.rsplit(":", 1)[-1]
            if name not in {arn.rsplit(":", 1)[-1] for arn in enforcer.world.state_machine_arns.values()}:
                return real_execution_logic(worker)  # a test's own state machine, not the template's
            with acting_as(f"statemachine:{enforcer.logical_id(name)}"):
                return real_execution_logic(worker)

        with ExitStack() as stack:
            stack.enter_context(mock.patch.object(BotocoreStubber, "__call__", stubber_call))
            stack.enter_context(mock.patch.object(self.world.dispatcher, "invoke", invoke))
            stack.enter_context(mock.patch.object(self.world.hosts, "tick", tick))
            stack.enter_context(mock.patch.object(ExecutionWorker, "_execution_logic", execution_logic))
            stack.enter_context(mock.patch.object(threading.Thread, "start", _start_inheriting))
            stack.enter_context(mock.patch.object(threading.Thread, "_bootstrap_inner", _bootstrap_inheriting))
            yield self

    def logical_id(self, physical_name: str) -> str:
        """The template's logical id of a function or state machine from the twin's physical name."""
        for logical_id, physical in self.world.resolver.physical_ids.items():
            if physical == physical_name or (isinstance(physical, str) and physical.endswith(":" + physical_name)):
                return logical_id
        raise TwinIamError(f"no resource of the template is named {physical_name}")

    def report(self) -> dict:
        return {"triples": len(self.exercised), "principals": sorted(self.principals_covered()),
                "denials": [str(d) for d in self.denials], "errors": list(self.errors)}


def moto_lookup(region: str, account: str, cluster_arn: Callable[[str], str]) -> Lookup:
    """A Lookup over moto's own backends, for tests that run without a twin world."""

    def secret_key_arn(secret_arn: str) -> str | None:
        from moto.secretsmanager.models import secretsmanager_backends

        secret = secretsmanager_backends[account][region].secrets.get(secret_arn)
        key = getattr(secret, "kms_key_id", None) if secret is not None else None
        if not key:
            return None
        return key if key.startswith("arn:") else f"arn:aws:kms:{region}:{account}:key/{key}"

    def s3_object_exists(bucket: str, key: str) -> bool:
        from moto.s3.models import s3_backends

        found = s3_backends[account]["aws"].buckets.get(bucket)
        return found is None or key in found.keys

    return Lookup(region, account, cluster_arn, secret_key_arn, s3_object_exists)


@contextmanager
def policy_enforced(principal: str, policies: dict[str, dict], lookup: Lookup) -> Iterator[list[Denial]]:
    """Every request sent inside the block is `principal`'s and allowed only by `policies` (name -> document):
    the operator CLI's tests, against moto resources without a twin world. Yields the denials."""
    real_stubber_call = BotocoreStubber.__call__
    denials: list[Denial] = []
    variables = caller_variables()

    def stubber_call(stubber: BotocoreStubber, event_name: str, request: Any, **kwargs: Any) -> Any:
        if not stubber.enabled:
            return real_stubber_call(stubber, event_name, request, **kwargs)
        _, service, operation = event_name.split(".", 2)
        for check in checks(service, operation, request_parameters(service, request), lookup):
            decision = decide(policies, check.action, check.resource, dict(check.context) | variables)
            if not decision.allowed:
                denial = Denial(principal, service, operation, check.action, check.resource, decision.reason)
                denials.append(denial)  # the caller's to judge: a test may remove an action on purpose
                return denied_response(request.url, service, denial, request.method)
            SUITE_EXERCISED[(principal, check.action, check.resource)] += 1
        return real_stubber_call(stubber, event_name, request, **kwargs)

    with acting_as(principal), mock.patch.object(BotocoreStubber, "__call__", stubber_call):
        yield denials
