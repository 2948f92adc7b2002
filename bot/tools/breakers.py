"""The tools' circuit breakers: one :class:`~bot.resilience.breaker.CircuitBreaker`
per tool, shared by every session through one :class:`Breakers` registry.

A tool's breaker opens after :data:`TOOL_BREAKER`'s five consecutive transient
failures, stays open for a fixed 30 s, then lets one trial call through at a
time; two successful trials close it. The executor fails calls fast while it
is open (``try_admit``) instead of holding them as the providers do.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from bot.resilience.breaker import BreakerPolicy, CircuitBreaker

__all__ = ["TOOL_BREAKER", "Breakers"]

TOOL_BREAKER = BreakerPolicy(threshold=5, success_threshold=2, base_delay=30.0,
                             max_delay=30.0, jitter=0.0)
"""The spec's tool breaker: 5 consecutive transient failures open it, 30 s open
(no growth, no jitter: a tool's timeout is predictable), 2 half-open successes close it."""


class Breakers:
    """The circuit breakers of every tool; one per process so sessions share them."""

    def __init__(self, policy: BreakerPolicy = TOOL_BREAKER, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.policy = policy
        self.clock = clock
        self._breakers: dict[str, CircuitBreaker] = {}

    def get(self, tool: str) -> CircuitBreaker:
        """The breaker of ``tool``, made on first use."""
        breaker = self._breakers.get(tool)
        if breaker is None:
            breaker = self._breakers[tool] = CircuitBreaker(
                self.policy, name=f"tool {tool!r}", clock=self.clock)
        return breaker

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Each tool's breaker state, by tool name."""
        return {name: b.snapshot() for name, b in sorted(self._breakers.items())}
