"""Powertools Logger, Tracer and Metrics for a handler module, set up the same way everywhere.

The X-Ray SDK's patching is what a cold start pays for: patch_all() imports a dozen integrations,
and patching botocore imports it. So a step that calls AWS patches botocore only (all it uses), and
a step that calls no AWS API patches nothing; its handler is still traced.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics.provider.cloudwatch_emf.cloudwatch import AmazonCloudWatchEMFProvider

# Many steps count something only when it happens (an alert sent, a lease released): an invocation
# with nothing to count is normal, and Powertools' warning for it would be a line of noise per call.
warnings.filterwarnings("ignore", message="No application metrics to publish", category=UserWarning)

# Every metric carries the cluster as well as the service: one stack runs per cluster, often
# several in one account, and the alarms (template.yaml) must not count another cluster's events.
CLUSTER_DIMENSION = "cluster"

# A custom metric costs $0.30 a month (prorated by the hours it is sent), so one exists only where an
# alarm watches it (template.yaml; tests/unit/test_visibility.py keeps the two equal), and it is sent
# only when non-zero: every such alarm treats missing data as not breaching, which is what a zero was.
# Every figure a handler counts, alarmed or not, goes into one structured log line per invocation (no
# EMF), which the dashboard's Logs Insights widgets sum: FIGURES_MESSAGE, the figures under FIGURES_FIELD.
ALARMED_METRICS = frozenset({"HostIdentityRejected", "HostCertificateRenewalFailed", "LoginLimitsPushFailed",
                             "SafetyGuardTripped", "LoginImbalance", "LeaveNoticesFailed"})
FIGURES_MESSAGE = "figures"
FIGURES_FIELD = "figures"
_figures: dict[str, float] = {}  # shared like Powertools' own metric set: one process, one invocation at a time


class _AlarmedMetricsOnly(AmazonCloudWatchEMFProvider):
    """Powertools' EMF provider, publishing only ALARMED_METRICS; every other figure is logged."""

    def add_metric(self, name: str, unit: Any, value: float, resolution: Any = 60) -> None:
        _figures[name] = _figures.get(name, 0) + float(value)  # alarmed ones too: the dashboard reads one line
        if name in ALARMED_METRICS and value:
            super().add_metric(name=name, unit=unit, value=value, resolution=resolution)

    logger: Logger | None = None  # the handler's own, so the line has its service and invocation keys

    def flush_metrics(self, raise_on_empty_metrics: bool = False) -> None:
        if _figures and self.logger is not None:
            self.logger.info(FIGURES_MESSAGE, extra={CLUSTER_DIMENSION: self.default_dimensions.get(CLUSTER_DIMENSION, ""),
                                                     FIGURES_FIELD: dict(_figures)})
        _figures.clear()
        if self.metric_set or raise_on_empty_metrics:  # most invocations have nothing to alarm on: no warning
            super().flush_metrics(raise_on_empty_metrics=raise_on_empty_metrics)


def handler_tools(calls_aws: bool) -> tuple[Logger, Tracer, Metrics]:
    tracer = Tracer(patch_modules=["botocore"]) if calls_aws else Tracer(auto_patch=False)
    metrics, logger = Metrics(), Logger()
    metrics.provider = _AlarmedMetricsOnly(
        namespace=metrics.namespace, service=metrics.service, metric_set=metrics.metric_set,
        dimension_set=metrics.dimension_set, metadata_set=metrics.metadata_set, default_dimensions=metrics.default_dimensions)
    metrics.provider.logger = logger
    cluster = os.environ.get("CLUSTER_NAME", "")
    # Metrics instances share their dimensions: set once per process, not once per handler module.
    # On Lambda a process serves one cluster; a process that serves several in turn (the twin) drops
    # the previous cluster's value first, so it is replaced, not overwritten with a warning.
    if cluster and metrics.default_dimensions.get(CLUSTER_DIMENSION) != cluster:
        metrics.dimension_set.pop(CLUSTER_DIMENSION, None)
        metrics.set_default_dimensions(**{CLUSTER_DIMENSION: cluster})
    return logger, tracer, metrics
