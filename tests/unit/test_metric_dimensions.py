"""One stack runs per cluster, often several in one account: metrics and alarms are per cluster."""

import json

from hpops_twin.template_model import TemplateModel

TEMPLATE = TemplateModel()


def test_every_alarm_on_our_metrics_names_the_service_and_this_cluster():
    alarms = {k: v["Properties"] for k, v in TEMPLATE.of_type("AWS::CloudWatch::Alarm").items()
              if v["Properties"].get("Namespace") == "HyperPodLoginAutopilot"}
    assert alarms
    for name, alarm in alarms.items():
        dimensions = {d["Name"]: d["Value"] for d in alarm["Dimensions"]}
        assert set(dimensions) == {"service", "cluster"}, name
        assert dimensions["cluster"] == {"Ref": "ClusterName"}, name


def test_handlers_metrics_carry_the_cluster(monkeypatch, capsys):
    monkeypatch.setenv("CLUSTER_NAME", "ml-research")
    monkeypatch.setenv("POWERTOOLS_SERVICE_NAME", "login-node-sync")
    monkeypatch.setenv("POWERTOOLS_METRICS_NAMESPACE", "HyperPodLoginAutopilot")
    from hpops_core.common.observability import handler_tools

    _, _, metrics = handler_tools(calls_aws=False)
    metrics.add_metric(name="SafetyGuardTripped", unit="Count", value=1)
    metrics.flush_metrics()
    emf = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert emf["cluster"] == "ml-research" and emf["service"] == "login-node-sync"
    assert ["service", "cluster"] in [sorted(d, key=["service", "cluster"].index)
                                      for d in emf["_aws"]["CloudWatchMetrics"][0]["Dimensions"]]
    metrics.clear_default_dimensions()


def test_only_alarmed_metrics_are_published_and_only_when_not_zero(monkeypatch, capsys):
    """A custom metric is billed by the hour it is sent: the rest are one log line the dashboard sums."""
    monkeypatch.setenv("CLUSTER_NAME", "ml-research")
    monkeypatch.setenv("POWERTOOLS_SERVICE_NAME", "login-node-sync")
    monkeypatch.setenv("POWERTOOLS_METRICS_NAMESPACE", "HyperPodLoginAutopilot")
    from hpops_core.common.observability import FIGURES_MESSAGE, handler_tools

    logger, _, metrics = handler_tools(calls_aws=False)
    # Powertools' logger keeps the stream it was made with; capsys swaps sys.stdout per test.
    monkeypatch.setattr(logger.registered_handler, "stream", __import__("sys").stdout)

    @metrics.log_metrics
    def handler(event, context):
        metrics.add_metric(name="TargetsRegistered", unit="Count", value=2)
        metrics.add_metric(name="TargetsRegistered", unit="Count", value=1)
        metrics.add_metric(name="HostIdentityRejected", unit="Count", value=0)
        metrics.add_metric(name="ClusterCostUsd", unit="None", value=1234.5)

    handler({}, None)
    lines = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    assert not [line for line in lines if "_aws" in line], "nothing to alarm on: no custom metric sent"
    [figures] = [line for line in lines if line.get("message") == FIGURES_MESSAGE]
    assert figures["cluster"] == "ml-research" and figures["service"] == "login-node-sync"
    assert figures["figures"] == {"TargetsRegistered": 3, "HostIdentityRejected": 0, "ClusterCostUsd": 1234.5}

    handler = metrics.log_metrics(lambda event, context: metrics.add_metric(name="HostIdentityRejected", unit="Count", value=1))
    handler({}, None)
    [emf] = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines() if line.startswith('{"_aws"')]
    assert [m["Name"] for m in emf["_aws"]["CloudWatchMetrics"][0]["Metrics"]] == ["HostIdentityRejected"]
    metrics.clear_default_dimensions()
