"""Self-healing load balancing: keep the NLB target group equal to the healthy, verified login nodes.

trigger.py          what starts a sync (HyperPod event, sweep, repair) -> one SyncRequest
config.py           the functions' configuration
target_plan.py      the decision: which IPs to register and deregister, with a reason each (pure)
sync_lease.py       one reconcile per cluster at a time (DynamoDB lease, IP cache)
target_group.py     the target group calls (DescribeTargetHealth, Register/DeregisterTargets)
execution_events.py a sync execution that ended badly releases its lease at once
"""
