"""Per-POSIX-user limits on concurrent Session Manager sessions on HyperPod login nodes.

Layout (pure pieces first, AWS at the edge):

* ``models``         - CloudTrail StartSession event model, target patterns, base errors.
* ``identity``       - pure: AWS principal -> the OS user Session Manager runs it as (Run As
                       preferences, SSMSessionRunAs tags, mapping rules in place of session tags).
* ``documents``      - pure: which sessions are interactive shells (and so count).
* ``policy``         - pure: which sessions to end, with reasons.
* ``session_api``    - ``SessionDirectory`` protocol + boto3 implementation (an in-memory one for
                       unit tests lives in tests/fake_session_directory.py).
* ``enforce``        - orchestration: fetch, resolve, decide, terminate, report.

The deployed part (functions/session_limits/app.py, statemachines/session_limits.asl.json) adds:

* ``config``         - the functions' frozen configuration, read from the environment at call time.
* ``trigger``        - StartSession event / sweep input -> ``SessionLimitsRequest`` (named errors).
* ``directories``    - owner-scoped and snapshot listings (cheap events, plan-before-ledger).
* ``ledger``         - ended session ids in the SyncStateTable (idempotency across runs).

The pure modules import no boto3 at module import time (``session_api`` and ``directories`` only
botocore's ``Config``/exceptions; ``ledger`` goes through ``hpops_core.common.clients``), so they load
without AWS credentials or a region.
"""
