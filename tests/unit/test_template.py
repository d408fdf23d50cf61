"""template.yaml and the ASL files agree with each other and with the code (one source of truth)."""

import json
import re
import tomllib
from importlib import metadata
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
    sources = [e for spec in MACHINES.values() for e in spec.events]
    sources += [e for spec in TEMPLATE.functions().values() for e in spec.events]
    assert any(e.name == "NodeReport" for e in sources)
    for event in sources:
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


def _pins(lines) -> dict[str, str]:
    pins = {}
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[name.split("[", 1)[0].strip().lower()] = version.strip()
    return pins


def test_layer_ships_the_sdk_and_libraries_the_tests_ran_with():
    project = _pins(tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["dependencies"])
    layer = _pins((REPO_ROOT / "layers" / "hpops_core" / "requirements.txt").read_text().splitlines())
    # boto3 and botocore travel together, or Lambda mixes the runtime's boto3 with our botocore.
    for name in ("aws-lambda-powertools", "boto3", "botocore", "s3transfer"):
        assert layer.get(name) == project.get(name), name
        assert layer[name] == metadata.version(name), f"{name}: the tests ran with {metadata.version(name)}"


def test_outputs_name_what_operators_need():
    outputs = TEMPLATE.raw["Outputs"]
    for name in ("LoginNodeSyncStateMachineArn", "TargetGroupArn", "AlertTopicArn", "EventDeliveryDLQUrl"):
        assert name in outputs


def _statements(logical_id: str) -> list[dict]:
    resource = TEMPLATE.raw["Resources"][logical_id]
    if resource["Type"] in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy"):
        return resource["Properties"]["PolicyDocument"]["Statement"]
    # A policy only some parameters grant (`!If [Condition, policy, !Ref AWS::NoValue]`): its statements too.
    policies = [p["Fn::If"][1] if isinstance(p, dict) and list(p) == ["Fn::If"] else p
                for p in resource["Properties"].get("Policies", [])]
    return [s for policy in policies if isinstance(policy, dict) for s in policy.get("Statement", [])]


def _who_may(action: str, resource_ref: str) -> set[str]:
    """Logical ids whose statements allow `action` on a resource naming `resource_ref`."""
    holders = set()
    for logical_id, resource in TEMPLATE.raw["Resources"].items():
        if resource["Type"] not in ("AWS::Serverless::Function", "AWS::IAM::Policy", "AWS::IAM::ManagedPolicy"):
            continue
        for statement in _statements(logical_id):
            actions = statement.get("Action", [])  # NotAction: the functions' boundary, which grants nothing
            actions = actions if isinstance(actions, list) else [actions]
            if action in actions and resource_ref in json.dumps(statement.get("Resource")):
                holders.add(logical_id)
    return holders


def test_only_the_signer_reads_the_host_ca_and_only_nodechannel_reads_the_host_keys_for_enrolled_agents():
    assert _who_may("secretsmanager:GetSecretValue", "HostCertificateAuthoritySecret") == {"SignHostCertificatesFunction"}
    # Not the node role (every user on a node holds it): NodeChannel answers the enrolled agent's signed fetch.
    assert _who_may("secretsmanager:GetSecretValue", "HostIdentitySecret") == {"NodeChannelFunction"}
    assert _who_may("kms:Decrypt", "HostIdentityKey") == {"NodeChannelFunction", "SignHostCertificatesFunction"}  # the CA shares the key
    verifier = TEMPLATE.raw["Resources"]["VerifyNodeIdentityFunction"]["Properties"]
    # SAM attaches AWSLambdaVPCAccessExecutionRole for VpcConfig; no statement of its own repeats it.
    assert "VpcConfig" in verifier and "Policies" not in verifier, "the verifier reads nothing but the network"


def _actions_on_partition(logical_id: str, partition: str) -> set[str]:
    """The table actions a function's statements allow on the state table's items in `partition`."""
    allowed = set()
    for statement in _statements(logical_id):
        keys = statement.get("Condition", {}).get("ForAllValues:StringLike", {}).get("dynamodb:LeadingKeys", [])
        if "SyncStateTable" in json.dumps(statement.get("Resource")) and partition in json.dumps(keys):
            actions = statement["Action"]
            allowed.update(actions if isinstance(actions, list) else [actions])
    return allowed


def test_nodechannel_uses_an_approval_and_never_writes_one():
    """An approved key is stored in one transaction: the approval's DeleteItem, the enrollment's PutItem
    (IAM checks each item as that action). Only the operator writes approvals; no enrollment is deleted."""
    assert _actions_on_partition("NodeChannelFunction", '"approval#${ClusterName}"') == {
        "dynamodb:GetItem", "dynamodb:DeleteItem"}
    assert _actions_on_partition("NodeChannelFunction", '"enroll#${ClusterName}"') == {
        "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem"}


def _references(value, target: str, conditions: tuple[str, ...] = ()):
    """The conditions under which each Ref / GetAtt / Sub naming `target` in `value` is evaluated (the
    yes-branches of the `Fn::If`s around it)."""
    if isinstance(value, list):
        for item in value:
            yield from _references(item, target, conditions)
    elif isinstance(value, dict):
        if list(value) == ["Fn::If"]:
            condition, yes, no = value["Fn::If"]
            yield from _references(yes, target, conditions + (condition,))
            yield from _references(no, target, conditions + ("not " + condition,))
            return
        if value.get("Ref") == target or (isinstance(value.get("Fn::GetAtt"), list) and value["Fn::GetAtt"][0] == target):
            yield conditions
        for key, item in value.items():
            if key == "Fn::Sub" and f"${{{target}" in json.dumps(item):
                yield conditions
            yield from _references(item, target, conditions)
    elif isinstance(value, str) and value == target:  # DependsOn
        yield conditions


def test_the_host_ca_exists_only_in_certificate_mode_and_survives_leaving_it():
    """Keys mode (the default) creates no CA secret ($0.40 a month nothing reads); a switch from certificate
    mode to keys mode keeps the CA users' known_hosts trust, and nothing refers to it where it does not exist."""
    raw = TEMPLATE.raw
    secret = raw["Resources"]["HostCertificateAuthoritySecret"]
    assert raw["Conditions"]["CertificateMode"] == {"Fn::Equals": [{"Ref": "HostIdentityMode"}, "certificate"]}
    assert raw["Parameters"]["HostIdentityMode"]["Default"] == "keys"
    assert secret["Condition"] == "CertificateMode"
    # Kept by an update that leaves certificate mode and by the stack's deletion; a rollback of the operation
    # that created it (before any CA could be installed) deletes it.
    assert (secret["DeletionPolicy"], secret["UpdateReplacePolicy"]) == ("RetainExceptOnCreate", "Retain")
    assert raw["Outputs"]["HostCertificateAuthoritySecretArn"]["Condition"] == "CertificateMode"
    assert raw["Globals"]["Function"]["Environment"]["Variables"]["HOST_CA_SECRET_ARN"] == {
        "Fn::If": ["CertificateMode", {"Ref": "HostCertificateAuthoritySecret"}, ""]}
    # Every reference, in the template as written and as SAM expands it, is made only in certificate mode.
    from hpops_twin.iam.principals import expanded_template

    expanded = expanded_template(TEMPLATE)
    for template in (raw, expanded):
        seen = 0
        for section in ("Resources", "Outputs"):
            for name, body in template[section].items():
                if name == "HostCertificateAuthoritySecret" and section == "Resources":
                    continue
                for conditions in _references(body, "HostCertificateAuthoritySecret"):
                    seen += 1
                    assert body.get("Condition") == "CertificateMode" or "CertificateMode" in conditions, (section, name)
        seen += sum(1 for c in _references(template.get("Globals", {}), "HostCertificateAuthoritySecret")
                    if c == ("CertificateMode",))
        assert seen >= 3, "the output, the signer's policy and (as written) the functions' environment refer to it"
    # The signer's role reads the CA (and decrypts it) only in certificate mode; nothing else of its role does.
    signer_role = expanded["Resources"]["SignHostCertificatesFunctionRole"]["Properties"]["Policies"]
    guarded = [p["Fn::If"] for p in signer_role if "Fn::If" in p]
    assert [(condition, [s["Action"] for s in yes["PolicyDocument"]["Statement"]], no) for condition, yes, no in guarded] == [
        ("CertificateMode", ["secretsmanager:GetSecretValue", "kms:Decrypt"], {"Ref": "AWS::NoValue"})]
    unguarded = json.dumps([p for p in signer_role if "Fn::If" not in p])
    assert "secretsmanager:GetSecretValue" not in unguarded and "kms:Decrypt" not in unguarded


def test_certificate_parameters_are_scoped_to_the_clusters_path():
    path = "parameter/hpops/${ClusterName}/host-certificates/*"
    assert _who_may("ssm:PutParameter", path) == {"SignHostCertificatesFunction"}
    assert _who_may("ssm:GetParameters", path) == {"NodeAgentPolicy"}
    assert _who_may("ssm:DeleteParameter", path) == {"CheckNodeReportFunction"}


def test_the_node_agent_policy_names_only_this_clusters_resources():
    statements = _statements("NodeAgentPolicy")
    actions = sorted(a for s in statements for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"]))
    # No secret, no key, no instruction: a user on the node holds this role.
    assert actions == ["events:PutEvents", "lambda:InvokeFunction", "sagemaker:DescribeCluster", "ssm:GetParameters"]
    # The agent may invoke its NodeChannel and no other function.
    assert [s["Resource"] for s in statements if s["Action"] == "lambda:InvokeFunction"] == [
        {"Fn::GetAtt": ["NodeChannelFunction", "Arn"]}]
    resources = json.dumps([s["Resource"] for s in statements])
    # API-driven Slurm configuration: the agent reads its own cluster's SlurmConfig, no other.
    assert [s["Resource"] for s in statements if s["Action"] == "sagemaker:DescribeCluster"] == [{"Ref": "ClusterArn"}]
    assert "*\"" not in resources.replace("/*", ""), "no bare wildcard resource"
    assert "parameter/hpops/${ClusterName}/node/*" in resources and "NodeReportBus" in resources
    assert "/instructions/" not in resources.replace("/node/*", ""), "instructions are under no path the role reads"
    assert "NodeAgentPolicyArn" in TEMPLATE.raw["Outputs"] and "NodeReportBusName" in TEMPLATE.raw["Outputs"]


def test_nothing_uses_run_command_which_cannot_reach_hyperpod_nodes():
    text = (REPO_ROOT / "template.yaml").read_text()
    assert "ssm:SendCommand" not in text and "AWS::SSM::Document" not in text and "GetCommandInvocation" not in text
    for path in [*(REPO_ROOT / "functions").rglob("*.py"), *(REPO_ROOT / "layers").rglob("*.py")]:
        assert "send_command" not in path.read_text(), path


def test_the_verifier_always_runs_in_the_vpc_and_a_deploy_without_subnets_is_refused():
    vpc = TEMPLATE.raw["Resources"]["VerifyNodeIdentityFunction"]["Properties"]["VpcConfig"]
    assert "Fn::If" not in json.dumps(vpc.get("SubnetIds")), "subnets are not optional"
    groups = vpc["SecurityGroupIds"]["Fn::If"]
    assert groups[0] == "CreateVerifierSecurityGroup" and groups[1] == [{"Ref": "VerifierSecurityGroup"}]
    assertions = TEMPLATE.raw["Rules"]["VerifierRunsInTheClusterVpc"]["Assertions"]
    asserted = json.dumps([a["Assert"] for a in assertions])
    assert '"Ref": "VerifierSubnetIds"' in asserted and '"Ref": "VpcId"' in asserted
    egress = TEMPLATE.raw["Resources"]["VerifierSecurityGroup"]["Properties"]["SecurityGroupEgress"]
    assert [(e["FromPort"], e["ToPort"]) for e in egress] == [({"Ref": "SshPort"}, {"Ref": "SshPort"})]


@pytest.mark.parametrize("subnets, vpc, refused", [("", "vpc-1", True), ("subnet-1", "", True), ("subnet-1,subnet-2", "vpc-1", False)])
def test_rules_refuse_a_deploy_the_verifier_could_not_work_in(subnets, vpc, refused):
    from hpops_twin.template_model import Resolver

    parameters = TEMPLATE.parameter_defaults() | {"VerifierSubnetIds": subnets, "VpcId": vpc}
    resolver = Resolver(TEMPLATE.raw, parameters, "us-east-1", "123456789012", "stack")
    results = [resolver.resolve(a["Assert"]) for a in TEMPLATE.raw["Rules"]["VerifierRunsInTheClusterVpc"]["Assertions"]]
    assert (not all(results)) == refused


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


def test_every_checkov_skip_says_why():
    config = (REPO_ROOT / ".checkov.yaml").read_text()
    skipped = re.findall(r"^\s*-\s*(CKV_\w+)\s*$", config, re.M)
    assert skipped, "no skip-check list found"
    for check in skipped:
        assert re.search(rf"^#\s+{check} \(.+\): \S", config, re.M), f"{check} skipped in .checkov.yaml without a reason"
    for logical_id, resource in TEMPLATE.resources.items():
        for skip in resource.get("Metadata", {}).get("checkov", {}).get("skip", []):
            assert len(skip.get("comment", "")) > 20, f"{logical_id} skips {skip.get('id')} without a reason"


def test_no_comment_points_at_an_issue_number_or_outside_the_repository():
    # Comments say why in their own words; a reader of this repository has no issue tracker open
    # and no ../shared folder.
    pattern = re.compile(r"\bissues? #?\d|\(issue \d|aws-facts\.md|\.\./shared|\bshared/[a-z-]+\.md")
    roots = ["layers", "functions", "node", "statemachines", "tests", "events", "cli", "twin"]
    files = [REPO_ROOT / name for name in ("template.yaml", "README.md", "Makefile", "samconfig.toml")]
    files += [p for root in roots for p in (REPO_ROOT / root).rglob("*") if p.is_file() and p.suffix in {".py", ".json", ".sh", ".md", ".yaml", ".service"}]
    offenders = [f"{p.relative_to(REPO_ROOT)}:{n}" for p in files
                 for n, line in enumerate(p.read_text(errors="ignore").splitlines(), 1) if pattern.search(line)]
    offenders = [o for o in offenders if not o.startswith("tests/unit/test_template.py")]
    assert not offenders, offenders


@pytest.mark.parametrize("logical_id", sorted(MACHINES))
def test_every_state_says_what_it_is_for(logical_id):
    def missing(states):
        for name, state in states.items():
            if not state.get("Comment"):
                yield name
            if state["Type"] == "Map":
                yield from missing((state.get("ItemProcessor") or state.get("Iterator"))["States"])
            for branch in state.get("Branches", []):
                yield from missing(branch["States"])

    assert not list(missing(definition(MACHINES[logical_id])["States"]))
