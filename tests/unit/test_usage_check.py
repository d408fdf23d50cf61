"""A kept, live usage report with usage starts the BudgetGuard check at once when holds are on; nothing else does."""

from __future__ import annotations

import dataclasses
import re

import pytest

from hpops_core.budget_guard import usage_check
from hpops_core.budget_guard.config import UsageReportConfig
from hpops_core.budget_guard.usage_reports import UsageRecord, UsageReport
from hpops_core.common.errors import ConfigurationError
from hpops_core.node_channel import contract

USED = UsageRecord("alice", "gpu", node_seconds=3600, cpu_seconds=0, gpu_seconds=8 * 3600, jobs=1)
REPORT = UsageReport("ml-research", "i-0123456789abcdef0", "2026-11-20T11:00:00Z", "2026-11-20T12:00:00Z", False,
                     contract.USAGE_OK, "", "2026-11-20T11:45:00Z", (USED,), {"gpu": "gpu"}, 1, 1)
PUT = "2026-11-20T11:45:02Z"
ARN = "arn:aws:states:us-east-1:123456789012:stateMachine:BudgetGuard"


def test_a_kept_report_with_usage_starts_one_sweep_named_after_the_report():
    check = usage_check.decide_usage_check(REPORT, True, "hold", PUT)
    assert check.start and check.input == {"cluster": "ml-research", "mode": "sweep"}
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,80}", check.name) and check.name.startswith("usage-ml-research-")
    # The same report (a redelivery) names the same execution; the next collection of the window another.
    assert usage_check.decide_usage_check(REPORT, True, "hold", PUT).name == check.name
    later = dataclasses.replace(REPORT, collected_at="2026-11-20T12:00:00Z")
    assert usage_check.decide_usage_check(later, True, "hold", "2026-11-20T12:00:01Z").name != check.name


@pytest.mark.parametrize("report, kept, action, put, why", [
    (REPORT, True, "alert", PUT, "UserBudgetAction is alert"),
    (REPORT, False, "hold", PUT, "not kept"),
    (REPORT, True, "hold", "2026-11-20T12:01:00Z", "not a live report"),  # a redelivery 16 minutes on
    (REPORT, True, "hold", None, "not a live report"),
    (REPORT, True, "hold", "yesterday", "not a live report"),
    (dataclasses.replace(REPORT, window_start="2026-11-20T08:00:00Z", window_end="2026-11-20T09:00:00Z"), True,
     "hold", PUT, "catching up"),
    (dataclasses.replace(REPORT, records=()), True, "hold", PUT, "no usage"),
    (dataclasses.replace(REPORT, records=(dataclasses.replace(USED, node_seconds=0, gpu_seconds=0),)), True, "hold",
     PUT, "no usage"),
    (dataclasses.replace(REPORT, status=contract.USAGE_SACCT_FAILED, records=()), True, "hold", PUT, "no usage"),
])
def test_nothing_starts_without_holds_a_kept_live_report_or_usage(report, kept, action, put, why):
    check = usage_check.decide_usage_check(report, kept, action, put)
    assert not check.start and why in check.reason and check.name is None


def test_the_machine_is_required_only_where_a_report_can_hold_someone():
    env = {"CLUSTER_NAME": "ml-research", "CONTROLLER_GROUP_NAME": "controller-machine", "STATE_TABLE_NAME": "t"}
    assert UsageReportConfig.from_env(env).budget_state_machine_arn is None
    with pytest.raises(ConfigurationError):
        UsageReportConfig.from_env(dict(env, USER_BUDGET_ACTION="hold"))
    config = UsageReportConfig.from_env(dict(env, USER_BUDGET_ACTION="hold", BUDGET_GUARD_STATE_MACHINE_ARN=ARN))
    assert config.hold_action == "hold" and config.budget_state_machine_arn == ARN
