"""Who may do what: template.yaml as `sam deploy` would create it, read as IAM policies.

aws-sam-translator (the library sam-cli deploys with) expands the template: each function's and
state machine's role (its Policies, SAM policy templates expanded, and the managed policies SAM
attaches, kept as data in managed_policies.json), each rule's role for starting a state machine.
The twin's Resolver then fills in the physical names and ARNs the twin provisioned.

Principals:
    function:<LogicalId>      the function's execution role
    statemachine:<LogicalId>  the state machine's role (its Lambda invokes, direct integrations)
    rule:<RuleLogicalId>      the role EventBridge uses to start the rule's state machine
    agent                     the node agent: NodeAgentPolicy on the instance group's role
    deployer                  whoever runs `sam deploy`: the DeployerPolicy of docs/deployer-role.json (its
                              change sets, the artifacts bucket, PassRole on the service role)
    cloudformation-service-role  the role CloudFormation creates, updates and deletes the stack's resources
                              with: the ServiceRolePolicy* of docs/deployer-role.json
    events.amazonaws.com      EventBridge itself, allowed only by resource policies (the DLQ's)
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

from hpops_twin.iam.evaluate import TwinIamError
from hpops_twin.template_model import Resolver, TemplateModel

MANAGED_POLICIES_PATH = Path(__file__).with_name("managed_policies.json")
DEPLOYER_ROLE_PATH = Path(__file__).resolve().parents[3] / "docs" / "deployer-role.json"


@cache
def managed_policies() -> dict[str, dict]:
    data = json.loads(MANAGED_POLICIES_PATH.read_text(encoding="utf-8"))
    return {arn: document for arn, document in data.items() if not arn.startswith("_")}


def deployer_policies(names: Any) -> tuple[dict[str, dict], dict[str, dict]]:
    """Fresh copies of the policies docs/deployer-role.json makes, filled for `names` (deployer_iam.Names):
    ({"DeployerPolicy": the deployer's}, {"ServiceRolePolicy1": ..., ...: the service role's})."""
    from hpops_twin.deployer_iam import filled

    template = json.loads(DEPLOYER_ROLE_PATH.read_text(encoding="utf-8"))
    documents = {name: filled(resource["Properties"]["PolicyDocument"], names)
                 for name, resource in template["Resources"].items() if resource["Type"] == "AWS::IAM::ManagedPolicy"}
    return ({"DeployerPolicy": documents.pop("DeployerPolicy")}, documents)


class _ManagedPolicyLoader:
    """What SAM asks IAM for (the managed policies by name); answered from managed_policies.json."""

    def load(self) -> dict[str, str]:
        return {arn.rsplit("/", 1)[-1]: arn for arn in managed_policies()}


@cache
def _expanded(template_text: str) -> str:
    import boto3
    from samtranslator.parser.parser import Parser
    from samtranslator.translator.translator import Translator
    from samtranslator.yaml_helper import yaml_parse

    template = yaml_parse(template_text)
    for resource in template["Resources"].values():
        properties = resource.get("Properties", {})
        for key in ("CodeUri", "DefinitionUri", "ContentUri"):
            if isinstance(properties.get(key), str):  # what `sam package` leaves there
                properties[key] = f"s3://twin-artifacts/{properties[key].strip('/')}"
    # What `sam deploy` runs (samtranslator's transform()), with the region given rather than read from the
    # environment; the region only fills pseudo parameters, which the twin's Resolver resolves itself.
    session = boto3.session.Session(region_name="us-east-1", aws_access_key_id="twin", aws_secret_access_key="twin")
    translator = Translator(None, Parser(), boto_session=session)
    managed = _ManagedPolicyLoader().load()
    return json.dumps(translator.translate(template, parameter_values={}, get_managed_policy_map=lambda: managed))


def expanded_template(template: TemplateModel) -> dict:
    """template.yaml as CloudFormation receives it from SAM (cached per template text)."""
    return json.loads(_expanded(template.path.read_text(encoding="utf-8")))


@dataclass(frozen=True)
class Grants:
    principals: dict[str, dict[str, dict]]  # principal -> {policy name: document}
    resource_policies: dict[str, dict]  # resource ARN -> {policy name: its resource policy}
    boundaries: dict[str, dict[str, dict]]  # principal -> {policy name: its permissions boundary}
    log_groups: dict[str, str]  # function principal -> the log group Lambda writes its logs to


def _drop_none(value: Any) -> Any:
    if isinstance(value, list):
        return [_drop_none(v) for v in value if v is not None]
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    return value


def _role_logical_id(role_ref: Any) -> str | None:
    if isinstance(role_ref, dict) and "Fn::GetAtt" in role_ref:
        target = role_ref["Fn::GetAtt"]
        return (target if isinstance(target, list) else target.split("."))[0]
    return None


def principal_policies(template: TemplateModel, resolver: Resolver,
                       policy_edit: Any = None) -> Grants:
    """What the template grants, for the resources the twin provisioned. `policy_edit(principal,
    policies)` may change a copy of each principal's policies (tests)."""
    expanded = expanded_template(template)
    resolver = replace(resolver, template=expanded)
    resources = expanded["Resources"]

    def live(resource: dict) -> bool:
        return "Condition" not in resource or resolver.condition(resource["Condition"])

    def role_policies(role_id: str) -> dict[str, dict]:
        role = resources[role_id]["Properties"]
        policies = {}
        for arn in role.get("ManagedPolicyArns", []):
            arn = resolver.resolve(arn)
            if arn not in managed_policies():
                raise TwinIamError(f"{role_id} attaches {arn}, which managed_policies.json does not hold")
            policies[arn.rsplit("/", 1)[-1]] = managed_policies()[arn]
        for inline in role.get("Policies", []):
            if "Fn::If" in inline:  # a policy only some parameters grant (SAM keeps the template's Fn::If)
                inline = resolver.resolve(inline)
                if inline is None:
                    continue
            policies[inline["PolicyName"]] = _drop_none(resolver.resolve(inline["PolicyDocument"]))
        return policies

    def boundary(role_id: str | None) -> dict[str, dict] | None:
        """The role's permissions boundary, a managed policy of this template (the twin provisions no IAM)."""
        reference = resources[role_id]["Properties"].get("PermissionsBoundary") if role_id else None
        if reference is None:
            return None
        if not (isinstance(reference, dict) and reference.get("Ref") in resources):
            raise TwinIamError(f"{role_id}'s permissions boundary {reference} is not a managed policy of the template")
        policy = resources[reference["Ref"]]["Properties"]["PolicyDocument"]
        return {reference["Ref"]: _drop_none(resolver.resolve(policy))}

    principals: dict[str, dict[str, dict]] = {}
    boundaries: dict[str, dict[str, dict]] = {}
    log_groups: dict[str, str] = {}
    for logical_id, resource in resources.items():
        if not live(resource):
            continue
        kind = resource["Type"]
        if kind in ("AWS::Lambda::Function", "AWS::StepFunctions::StateMachine"):
            role_id = _role_logical_id(resource["Properties"].get("Role") or resource["Properties"].get("RoleArn"))
            prefix = "function" if kind == "AWS::Lambda::Function" else "statemachine"
            principals[f"{prefix}:{logical_id}"] = role_policies(role_id) if role_id else {}
            if boundary(role_id) is not None:
                boundaries[f"{prefix}:{logical_id}"] = boundary(role_id)
            logging = resolver.resolve(resource["Properties"].get("LoggingConfig") or {})
            if prefix == "function":
                group = logging.get("LogGroup") or f"/aws/lambda/{resolver.physical_ids.get(logical_id, logical_id)}"
                log_groups[f"function:{logical_id}"] = group
        elif kind == "AWS::Events::Rule":
            for target in resource["Properties"].get("Targets", []):
                role_id = _role_logical_id(target.get("RoleArn"))
                if role_id:
                    principals[f"rule:{logical_id}"] = role_policies(role_id)
        elif kind == "AWS::IAM::ManagedPolicy" and logical_id == "NodeAgentPolicy":
            principals["agent"] = {logical_id: _drop_none(resolver.resolve(resource["Properties"]["PolicyDocument"]))}
    resource_policies: dict[str, dict] = {}
    for logical_id, resource in resources.items():
        if live(resource) and resource["Type"] == "AWS::SQS::QueuePolicy":
            document = _drop_none(resolver.resolve(resource["Properties"]["PolicyDocument"]))
            for queue_url in resolver.resolve(resource["Properties"]["Queues"]):
                queue_id = next(k for k, v in resolver.physical_ids.items() if v == queue_url)
                resource_policies[resolver.attributes[(queue_id, "Arn")]] = {logical_id: document}
    if policy_edit is not None:
        principals = copy.deepcopy(principals)
        for principal, policies in principals.items():
            policy_edit(principal, policies)
    return Grants(principals, resource_policies, boundaries, log_groups)
