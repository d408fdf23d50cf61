"""Per-user session limits, end to end in the twin: the CloudTrail rule and the sweep schedule from
template.yaml, the real ASL (statemachines/session_limits.asl.json), the real handlers
(functions/session_limits/, one module per function), and Session Manager played by
twin/hpops_twin/ssm_sessions.py.

Every assertion is about what users would see: which of their sessions are still open, which were
terminated, and what the AlertTopic said.
"""

from __future__ import annotations

import copy
import time
from dataclasses import replace

import pytest

from hpops_twin.template_model import TemplateModel
from hpops_twin.world import ENFORCING, TwinWorld

@pytest.fixture
def make_world():
    """A twin with some template parameters changed (as `sam deploy --parameter-overrides` would).

    Its account has Session Manager's Run As on (the twin's users carry SSMSessionRunAs tags), unless
    `preferences=None` (never configured: Run As off) or `preferences=(enabled, default user)`."""
    opened: list[TwinWorld] = []

    def make(preferences=(True, ""), **parameters: str) -> TwinWorld:
        template = TemplateModel()
        for name, value in (ENFORCING | parameters).items():
            template.raw["Parameters"][name]["Default"] = value
        world = TwinWorld(template=template, session_preferences=preferences)
        world.__enter__()
        opened.append(world)
        return world

    yield make
    for world in opened:
        world.__exit__(None, None, None)


@pytest.fixture
def world(make_world):
    return make_world()


def check(world: TwinWorld, started) -> list:
    """Route events (or take execution ARNs), wait, and return the results."""
    arns = started if isinstance(started, list) and all(isinstance(a, str) for a in started) else world.publish(started)
    return world.wait(arns, timeout=120)


def succeeded(results) -> list:
    failed = [(r.name, r.error, r.cause) for r in results if r.status != "SUCCEEDED"]
    assert not failed, failed
    return results


def report(result) -> dict:
    return result.output["enforcement"]["report"]


def open_sessions(world: TwinWorld, user: str, count: int):
    """`user` opens `count` sessions one after the other; each StartSession event is delivered
    and its execution finishes before the next session starts."""
    opened = []
    for _ in range(count):
        started = world.sessions.start_session(user)
        succeeded(check(world, [started.event]))
        opened.append(started)
    return opened


# ---------------------------------------------------------------------- the limit


def test_third_session_over_a_limit_of_two_ends_exactly_the_newest(world):
    first, second, third = open_sessions(world, "alice", 3)
    store = world.sessions.store

    assert store.status(first.session_id) == "Connected"
    assert store.status(second.session_id) == "Connected"
    assert store.status(third.session_id) == "Terminated"
    assert store.terminated_by_api() == [third.session_id], "exactly one TerminateSession, for the newest"
    assert [s.session_id for s in store.active(target_prefix=world.sessions.login_prefix())] == [first.session_id, second.session_id]

    alerts = world.sessions.alerts()
    assert len(alerts) == 1
    assert "alice" in alerts[0]["subject"]
    text = alerts[0]["message"]
    assert "User alice: limit 2, 3 active session(s); ended 1" in text
    assert f"{third.session_id} on login-{third.instance_id}" in text and "terminated" in text


def test_sessions_under_the_limit_are_left_alone_and_nobody_is_told(world):
    first, second = open_sessions(world, "bob", 2)
    assert world.sessions.store.status(first.session_id) == world.sessions.store.status(second.session_id) == "Connected"
    assert world.sessions.store.terminated_by_api() == []
    assert world.sessions.alerts() == []


def test_oldest_excess_policy_ends_the_oldest(make_world):
    world = make_world(SessionExcessPolicy="oldest")
    first, second, third = open_sessions(world, "alice", 3)
    store = world.sessions.store
    assert store.terminated_by_api() == [first.session_id]
    assert store.status(second.session_id) == store.status(third.session_id) == "Connected"


def test_per_user_override_raises_one_users_limit(make_world):
    world = make_world(SessionLimitOverrides='{"carol": 3}')
    open_sessions(world, "carol", 3)
    open_sessions(world, "dave", 3)
    ended = world.sessions.store.terminated_by_api()
    assert len(ended) == 1 and ended[0].startswith("dave-")


# ---------------------------------------------------------------------- idempotency


def test_duplicate_event_terminates_nothing_extra(world):
    store = world.sessions.store
    with store.stale_listings():  # DescribeSessions keeps listing the ended session as Connected
        first, second, third = open_sessions(world, "alice", 3)
        assert store.terminated_by_api() == [third.session_id]

        # alice closes her oldest session and opens a new one: she is at 2 again (second, fourth).
        store.end_by_user(first.session_id)
        fourth = world.sessions.start_session("alice")
        # EventBridge delivers the old StartSession event again, and the new one.
        results = succeeded(check(world, [third.event, third.event, fourth.event]))

    assert store.terminated_by_api() == [third.session_id], "the stale listing cost nobody a second session"
    assert store.status(second.session_id) == store.status(fourth.session_id) == "Connected"
    assert all(report(r)["endedCount"] == 0 for r in results)
    assert len(world.sessions.alerts()) == 1, "one notification for the one session ended"


def test_ended_sessions_are_recorded_with_a_ttl(world):
    *_, third = open_sessions(world, "alice", 3)
    table = world.resolver.physical_ids["SyncStateTable"]
    item = world.aws.client("dynamodb").get_item(
        TableName=table, Key={"pk": {"S": f"session#{world.cluster_name}"}, "sk": {"S": f"session#{third.session_id}"}}
    )["Item"]
    assert item["kind"]["S"] == "ended" and item["user"]["S"] == "alice"
    assert int(item["ttl"]["N"]) > int(time.time()) + 3600, "expires through the table's TTL, not soon"


# ---------------------------------------------------------------------- the sweep


def test_sweep_catches_a_session_whose_event_was_lost(world):
    first, second = open_sessions(world, "alice", 2)
    lost = world.sessions.start_session("alice")  # CloudTrail -> EventBridge never delivers this one
    assert world.sessions.store.status(lost.session_id) == "Connected"

    result = succeeded(check(world, [world.sessions.sweep()]))[0]
    assert report(result)["scope"] == "all"
    assert world.sessions.store.terminated_by_api() == [lost.session_id]
    assert world.sessions.store.status(first.session_id) == world.sessions.store.status(second.session_id) == "Connected"


def test_sweep_counts_a_user_reached_through_two_principals(world):
    """Two roles run as alice: each StartSession is checked against its own principal's sessions
    (cheap, never wrong, may under-count); the sweep sees alice's three sessions and ends one."""
    sessions = world.sessions
    open_sessions(world, "alice", 2)
    other = sessions.start_session("alice-admin", run_as="alice", role_name="hpops-user-alice-admin")
    result = succeeded(check(world, [other.event]))[0]
    assert report(result)["scope"] == "owner" and report(result)["endedCount"] == 0

    succeeded(check(world, [sessions.sweep()]))
    assert sessions.store.terminated_by_api() == [other.session_id], "the newest of alice's three"


def test_sweep_of_many_users_ends_only_the_excess(world):
    sessions = world.sessions
    for number in range(30):
        sessions.add_sessions(f"user{number:02d}", 2 + (number % 3 == 0))  # every third user has 3
    # Sessions elsewhere: worker nodes and another group are never counted.
    sessions.add_sessions("user00", 5, group="gpu")
    result = succeeded(check(world, [sessions.sweep()]))[0]
    ended = sessions.store.terminated_by_api()
    assert len(ended) == 10 and report(result)["endedCount"] == 10
    assert {s.split("-")[0] for s in ended} == {f"user{n:02d}" for n in range(0, 30, 3)}
    assert all(s.status == "Connected" for s in sessions.store.active(target_prefix=sessions.target("", "gpu")))


def test_dry_run_sweep_input_terminates_nothing(world):
    sessions = world.sessions
    sessions.add_sessions("alice", 3)
    result = succeeded(check(world, [sessions.start_check({"cluster": world.cluster_name, "mode": "sweep", "dryRun": True})]))[0]
    assert report(result)["dryRun"] is True and report(result)["plannedCount"] == 1
    assert sessions.store.terminated_by_api() == []
    assert len(sessions.store.active(target_prefix=sessions.login_prefix())) == 3
    assert "would end 1" in sessions.alerts()[0]["subject"]


# ---------------------------------------------------------------------- exemptions and dry run


def test_exempt_user_is_untouched(make_world):
    world = make_world(SessionExemptUsers="ops,backup")
    opened = open_sessions(world, "ops", 4)
    succeeded(check(world, [world.sessions.sweep()]))
    assert all(world.sessions.store.status(s.session_id) == "Connected" for s in opened)
    assert world.sessions.store.terminated_by_api() == []
    assert world.sessions.alerts() == []


def test_exempt_principal_pattern_is_untouched(make_world):
    world = make_world(SessionExemptPrincipals="arn:aws:sts::*:assumed-role/BreakGlass/*")
    opened = [world.sessions.start_session("oncall", role_name="BreakGlass", run_as="oncall") for _ in range(3)]
    succeeded(check(world, [s.event for s in opened]))
    succeeded(check(world, [world.sessions.sweep()]))  # an execution ARN, awaited on its own
    assert world.sessions.store.terminated_by_api() == []


def test_dry_run_deployment_terminates_nothing_and_reports_once(make_world):
    world = make_world(SessionLimitsDryRun="true")
    sessions = world.sessions
    opened = open_sessions(world, "alice", 3)
    succeeded(check(world, [sessions.sweep()]))
    succeeded(check(world, [sessions.sweep()]))
    # Even an explicit dryRun false cannot switch the deployment's dry run off.
    result = succeeded(check(world, [sessions.start_check({"cluster": world.cluster_name, "mode": "sweep", "dryRun": False})]))[0]

    assert report(result)["dryRun"] is True
    assert sessions.store.terminated_by_api() == []
    assert all(sessions.store.status(s.session_id) == "Connected" for s in opened)
    alerts = sessions.alerts()
    assert len(alerts) == 1, "reported once, not on every sweep"
    assert "would end 1" in alerts[0]["subject"] and "DRY RUN" in alerts[0]["message"]
    assert f"{opened[2].session_id} on login-{opened[2].instance_id}" in alerts[0]["message"]


# ---------------------------------------------------------------------- run as, as Session Manager applies it


def test_with_run_as_off_on_hyperpod_every_shell_is_root_nothing_ends_and_one_alert_says_why(make_world):
    """No preferences document (never configured): on a HyperPod node Session Manager connects as
    root, whatever the principals' SSMSessionRunAs tags say. Root is never limited: nothing ends,
    the output says why, and the operator is told once, not on every run; again when it turns on."""
    world = make_world(preferences=None)
    sessions = world.sessions
    opened = sessions.add_sessions("alice", 3) + sessions.add_sessions("bob", 1)
    first, second = (succeeded(check(world, [sessions.sweep()]))[0] for _ in range(2))

    assert sessions.store.terminated_by_api() == []
    assert all(sessions.store.status(s.session_id) == "Connected" for s in opened)
    for result in (first, second):
        out = report(result)
        assert out["usersOverLimit"] == [] and out["endedCount"] == 0 and out["limitsApply"] is False
        assert out["note"] == "Run As is off: sessions run as root, per-user limits cannot apply"
        assert out["runAs"].startswith("Run As is off: sessions run as root")
        assert out["unresolvedCount"] == 4
    assert (report(first)["runAsAlerted"], report(second)["runAsAlerted"]) == (True, False)
    alerts = sessions.alerts()
    assert len(alerts) == 1, "one alert per change of state"
    assert "Run As is off" in alerts[0]["subject"]
    assert "Run As is off: sessions run as root, per-user limits cannot apply" in alerts[0]["message"]

    world.save_session_preferences(True)
    back_on = report(succeeded(check(world, [sessions.sweep()]))[0])
    assert back_on["limitsApply"] is True and back_on["runAsAlerted"] is True
    assert sessions.store.terminated_by_api() == [opened[2].session_id], "alice's newest, now that limits apply"
    assert any("Run As is on again" in a["subject"] for a in sessions.alerts())


def test_run_as_default_user_counts_untagged_principals_together(make_world):
    world = make_world(preferences=(True, "shared"))
    sessions = world.sessions
    sessions.add_sessions("carol", 2, role_name="hpops-untagged-carol", tag=False)
    sessions.add_sessions("dave", 1, role_name="hpops-untagged-dave", tag=False)
    tagged = sessions.add_sessions("erin", 2)  # her role's SSMSessionRunAs tag outranks the default
    result = succeeded(check(world, [sessions.sweep()]))[0]
    over = report(result)["usersOverLimit"]
    assert [(u["user"], u["activeCount"]) for u in over] == [("shared", 3)]
    assert all(sessions.store.status(s.session_id) == "Connected" for s in tagged)
    assert len(sessions.store.terminated_by_api()) == 1


def test_port_forwarding_and_ssh_sessions_are_not_shells_and_never_end(world):
    sessions = world.sessions
    shells = sessions.add_sessions("alice", 2)
    tunnels = sessions.add_sessions("alice", 3)
    for record, document in zip(tunnels, ("AWS-StartPortForwardingSession", "AWS-StartSSHSession",
                                          "AWS-StartNonInteractiveCommand")):
        sessions.store.sessions[record.session_id] = replace(record, document_name=document)
    result = succeeded(check(world, [sessions.sweep()]))[0]
    assert sessions.store.terminated_by_api() == []
    assert all(sessions.store.status(s.session_id) == "Connected" for s in shells + tunnels)
    assert report(result)["notShellsCount"] == 3


def test_a_session_on_a_sibling_group_is_counted_as_not_on_login_nodes_and_left_alone(world):
    sessions = world.sessions
    sessions.add_sessions("alice", 2)
    sibling = sessions.add_sessions("alice", 1, group=f"{world.login_group}-2")[0]
    result = succeeded(check(world, [sessions.sweep()]))[0]
    assert report(result)["notOnLoginNodesCount"] == 1
    assert sessions.store.status(sibling.session_id) == "Connected"
    assert sessions.store.terminated_by_api() == []


def test_a_session_id_with_plus_equals_comma_is_limited_like_any_other(world):
    """Session ids start with the caller's session name, which may carry `+=,` (botocore allows any
    1-96 characters); such a StartSession used to fail the execution as malformed."""
    opened = [world.sessions.start_session("alice+ops=1,x", run_as="alice") for _ in range(3)]
    assert all(s.session_id.startswith("alice+ops=1,x-") for s in opened)
    succeeded(check(world, [s.event for s in opened]))
    assert world.sessions.store.terminated_by_api() == [opened[2].session_id]


# ---------------------------------------------------------------------- input that is not ours


def test_malformed_cloudtrail_event_fails_with_a_named_error_and_ends_nothing(world):
    sessions = world.sessions
    sessions.add_sessions("alice", 2)
    started = sessions.start_session("alice")  # alice is over the limit: a real check would end one
    broken = copy.deepcopy(started.event)
    broken["detail"]["responseElements"]["sessionId"] = "alice-1; rm -rf /"
    results = check(world, [broken])
    assert len(results) == 1, "the rule still matched: it does not look at the session id"
    assert results[0].status == "FAILED"
    assert results[0].error == "MalformedEventError"
    assert "responseElements.sessionId" in results[0].cause
    assert sessions.store.terminated_by_api() == []
    assert world.counter.calls["ssm.DescribeSessions"] == 0, "rejected before any AWS call"


def test_failed_start_session_call_starts_nothing(world):
    started = world.sessions.start_session("alice")
    denied = copy.deepcopy(started.event)
    denied["detail"]["errorCode"] = "AccessDenied"
    denied["detail"]["responseElements"] = None
    assert world.publish([denied]) == []


def test_event_for_another_cluster_matches_no_rule(world):
    started = world.sessions.start_session("alice")
    foreign = copy.deepcopy(started.event)
    foreign["detail"]["requestParameters"]["target"] = started.target.replace(world.sessions.cluster_id, "0123456789ab")
    assert world.publish([foreign]) == []
    worker = copy.deepcopy(started.event)
    worker["detail"]["requestParameters"]["target"] = world.sessions.target(started.instance_id, "gpu")
    assert world.publish([worker]) == []


def test_session_on_a_sibling_group_with_the_same_prefix_is_ignored(world):
    sessions = world.sessions
    sessions.add_sessions("alice", 2)
    sibling = sessions.start_session("alice", group=f"{world.login_group}-2")
    results = succeeded(check(world, [sibling.event]))
    assert results[0].output["request"]["ignored"] is True
    assert "instance group 'login-2'" in results[0].output["request"]["ignoredReason"]
    assert sessions.store.terminated_by_api() == []


def test_sweep_for_another_cluster_is_rejected(world):
    result = check(world, [world.sessions.start_check({"cluster": "someone-else", "mode": "sweep"})])[0]
    assert result.status == "FAILED" and result.error == "UnknownClusterError"


def test_malformed_configuration_fails_with_a_named_error(make_world):
    world = make_world(SessionLimitOverrides='{"alice": "lots"}')
    world.sessions.add_sessions("alice", 3)
    result = check(world, [world.sessions.sweep()])[0]
    assert result.status == "FAILED" and result.error == "ConfigurationError"
    assert "SESSION_LIMIT_OVERRIDES" in result.cause
    assert world.sessions.store.terminated_by_api() == []


# ---------------------------------------------------------------------- cost and robustness


def test_start_session_event_under_the_limit_costs_at_most_three_calls(world):
    sessions = world.sessions
    for number in range(20):  # a busy account: other users' sessions everywhere
        sessions.add_sessions(f"user{number:02d}", 2)
    started = sessions.start_session("alice")
    world.counter.reset()
    result = succeeded(check(world, [started.event]))[0]
    calls = dict(world.counter.calls)
    assert sum(calls.values()) <= 3, calls
    # One Query of each partition: the login nodes' SSH sessions count with the shells; the ledger.
    assert calls == {"ssm.DescribeSessions": 1, "dynamodb.Query": 2}, "no IAM, writes or SNS for a user under the limit"
    assert report(result)["scope"] == "owner"


def test_owner_filter_mismatch_falls_back_to_the_full_listing(world, monkeypatch):
    """If DescribeSessions' Owner filter wanted a different value than the caller ARN (the API
    reference does not say), the scoped listing misses the new session; enforcement then lists
    everything and still ends the right session."""
    from hpops_twin import ssm_sessions

    real = ssm_sessions._matches
    monkeypatch.setattr(ssm_sessions, "_matches", lambda s, key, value: False if key == "Owner" else real(s, key, value))
    world.sessions.add_sessions("alice", 2)
    third = world.sessions.start_session("alice")
    result = succeeded(check(world, [third.event]))[0]
    assert report(result)["scope"] == "all"
    assert world.sessions.store.terminated_by_api() == [third.session_id]


def test_describe_sessions_pages_and_filters_like_the_api(world):
    sessions = world.sessions
    sessions.add_sessions("alice", 450)
    ssm = world.aws.client("ssm")
    pages = list(ssm.get_paginator("describe_sessions").paginate(State="Active", PaginationConfig={"PageSize": 200}))
    assert [len(p["Sessions"]) for p in pages] == [200, 200, 50]
    first = pages[0]["Sessions"][0]
    assert ssm.describe_sessions(State="Active", Filters=[{"key": "SessionId", "value": first["SessionId"]}])["Sessions"] == [first]
    ssm.terminate_session(SessionId=first["SessionId"])
    assert ssm.describe_sessions(State="History")["Sessions"][0]["Status"] == "Terminated"
    with pytest.raises(ssm.exceptions.ClientError, match="MaxResults"):
        ssm.describe_sessions(State="Active", MaxResults=201)


def test_failed_termination_fails_the_execution_by_name_and_says_so(world):
    sessions = world.sessions
    first, second = open_sessions(world, "alice", 2)
    third = sessions.start_session("alice")
    sessions.store.failing_terminations.add(third.session_id)
    result = check(world, [third.event])[0]
    assert result.status == "FAILED" and result.error == "SessionTerminationFailed"
    assert third.session_id in result.cause
    assert sessions.store.status(third.session_id) == "Connected"
    alert = sessions.alerts()[-1]
    assert "FAILED" in alert["subject"] and "TERMINATION FAILED" in alert["message"]

    sessions.store.failing_terminations.clear()  # the next sweep retries it
    succeeded(check(world, [sessions.sweep()]))
    assert sessions.store.status(third.session_id) == "Terminated"


def test_duplicate_event_after_the_session_ended_costs_two_reads(world):
    *_, third = open_sessions(world, "alice", 3)
    world.counter.reset()
    result = succeeded(check(world, [third.event]))[0]
    assert report(result)["scope"] == "owner", "alice's other sessions show the Owner filter works"
    assert dict(world.counter.calls) == {"ssm.DescribeSessions": 1, "dynamodb.Query": 2}
    assert world.sessions.store.terminated_by_api() == [third.session_id]
