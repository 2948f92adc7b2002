"""Counters of every tool since the process started: :class:`ToolMetrics` per tool
in one :class:`ToolMetricsRegistry`, for ``/status`` and observers."""

from __future__ import annotations

from dataclasses import dataclass

from bot.tools.classify import Classification

__all__ = ["ToolMetrics", "ToolMetricsRegistry"]


@dataclass(slots=True)
class ToolMetrics:
    """Counters of one tool since the process started.

    ``error_count`` counts failed attempts (``transient_error_count`` +
    ``permanent_error_count``); ``retry_count`` the retries made and
    ``retry_successes`` those that succeeded.
    """

    calls: int = 0
    error_count: int = 0
    transient_error_count: int = 0
    permanent_error_count: int = 0
    retry_count: int = 0
    retry_successes: int = 0
    circuit_breaker_opens: int = 0
    short_circuits: int = 0
    """Calls failed fast because the breaker was open."""
    timeout_count: int = 0
    skipped: int = 0

    @property
    def retry_success_rate(self) -> float | None:
        """Share of retries that succeeded (``None`` before the first retry)."""
        return self.retry_successes / self.retry_count if self.retry_count else None

    def error(self, classification: Classification) -> None:
        self.error_count += 1
        if classification == "transient":
            self.transient_error_count += 1
        else:
            self.permanent_error_count += 1

    def snapshot(self) -> dict[str, int | float | None]:
        return {
            "calls": self.calls, "error_count": self.error_count,
            "transient_error_count": self.transient_error_count,
            "permanent_error_count": self.permanent_error_count,
            "retry_count": self.retry_count, "retry_successes": self.retry_successes,
            "retry_success_rate": self.retry_success_rate,
            "circuit_breaker_opens": self.circuit_breaker_opens,
            "short_circuits": self.short_circuits, "timeout_count": self.timeout_count,
            "skipped": self.skipped,
        }


class ToolMetricsRegistry:
    """:class:`ToolMetrics` per tool name, in memory; one per process."""

    def __init__(self) -> None:
        self._metrics: dict[str, ToolMetrics] = {}

    def get(self, tool: str) -> ToolMetrics:
        metrics = self._metrics.get(tool)
        if metrics is None:
            metrics = self._metrics[tool] = ToolMetrics()
        return metrics

    def snapshot(self) -> dict[str, dict[str, int | float | None]]:
        return {name: m.snapshot() for name, m in sorted(self._metrics.items())}

