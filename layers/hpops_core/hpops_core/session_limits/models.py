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

from hpops_core.common import validation


class SessionLimitError(Exception):
    """Base class for every named error of the session-limits feature."""


class MalformedSessionEvent(SessionLimitError, ValueError):
    """The event is not a successful, well-formed CloudTrail ``StartSession`` record."""


# --- patterns (the rules themselves live in hpops_core/common/validation.py) ----------------------------

# botocore: 1-96 characters, no pattern; ids start with the caller's session name, which may carry
# `+=,.@_-`. Only whitespace and control characters are refused (they would forge log lines).
SESSION_ID_PATTERN = validation.SESSION_ID_PATTERN
SESSION_ID_RE = validation.SESSION_ID_RE

CLUSTER_ID_PATTERN = validation.CLUSTER_ID_PATTERN
INSTANCE_GROUP_PATTERN = validation.INSTANCE_GROUP_PATTERN
# Targets name real nodes (botocore's ClusterNodeId), never an event's loose spelling.
INSTANCE_ID_PATTERN = validation.INSTANCE_ID_PATTERN

# The instance id is anchored at the end, so a group name that itself contains hyphens
# ("login-b") still parses unambiguously: the regex backtracks to the last "-i-<hex>".
TARGET_RE = re.compile(
    rf"\Asagemaker-cluster:(?P<cluster_id>{CLUSTER_ID_PATTERN})"
    rf"_(?P<group>{INSTANCE_GROUP_PATTERN})-(?P<instance_id>{INSTANCE_ID_PATTERN})\Z"
)
CLUSTER_ID_RE = validation.CLUSTER_ID_RE
INSTANCE_GROUP_RE = validation.INSTANCE_GROUP_RE

# IAM/STS principal ARNs as they appear in userIdentity.arn and DescribeSessions' Owner.
PRINCIPAL_ARN_RE = re.compile(
    r"\Aarn:aws[a-z-]*:(?:iam|sts)::[0-9]{12}:[A-Za-z0-9+=,.@_/-]{1,400}\Z"
)


def cluster_id_from_arn(cluster_arn: str) -> str:
    """``arn:aws:sagemaker:us-east-1:111122223333:cluster/abc123def456`` -> ``abc123def456``."""
    cluster_id = cluster_arn.rsplit("/", 1)[-1] if isinstance(cluster_arn, str) else None
    if not validation.is_cluster_arn(cluster_arn) or not validation.is_cluster_id(cluster_id):
        raise MalformedSessionEvent(f"not a SageMaker HyperPod cluster ARN: {validation.shown(cluster_arn)}")
    return cluster_id


def login_target_prefix(cluster_id: str, login_group: str) -> str:
    """The Session Manager target prefix of a cluster's login-group nodes.

    Only a *prefix*: group ``login`` is also a prefix of group ``login-2``'s targets, so callers
    must confirm a full match with :func:`login_target_matches` after prefix filtering.
    """
    try:
        validation.check_cluster_id(cluster_id)
        validation.check_instance_group(login_group)
    except validation.InvalidValue as exc:
        raise MalformedSessionEvent(str(exc)) from None
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
    return target_mismatch(target, cluster_id, login_group) is None


def target_mismatch(target: Any, cluster_id: str, login_group: str) -> str | None:
    """Why ``target`` is not a login node of this cluster (None when it is one). Names the group,
    never echoes an unrecognised target."""
    parsed = parse_target(target)
    if parsed is None:
        return "target does not look like sagemaker-cluster:<cluster-id>_<group>-<instance-id>"
    if parsed[0] != cluster_id:
        return f"target is on cluster id {parsed[0]}, not {cluster_id}"
    if parsed[1] != login_group:
        return f"target is on instance group {parsed[1]!r}, not the login group {login_group!r}"
    return None


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
        if not validation.is_session_id(value):
            raise ValueError("responseElements.sessionId is not 1-96 characters without spaces or control characters")
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
