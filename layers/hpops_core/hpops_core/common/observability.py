"""Powertools Logger, Tracer and Metrics for a handler module, set up the same way everywhere.

The X-Ray SDK's patching is what a cold start pays for: patch_all() imports a dozen integrations,
and patching botocore imports it. So a step that calls AWS patches botocore only (all it uses), and
a step that calls no AWS API patches nothing; its handler is still traced.
"""

from __future__ import annotations

from aws_lambda_powertools import Logger, Metrics, Tracer


def handler_tools(calls_aws: bool) -> tuple[Logger, Tracer, Metrics]:
    tracer = Tracer(patch_modules=["botocore"]) if calls_aws else Tracer(auto_patch=False)
    return Logger(), tracer, Metrics()
