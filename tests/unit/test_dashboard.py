"""The stack's CloudWatch dashboard: valid JSON once CloudFormation substitutes it, and every graph
shows something that exists (a figure a handler counts, a state machine, an alarm of the stack)."""

import json
import re

from hpops_twin.template_model import REPO_ROOT, TemplateModel

TEMPLATE = TemplateModel()
RESOURCES = TEMPLATE.raw["Resources"]
BODY, VARIABLES = RESOURCES["OperatorDashboard"]["Properties"]["DashboardBody"]["Fn::Sub"]


def substituted(user_spend: bool = True, admission: bool = True) -> dict:
    """The body as CloudFormation would render it, with stand-ins for the values it fills in, and
    the per-user parts (Fn::If on UserSpendOn) and load-aware admission's (AdmissionOn) in or out."""
    stand_ins = {"AlarmArns": '","'.join(f"arn:aws:cloudwatch:us-east-1:123456789012:alarm:{n}" for n in alarm_names())}

    def value(match: re.Match) -> str:
        name = match.group(1)
        variable = VARIABLES.get(name)
        if isinstance(variable, dict) and "Fn::If" in variable:
            condition, when_on, when_off = variable["Fn::If"]
            on = {"UserSpendOn": user_spend, "AdmissionOn": admission}[condition]
            text = when_on["Fn::Sub"] if isinstance(when_on, dict) else when_on
            return re.sub(r"\$\{([^}]+)\}", value, text) if on else when_off
        return stand_ins.get(name, f"<{name}>")
    return json.loads(re.sub(r"\$\{([^}]+)\}", value, BODY))


def alarm_names() -> list[str]:
    return [item["Fn::GetAtt"][0] if isinstance(item["Fn::GetAtt"], list) else item["Fn::GetAtt"].split(".")[0]
            for item in VARIABLES["AlarmArns"]["Fn::Join"][1]]


def emitted_metric_names() -> set[str]:
    names = set()
    for path in list((REPO_ROOT / "functions").rglob("*.py")) + list((REPO_ROOT / "layers" / "hpops_core").rglob("*.py")):
        text = path.read_text()
        names.update(re.findall(r'add_metric\(name="(\w+)"', text))
        names.update(re.findall(r'\(\s*"(\w+)",\s*"\w+"\)', text))  # (metric, key) pairs looped over
        names.update(re.findall(r'"(\w+)": len\(', text))  # TaskResult metrics dictionaries
    return names


def figures_queried(widgets: list[dict]) -> set[str]:
    """The handlers' figures the Logs Insights widgets sum (observability.py logs them, one line per invocation)."""
    return {name for w in widgets if w["type"] == "log" for name in re.findall(r"figures\.(\w+)", w["properties"]["query"])}


def test_the_body_is_json_and_names_only_what_exists():
    from hpops_core.common.observability import ALARMED_METRICS

    widgets = substituted()["widgets"]
    emitted = emitted_metric_names()
    state_machines = {k for k, v in RESOURCES.items() if v["Type"] == "AWS::Serverless::StateMachine"}
    shown_machines = set()
    for widget in widgets:
        for metric in widget["properties"].get("metrics", []):
            if metric[0] == "HyperPodLoginAutopilot":
                assert metric[1] in ALARMED_METRICS, f"{metric[1]} is graphed but only alarmed metrics are published"
                assert metric[2:6] == ["service", metric[3], "cluster", "<ClusterName>"]
            if metric[0] == "AWS/States":
                shown_machines.add(metric[3].strip("<>"))
    assert shown_machines == state_machines
    queried = figures_queried(widgets)
    assert {"TargetsRegistered", "SessionsEnded", "ClusterCostUsd"} <= queried
    assert not queried - emitted, f"queried but no handler counts them: {sorted(queried - emitted)}"


def test_the_figure_widgets_read_this_clusters_figure_lines():
    from hpops_core.common.observability import FIGURES_FIELD, FIGURES_MESSAGE

    for widget in (w for w in substituted()["widgets"] if "figures." in w["properties"].get("query", "")):
        query = widget["properties"]["query"]
        assert query.startswith(f"SOURCE '<FunctionsLogGroup>' | filter message = \"{FIGURES_MESSAGE}\" and cluster = "
                                "\"<ClusterName>\""), widget["properties"]["title"]
        assert f"{FIGURES_FIELD}." in query and " by bin(" in query


def test_the_alarm_widget_lists_every_alarm_that_always_exists():
    always = {k for k, v in RESOURCES.items() if v["Type"] == "AWS::CloudWatch::Alarm" and "Condition" not in v}
    assert set(alarm_names()) == always
    [alarms] = [w for w in substituted()["widgets"] if w["type"] == "alarm"]
    assert len(alarms["properties"]["alarms"]) == len(always)


def test_healthy_targets_are_searched_by_the_target_groups_own_dimension():
    dimension = VARIABLES["TargetGroupDimension"]["Fn::Select"]
    assert dimension[0] == 5  # arn:aws:elasticloadbalancing:<region>:<account>:targetgroup/<name>/<id>
    assert "HealthyHostCount" in BODY and 'TargetGroup=\\"${TargetGroupDimension}\\"' in BODY


def test_the_per_user_table_reads_the_lines_check_user_spend_logs():
    [table] = [w for w in substituted()["widgets"] if w["type"] == "log" and "user spend" in w["properties"]["query"]]
    query = table["properties"]["query"]
    assert query.startswith("SOURCE '<FunctionsLogGroup>'") and 'message = "user spend"' in query
    handler = (REPO_ROOT / "functions" / "budget_guard" / "user_spend.py").read_text()
    assert 'logger.info("user spend", extra=row)' in handler
    core = (REPO_ROOT / "layers" / "hpops_core" / "hpops_core" / "budget_guard" / "spend_check.py").read_text()
    for field in ("usd", "percentOfLimit", "projectedUsd", "nodeHours", "gpuHours"):
        assert f"latest({field})" in query and f'"{field}"' in core


def test_without_per_user_spend_the_per_user_widgets_are_gone_and_the_budget_stays():
    def tables(widgets):
        return [w for w in widgets if w["type"] == "log" and "user spend" in w["properties"]["query"]]
    on, off = substituted(True)["widgets"], substituted(False)["widgets"]
    assert len(tables(on)) == 1 and not tables(off)
    assert figures_queried(on) - figures_queried(off) == {"ClusterCostUsd", "UsersUsd", "IdleUsd", "UsersHeld", "UserSpendAlerts"}
    assert {"ClusterBudgetUsd", "BudgetProjectionAlerts"} <= figures_queried(off)


def test_the_spread_graph_reads_the_line_check_reported_sessions_logs():
    [graph] = [w for w in substituted()["widgets"] if w["type"] == "log" and "login spread" in w["properties"]["query"]]
    query = graph["properties"]["query"]
    handler = (REPO_ROOT / "functions" / "session_limits" / "check_reported_sessions.py").read_text()
    assert 'logger.info("login spread", extra=report_check.login_spread(presence.fresh))' in handler
    core = (REPO_ROOT / "layers" / "hpops_core" / "hpops_core" / "session_limits" / "cluster_sessions.py").read_text()
    for field in ("maxOverMean", "meanPerNode"):
        assert f"max({field})" in query and f'"{field}"' in core


def test_the_admission_table_reads_the_moves_login_admission_logs_and_goes_with_it():
    [table] = [w for w in substituted()["widgets"] if w["type"] == "log" and "rotation" in w["properties"]["query"]]
    handler = (REPO_ROOT / "functions" / "login_node_sync" / "login_admission.py").read_text()
    assert 'logger.info(f"{verb}{move.action} rotation", extra={"instanceId": move.instance_id' in handler
    assert "filter message like /rotation$/" in table["properties"]["query"]
    assert not [w for w in substituted(admission=False)["widgets"] if "rotation" in w["properties"].get("query", "")]
