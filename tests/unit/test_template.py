"""template.yaml and the ASL files agree with each other and with the code (one source of truth)."""

import json
import re
import tomllib
from pathlib import Path

import pytest

from hpops_twin.template_model import REPO_ROOT, TemplateModel

TEMPLATE = TemplateModel()
MACHINES = TEMPLATE.state_machines()


def definition(spec) -> dict:
    return json.loads(spec.definition_path.read_text())


def all_states(states: dict):
    for name, state in states.items():
        yield name, state
        for branch in state.get("Branches", []):
            yield from all_states(branch["States"])
        if "ItemProcessor" in state:
            yield from all_states(state["ItemProcessor"]["States"])


@pytest.mark.parametrize("logical_id", sorted(MACHINES))
def test_substitutions_and_placeholders_match(logical_id):
    spec = MACHINES[logical_id]
    placeholders = set(re.findall(r"\$\{(\w+)\}", spec.definition_path.read_text()))
    assert placeholders == set(spec.substitutions), "every ${X} in the ASL has a DefinitionSubstitution and vice versa"


@pytest.mark.parametrize("logical_id", sorted(MACHINES))
def test_every_task_retries_and_catches(logical_id):
    for name, state in all_states(definition(MACHINES[logical_id])["States"]):
        if state["Type"] == "Task":
            assert state.get("Retry"), f"{name} has no Retry"
            assert any("States.ALL" in c["ErrorEquals"] for c in state.get("Catch", [])), f"{name} has no catch-all"


def test_lease_outlives_the_longest_execution():
    timeout = definition(MACHINES["LoginNodeSyncStateMachine"])["TimeoutSeconds"]
    lease = int(TEMPLATE.globals["Function"]["Environment"]["Variables"]["LEASE_SECONDS"])
    assert lease > timeout


def test_every_function_handler_exists():
    for spec in TEMPLATE.functions().values():
        module, function = spec.handler.rsplit(".", 1)
        source = (spec.code_uri / f"{module}.py").read_text()
        assert re.search(rf"^def {function}\(", source, re.M), f"{spec.logical_id}: {spec.handler} not found"


def test_every_event_rule_has_a_dead_letter_queue_and_retry_policy():
    for spec in MACHINES.values():
        for event in spec.events:
            assert "DeadLetterConfig" in event.properties, event.name
            assert "RetryPolicy" in event.properties, event.name


def test_rules_cover_all_three_hyperpod_detail_types_scoped_to_the_cluster():
    patterns = [e.properties["Pattern"] for e in MACHINES["LoginNodeSyncStateMachine"].events if e.kind == "EventBridgeRule"]
    detail_types = {dt for p in patterns for dt in p["detail-type"]}
    assert detail_types == {
        "SageMaker HyperPod Cluster State Change",
        "SageMaker HyperPod Cluster Node Health Event",
        "SageMaker HyperPod Cluster Event",
    }
    assert all("aws.sagemaker" in p["source"] for p in patterns)
    assert all("Ref" in json.dumps(p["detail"]) and "ClusterName" in json.dumps(p["detail"]) for p in patterns)


def test_every_iam_wildcard_says_why():
    lines = (REPO_ROOT / "template.yaml").read_text().splitlines()
    for number, line in enumerate(lines):
        if re.search(r"Resource:\s*[\"']\*[\"']", line):
            assert lines[number - 1].strip().startswith("#"), f"template.yaml:{number + 1} wildcard without a comment"


def test_log_groups_have_retention():
    for logical_id, resource in TEMPLATE.of_type("AWS::Logs::LogGroup").items():
        assert "RetentionInDays" in resource["Properties"], logical_id


def test_layer_pins_the_same_powertools_as_the_project():
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pinned = next(d for d in project if d.startswith("aws-lambda-powertools"))
    layer = (REPO_ROOT / "layers" / "hpops_core" / "requirements.txt").read_text().split()
    assert pinned in layer


def test_outputs_name_what_operators_need():
    outputs = TEMPLATE.raw["Outputs"]
    for name in ("LoginNodeSyncStateMachineArn", "TargetGroupArn", "AlertTopicArn", "EventDeliveryDLQUrl"):
        assert name in outputs


def _statements(logical_id: str) -> list[dict]:
    resource = TEMPLATE.raw["Resources"][logical_id]
    if resource["Type"] == "AWS::IAM::Policy":
        return resource["Properties"]["PolicyDocument"]["Statement"]
    return [s for policy in resource["Properties"].get("Policies", []) if isinstance(policy, dict)
            for s in policy.get("Statement", [])]


def _who_may(action: str, resource_ref: str) -> set[str]:
    """Logical ids whose statements allow `action` on a resource naming `resource_ref`."""
    holders = set()
    for logical_id, resource in TEMPLATE.raw["Resources"].items():
        if resource["Type"] not in ("AWS::Serverless::Function", "AWS::IAM::Policy"):
            continue
        for statement in _statements(logical_id):
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            if action in actions and resource_ref in json.dumps(statement.get("Resource")):
                holders.add(logical_id)
    return holders


def test_only_the_signer_reads_the_host_ca_and_only_nodes_read_the_host_keys():
    assert _who_may("secretsmanager:GetSecretValue", "HostCertificateAuthoritySecret") == {"SignHostCertificatesFunction"}
    assert _who_may("secretsmanager:GetSecretValue", "HostIdentitySecret") == {"NodesReadHostIdentityPolicy"}
    verifier = TEMPLATE.raw["Resources"]["VerifyNodeIdentityFunction"]["Properties"]["Policies"]
    assert verifier == [{"VPCAccessPolicy": {}}], "the verifier reads nothing but the network"


def test_certificate_parameters_are_scoped_to_the_clusters_path():
    path = "parameter/hpops/${ClusterName}/host-certificates/*"
    assert _who_may("ssm:PutParameter", path) == {"SignHostCertificatesFunction"}
    assert _who_may("ssm:GetParameter", path) == {"NodesReadHostIdentityPolicy"}
    assert _who_may("ssm:DeleteParameter", path) == {"CheckHostIdentityPushFunction"}


def test_every_custom_metric_alarm_watches_a_metric_the_code_emits_under_that_service():
    emitted = set()
    for path in [*(REPO_ROOT / "functions").rglob("*.py"), *(REPO_ROOT / "layers").rglob("*.py")]:
        emitted |= set(re.findall(r'add_metric\(\s*name="(\w+)"', path.read_text()))
    services = {v["Environment"]["Variables"].get("POWERTOOLS_SERVICE_NAME") for v in
                (r["Properties"] for r in TEMPLATE.raw["Resources"].values() if r["Type"] == "AWS::Serverless::Function")
                if "Environment" in v}
    services.add(TEMPLATE.globals["Function"]["Environment"]["Variables"]["POWERTOOLS_SERVICE_NAME"])
    alarms = {k: r["Properties"] for k, r in TEMPLATE.of_type("AWS::CloudWatch::Alarm").items()
              if r["Properties"].get("Namespace") == "HyperPodLoginAutopilot"}
    assert {"HostIdentityRejectedAlarm", "HostCertificateRenewalFailedAlarm", "LoginLimitsPushFailedAlarm"} <= set(alarms)
    for logical_id, alarm in alarms.items():
        assert alarm["MetricName"] in emitted, f"{logical_id} watches a metric nothing emits"
        dimension = {d["Name"]: d["Value"] for d in alarm["Dimensions"]}
        assert dimension.get("service") in services, f"{logical_id}: unknown service dimension"
