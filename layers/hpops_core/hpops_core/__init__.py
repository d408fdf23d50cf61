"""Shared code for the HyperPod login-node autopilot Lambdas (deployed as a Lambda layer).

Where things live:
  events.py        what enters: Parser models for every event shape, normalised to a SyncRequest
  target_plan.py   where the decision is made: pure, no AWS
  aws/             where AWS is called: thin adapters over boto3
  config.py        per-function configuration, read from the environment at call time
  errors.py        named errors; their class names become Step Functions error names
"""
