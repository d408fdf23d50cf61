"""The one error root, HpopsError, and the errors every feature shares.

Everything hpops raises on purpose derives from HpopsError; each feature adds named subclasses
(BudgetGuardError, HostIdentityError, SessionLimitError, ...), and tests/unit/test_architecture.py
checks that every error name the state machines Retry or Catch is one of them. A Lambda that raises one of these fails its Step Functions task with the class name as the
error name (`MalformedEventError`, ...), so the state machine can Retry or Catch it by name and
the failed execution says exactly what went wrong. Messages never include secrets.
"""


class HpopsError(Exception):
    """Base class: everything the autopilot raises on purpose."""


class ConfigurationError(HpopsError):
    """A required environment variable is missing or malformed (a deployment bug)."""


class MalformedEventError(HpopsError):
    """The input is not one of the event shapes we accept. Nothing was changed."""


class UnknownClusterError(HpopsError):
    """The event or request names a cluster this stack does not manage. Nothing was changed."""


class LoginGroupError(HpopsError):
    """LoginGroupName is not a group of the cluster, or its SlurmConfig says it is not the Login group.
    The message names the groups the cluster has. Nothing was changed."""


class EmptyListingGuardError(HpopsError):
    """Refused to deregister every target: the login group listed empty while the cluster is live."""


class TransientAwsError(HpopsError):
    """AWS throttled or failed after botocore's own retries; the state machine retries with backoff."""


class LeaseLostError(HpopsError):
    """This execution no longer holds the cluster's reconcile lease (it expired and was taken)."""
