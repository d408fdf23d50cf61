"""template.yaml's budget guard section agrees with the code and keeps its promises."""

import json

from hpops_core.budget_guard.guard import ALERT_DETAIL_TYPE, ALERT_SOURCE
from hpops_core.budget_guard.trigger import parse_budget_input
from hpops_twin.template_model import Resolver, TemplateModel

TEMPLATE = TemplateModel()
RESOURCES = TEMPLATE.resources
MACHINE = TEMPLATE.state_machines()["BudgetGuardStateMachine"]


def statements(logical_id):
    return [s for p in RESOURCES[logical_id]["Properties"].get("Policies", []) if isinstance(p, dict)
            for s in p.get("Statement", [])]


def test_budgets_may_publish_to_the_alert_topic_for_this_account_only():
    policy = RESOURCES["AlertTopicPolicy"]["Properties"]
    assert policy["Topics"] == [{"Ref": "AlertTopic"}]
    budgets = next(s for s in policy["PolicyDocument"]["Statement"] if s["Principal"] == {"Service": "budgets.amazonaws.com"})
    assert budgets["Action"] == "sns:Publish"
    assert budgets["Condition"]["StringEquals"] == {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}
    assert budgets["Condition"]["ArnLike"]["aws:SourceArn"] == {"Fn::Sub": "arn:${AWS::Partition}:budgets::${AWS::AccountId}:*"}
    # The policy replaces the default one: the stack's alarms must still reach the topic.
    assert any(s["Principal"] == {"Service": "cloudwatch.amazonaws.com"} for s in policy["PolicyDocument"]["Statement"])


def test_the_budget_role_only_touches_this_clusters_budgets():
    (budgets,) = [s for s in statements("EnsureBudgetsFunction") if "budgets:ModifyBudget" in s["Action"]]
    resolver = Resolver(TEMPLATE.raw, {"ClusterName": "lab"}, "us-east-1", "123456789012", "s")
    assert resolver.resolve(budgets["Resource"]) == [
        "arn:aws:budgets::123456789012:budget/hpops-lab",
        "arn:aws:budgets::123456789012:budget/hpops-lab-u-*",
    ]


def test_alerts_go_to_the_default_bus_with_the_documented_pattern():
    (put,) = [s for s in statements("PublishAlertFunction") if s.get("Action") == "events:PutEvents"]
    assert put["Resource"]["Fn::Sub"].endswith(":event-bus/default")
    pattern = json.loads(TEMPLATE.raw["Outputs"]["BudgetAlertEventPattern"]["Value"])
    assert pattern == {"source": [ALERT_SOURCE], "detail-type": [ALERT_DETAIL_TYPE]}


def test_the_rule_and_the_sweep_feed_inputs_the_parser_accepts():
    events = {e.name: e for e in MACHINE.events}
    rule = events["BudgetClusterStateChange"].properties["Pattern"]
    assert rule["detail-type"] == ["SageMaker HyperPod Cluster State Change"]
    assert rule["detail"] == {"ClusterName": [{"Ref": "ClusterName"}]}
    resolver = Resolver(TEMPLATE.raw, {"ClusterName": "lab"}, "us-east-1", "123456789012", "s")
    sweep = json.loads(resolver.resolve(events["BudgetSweep"].properties["Input"]))
    assert parse_budget_input(sweep, "2026-11-10T00:00:00Z", "lab").mode == "sweep"


def test_bad_input_ends_in_input_rejected_before_anything_is_touched():
    states = json.loads(MACHINE.definition_path.read_text())["States"]
    assert states["WrapInput"]["Next"] == "ParseBudgetTrigger"
    catches = states["ParseBudgetTrigger"]["Catch"]
    assert catches[0] == {"ErrorEquals": ["MalformedEventError", "UnknownClusterError"], "ResultPath": "$.error",
                          "Next": "InputRejected"}
    for name in ("EnsureBudgets", "ProjectSpend", "PublishAlert", "RememberClusterState"):
        assert "TransientAwsError" in states[name]["Retry"][0]["ErrorEquals"], name


def test_the_projection_may_read_the_price_list_and_gets_the_last_resort_rates():
    (price_list,) = [s for s in statements("ProjectSpendFunction") if s.get("Action") == "pricing:GetProducts"]
    assert price_list["Resource"] == "*"
    variables = RESOURCES["ProjectSpendFunction"]["Properties"]["Environment"]["Variables"]
    assert variables["RATE_OVERRIDES_JSON"] == {"Ref": "RateOverridesJson"}
    parameter = TEMPLATE.raw["Parameters"]["RateOverridesJson"]
    assert parameter["Default"] == "{}" and "Last resort" in parameter["Description"]
    assert "HourlyPricesJson" not in TEMPLATE.raw["Parameters"] and "HOURLY_PRICES_JSON" not in variables


def test_the_kept_cost_explorer_answer_is_the_only_new_item_the_budget_roles_touch():
    parameter = TEMPLATE.raw["Parameters"]["CostExplorerMaxAgeHours"]
    assert (parameter["Default"], parameter["MinValue"], parameter["MaxValue"]) == (24, 1, 24)
    assert TEMPLATE.function_environment("CheckUserSpendFunction")["COST_EXPLORER_MAX_AGE_HOURS"] == {
        "Ref": "CostExplorerMaxAgeHours"}
    resolver = Resolver(TEMPLATE.raw, {"ClusterName": "lab"}, "us-east-1", "123456789012", "s")
    for function in ("CheckUserSpendFunction", "ProjectSpendFunction"):
        keys = [key for table in statements(function) if "dynamodb:PutItem" in table.get("Action", [])
                for key in resolver.resolve(table["Condition"]["ForAllValues:StringLike"]["dynamodb:LeadingKeys"])]
        assert "ce-cache#lab" in keys and not any(k.startswith("sync") for k in keys), function


USER_SPEND_PARTS = {"RecordUsageReportFunction", "CheckUserSpendFunction", "PublishUserSpendAlertFunction",
                    "UserSpendAlertTopic"}


def test_user_spend_enabled_false_leaves_out_per_user_spend_and_keeps_the_cluster_budget():
    parameter = TEMPLATE.raw["Parameters"]["UserSpendEnabled"]
    assert (parameter["Default"], parameter["AllowedValues"]) == ("true", ["true", "false"])
    conditional = {k for k, v in RESOURCES.items() if v.get("Condition") == "UserSpendOn"}
    assert conditional == USER_SPEND_PARTS
    assert TEMPLATE.raw["Outputs"]["UserSpendAlertTopicArn"]["Condition"] == "UserSpendOn"
    for on, collect in (("true", "on"), ("false", "off")):
        resolver = Resolver(TEMPLATE.raw, {"ClusterName": "lab", "UserSpendEnabled": on}, "us-east-1", "123456789012", "s")
        assert resolver.condition("UserSpendOn") is (on == "true")
        switch = resolver.resolve(RESOURCES["UserSpendSwitchParameter"]["Properties"])
        assert (switch["Name"], switch["Value"]) == ("/hpops/lab/node/user-spend", collect)
    # The cluster budget, its projection and the machine itself never depend on the switch.
    for logical_id in ("EnsureBudgetsFunction", "ProjectSpendFunction", "PublishAlertFunction", "BudgetGuardStateMachine"):
        assert "Condition" not in RESOURCES[logical_id], logical_id


def test_without_per_user_spend_nothing_left_in_the_stack_names_what_is_gone():
    """What CloudFormation would refuse: a resource or output that always exists and refers to one
    that UserSpendEnabled=false leaves out (checked on the template as SAM expands it)."""
    from hpops_twin.iam.principals import expanded_template

    expanded = expanded_template(TEMPLATE)
    params = TEMPLATE.parameter_defaults() | {"ClusterName": "lab", "UserSpendEnabled": "false",
                                              "ClusterArn": "arn:aws:sagemaker:us-east-1:123456789012:cluster/x"}
    probe = Resolver(expanded, params, "us-east-1", "123456789012", "s")
    live = {k for k, r in expanded["Resources"].items() if "Condition" not in r or probe.condition(r["Condition"])}
    assert not live & USER_SPEND_PARTS and {"BudgetGuardStateMachine", "EnsureBudgetsFunction"} <= live

    class LiveAttributes(dict):
        def __contains__(self, key):
            return key[0] in live

        def __getitem__(self, key):
            return f"{key[0]}.{key[1]}"

    resolver = Resolver(expanded, params, "us-east-1", "123456789012", "s",
                        physical_ids={k: f"arn:aws:x:us-east-1:123456789012:{k}" for k in live},
                        attributes=LiveAttributes())
    for logical_id in sorted(live):
        resolver.resolve(expanded["Resources"][logical_id].get("Properties", {}))
    for name, output in expanded.get("Outputs", {}).items():
        if "Condition" not in output or resolver.condition(output["Condition"]):
            resolver.resolve(output["Value"])


def test_the_machine_checks_users_only_on_a_sweep_of_a_stack_with_per_user_spend():
    choice = MACHINE.definition()["States"]["UserSpendDue"] if hasattr(MACHINE, "definition") else json.loads(
        MACHINE.definition_path.read_text())["States"]["UserSpendDue"]
    (rule,) = choice["Choices"]
    assert rule["Next"] == "CheckUserSpend" and choice["Default"] == "BudgetChecked"
    assert {(c["Variable"], c["StringEquals"]) for c in rule["And"]} == {
        ("$.request.mode", "sweep"), ("$.userSpendEnabled", "true")}
    parse = json.loads(MACHINE.definition_path.read_text())["States"]["ParseBudgetTrigger"]
    assert parse["ResultSelector"]["userSpendEnabled"] == "${UserSpendEnabled}"
    assert MACHINE.substitutions["UserSpendEnabled"] == {"Ref": "UserSpendEnabled"}
