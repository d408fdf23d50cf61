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
    metrics.add_metric(name="TargetsRegistered", unit="Count", value=1)
    metrics.flush_metrics()
    emf = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert emf["cluster"] == "ml-research" and emf["service"] == "login-node-sync"
    assert ["service", "cluster"] in [sorted(d, key=["service", "cluster"].index)
                                      for d in emf["_aws"]["CloudWatchMetrics"][0]["Dimensions"]]
    metrics.clear_default_dimensions()
