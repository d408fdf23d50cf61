"""Run Lambda tasks in-process with the real handlers named in template.yaml.

moto runs Lambda code only in Docker, which these machines do not have. moto's Step Functions
interpreter invokes Lambda through moto's Lambda API, which ends in `LambdaFunction._invoke_lambda`;
we replace that one method so the invocation runs the real handler (from CodeUri + Handler) with
the function's environment from the template. Everything above it (the Invoke API, the payload
encoding, FunctionError handling, the state machine's Retry/Catch on the error name) is moto's.

Invocations run one at a time (a lock): handlers read their configuration from os.environ at
call time, and each function has its own environment.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any
from unittest import mock

from moto.awslambda.models import LambdaFunction


class _ThreadRoutedStdout(io.TextIOBase):
    """sys.stdout that sends a handler's prints (Powertools logs and EMF metrics) to its invocation.

    Powertools' Logger binds the stream it finds at import time, so this is installed once per
    process, before any handler module is imported, and passes everything else through.
    """

    def __init__(self) -> None:
        self.local = threading.local()

    def write(self, text: str) -> int:
        buffer = getattr(self.local, "buffer", None)
        return (buffer or sys.__stdout__).write(text)

    def flush(self) -> None:
        sys.__stdout__.flush()


_ROUTED_STDOUT = _ThreadRoutedStdout()
_MODULES: dict[Path, ModuleType] = {}  # handler modules are imported once per process, like a warm Lambda


@dataclass
class Invocation:
    function: str
    event: Any
    result: Any = None
    error_type: str | None = None
    error_message: str | None = None
    logs: str = ""
    seconds: float = 0.0


@dataclass
class FunctionBinding:
    name: str  # physical function name in moto
    code_uri: Path
    handler: str
    environment: dict[str, str]


@dataclass
class LambdaDispatcher:
    bindings: dict[str, FunctionBinding] = field(default_factory=dict)
    invocations: list[Invocation] = field(default_factory=list)
    base_environment: dict[str, str] = field(default_factory=dict)
    # Called with (function name, payload) before moto's Step Functions invokes a function.
    before_invoke: list = field(default_factory=list)
    _lock: threading.RLock = field(default_factory=threading.RLock)

    @property
    def environment_lock(self) -> threading.RLock:
        """Held while a handler runs with its own environment variables set in os.environ."""
        return self._lock

    def bind(self, binding: FunctionBinding) -> None:
        self.bindings[binding.name] = binding

    def _load(self, code_file: Path) -> ModuleType:
        if code_file not in _MODULES:
            module_name = "twin_lambda_" + "_".join(code_file.with_suffix("").parts[-2:])
            spec = importlib.util.spec_from_file_location(module_name, code_file)
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module
            with mock.patch.object(sys, "stdout", _ROUTED_STDOUT):  # Logger binds its stream here
                spec.loader.exec_module(module)
            _MODULES[code_file] = module
        return _MODULES[code_file]

    def handler_for(self, binding: FunctionBinding):
        module_name, function_name = binding.handler.rsplit(".", 1)
        module = self._load(binding.code_uri / f"{module_name}.py")
        return getattr(module, function_name)

    @contextmanager
    def _environment(self, variables: dict[str, str]) -> Iterator[None]:
        # Not mock.patch.dict: its exit clears os.environ and refills it, and meanwhile other threads
        # (moto's executions, the harness) create boto3 clients, which read the region and iterate
        # os.environ (proxy lookup): they saw a half-empty environment or a KeyError. Only the
        # variables that differ are set, and only those are put back (an added one is removed).
        wanted = self.base_environment | variables
        saved = {name: os.environ.get(name) for name in wanted if os.environ.get(name) != wanted[name]}
        os.environ.update({name: wanted[name] for name in saved})
        try:
            yield
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value

    current_function: str | None = None  # the function whose handler is running, for call attribution

    def invoke(self, function_name: str, event: Any) -> Invocation:
        binding = self.bindings[function_name]
        record = Invocation(function=binding.name, event=event)
        stdout = _ROUTED_STDOUT
        with self._lock, self._environment(binding.environment), mock.patch.object(sys, "stdout", stdout):
            handler = self.handler_for(binding)
            buffer = io.StringIO()
            # A handler's PutEvents can deliver to another function here, within its invocation
            # (EventBridge would call it a moment later): the caller's log and attribution come back after.
            outer_buffer, outer_function = getattr(stdout.local, "buffer", None), self.current_function
            stdout.local.buffer = buffer
            self.current_function = binding.name  # the lock makes this unambiguous
            started = time.perf_counter()
            try:
                record.result = handler(event, _LambdaContext(binding.name))
            except Exception as error:  # the real Lambda runtime reports any exception as a function error
                record.error_type = type(error).__name__
                record.error_message = str(error)
                buffer.write(traceback.format_exc())
            finally:
                record.seconds = time.perf_counter() - started
                stdout.local.buffer = outer_buffer
                self.current_function = outer_function
            record.logs = buffer.getvalue()
        self.invocations.append(record)
        return record

    @contextmanager
    def installed(self) -> Iterator[LambdaDispatcher]:
        """Route moto's Lambda invocations here for the duration of the block."""
        dispatcher = self

        def invoke_in_process(function: LambdaFunction, event: Any = None) -> tuple[str, bool, str]:
            payload = json.loads(event) if isinstance(event, str | bytes) else event
            for hook in dispatcher.before_invoke:
                hook(function.function_name, payload)
            record = dispatcher.invoke(function.function_name, payload)
            if record.error_type:
                body = {"errorType": record.error_type, "errorMessage": record.error_message}
                return json.dumps(body), True, record.logs
            return json.dumps(record.result), False, record.logs

        # botocore looks up HTTP proxies by iterating os.environ whenever a client is made (moto makes
        # one per Lambda task, from its own threads) while invocations here change os.environ: the
        # iteration could meet a variable removed mid-way (KeyError -> States.Runtime). moto answers
        # every call in-process, so there is no proxy to find.
        with mock.patch.object(LambdaFunction, "_invoke_lambda", invoke_in_process), \
                mock.patch("botocore.endpoint.get_environ_proxies", lambda url: {}):
            yield self


class _LambdaContext:
    """The parts of the Lambda context object that Powertools and our handlers read."""

    def __init__(self, function_name: str):
        self.function_name = function_name
        self.function_version = "$LATEST"
        # The account and region the twin plays (world.py sets both in the environment).
        self.invoked_function_arn = "arn:aws:lambda:{}:{}:function:{}".format(
            os.environ.get("AWS_REGION", "us-east-1"), os.environ.get("MOTO_ACCOUNT_ID", "123456789012"), function_name)
        self.memory_limit_in_mb = 256
        self.aws_request_id = str(uuid.uuid4())
        self.log_group_name = f"/aws/lambda/{function_name}"
        self.log_stream_name = "twin"
        self._deadline = time.monotonic() + 60

    def get_remaining_time_in_millis(self) -> int:
        return int(max(0.0, self._deadline - time.monotonic()) * 1000)
