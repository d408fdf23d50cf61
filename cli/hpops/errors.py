"""What goes wrong for an operator, said in one line that names the problem and the fix.

Commands raise CliError for what they check themselves (files, arguments, a stack missing an
output); `hpops.main.main` turns a CliError, and the AWS SDK's and hpops_core's errors, into that
one line and exit status 2, never a traceback. One place, so every command says it the same way.
"""

from __future__ import annotations

import re

from botocore.exceptions import (
    ClientError,
    EndpointConnectionError,
    NoCredentialsError,
    NoRegionError,
    PartialCredentialsError,
    ProfileNotFound,
    SSOError,
    TokenRetrievalError,
)

from hpops_core.common.errors import HpopsError, TransientAwsError

# Exit status, the same for the same cause in every command: 0 all is well; EXIT_PROBLEM the command
# found a problem and named it (with its fix); EXIT_USAGE it could not tell or could not start.
EXIT_PROBLEM = 1
EXIT_USAGE = 2  # usage or setup error: the command could not tell (as `hpops cost` documents)

NO_REGION = "no AWS region: pass --region, or set AWS_REGION (or a region in your AWS profile)"
NO_CREDENTIALS = ("no AWS credentials found: run `aws configure` or `aws sso login`, "
                  "or set AWS_PROFILE to a profile that has them")
EXPIRED_CODES = frozenset({"ExpiredToken", "ExpiredTokenException"})
REJECTED_CODES = frozenset({"InvalidClientTokenId", "UnrecognizedClientException", "SignatureDoesNotMatch"})
# EC2 and SNS spell "access denied" their own way.
DENIED_CODES = frozenset({"UnauthorizedOperation", "AuthorizationError"})
# AWS names the IAM action in the message: "... is not authorized to perform: states:ListExecutions on ..."
ACTION_RE = re.compile(r"perform: ([A-Za-z0-9-]+:[A-Za-z0-9*]+)")
# A HEAD request's answer has no body: a refusal is a bare 403 naming no action. S3 also answers a
# missing object with 403 to a caller who may not list its bucket.
HEAD_OBJECT_REFUSED = ("access denied to s3:GetObject, or to s3:ListBucket for a missing object ({}): use a role "
                       "or profile allowed both on the bucket, or ask your AWS administrator to grant them")
MISSING_STACK_RE = re.compile(r"Stack with id (\S+) does not exist")
MAX_DETAIL = 300


class CliError(HpopsError):
    """A problem the operator can fix; the message says which and how, in one line."""


class NotCertificateMode(CliError):
    """A host CA command on a stack deployed in keys mode, which has no CA secret to write or read."""

    def __init__(self, stack_name: str) -> None:
        super().__init__(f"stack {stack_name} is not in certificate mode: it has no host CA secret (output "
                         "HostCertificateAuthoritySecretArn). Deploy it with --parameter-overrides "
                         "HostIdentityMode=certificate first, then run hpops host-keys ca-generate")


def one_line(text: str, limit: int = MAX_DETAIL) -> str:
    """Whitespace (newlines included) collapsed, cut at ``limit`` characters."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def detail(error: BaseException) -> str:
    """What AWS or the library said: `Operation: Code: Message` for an API error."""
    if isinstance(error, ClientError):
        info = error.response.get("Error", {})
        return one_line(f"{error.operation_name}: {info.get('Code', 'error')}: {info.get('Message', '')}".rstrip(": "))
    return one_line(f"{type(error).__name__}: {error}")


def explain(error: BaseException, region: str | None) -> str:
    """The one line for an error a command let through. ``region``: where the command looked."""
    if isinstance(error, CliError):
        return one_line(str(error), 1000)
    if isinstance(error, NoRegionError):
        return NO_REGION
    if isinstance(error, PartialCredentialsError):
        return (f"incomplete AWS credentials ({detail(error)}): set the missing value, or unset the others "
                "and use a profile (AWS_PROFILE)")
    if isinstance(error, NoCredentialsError):
        return NO_CREDENTIALS
    if isinstance(error, ProfileNotFound):
        return f"{detail(error)}: check AWS_PROFILE against ~/.aws/config"
    if isinstance(error, (TokenRetrievalError, SSOError)):
        return f"AWS credentials expired ({detail(error)}): run `aws sso login` (or renew them) and try again"
    if isinstance(error, EndpointConnectionError):
        return f"cannot reach AWS ({detail(error)}): check the network, and --region"
    if isinstance(error, ClientError):
        return _client_error(error, region)
    if isinstance(error, TransientAwsError):
        return f"AWS kept throttling or failing ({detail(error)}): try again in a minute"
    if isinstance(error, OSError) and error.filename is not None:
        return f"{error.filename}: {error.strerror or type(error).__name__}: check the path and its permissions"
    return detail(error)


def _client_error(error: ClientError, region: str | None) -> str:
    info = error.response.get("Error", {})
    code, message = str(info.get("Code", "")), str(info.get("Message", ""))
    if code in EXPIRED_CODES:
        return (f"AWS credentials expired ({detail(error)}): renew them (`aws sso login`, or new temporary "
                "credentials) and try again")
    if code in REJECTED_CODES:
        return f"AWS does not accept these credentials ({detail(error)}): check AWS_PROFILE and your keys"
    if code == "403" and error.operation_name == "HeadObject":
        return HEAD_OBJECT_REFUSED.format(detail(error))
    if code.startswith("AccessDenied") or code in DENIED_CODES:
        found = ACTION_RE.search(message)
        action = found.group(1) if found else error.operation_name
        return (f"access denied to {action} ({detail(error)}): use a role or profile allowed {action}, "
                "or ask your AWS administrator to grant it")
    missing = MISSING_STACK_RE.search(message) if code == "ValidationError" else None
    if missing:
        where = f" in {region}" if region else ""
        return (f"stack {missing.group(1)} not found{where} ({detail(error)}): check --stack-name, "
                "and --region (the region the stack was deployed to)")
    return detail(error)
