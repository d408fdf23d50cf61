"""The autopilot's Lambda code, deployed as one layer; functions/<feature>/app.py are thin handlers over it.

Every feature package has the same shape: what starts it (trigger), its configuration (config),
pure decisions with a reason each, and the modules that call AWS. Features never import each other;
what they share lives in three packages:

  common/        name rules (validation), configuration helpers, the error root, AWS clients
  cluster/       the HyperPod cluster: its EventBridge events, its login group's nodes
  node_channel/  how the stack and the node agent talk (Parameter Store, node reports)

  login_sync/    NLB target group == healthy, verified login nodes
  host_identity/ one SSH host identity on every login node, verified over the network
  session_limits/ per-POSIX-user Session Manager session limits and maxlogins
  budget_guard/  the cluster budget and early overrun alerts
"""
