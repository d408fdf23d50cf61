"""Powertools Logger, Tracer and Metrics for a handler module, set up the same way everywhere.

The X-Ray SDK's patching is what a cold start pays for: patch_all() imports a dozen integrations,
and patching botocore imports it. So a step that calls AWS patches botocore only (all it uses), and
a step that calls no AWS API patches nothing; its handler is still traced.
"""

from __future__ import annotations

import os
import warnings

from aws_lambda_powertools import Logger, Metrics, Tracer

# Many steps count something only when it happens (an alert sent, a lease released): an invocation
# with nothing to count is normal, and Powertools' warning for it would be a line of noise per call.
warnings.filterwarnings("ignore", message="No application metrics to publish", category=UserWarning)

# Every metric carries the cluster as well as the service: one stack runs per cluster, often
# several in one account, and the alarms (template.yaml) must not count another cluster's events.
CLUSTER_DIMENSION = "cluster"


def handler_tools(calls_aws: bool) -> tuple[Logger, Tracer, Metrics]:
    tracer = Tracer(patch_modules=["botocore"]) if calls_aws else Tracer(auto_patch=False)
    metrics = Metrics()
    cluster = os.environ.get("CLUSTER_NAME", "")
    # Metrics instances share their dimensions: set once per process, not once per handler module.
    # On Lambda a process serves one cluster; a process that serves several in turn (the twin) drops
    # the previous cluster's value first, so it is replaced, not overwritten with a warning.
    if cluster and metrics.default_dimensions.get(CLUSTER_DIMENSION) != cluster:
        metrics.dimension_set.pop(CLUSTER_DIMENSION, None)
        metrics.set_default_dimensions(**{CLUSTER_DIMENSION: cluster})
    return Logger(), tracer, metrics
