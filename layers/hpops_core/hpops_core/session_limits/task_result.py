"""What a SessionLimits task hands back to its Lambda handler: output, metrics, log lines, error."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from hpops_core.common.errors import HpopsError

OUTPUT_LIST_MAX = 100  # list entries per output: keeps the execution state (256 KiB) small however big a sweep is


@dataclass(frozen=True)
class LogLine:
    level: Literal["info", "warning", "error"]
    message: str
    extra: Mapping[str, Any]


@dataclass(frozen=True)
class TaskResult:
    """The task output, metrics (name -> count), log lines, and the named error to fail the task
    with once they are emitted (None: the task succeeds)."""

    output: dict[str, Any]
    metrics: Mapping[str, int] = field(default_factory=dict)
    log: tuple[LogLine, ...] = ()
    error: HpopsError | None = None

    def emit(self, metrics: Any, logger: Any) -> None:
        """Add the metrics (a Powertools ``Metrics``) and write the log lines (a Powertools ``Logger``)."""
        for name, value in self.metrics.items():
            metrics.add_metric(name=name, unit="Count", value=value)
        for line in self.log:
            getattr(logger, line.level)(line.message, extra=dict(line.extra))

    def output_or_raise(self) -> dict[str, Any]:
        if self.error is not None:
            raise self.error
        return self.output
