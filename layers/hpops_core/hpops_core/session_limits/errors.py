"""The session-limits feature's named errors, under the one root ``HpopsError``.

Their class names are what statemachines/session_limits.asl.json and the alarms see, so they never
change. Feature modules define their own subclasses of :class:`SessionLimitError` next to the code
that raises them (``InvalidPolicy`` in policy, ``SessionListingFailed`` in session_api, ...).
"""

from __future__ import annotations

from hpops_core.common.errors import HpopsError


class SessionLimitError(HpopsError):
    """Base class for every named error of the session-limits feature."""


class MalformedSessionEvent(SessionLimitError, ValueError):
    """The event is not a successful, well-formed CloudTrail ``StartSession`` record."""
