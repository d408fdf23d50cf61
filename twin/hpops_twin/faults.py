"""Fault injection for the chaos suite (chaos.py): AWS answering badly, Lambdas dying mid-call.

Where faults enter: moto's in-process mock is a `before-send` handler (BotocoreStubber, in
botocore's BUILTIN_HANDLERS, so every client has it). botocore calls every `before-send` handler
and uses the first response, so a second handler of our own could answer with an error but
moto would still carry out the request. `ChaosTransport` therefore wraps the stubber itself: for
a call it faults, moto is never reached, and botocore gets an `AWSResponse` carrying the error
the service would send (HTTP 400 throttling, HTTP 500/503) on the wire. botocore's own retry
logic (each client's configured retry mode, attempts and retry quota) then sees it as it would
on AWS. Throttled and 5xx requests are modelled as not processed, which is what throttling
always is and what 503 normally is.

Only our code is faulted: calls made while a Lambda handler runs (the world's dispatcher) or
while a node agent ticks (the world's simulated login nodes). The harness's own calls (reading
the target group, users starting sessions) and moto's Step Functions interpreter are never
faulted. Which code is running is a thread-local scope: handlers and agents run synchronously
on the thread that invoked them, and moto answers in-process on that same thread.

Every request our code sends that reaches moto is kept in `ChaosTransport.wire` (service,
operation, parameters, HTTP status, who sent it), so side effects can be counted where AWS
would count them, after botocore's retries.

    with ChaosTransport(world).installed() as chaos:
        with chaos.faults(rate=0.3, seed=7):
            ...
        chaos.injected          # Counter {(service, kind): n}
        chaos.executed("elastic-load-balancing-v2", "RegisterTargets")
"""

from __future__ import annotations

import json
import random
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any
from unittest import mock
from urllib.parse import parse_qs

from botocore.awsrequest import AWSResponse
from botocore.retries import standard as standard_retries
from moto.core.botocore_stubber import BotocoreStubber, MockRawResponse

# botocore service ids (hyphenized) the suite faults, with the throttling error code each one
# sends. Query-protocol services (ELBv2) say "Throttling"; JSON ones say "ThrottlingException".
FAULTED_SERVICES: dict[str, str] = {
    "sagemaker": "ThrottlingException",
    "elastic-load-balancing-v2": "Throttling",
    "ssm": "ThrottlingException",
    "secrets-manager": "ThrottlingException",
    "budgets": "ThrottlingException",
}
QUERY_PROTOCOL = {"elastic-load-balancing-v2": "http://elasticloadbalancing.amazonaws.com/doc/2015-12-01/"}

# Among injected faults: half throttling, half 5xx (split evenly between 500 and 503).
FAULT_KINDS = ("throttle", "throttle", "500", "503")

READ_PREFIXES = ("Describe", "List", "Get", "BatchGet")
READ_OPERATIONS = frozenset({"Query", "Scan"})


def is_mutating(operation: str) -> bool:
    """Anything but a read. DynamoDB UpdateItem/PutItem (the lease, the caches) count as writes."""
    return not operation.startswith(READ_PREFIXES) and operation not in READ_OPERATIONS


@dataclass(frozen=True)
class WireCall:
    """One request our code sent that reached the (emulated) service."""

    service: str
    operation: str
    params: dict
    status: int | None
    sender: str  # "lambda:<function name>" or "agent:<instance id>"
    at: datetime

    @property
    def mutating(self) -> bool:
        return is_mutating(self.operation)

    @property
    def ok(self) -> bool:
        return self.status is not None and self.status < 300


def _error_response(url: str, service: str, kind: str) -> AWSResponse:
    request_id = str(uuid.uuid4())
    if kind == "throttle":
        code, status, message, party = FAULTED_SERVICES[service], 400, "Rate exceeded", "Sender"
    elif kind == "500":
        code, status, message, party = "InternalFailure", 500, "We encountered an internal error. Please try again.", "Receiver"
    else:
        code, status, message, party = "ServiceUnavailable", 503, "Service is unavailable. Please try again.", "Receiver"
    if service in QUERY_PROTOCOL:
        body = (f'<ErrorResponse xmlns="{QUERY_PROTOCOL[service]}"><Error><Type>{party}</Type><Code>{code}</Code>'
                f"<Message>{message}</Message></Error><RequestId>{request_id}</RequestId></ErrorResponse>")
        headers = {"Content-Type": "text/xml", "x-amzn-RequestId": request_id}
    else:
        body = json.dumps({"__type": code, "message": message})
        headers = {"Content-Type": "application/x-amz-json-1.1", "x-amzn-RequestId": request_id,
                   "x-amzn-ErrorType": code}
    return AWSResponse(url, status, headers, MockRawResponse(body))


def _params(body: Any) -> dict:
    if body is None or hasattr(body, "read"):
        return {}
    text = body.decode("utf-8", errors="replace") if isinstance(body, bytes) else str(body)
    if text.startswith("{"):
        try:
            parsed = json.loads(text)
        except ValueError:
            return {}
        return parsed if isinstance(parsed, dict) else {}
    return {k: v[0] if len(v) == 1 else v for k, v in parse_qs(text, keep_blank_values=True).items()}


def lambda_timeout_error(name: str = "Sandbox.Timedout") -> type[Exception]:
    """An exception whose class name is the error type Lambda reports for a timed-out function.

    The dispatcher reports `type(error).__name__` as the invocation's errorType and moto's Step
    Functions uses the errorType as the error name, as Step Functions does with the Lambda
    service's answer for a function that ran out of time."""
    return type(name, (Exception,), {})


class _Scope(threading.local):
    def __init__(self) -> None:
        self.stack: list[str] = []


class ChaosTransport:
    def __init__(self, world: Any, services: dict[str, str] | None = None, backoff_scale: float = 1.0):
        self.world = world
        self.services = dict(services or FAULTED_SERVICES)
        # botocore's computed backoff is multiplied by this (1.0: real delays). Which calls are
        # retried, how often and the retry quota are botocore's own either way.
        self.backoff_scale = backoff_scale
        self.wire: list[WireCall] = []
        self.injected: Counter = Counter()  # (service, kind) -> faults sent instead of an answer
        self.offered: Counter = Counter()  # service -> requests from our code while faults were on
        self._scope = _Scope()
        self._lock = threading.Lock()
        self._rate = 0.0
        self._active = False
        self._rng = random.Random(0)
        # Each: (sender, service, operation) -> None, or raises to stop the calling code there.
        self._tripwires: list[Callable[[str, str, str], None]] = []

    # ------------------------------------------------------------------ installation
    @contextmanager
    def installed(self) -> Iterator[ChaosTransport]:
        transport = self
        real_stubber_call = BotocoreStubber.__call__
        real_invoke = self.world.dispatcher.invoke
        real_tick = self.world.hosts.tick
        real_delay = standard_retries.ExponentialBackoff.delay_amount

        def stubber_call(stubber: BotocoreStubber, event_name: str, request: Any, **kwargs: Any) -> Any:
            sender = transport.sender()
            if sender is None or not stubber.enabled:
                return real_stubber_call(stubber, event_name, request, **kwargs)
            _, service, operation = event_name.split(".", 2)
            for tripwire in list(transport._tripwires):
                tripwire(sender, service, operation)
            fault = transport._draw(service)
            if fault is not None:
                return _error_response(request.url, service, fault)
            response = real_stubber_call(stubber, event_name, request, **kwargs)
            call = WireCall(service, operation, _params(request.body), getattr(response, "status_code", None), sender,
                            datetime.now(timezone.utc))
            with transport._lock:
                transport.wire.append(call)
            return response

        def invoke(function_name: str, event: Any) -> Any:
            with transport.scoped(f"lambda:{function_name}"):
                return real_invoke(function_name, event)

        def tick(instance_id: str) -> Any:
            with transport.scoped(f"agent:{instance_id}"):
                return real_tick(instance_id)

        def delay_amount(backoff: Any, context: Any) -> float:
            return real_delay(backoff, context) * transport.backoff_scale

        with ExitStack() as stack:
            stack.enter_context(mock.patch.object(BotocoreStubber, "__call__", stubber_call))
            stack.enter_context(mock.patch.object(self.world.dispatcher, "invoke", invoke))
            stack.enter_context(mock.patch.object(self.world.hosts, "tick", tick))
            stack.enter_context(mock.patch.object(standard_retries.ExponentialBackoff, "delay_amount", delay_amount))
            yield self

    @contextmanager
    def scoped(self, sender: str) -> Iterator[None]:
        self._scope.stack.append(sender)
        try:
            yield
        finally:
            self._scope.stack.pop()

    def sender(self) -> str | None:
        return self._scope.stack[-1] if self._scope.stack else None

    # ------------------------------------------------------------------ faults
    @contextmanager
    def faults(self, rate: float, seed: int) -> Iterator[None]:
        """Each request of our code to a faulted service fails with probability `rate`."""
        with self._lock:
            self._rate, self._rng, self._active = rate, random.Random(seed), True
        try:
            yield
        finally:
            with self._lock:
                self._rate, self._active = 0.0, False

    def _draw(self, service: str) -> str | None:
        if service not in self.services:
            return None
        with self._lock:
            if not self._active:
                return None
            self.offered[service] += 1
            if self._rng.random() >= self._rate:
                return None
            kind = self._rng.choice(FAULT_KINDS)
            self.injected[(service, kind)] += 1
            return kind

    @contextmanager
    def lambda_times_out(self, function_suffix: str, service: str, operation: str,
                         error_name: str = "Sandbox.Timedout") -> Iterator[list[str]]:
        """The next run of the function ending in `function_suffix` is killed when it is about to
        send `operation`: the request is never sent and the invocation ends with `error_name`.
        Yields a list that receives the sender once the timeout has fired."""
        fired: list[str] = []
        error = lambda_timeout_error(error_name)

        def tripwire(sender: str, call_service: str, call_operation: str) -> None:
            if not fired and sender.endswith(function_suffix) and (call_service, call_operation) == (service, operation):
                fired.append(sender)
                raise error(f"RequestId: {uuid.uuid4()} Error: Task timed out after 60.00 seconds")

        self._tripwires.append(tripwire)
        try:
            yield fired
        finally:
            self._tripwires.remove(tripwire)

    # ------------------------------------------------------------------ reading
    def mark(self) -> int:
        return len(self.wire)

    def executed(self, service: str | None = None, operation: str | None = None, since: int = 0) -> list[WireCall]:
        with self._lock:
            calls = self.wire[since:]
        return [c for c in calls if (service is None or c.service == service) and (operation is None or c.operation == operation)]

    def mutations(self, since: int = 0) -> list[WireCall]:
        return [c for c in self.executed(since=since) if c.mutating]

    def injected_by_service(self) -> dict[str, dict[str, int]]:
        table: dict[str, dict[str, int]] = {s: {"throttle": 0, "500": 0, "503": 0, "offered": 0} for s in self.services}
        for (service, kind), count in self.injected.items():
            table[service][kind] += count
        for service, count in self.offered.items():
            table[service]["offered"] += count
        return table


def target_ids(call: WireCall) -> list[str]:
    """The IPs in a RegisterTargets/DeregisterTargets request (query protocol: Targets.member.N.Id)."""
    return [v for k, v in sorted(call.params.items()) if k.startswith("Targets.member.") and k.endswith(".Id")]
