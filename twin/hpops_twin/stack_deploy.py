"""`sam deploy` and `sam delete` in the twin, as the deployer and CloudFormation's service role would run them.

The deployer (a person or pipeline) makes only sam deploy's own calls: the aws-sam-cli-managed-default stack
and its bucket once (`--resolve-s3`; CloudFormation creates that stack with the deployer's credentials:
sam passes no role for it), the artifacts' upload, then the stack's change set through the service role
(`--role-arn`: CreateChangeSet with RoleARN, which also needs iam:PassRole on that role) and its execution.
CloudFormation then creates, updates or deletes each resource as the service role; when a creation fails
it rolls back, deleting what it made, as the same role.

The deployer's CloudFormation calls are decided by the twin's IAM enforcement exactly as a request on the
wire would be (same operation table, same policies), and refused with CloudFormation's AccessDenied; they
do not reach moto, whose CloudFormation would create the resources itself. Everything else (the bucket,
the uploads, every resource) is a real request to moto under the principal making it.
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from typing import Any

from botocore.exceptions import ClientError

from hpops_twin.deployer_iam import ARTIFACTS_BUCKET, SAM_MANAGED_STACK
from hpops_twin.iam.enforce import DEPLOYER, SERVICE_ROLE, acting_as

SERVICE_ROLE_NAME = "hpops-twin-deploy"
# CloudFormation names the managed stack's bucket <stack>-<logical id, lower case>-<suffix>.
BUCKET = ARTIFACTS_BUCKET.replace("*", "1a2b3c4d5e6f")
# What sam's managed stack declares (samcli/lib/bootstrap/bootstrap.py), as far as IAM sees it.
MANAGED_STACK_TEMPLATE = json.dumps({"Transform": "AWS::Serverless-2016-10-31",
                                     "Resources": {"SamCliSourceBucket": {"Type": "AWS::S3::Bucket"}}})


class StackRolledBack(Exception):
    """A creation failed; CloudFormation deleted what it had made (the cause is chained)."""


class SamDeploy:
    def __init__(self, world: Any):
        self.world = world
        self.changes = 0  # change sets made, for their names
        self.artifacts: dict[str, str] = {}  # CodeUri/DefinitionUri -> the key sam uploaded it as

    @property
    def role_arn(self) -> str:
        return self.world.deployer_names.service_role

    def _cloudformation(self, operation: str, **params: Any) -> None:
        """One of sam's CloudFormation calls, as the deployer: refused as CloudFormation refuses it."""
        denial = self.world.iam.authorize(DEPLOYER, "cloudformation", operation, params)
        if denial is not None:
            raise ClientError({"Error": {"Code": "AccessDenied", "Message": str(denial)}}, operation)

    def _change_set(self, stack: str, kind: str, template: str, **role: str) -> None:
        self.changes += 1
        name = f"samcli-deploy{self.changes}"
        self._cloudformation("CreateChangeSet", StackName=stack, ChangeSetName=name, ChangeSetType=kind,
                             TemplateBody=template, **role)
        self._cloudformation("DescribeChangeSet", StackName=stack, ChangeSetName=name)
        self._cloudformation("ExecuteChangeSet", StackName=stack, ChangeSetName=name)

    def resolve_s3(self) -> str:
        """`sam deploy --resolve-s3`: the managed stack and its bucket, made once."""
        self._cloudformation("DescribeStacks", StackName=SAM_MANAGED_STACK)
        s3 = self.world.aws.client("s3")
        if BUCKET not in {b["Name"] for b in s3.list_buckets().get("Buckets", [])}:
            self._change_set(SAM_MANAGED_STACK, "CREATE", MANAGED_STACK_TEMPLATE)
            with acting_as(DEPLOYER):  # no role: CloudFormation uses the deployer's credentials
                # Outside us-east-1, S3 refuses a bucket without its Region as the location constraint.
                region = s3.meta.region_name
                s3.create_bucket(Bucket=BUCKET, **({} if region == "us-east-1" else {
                    "CreateBucketConfiguration": {"LocationConstraint": region}}))
                s3.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
                s3.put_public_access_block(Bucket=BUCKET, PublicAccessBlockConfiguration={
                    "BlockPublicAcls": True, "IgnorePublicAcls": True, "BlockPublicPolicy": True,
                    "RestrictPublicBuckets": True})
                s3.put_bucket_encryption(Bucket=BUCKET, ServerSideEncryptionConfiguration={
                    "Rules": [{"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "aws:kms"}}]})
                s3.put_bucket_tagging(Bucket=BUCKET, Tagging={"TagSet": [{"Key": "ManagedStackSource",
                                                                          "Value": "AwsSamCli"}]})
                # (sam's policy also denies requests without TLS: moto's own evaluation would refuse the twin's)
                s3.put_bucket_policy(Bucket=BUCKET, Policy=json.dumps({"Version": "2012-10-17", "Statement": [{
                    "Effect": "Allow", "Principal": {"Service": "serverlessrepo.amazonaws.com"},
                    "Action": "s3:GetObject", "Resource": f"arn:aws:s3:::{BUCKET}/*",
                    "Condition": {"StringEquals": {"aws:SourceAccount": self.world.account_id}}}]}))
        self._cloudformation("DescribeStacks", StackName=SAM_MANAGED_STACK)
        return BUCKET

    def upload(self, revision: str) -> None:
        """`sam deploy` uploads each function's package, keyed by its content (the twin's: a marker)."""
        s3 = self.world.aws.client("s3")
        with acting_as(DEPLOYER):
            for spec in self.world.template.functions().values():
                package = io.BytesIO()
                with zipfile.ZipFile(package, "w") as archive:
                    archive.writestr("README", f"{spec.code_uri} {revision}: code runs in-process in the twin")
                body = package.getvalue()
                key = hashlib.md5(body, usedforsecurity=False).hexdigest()
                try:  # sam skips what is there already
                    s3.head_object(Bucket=BUCKET, Key=key)
                except ClientError:
                    s3.put_object(Bucket=BUCKET, Key=key, Body=body)
                self.artifacts[spec.code_uri] = key

    def code(self, code_uri: str) -> dict:
        return {"S3Bucket": BUCKET, "S3Key": self.artifacts[code_uri]}

    def create(self) -> None:
        """`sam deploy` of a new stack. A failed creation is rolled back (StackRolledBack)."""
        world = self.world
        self.resolve_s3()
        self.upload("1")
        stack = world.stack_name
        self._cloudformation("DescribeStacks", StackName=stack)
        self._change_set(stack, "CREATE", world.template.path.read_text(encoding="utf-8"), RoleARN=self.role_arn)
        try:
            with acting_as(SERVICE_ROLE):
                world.create_stack_resources()
        except Exception as failure:
            with acting_as(SERVICE_ROLE):
                world.delete_stack_resources(rollback=True)
            self._cloudformation("DescribeStackEvents", StackName=stack)
            raise StackRolledBack(f"{stack}: ROLLBACK_COMPLETE after {failure}") from failure
        self._cloudformation("DescribeStackEvents", StackName=stack)
        self._cloudformation("DescribeStacks", StackName=stack)

    def update(self) -> None:
        """`sam deploy` of new code: a change set that updates every function and state machine."""
        world = self.world
        self.upload(str(self.changes + 1))
        stack = world.stack_name
        self._cloudformation("DescribeStacks", StackName=stack)
        self._cloudformation("GetTemplateSummary", StackName=stack)
        self._change_set(stack, "UPDATE", world.template.path.read_text(encoding="utf-8"), RoleARN=self.role_arn)
        with acting_as(SERVICE_ROLE):
            world.update_stack_resources()
        self._cloudformation("DescribeStackEvents", StackName=stack)

    def delete(self) -> None:
        """`sam delete`: the stack's deletion, through the service role."""
        stack = self.world.stack_name
        self._cloudformation("DescribeStacks", StackName=stack)
        self._cloudformation("DeleteStack", StackName=stack, RoleARN=self.role_arn)
        with acting_as(SERVICE_ROLE):
            self.world.delete_stack_resources()
        self._cloudformation("DescribeStackEvents", StackName=stack)
