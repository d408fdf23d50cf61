"""Where AWS is called: one place that makes boto3 clients.

Clients are made on first use (not at import) and reused across warm invocations. botocore's
`standard` retry mode handles throttling and transient 5xx with jittered backoff; what still
fails after that becomes TransientAwsError, which the state machine retries with its own backoff.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from contextlib import contextmanager

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError, ConnectionError as BotocoreConnectionError

from hpops_core.common.errors import TransientAwsError

RETRY_CONFIG = Config(
    retries={"mode": "standard", "max_attempts": 6},
    connect_timeout=5,
    read_timeout=20,
)

THROTTLING_CODES = frozenset(
    {"Throttling", "ThrottlingException", "ThrottledException", "RequestLimitExceeded",
     "TooManyRequestsException", "ProvisionedThroughputExceededException", "RequestThrottled",
     "ServiceUnavailable", "InternalError", "InternalFailure", "InternalServerError"}
)


@functools.cache
def client(service: str):
    return boto3.client(service, config=RETRY_CONFIG)


def reset_clients() -> None:
    """Forget cached clients (the local twin calls this when it starts a new world)."""
    client.cache_clear()


@contextmanager
def transient_errors_named(operation: str) -> Iterator[None]:
    """Re-raise throttling/5xx that outlived botocore's retries as TransientAwsError."""
    try:
        yield
    except ClientError as error:
        code = error.response.get("Error", {}).get("Code", "")
        status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        if code in THROTTLING_CODES or status >= 500:
            raise TransientAwsError(f"{operation}: {code or status}") from error
        raise
    except BotocoreConnectionError as error:
        raise TransientAwsError(f"{operation}: {type(error).__name__}") from error


def start_named_execution(state_machine_arn: str, name: str, payload: dict) -> bool:
    """Start an execution under a deterministic name: True when Step Functions took it (a new one, or
    the same one still running: StartExecution with a running standard execution's name and input
    returns it); False when one of that name has ended (ExecutionAlreadyExists: already checked)."""
    try:
        with transient_errors_named("states:StartExecution"):
            client("stepfunctions").start_execution(stateMachineArn=state_machine_arn, name=name,
                                                    input=json.dumps(payload, sort_keys=True))
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") == "ExecutionAlreadyExists":
            return False
        raise
    return True
