"""Session Manager in the twin: the SSM session APIs moto lacks, and users who open sessions.

moto 5.2.1 has no ``StartSession``, ``DescribeSessions`` or ``TerminateSession``. While a world is
active, :meth:`SessionManagerTwin.installed` adds them to moto's SSM response class, backed by an
in-memory :class:`SessionStore`, so our Lambda code calls them through plain boto3 (and the world
counts those calls like any other):

* ``StartSession`` records a Connected session whose ``Owner`` is the *caller's* ARN, resolved
  from the request's credentials by moto's STS (an assumed role -> ``assumed-role/<role>/<name>``).
* ``DescribeSessions`` pages for real (``MaxResults`` 1-200, opaque ``NextToken``), honours
  ``State`` (Active = Connected/Connecting/Disconnected/Terminating, History = Terminated/Failed)
  and the documented filter keys (InvokedAfter/Before, Target, Owner, Status, SessionId, AccessType;
  exact matches, as on AWS).
* ``TerminateSession`` ends a session for good (Terminated, EndDate); ending an ended or unknown
  session succeeds, as the API documents no error for it.

:class:`SessionManagerTwin` plays the users: ``start_session("alice")`` creates alice's IAM role
(tagged ``SSMSessionRunAs=alice``) in moto, assumes it, calls ``StartSession`` on a login node
with alice's credentials and returns the CloudTrail ``StartSession`` EventBridge event that
``world.publish`` routes through the template's rule. Where AWS is eventually consistent, the
store can be told to lag (:meth:`SessionStore.stale_listings`).
"""

from __future__ import annotations

import base64
import itertools
import json
import secrets
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from typing import Any
from unittest import mock

import boto3
from moto.core.responses import ActionResult
from moto.sns.models import sns_backends
from moto.ssm.exceptions import SSMException
from moto.ssm.responses import SimpleSystemManagerResponse
from moto.sts.models import sts_backends

RUN_AS_TAG = "SSMSessionRunAs"
ACTIVE_STATUSES = frozenset({"Connected", "Connecting", "Disconnected", "Terminating"})
HISTORY_STATUSES = frozenset({"Terminated", "Failed"})
FILTER_KEYS = frozenset({"InvokedAfter", "InvokedBefore", "Target", "Owner", "Status", "SessionId", "AccessType"})
DEFAULT_MAX_RESULTS = 20


class ValidationException(SSMException):
    def __init__(self, message: str):
        super().__init__("ValidationException", message)


class InvalidFilterKey(SSMException):
    def __init__(self, message: str):
        super().__init__("InvalidFilterKey", message)


class InvalidNextToken(SSMException):
    def __init__(self) -> None:
        super().__init__("InvalidNextToken", "The specified token is not valid.")


@dataclass(frozen=True)
class SessionRecord:
    session_id: str
    target: str
    owner: str
    start_date: datetime
    status: str = "Connected"
    end_date: datetime | None = None
    document_name: str = "SSM-SessionManagerRunShell"
    reason: str | None = None

    def api(self) -> dict[str, Any]:
        record = {
            "SessionId": self.session_id, "Target": self.target, "Status": self.status, "StartDate": self.start_date,
            "DocumentName": self.document_name, "Owner": self.owner, "AccessType": "Standard",
        }
        if self.end_date:
            record["EndDate"] = self.end_date
        if self.reason:
            record["Reason"] = self.reason
        return record


@dataclass
class SessionStore:
    """Every session of one account and region, in start order."""

    sessions: dict[str, SessionRecord] = field(default_factory=dict)
    terminate_calls: list[str] = field(default_factory=list)  # every TerminateSession, in order
    failing_terminations: set[str] = field(default_factory=set)  # TerminateSession fails for these
    _lock: threading.RLock = field(default_factory=threading.RLock)
    _last_start: datetime | None = None
    _stale: dict[str, SessionRecord] | None = None  # what listings still show while lagging

    # ------------------------------------------------------------------ arranging
    def next_start_date(self) -> datetime:
        """Now, but strictly after the previous session: StartDate (millisecond precision on the
        wire) is what orders a user's sessions, and the twin starts them in quick succession."""
        with self._lock:
            now = datetime.now(timezone.utc)
            now = now.replace(microsecond=now.microsecond // 1000 * 1000)
            start = now if self._last_start is None or now > self._last_start else self._last_start + timedelta(milliseconds=1)
            self._last_start = start
            return start

    def add(self, target: str, owner: str, session_id: str | None = None, start_date: datetime | None = None,
            status: str = "Connected", name_hint: str = "user") -> SessionRecord:
        with self._lock:
            session_id = session_id or f"{name_hint}-{secrets.token_hex(9)[:17]}"
            if session_id in self.sessions:
                raise ValueError(f"duplicate session id {session_id}")
            record = SessionRecord(session_id, target, owner, start_date or self.next_start_date(), status)
            self.sessions[session_id] = record
            return record

    def end_by_user(self, session_id: str) -> None:
        """The user types `exit`: the session ends without any TerminateSession from us."""
        self._set_ended(session_id)

    def _set_ended(self, session_id: str) -> None:
        with self._lock:
            record = self.sessions[session_id]
            if record.status not in HISTORY_STATUSES:
                self.sessions[session_id] = replace(record, status="Terminated", end_date=datetime.now(timezone.utc))

    @contextmanager
    def stale_listings(self) -> Iterator[None]:
        """Until the block ends, DescribeSessions keeps showing sessions ended by TerminateSession
        as they were (AWS's listing lags a termination)."""
        with self._lock:
            self._stale = {}
        try:
            yield
        finally:
            with self._lock:
                self._stale = None

    # ------------------------------------------------------------------ reading
    def status(self, session_id: str) -> str:
        return self.sessions[session_id].status

    def active(self, owner_prefix: str | None = None, target_prefix: str | None = None) -> list[SessionRecord]:
        with self._lock:
            return [
                s for s in self.sessions.values() if s.status in ACTIVE_STATUSES
                and (owner_prefix is None or s.owner.startswith(owner_prefix))
                and (target_prefix is None or s.target.startswith(target_prefix))
            ]

    def terminated_by_api(self) -> list[str]:
        return list(dict.fromkeys(self.terminate_calls))

    # ------------------------------------------------------------------ the API
    def describe(self, state: str, filters: list[dict] | None, max_results: int | None, token: str | None) -> tuple[list[dict], str | None]:
        if state not in ("Active", "History"):
            raise ValidationException("State must be Active or History")
        if max_results is None:
            max_results = DEFAULT_MAX_RESULTS
        if not 1 <= int(max_results) <= 200:
            raise ValidationException("MaxResults must be between 1 and 200")
        filters = filters or []
        if len(filters) > 6:
            raise ValidationException("at most 6 filters")
        checks = []
        for item in filters:
            key, value = item.get("key"), item.get("value")
            if key not in FILTER_KEYS:
                raise InvalidFilterKey(f"invalid filter key {key}")
            if not isinstance(value, str) or not 1 <= len(value) <= 400:
                raise ValidationException(f"invalid value for filter {key}")
            checks.append((key, value))
        offset = 0
        if token:
            try:
                offset = int(json.loads(base64.b64decode(token))["offset"])
            except Exception:
                raise InvalidNextToken() from None
        wanted = ACTIVE_STATUSES if state == "Active" else HISTORY_STATUSES
        with self._lock:
            shown = [self._stale.get(s.session_id, s) if self._stale is not None else s for s in self.sessions.values()]
        matching = [s for s in shown if s.status in wanted and all(_matches(s, k, v) for k, v in checks)]
        page = matching[offset : offset + int(max_results)]
        following = offset + len(page)
        next_token = base64.b64encode(json.dumps({"offset": following}).encode()).decode() if following < len(matching) else None
        return [s.api() for s in page], next_token

    def terminate(self, session_id: str) -> None:
        with self._lock:
            self.terminate_calls.append(session_id)
            if session_id in self.failing_terminations:
                raise SSMException("InvalidParameters", f"session {session_id} cannot be terminated")
            if session_id not in self.sessions:
                return
            if self._stale is not None and session_id not in self._stale:
                self._stale[session_id] = self.sessions[session_id]
            self._set_ended(session_id)


def _matches(session: SessionRecord, key: str, value: str) -> bool:
    if key == "Target":
        return session.target == value
    if key == "Owner":
        return session.owner == value
    if key == "Status":
        return session.status == value
    if key == "SessionId":
        return session.session_id == value
    if key == "AccessType":
        return value == "Standard"
    when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    when = when if when.tzinfo else when.replace(tzinfo=timezone.utc)
    return session.start_date >= when if key == "InvokedAfter" else session.start_date < when


# ---------------------------------------------------------------------- moto response methods
_STORES: dict[tuple[str, str], SessionStore] = {}


def _store(response: SimpleSystemManagerResponse) -> SessionStore:
    return _STORES.setdefault((response.current_account, response.region), SessionStore())


def _describe_sessions(self: SimpleSystemManagerResponse) -> ActionResult:
    sessions, token = _store(self).describe(
        self._get_param("State"), self._get_param("Filters"), self._get_param("MaxResults"), self._get_param("NextToken")
    )
    result: dict[str, Any] = {"Sessions": sessions}
    if token:
        result["NextToken"] = token
    return ActionResult(result)


def _terminate_session(self: SimpleSystemManagerResponse) -> ActionResult:
    session_id = self._get_param("SessionId")
    if not isinstance(session_id, str) or not 1 <= len(session_id) <= 96:
        raise ValidationException("SessionId must be 1-96 characters")
    _store(self).terminate(session_id)
    return ActionResult({"SessionId": session_id})


def _start_session(self: SimpleSystemManagerResponse) -> ActionResult:
    target = self._get_param("Target")
    if not isinstance(target, str) or not 1 <= len(target) <= 400:
        raise ValidationException("Target must be 1-400 characters")
    _, caller_arn, _ = sts_backends[self.current_account][self.partition].get_caller_identity(self.get_access_key(), self.region)
    name = caller_arn.rsplit("/", 1)[-1]
    record = _store(self).add(target, caller_arn, name_hint=name)
    if self._get_param("Reason"):
        _store(self).sessions[record.session_id] = replace(record, reason=self._get_param("Reason"))
    return ActionResult({
        "SessionId": record.session_id,
        "TokenValue": secrets.token_urlsafe(24),
        "StreamUrl": f"wss://ssmmessages.{self.region}.amazonaws.com/v1/data-channel/{record.session_id}?role=publish_subscribe",
    })


# ---------------------------------------------------------------------- users and events
@dataclass(frozen=True)
class StartedSession:
    session_id: str
    user: str
    owner: str  # the principal ARN (DescribeSessions' Owner, CloudTrail's userIdentity.arn)
    target: str
    instance_id: str
    event: dict  # the CloudTrail StartSession record as EventBridge delivers it


class SessionManagerTwin:
    """The world's Session Manager: its session store, its users, their CloudTrail events."""

    def __init__(self, world: Any):
        # world: the TwinWorld that owns this; world.py imports this module, so it is not imported back.
        self.world = world
        self.store = SessionStore()
        self._roles: dict[str, str] = {}
        self._counter = itertools.count(1)

    @contextmanager
    def installed(self) -> Iterator[SessionManagerTwin]:
        key = (self.world.account_id, self.world.region)
        _STORES[key] = self.store
        patches = [
            mock.patch.object(SimpleSystemManagerResponse, name, function, create=True)
            for name, function in (("describe_sessions", _describe_sessions), ("terminate_session", _terminate_session),
                                   ("start_session", _start_session))
        ]
        for patch in patches:
            patch.start()
        try:
            yield self
        finally:
            for patch in reversed(patches):
                patch.stop()
            _STORES.pop(key, None)

    # ------------------------------------------------------------------ where sessions go
    @property
    def cluster_id(self) -> str:
        return str(self.world.resolver.parameters["ClusterArn"]).rsplit("/", 1)[-1]

    def target(self, instance_id: str, group: str | None = None) -> str:
        return f"sagemaker-cluster:{self.cluster_id}_{group or self.world.login_group}-{instance_id}"

    def login_prefix(self) -> str:
        return f"sagemaker-cluster:{self.cluster_id}_{self.world.login_group}-"

    def login_nodes(self) -> list[str]:
        world = self.world
        return sorted(n.instance_id for n in world.sim.nodes(world.cluster_name, world.login_group) if n.status == "Running")

    # ------------------------------------------------------------------ users
    def user_role(self, user: str, run_as: str | None = "", role_name: str | None = None) -> str:
        """The IAM role `user` assumes, tagged SSMSessionRunAs=<run_as> (default: the user; None: untagged)."""
        name = role_name or f"hpops-user-{user}"
        if name not in self._roles:
            iam = self.world.aws.client("iam")
            trust = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": {"AWS": "*"}, "Action": "sts:AssumeRole"}]}
            tags = [] if run_as is None else [{"Key": RUN_AS_TAG, "Value": run_as or user}]
            self._roles[name] = iam.create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps(trust), Tags=tags)["Role"]["Arn"]
        return self._roles[name]

    def start_session(self, user: str, instance_id: str | None = None, *, group: str | None = None,
                      run_as: str | None = "", role_name: str | None = None) -> StartedSession:
        """`user` assumes their role and runs `aws ssm start-session --target ...` on a login node
        (round-robin when none is named). Returns the session and its CloudTrail event."""

        role_arn = self.user_role(user, run_as=run_as, role_name=role_name)
        credentials = self.world.aws.client("sts").assume_role(RoleArn=role_arn, RoleSessionName=user)["Credentials"]
        as_user = boto3.session.Session(
            aws_access_key_id=credentials["AccessKeyId"], aws_secret_access_key=credentials["SecretAccessKey"],
            aws_session_token=credentials["SessionToken"], region_name=self.world.region,
        )
        if instance_id is None:
            nodes = self.login_nodes()
            instance_id = nodes[next(self._counter) % len(nodes)]
        target = self.target(instance_id, group)
        session_id = as_user.client("ssm").start_session(Target=target)["SessionId"]
        record = self.store.sessions[session_id]
        identity = as_user.client("sts").get_caller_identity()
        event = self.cloudtrail_event(session_id, target, identity["Arn"], identity["UserId"], role_arn, record.start_date)
        return StartedSession(session_id, user, identity["Arn"], target, instance_id, event)

    def add_sessions(self, user: str, count: int, *, role_name: str | None = None, instance_id: str | None = None,
                     group: str | None = None, target: str | None = None, tag: bool = True) -> list[SessionRecord]:
        """Sessions that already exist (no API call, no event): for sweeps, lost events and benches."""
        account_id = self.world.account_id

        role = role_name or f"hpops-user-{user}"
        if tag:
            self.user_role(user, role_name=role)
        owner = f"arn:aws:sts::{account_id}:assumed-role/{role}/{user}"
        nodes = self.login_nodes()
        return [
            self.store.add(target or self.target(instance_id or nodes[i % len(nodes)], group), owner, name_hint=user)
            for i in range(count)
        ]

    # ------------------------------------------------------------------ CloudTrail
    def cloudtrail_event(self, session_id: str, target: str, caller_arn: str, caller_user_id: str, role_arn: str,
                         when: datetime) -> dict:
        """The CloudTrail record of a successful StartSession, as EventBridge delivers it
        (shape of events/ssm-start-session.json)."""
        account_id, region = self.world.account_id, self.world.region

        stamp = when.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        return {
            "version": "0",
            "id": str(uuid.uuid4()),
            "detail-type": "AWS API Call via CloudTrail",
            "source": "aws.ssm",
            "account": account_id,
            "time": stamp,
            "region": region,
            "resources": [],
            "detail": {
                "eventVersion": "1.09",
                "userIdentity": {
                    "type": "AssumedRole",
                    "principalId": caller_user_id,
                    "arn": caller_arn,
                    "accountId": account_id,
                    "sessionContext": {
                        "sessionIssuer": {"type": "Role", "principalId": caller_user_id.split(":", 1)[0], "arn": role_arn,
                                          "accountId": account_id, "userName": role_arn.rsplit("/", 1)[-1]},
                        "attributes": {"creationDate": stamp, "mfaAuthenticated": "false"},
                    },
                },
                "eventTime": stamp,
                "eventSource": "ssm.amazonaws.com",
                "eventName": "StartSession",
                "awsRegion": region,
                "sourceIPAddress": "198.51.100.23",
                "userAgent": "aws-cli/2.22.4 md/command#ssm.start-session",
                "requestParameters": {"target": target},
                "responseElements": {
                    "sessionId": session_id,
                    "tokenValue": "Value hidden due to security reasons.",
                    "streamUrl": f"wss://ssmmessages.{region}.amazonaws.com/v1/data-channel/{session_id}?role=publish_subscribe",
                },
                "requestID": str(uuid.uuid4()),
                "eventID": str(uuid.uuid4()),
                "readOnly": False,
                "eventType": "AwsApiCall",
                "managementEvent": True,
                "recipientAccountId": account_id,
                "eventCategory": "Management",
            },
        }

    # ------------------------------------------------------------------ running the state machine
    def state_machine_arn(self) -> str:
        return self.world.output("SessionLimitsStateMachineArn")

    def sweep(self) -> str:
        """What the SessionSweep schedule starts."""
        return self.world.run_schedule("SessionSweep")

    def start_check(self, payload: Any) -> str:
        """start-execution on the SessionLimits state machine with any input."""
        return self.world._start(self.state_machine_arn(), payload, "manual", None)

    def alerts(self) -> list[dict]:
        """Messages published to the AlertTopic so far: {"subject", "message"}."""
        account_id, region = self.world.account_id, self.world.region

        topic = sns_backends[account_id][region].topics[self.world.output("AlertTopicArn")]
        return [{"subject": subject, "message": message} for _, message, subject, *_ in topic.sent_notifications]
