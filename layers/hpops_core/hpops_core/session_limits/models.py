"""CloudTrail ``StartSession`` event (via EventBridge) as a Powertools Parser model.

Everything taken from the event is checked against tight patterns before use: the event body
is attacker-influenced (any principal allowed to call StartSession chooses the target string,
and the session id ends up in log lines, SNS text and a TerminateSession call).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from aws_lambda_powertools.utilities.parser.models import EventBridgeModel
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from hpops_core.common import validation

from .errors import MalformedSessionEvent, SessionLimitError  # noqa: F401  (SessionLimitError: named from here by callers)
from .targets import PRINCIPAL_ARN_RE, TARGET_RE


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
