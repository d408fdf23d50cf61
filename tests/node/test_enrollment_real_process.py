"""Two real agents on one machine, installed the real way (bundle + install.sh), holding the same
role (the same AWS credentials): the first enrolls its key for the login instance; the second,
configured as the same instance but without the first one's key, cannot report for it.

AWS is a moto server (the bus, an SQS queue behind a rule, the state table); the NodeChannel function
and RecordNodeReport are the real handlers, run in this process behind a loopback endpoint that speaks
Lambda's Invoke API (AWS_ENDPOINT_URL_LAMBDA), with DescribeClusterNode answered as AWS would for the
instance (moto's cluster nodes have no IPs). Needs ssh-keygen (OpenSSH >= 8.1).
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import boto3
import pytest
from real_tools import MotoServer, free_port, require

from hpops_core.common import clients
from hpops_core.node_channel import contract, node_proof, proof_format

REPO = Path(__file__).resolve().parents[2]
CLUSTER = "install-cluster"
REGION = "ap-southeast-2"  # moto servers of one test process share their backends: names of its own
BUS = "hpops-enrollment-reports"
TABLE = "enrollment-state"
INSTANCE = "i-0123456789abcdef0"
IP = "10.1.0.5"
CHANNEL = "hpops-node-channel"


def _handler(relative: str, name: str):
    spec = importlib.util.spec_from_file_location(f"real_process_{name}", REPO / relative)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Stack:
    """The stack's side: moto for AWS, the real NodeChannel and RecordNodeReport handlers in-process."""

    def __init__(self, monkeypatch):
        self.lambda_port = free_port()
        self.moto = MotoServer().start()  # from no accounts, whatever ran before on this worker
        self.endpoint = self.moto.endpoint
        for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                            "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": REGION, "AWS_REGION": REGION,
                            "AWS_ENDPOINT_URL": self.endpoint, "CLUSTER_NAME": CLUSTER, "LOGIN_GROUP_NAME": "login",
                            "CONTROLLER_GROUP_NAME": "controller-machine", "STATE_TABLE_NAME": TABLE,
                            "POWERTOOLS_TRACE_DISABLED": "true", "POWERTOOLS_METRICS_NAMESPACE": "test",
                            "POWERTOOLS_SERVICE_NAME": "node-channel"}.items():
            monkeypatch.setenv(name, value)
        clients.reset_clients()
        session = boto3.session.Session()
        session.client("dynamodb").create_table(
            TableName=TABLE, BillingMode="PAY_PER_REQUEST",
            AttributeDefinitions=[{"AttributeName": k, "AttributeType": "S"} for k in ("pk", "sk")],
            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}])
        self.sqs, events = session.client("sqs"), session.client("events")
        events.create_event_bus(Name=BUS)
        self.queue = self.sqs.create_queue(QueueName="reports")["QueueUrl"]
        arn = self.sqs.get_queue_attributes(QueueUrl=self.queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        events.put_rule(Name="reports", EventBusName=BUS, EventPattern=json.dumps({"source": [contract.REPORT_SOURCE]}))
        events.put_targets(Rule="reports", EventBusName=BUS, Targets=[{"Id": "q", "Arn": arn}])
        # AWS's record of the instance: the login group, its IP, launched just now (inside the window).
        self.aws_node = {"InstanceGroupName": "login", "PrivatePrimaryIp": IP, "InstanceStatus": {"Status": "Running"},
                         "LaunchTime": dt.datetime.now(dt.timezone.utc)}
        self.channel = _handler("functions/node_channel/app.py", "node_channel")
        self.reports = _handler("functions/node_reports/app.py", "node_reports")
        for module in (self.channel, self.reports):
            monkeypatch.setattr(module, "describe_node", lambda cluster, instance_id: dict(self.aws_node))
        self.answers: list[dict] = []
        self.http = ThreadingHTTPServer(("127.0.0.1", self.lambda_port), self._lambda_api())
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def _lambda_api(self):
        stack = self

        class LambdaApi(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                assert self.path == f"/2015-03-31/functions/{CHANNEL}/invocations", self.path
                request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                answer = stack.channel.handle(request, _Context())
                stack.answers.append(answer)
                body = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        return LambdaApi

    def environment(self) -> dict:
        env = {key: value for key, value in os.environ.items() if not key.startswith(("AWS_", "POWERTOOLS"))}
        return env | {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing",
                      "AWS_DEFAULT_REGION": REGION, "AWS_ENDPOINT_URL": self.endpoint,
                      "AWS_ENDPOINT_URL_LAMBDA": f"http://127.0.0.1:{self.lambda_port}", "HPOPS_PYTHON": sys.executable}

    def sent_reports(self) -> list[dict]:
        bodies = []
        while True:
            messages = self.sqs.receive_message(QueueUrl=self.queue, MaxNumberOfMessages=10).get("Messages", [])
            if not messages:
                return bodies
            for message in messages:
                bodies.append(json.loads(message["Body"]))
                self.sqs.delete_message(QueueUrl=self.queue, ReceiptHandle=message["ReceiptHandle"])

    def record(self, event: dict) -> dict:
        return self.reports.record_node_report(event, _Context())

    def stored(self) -> dict:
        item = boto3.client("dynamodb").get_item(TableName=TABLE, Key={
            "pk": {"S": f"node-report#{CLUSTER}"}, "sk": {"S": f"node-report#{INSTANCE}"}}).get("Item")
        return json.loads(item["report"]["S"]) if item else {}

    def close(self):
        self.http.shutdown()
        self.moto.close()
        clients.reset_clients()


class _Context:
    function_name, function_version, memory_limit_in_mb = "test", "$LATEST", 256
    invoked_function_arn = f"arn:aws:lambda:{REGION}:123456789012:function:test"
    aws_request_id, log_group_name, log_stream_name = "r", "g", "s"

    def get_remaining_time_in_millis(self):
        return 15_000


def install_agent(tmp_path: Path, name: str, stack: Stack) -> subprocess.CompletedProcess:
    from hpops_node_agent import bundle as bundle_module

    folder = tmp_path / name
    (folder / "lifecycle").mkdir(parents=True)
    (folder / "lifecycle" / "provisioning_parameters.json").write_text(json.dumps(
        {"controller_group": "controller-machine", "login_group": "login", "worker_groups": []}))
    resource = folder / "resource_config.json"
    resource.write_text(json.dumps({"InstanceGroups": [{"Name": "login", "Instances": [
        {"InstanceName": "l1", "CustomerIpAddress": IP, "InstanceId": INSTANCE}]}]}))
    bundle = bundle_module.build_bundle(folder / "lifecycle", CLUSTER, REGION, BUS, vendor=False, node_channel=CHANNEL)
    config = json.loads((bundle / "agent.json").read_text())
    config.update(resourceConfig=str(resource), ip=IP, sshdCmd="true", reloadCmd="true")
    (bundle / "agent.json").write_text(json.dumps(config))
    root = folder / "root"
    (root / "etc" / "ssh").mkdir(parents=True)
    (root / "etc" / "ssh" / "sshd_config").write_text("Port 22\n")
    return subprocess.run(["bash", str(bundle / "install.sh"), "--root", str(root), "--no-systemd"],
                          capture_output=True, text=True, timeout=180, env=stack.environment(), cwd=bundle.parent)


@pytest.fixture
def stack(monkeypatch):
    require((shutil.which("ssh-keygen") or "/usr/bin/ssh-keygen",), "the agent key tests", "apt-get install openssh-client")
    running = Stack(monkeypatch)
    yield running
    running.close()


def test_a_second_agent_with_the_same_role_cannot_report_for_the_enrolled_one(tmp_path, stack):
    first = install_agent(tmp_path, "first", stack)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "agent key: SHA256:" in first.stdout and "first cycle done" in first.stdout
    key_a = tmp_path / "first" / "root" / "var" / "lib" / "hpops-node-agent" / "agent-key"
    assert oct(key_a.stat().st_mode & 0o777) == "0o600"
    [enrolled] = stack.answers
    assert enrolled["ok"] and enrolled["status"] == "enrolled" and enrolled["role"] == "login"
    [report] = stack.sent_reports()
    assert set(report["detail"]) >= {"proof", "sequence"}
    assert stack.record(report)["recorded"] and stack.stored()["instanceId"] == INSTANCE

    # Time passes: the instance's enrollment window closes. The second agent (its own key) claims it.
    stack.aws_node["LaunchTime"] = dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=3)
    second = install_agent(tmp_path, "second", stack)
    assert second.returncode == 0, second.stdout + second.stderr  # never blocks the node's provisioning
    refused = stack.answers[-1]
    assert (refused["ok"], refused["error"]) == (False, "EnrollmentConflictError")
    assert "enrolled with another key" in refused["message"], "the refusal names the rule"
    assert stack.sent_reports() == [], "the second agent sends nothing it cannot sign as the enrolled key"

    # What it could sign (with its own key, by the same ssh-keygen) is refused, and nothing changes.
    before = stack.stored()
    key_b = tmp_path / "second" / "root" / "var" / "lib" / "hpops-node-agent" / "agent-key"
    forged = dict(report["detail"], reportedAt=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                  sessions={"list": []})
    forged.pop("proof")
    forged["sequence"] = report["detail"]["sequence"] + 1
    forged["proof"] = subprocess.run(
        ["ssh-keygen", "-Y", "sign", "-q", "-f", str(key_b), "-n", proof_format.namespace("report", CLUSTER)],
        input=proof_format.canonical(forged), capture_output=True, check=True).stdout.decode()
    with pytest.raises(node_proof.NodeProofKeyMismatchError):
        stack.record(dict(report, detail=forged))
    assert stack.stored() == before
    # The first agent's own report delivered again (EventBridge delivers at least once) changes nothing.
    stack.record(report)
    assert {k: v for k, v in stack.stored().items() if k != "receivedAt"} == {
        k: v for k, v in before.items() if k != "receivedAt"}
