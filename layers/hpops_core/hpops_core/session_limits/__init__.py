"""Per-POSIX-user limits on concurrent Session Manager sessions on HyperPod login nodes.

Enforcement is three steps, each its own function:

* ``gather``         - every AWS read (sessions under the login target prefix, the Run As
                       preferences, the principals' SSMSessionRunAs tags) -> an immutable
                       ``SessionSnapshot``, with the reason for each listed session not counted.
* ``decide``         - pure: snapshot, policy, identity config, now, already-ended ids -> a
                       ``TerminationPlan``; every session to end and every user over a limit says why.
* ``apply``          - TerminateSession for exactly the plan's sessions -> what ended, what failed.

Pure pieces they use, and the AWS seam:

* ``errors``         - ``SessionLimitError`` (under ``HpopsError``) and ``MalformedSessionEvent``.
* ``targets``        - Session Manager targets of HyperPod nodes; which are this cluster's login nodes.
* ``identity``       - AWS principal -> the OS user Session Manager runs it as (Run As
                       preferences, SSMSessionRunAs tags, mapping rules in place of session tags).
* ``documents``      - which sessions are interactive shells (and so count).
* ``policy``         - per POSIX user, which sessions are over the limit, with reasons.
* ``session_api``    - ``SessionDirectory`` protocol + boto3 implementation, and its owner-scoped
                       listing for the cheap event check (an in-memory double for unit tests lives
                       in tests/fake_session_directory.py).
* ``enforce``        - ``EnforcementReport`` (notification, metrics) and ``enforce()``, the three
                       steps in one call for callers without a ledger.

The deployed part (one handler module per function in functions/session_limits/,
statemachines/session_limits.asl.json) adds:

* ``config``         - the functions' frozen configuration, read from the environment at call time.
* ``models``         - the CloudTrail StartSession event as a pydantic model (ParseSessionTrigger only).
* ``trigger``        - StartSession event / sweep input -> ``SessionLimitsRequest`` (named errors).
* ``request``        - the request as later tasks read it back from the execution state.
* ``ledger``         - ended session ids in the SyncStateTable (idempotency across runs).
* ``run``            - one EnforceSessionLimits run: gather, decide, ledger, apply, record, notify,
                       output; ``SessionTerminationFailed`` / ``SessionReportFailed``.
* ``report_check``   - CheckReportedSessions: a login node's session list changed; start a run
                       (mode "nodes", a deterministic name) when someone is over, cluster-wide.
* ``login_limits``   - PublishLoginLimits: the same limits as pam_limits maxlogins for the nodes' agents.
* ``task_result``    - what a task hands its handler: output, metrics, log lines, error.

Only ``models`` and ``trigger`` import pydantic, so EnforceSessionLimits and PublishLoginLimits
start without it. The
pure modules import no boto3 at module import time (``session_api`` only botocore's
``Config``/exceptions), so they load without AWS credentials or a region.
"""
