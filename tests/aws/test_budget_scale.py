"""The budget paths past the sizes that broke them: CheckUserSpend and SendUserAlerts fed stored data (moto).

250 users cross their limit in one sweep at month end: more than the ~220 whose alerts, returned in
the step's state, failed the execution after they were marked sent; more held users than the 4 KB
holds parameter could name. Every one is told, held, and released; a send that fails is sent again.
(The bench's scale section runs the same at 200 / 2,000 / 10,000 users.)
"""

from __future__ import annotations

import datetime as dt
import json
import os
from collections import Counter
from types import SimpleNamespace
from unittest import mock

import boto3
import pytest

from hpops_core.budget_guard import alert_outbox, spend_check
from hpops_core.budget_guard.config import UserSpendConfig
from hpops_core.budget_guard.guard import AlertDeliveryError
from hpops_core.budget_guard.holds import HoldsTooLarge
from hpops_core.node_channel import user_holds, user_holds_store
from hpops_twin.scale_budget_bench import (
    CLUSTER,
    GROUP,
    INSTANCE_TYPE,
    MONTH_END,
    NODES,
    RAISED_LIMIT_USD,
    STATE_LIMIT,
    TABLE,
    CallCount,
    NoBill,
    RecordingTopics,
    expected_spend,
    seed_month,
    stored_world,
    sweep,
    user_names,
)

USERS = 250
OLD_PARAMETER_LIMIT = 4096


@pytest.fixture(scope="module")
def crossed():
    """One crossing sweep, then one with the limit raised, on one stored month (read after, outside moto)."""
    topics, released = RecordingTopics(), RecordingTopics()
    with stored_world():
        names = user_names(USERS)
        windows = seed_month(names, MONTH_END, active=50, windows=2)
        check, send = sweep(MONTH_END, "arn:execution:crossing", CallCount(), topics, memory=False)
        answer = user_holds_store.read(TABLE, CLUSTER)
        queued = alert_outbox.count(TABLE, CLUSTER)
        user_topic = os.environ["USER_ALERT_TOPIC_ARN"]
        os.environ["USER_MONTHLY_BUDGET_USD"] = RAISED_LIMIT_USD
        release = sweep(MONTH_END + dt.timedelta(minutes=5), "arn:execution:raised", CallCount(), released, memory=False)
        after = user_holds_store.read(TABLE, CLUSTER)
    return SimpleNamespace(names=names, windows=windows, topics=topics, check=check, send=send, answer=answer, queued=queued,
                           user_topic=user_topic, release=release, released=released, after=after)


def test_every_user_crossing_at_once_is_told_and_the_step_state_stays_small(crossed):
    assert crossed.check["result"]["alertCount"] == 3 * USERS  # actual, projected, held: each user
    assert (crossed.send["sent"], crossed.queued) == (3 * USERS, 0)
    users = {m["MessageAttributes"]["user"]["StringValue"] for topic, m in crossed.topics.messages
             if topic == crossed.user_topic}
    assert users == set(crossed.names)
    assert len(crossed.topics.events) == 3 * USERS
    # The same alerts as a list in the step's state (as the step returned them before): over 256 KB.
    spend_alerts = [json.loads(e["Detail"]) for e in crossed.topics.events if json.loads(e["Detail"])["kind"] != "hold"]
    assert len(json.dumps(spend_alerts)) > STATE_LIMIT
    # Counts and the first rows only (holds.MAX_DECISION_ROWS): the same bound at any number of users.
    assert crossed.check["output"] < 64 * 1024 and crossed.send["output"] < 1024


def test_each_users_spend_is_what_the_stored_usage_makes_it(crossed):
    # 11 settled node-hours each in the running total, 0.1 for 50 users in each stored window, at $100/h.
    assert crossed.windows == 2
    assert crossed.check["result"]["usersUsd"] == expected_spend(USERS, 50, 2) == f"{(11 * USERS + 10) * 100:.2f}"


def test_every_held_user_reaches_the_controller_agent_past_the_old_4_kb_parameter(crossed):
    document = user_holds.parse_document(crossed.answer["value"])  # the agent's own parser
    assert document["users"] == sorted(crossed.names)
    assert len(user_holds.canonical_json(document)) > OLD_PARAMETER_LIMIT


def test_a_send_that_fails_stays_queued_and_the_next_try_sends_it():
    topics = RecordingTopics()
    with stored_world():
        seed_month(user_names(12), MONTH_END, active=0, windows=0)
        config = SimpleNamespace(alert_topic_arn=os.environ["ALERT_TOPIC_ARN"], user_topic_arn="",
                                 cluster_name=CLUSTER, state_table=TABLE)
        _check()
        topics.refuse = 2
        with pytest.raises(AlertDeliveryError, match="2 of 36 queued alert"):
            spend_check.send_queued_alerts(config, sns=topics, events=topics)
        assert alert_outbox.count(TABLE, CLUSTER) == 2
        assert spend_check.send_queued_alerts(config, sns=topics, events=topics)["sent"] == 2
        assert alert_outbox.count(TABLE, CLUSTER) == 0
        told = Counter(m["MessageAttributes"]["user"]["StringValue"] for _, m in topics.messages)
        assert set(told) == set(user_names(12)) and sum(told.values()) == 36


def test_a_holds_list_that_cannot_be_delivered_fails_the_step_by_name():
    with stored_world():
        seed_month(user_names(20), MONTH_END, active=0, windows=0)
        with mock.patch.object(user_holds_store, "MAX_DOCUMENT_BYTES", 200), pytest.raises(HoldsTooLarge):
            _check()
        assert user_holds_store.read(TABLE, CLUSTER) is None


def test_every_held_user_is_released_when_the_limit_is_raised(crossed):
    check, send = crossed.release
    assert (check["result"]["holdAlerts"], check["result"]["spendAlerts"], send["sent"]) == (USERS, 0, USERS)
    assert user_holds.parse_document(crossed.after["value"])["users"] == []
    assert {json.loads(e["Detail"])["transition"] for e in crossed.released.events} == {"released"}


def _check(owner: str = "arn:execution:one") -> dict:
    observed = {"InstanceGroups": [{"InstanceGroupName": GROUP, "InstanceType": INSTANCE_TYPE, "CurrentCount": NODES}]}
    return spend_check.check_user_spend(UserSpendConfig.from_env(), {"now": MONTH_END.isoformat()}, observed,
                                        ce=NoBill(), pricing=NoBill(), owner=owner)


def test_a_check_that_dies_between_chunks_queues_the_unmarked_alerts_again_and_each_is_sent_once():
    """Alerts are queued and marked a chunk at a time (the step holds one chunk, not every user's): a
    check that dies after queuing a chunk, before marking it, leaves them queued and unmarked; the
    next check queues the same items again (the same keys), so each alert is sent exactly once."""
    topics = RecordingTopics()
    with stored_world():
        seed_month(user_names(12), MONTH_END, active=0, windows=0)
        marked = spend_check.mark_all_fired
        calls = []

        def dies_on_the_second_chunk(*args, **kwargs):
            calls.append(args)
            if len(calls) == 2:
                raise RuntimeError("the step died here")
            return marked(*args, **kwargs)

        with mock.patch.object(spend_check, "QUEUE_CHUNK", 10), \
                mock.patch.object(spend_check, "mark_all_fired", dies_on_the_second_chunk), \
                pytest.raises(RuntimeError):
            _check()
        assert alert_outbox.count(TABLE, CLUSTER) == 20  # two chunks queued, only the first marked
        again = _check("arn:execution:two")
        assert again["spendAlerts"] == 14  # the first chunk was marked: not decided again
        config = SimpleNamespace(alert_topic_arn=os.environ["ALERT_TOPIC_ARN"], user_topic_arn="",
                                 cluster_name=CLUSTER, state_table=TABLE)
        while spend_check.send_queued_alerts(config, sns=topics, events=topics)["more"]:
            pass
    keys = Counter((m["MessageAttributes"]["user"]["StringValue"], m["Subject"]) for _, m in topics.messages)
    assert len(keys) == 36 and set(keys.values()) == {1}  # 12 users x (actual, projected, held), once each


def test_a_sweep_that_read_an_older_header_keeps_nothing_of_its_own():
    """Two sweeps at once: the one whose header read is stale has its header refused (paged_items.put_header),
    so the holds document, the hold state and the running total stay the winner's, never a mix."""
    from hpops_core.budget_guard import hold_state, usage_store
    from hpops_core.budget_guard.user_spend import MonthUsage
    from hpops_core.common.errors import TransientAwsError

    with stored_world():
        names = user_names(3)
        seed_month(names, MONTH_END, active=0, windows=0)  # the running total's revision 1
        first, second = (user_holds.desired_document("2026-11", "2026-12-01T00:00:00Z", False, users)
                         for users in (names[:2], names))
        assert user_holds_store.publish(TABLE, CLUSTER, first, "arn:execution:one", MONTH_END) == 1
        with mock.patch.object(user_holds_store, "_header", return_value=None), pytest.raises(TransientAwsError):
            user_holds_store.publish(TABLE, CLUSTER, second, "arn:execution:two", MONTH_END)
        assert user_holds.parse_document(user_holds_store.read(TABLE, CLUSTER)["value"])["users"] == names[:2]

        hold_state._save_state(TABLE, CLUSTER, 0, {names[0]: {"state": "held"}}, "arn:execution:one", "v1", MONTH_END)
        with pytest.raises(TransientAwsError):
            hold_state._save_state(TABLE, CLUSTER, 0, {names[1]: {"state": "held"}}, "arn:execution:two", "v1", MONTH_END)
        assert set(hold_state.read_state(TABLE, CLUSTER)["holds"]) == {names[0]}

        month = f"{MONTH_END:%Y-%m}"
        kept, _ = usage_store.month_totals(TABLE, CLUSTER, month, MONTH_END, save=False)
        assert not usage_store._save_running_total(TABLE, CLUSTER, month, MonthUsage(), {}, None,
                                                   "arn:execution:two", MONTH_END, boto3.client("dynamodb"), {})
        again, _ = usage_store.month_totals(TABLE, CLUSTER, month, MONTH_END, save=False)
        assert again.users == kept.users and set(again.users) == set(names)
