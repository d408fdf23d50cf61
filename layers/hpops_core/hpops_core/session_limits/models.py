"""CloudTrail ``StartSession`` event (via EventBridge) as a Powertools Parser model.

Everything taken from the event is checked against tight patterns before use: the event body
is attacker-influenced (any principal allowed to call StartSession chooses the target string,
and the session id ends up in log lines, SNS text and a TerminateSession call).
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Literal

from aws_lambda_powertools.utilities.parser.models import EventBridgeModel
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


class SessionLimitError(Exception):
    """Base class for every named error of the session-limits feature."""


class MalformedSessionEvent(SessionLimitError, ValueError):
    """The event is not a successful, well-formed CloudTrail ``StartSession`` record."""


# --- patterns ---------------------------------------------------------------------------------

# Session ids look like "<role-session-or-user-name>-<hex>"; federated names bring '@' and '.'.
# API limit is 96 characters; the character set keeps them safe in logs and messages.
SESSION_ID_PATTERN = r"[A-Za-z0-9._@-]{1,96}"
SESSION_ID_RE = re.compile(rf"^{SESSION_ID_PATTERN}$")

# HyperPod cluster ids are 12 lowercase alphanumerics (last segment of the cluster ARN); accept a
# little more so that twins/tests with other lengths still work, but never separators.
CLUSTER_ID_PATTERN = r"[a-z0-9]{1,64}"
# SageMaker ClusterInstanceGroupName: [a-zA-Z0-9](-*[a-zA-Z0-9])*, max 63.
INSTANCE_GROUP_PATTERN = r"[A-Za-z0-9](?:-*[A-Za-z0-9]){0,62}"
# EC2 instance ids: i- followed by 8 or 17 hex digits.
INSTANCE_ID_PATTERN = r"i-[0-9a-f]{8}(?:[0-9a-f]{9})?"

# The instance id is anchored at the end, so a group name that itself contains hyphens
# ("login-b") still parses unambiguously: the regex backtracks to the last "-i-<hex>".
TARGET_RE = re.compile(
    rf"^sagemaker-cluster:(?P<cluster_id>{CLUSTER_ID_PATTERN})"
    rf"_(?P<group>{INSTANCE_GROUP_PATTERN})-(?P<instance_id>{INSTANCE_ID_PATTERN})$"
)
CLUSTER_ID_RE = re.compile(rf"^{CLUSTER_ID_PATTERN}$")
INSTANCE_GROUP_RE = re.compile(rf"^{INSTANCE_GROUP_PATTERN}$")

# IAM/STS principal ARNs as they appear in userIdentity.arn and DescribeSessions' Owner.
PRINCIPAL_ARN_RE = re.compile(
    r"^arn:aws[a-z-]*:(?:iam|sts)::[0-9]{12}:[A-Za-z0-9+=,.@_/-]{1,400}$"
)

CLUSTER_ARN_RE = re.compile(
    rf"^arn:aws[a-z-]*:sagemaker:[a-z0-9-]+:[0-9]{{12}}:cluster/(?P<cluster_id>{CLUSTER_ID_PATTERN})$"
)


def cluster_id_from_arn(cluster_arn: str) -> str:
    """``arn:aws:sagemaker:us-east-1:111122223333:cluster/abc123def456`` -> ``abc123def456``."""
    match = CLUSTER_ARN_RE.match(cluster_arn or "")
    if not match:
        raise MalformedSessionEvent(f"not a SageMaker HyperPod cluster ARN: {cluster_arn!r}")
    return match.group("cluster_id")


def login_target_prefix(cluster_id: str, login_group: str) -> str:
    """The Session Manager target prefix of a cluster's login-group nodes.

    Only a *prefix*: group ``login`` is also a prefix of group ``login-2``'s targets, so callers
    must confirm a full match with :func:`login_target_matches` after prefix filtering.
    """
    if not CLUSTER_ID_RE.match(cluster_id or ""):
        raise MalformedSessionEvent(f"invalid cluster id: {cluster_id!r}")
    if not INSTANCE_GROUP_RE.match(login_group or ""):
        raise MalformedSessionEvent(f"invalid instance group name: {login_group!r}")
    return f"sagemaker-cluster:{cluster_id}_{login_group}-"


def parse_target(target: str) -> tuple[str, str, str] | None:
    """Split a HyperPod session target into ``(cluster_id, group, instance_id)``; None if not one."""
    if not isinstance(target, str):
        return None
    match = TARGET_RE.match(target)
    if not match:
        return None
    return match.group("cluster_id"), match.group("group"), match.group("instance_id")


def login_target_matches(target: str, cluster_id: str, login_group: str) -> bool:
    """True only for a node of exactly ``login_group`` in exactly ``cluster_id``."""
    parsed = parse_target(target)
    return parsed is not None and parsed[0] == cluster_id and parsed[1] == login_group


# --- the model --------------------------------------------------------------------------------

_LENIENT = ConfigDict(extra="ignore", populate_by_name=True, str_strip_whitespace=False)


class SessionIssuer(BaseModel):
    model_config = _LENIENT

    type: str | None = None
    principalId: str | None = None
    arn: str | None = None
    accountId: str | None = None
    userName: str | None = None


class SessionContext(BaseModel):
    model_config = _LENIENT

    sessionIssuer: SessionIssuer | None = None
    attributes: dict[str, Any] | None = None


class UserIdentity(BaseModel):
    model_config = _LENIENT

    type: str = Field(max_length=64)
    principalId: str = Field(max_length=256)
    arn: str
    accountId: str | None = None
    sessionContext: SessionContext | None = None

    @field_validator("arn")
    @classmethod
    def _principal_arn(cls, value: str) -> str:
        if not PRINCIPAL_ARN_RE.match(value):
            raise ValueError("userIdentity.arn is not an IAM/STS principal ARN")
        return value


class StartSessionRequest(BaseModel):
    model_config = _LENIENT

    target: str
    documentName: str | None = Field(default=None, pattern=r"^[a-zA-Z0-9_\-.:/]{3,128}$")

    @field_validator("target")
    @classmethod
    def _hyperpod_target(cls, value: str) -> str:
        if not TARGET_RE.match(value):
            raise ValueError("requestParameters.target is not a sagemaker-cluster target")
        return value


class StartSessionResponse(BaseModel):
    model_config = _LENIENT

    sessionId: str
    # tokenValue/streamUrl are redacted by CloudTrail and never needed; ignored on purpose.

    @field_validator("sessionId")
    @classmethod
    def _session_id(cls, value: str) -> str:
        if not SESSION_ID_RE.match(value):
            raise ValueError("responseElements.sessionId has unexpected characters or length")
        return value


class StartSessionDetail(BaseModel):
    model_config = _LENIENT

    eventVersion: str | None = None
    eventSource: Literal["ssm.amazonaws.com"]
    eventName: Literal["StartSession"]
    eventTime: datetime
    eventID: str = Field(pattern=r"^[A-Za-z0-9-]{1,64}$")
    awsRegion: str | None = None
    userIdentity: UserIdentity
    requestParameters: StartSessionRequest
    responseElements: StartSessionResponse

    @model_validator(mode="before")
    @classmethod
    def _successful_call_only(cls, data: Any) -> Any:
        # A denied/failed StartSession is still recorded by CloudTrail (errorCode set,
        # responseElements null). No session exists, so there is nothing to count.
        if isinstance(data, dict):
            if data.get("errorCode") or data.get("errorMessage"):
                raise ValueError(f"StartSession call failed: errorCode={data.get('errorCode')!r}")
            if not data.get("responseElements"):
                raise ValueError("StartSession record has no responseElements (call did not succeed)")
        return data


class StartSessionEvent(EventBridgeModel):
    """EventBridge envelope around a CloudTrail ``StartSession`` record."""

    source: Literal["aws.ssm"]
    detail_type: Literal["AWS API Call via CloudTrail"] = Field(alias="detail-type")
    detail: StartSessionDetail

    @property
    def session_id(self) -> str:
        return self.detail.responseElements.sessionId

    @property
    def target(self) -> str:
        return self.detail.requestParameters.target

    @property
    def owner_arn(self) -> str:
        """The calling principal; the same string DescribeSessions reports as ``Owner``."""
        return self.detail.userIdentity.arn

    @property
    def event_time(self) -> datetime:
        return self.detail.eventTime

    @property
    def event_id(self) -> str:
        return self.detail.eventID


def parse_start_session(event: Any) -> StartSessionEvent:
    """Validate a raw EventBridge event; raise :class:`MalformedSessionEvent` on anything odd."""
    if isinstance(event, StartSessionEvent):
        return event
    if not isinstance(event, dict):
        raise MalformedSessionEvent(f"event must be a JSON object, got {type(event).__name__}")
    try:
        return StartSessionEvent.model_validate(event)
    except ValidationError as exc:
        # Keep the message short and free of input values (they may be hostile / huge).
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '<event>'}: {err['msg']}"
            for err in exc.errors(include_input=False, include_url=False)
        )
        raise MalformedSessionEvent(f"not a usable StartSession event: {problems}") from None
