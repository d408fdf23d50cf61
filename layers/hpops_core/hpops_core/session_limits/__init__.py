"""Per-POSIX-user limits on concurrent Session Manager sessions on HyperPod login nodes.

Layout (pure pieces first, AWS at the edge):

* ``models``         - CloudTrail StartSession event model, target patterns, base errors.
* ``identity``       - pure: AWS principal -> POSIX user (SSMSessionRunAs tag, mapping rules, fallback).
* ``policy``         - pure: which sessions to end, with reasons.
* ``session_api``    - ``SessionDirectory`` protocol + boto3 implementation.
* ``fake_directory`` - in-memory ``SessionDirectory`` for tests and the local twin.
* ``enforce``        - orchestration: fetch, resolve, decide, terminate, report.

Nothing here imports boto3 at module import time except ``session_api`` (and only botocore's
``Config``/``ClientError`` there), so the pure modules load without AWS credentials or a region.
"""
