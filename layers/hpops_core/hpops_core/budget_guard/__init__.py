"""Budget guardrails for HyperPod clusters.

Research groups run clusters on fixed grants. This package keeps an AWS Budget
alongside every cluster (``budget_spec`` + ``aws_budgets``) and raises an early
alert when a scale-out makes a month-end overrun likely (``projection``), because
Budgets' own alerts trail real usage by hours. ``alert_state`` makes each
threshold fire once per cluster (or user) per month.

Per user, spend comes from Slurm accounting: the controller's usage reports
(``usage_reports``, kept by ``usage_store``) priced at each instance type's rate
(``rates``: billed, list or override; fetched by ``pricing``), decided by
``user_spend`` and run by ``spend_check``.

``projection``, ``budget_spec``, ``rates``, ``usage_reports`` and ``user_spend`` are
pure (no AWS, time is an input); ``aws_budgets``, ``pricing``, ``usage_store`` and
``alert_state`` talk to AWS. Importing this package must stay cheap and boto3-free
so the pure modules can be used anywhere.
"""


from hpops_core.common.errors import HpopsError


class BudgetGuardError(HpopsError):
    """Base class for every error raised by hpops_core.budget_guard."""
