"""The node channel: how the stack and the node agent on each login node talk.

The stack never pushes to a node (SSM Run Command cannot target HyperPod nodes). It publishes
desired state in Parameter Store and Secrets Manager; the agent polls, converges and reports what
it applied as an EventBridge event on the stack's node-report bus. `contract` holds the names and
document shapes both sides use; it is standard-library only, so the agent bundle ships it as is,
together with `login_limits` and the name rules they import (hpops_core.common.validation).
"""
