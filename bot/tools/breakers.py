"""The tools' circuit breakers: one :class:`~bot.resilience.breaker.CircuitBreaker`
per tool (per tool and key for a tool with a ``breaker_key``), shared by every
session through one :class:`Breakers` registry.

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

__all__ = ["MAX_KEYED", "TOOL_BREAKER", "Breakers"]

TOOL_BREAKER = BreakerPolicy(threshold=5, success_threshold=2, base_delay=30.0,
                             max_delay=30.0, jitter=0.0)
"""The spec's tool breaker: 5 consecutive transient failures open it, 30 s open
(no growth, no jitter: a tool's timeout is predictable), 2 half-open successes close it."""

MAX_KEYED = 4_096
"""Keyed breakers kept: past this, those that hold no failure are forgotten, then the oldest."""

_SEVERITY = {"closed": 0, "half_open": 1, "open": 2}


class Breakers:
    """The circuit breakers of every tool; one per process so sessions share them."""

    def __init__(self, policy: BreakerPolicy = TOOL_BREAKER, *,
                 clock: Callable[[], float] = time.monotonic, max_keyed: int = MAX_KEYED) -> None:
        self.policy = policy
        self.clock = clock
        self.max_keyed = max_keyed
        self._breakers: dict[tuple[str, str], CircuitBreaker] = {}
        self._keyed = 0

    def get(self, tool: str, key: str = "") -> CircuitBreaker:
        """The breaker of ``tool`` (of ``tool`` for ``key``), made on first use."""
        breaker = self._breakers.get((tool, key))
        if breaker is None:
            if key:
                if self._keyed >= self.max_keyed:
                    self._forget()
                self._keyed += 1
            name = f"tool {tool!r}" + (f" for {key}" if key else "")
            breaker = self._breakers[(tool, key)] = CircuitBreaker(
                self.policy, name=name, clock=self.clock)
        return breaker

    def _forget(self) -> None:
        """Drop keyed breakers that remember nothing (closed, no failure), then the
        oldest, until there is room for one more."""
        keyed = [k for k in self._breakers if k[1]]
        idle = [k for k in keyed if self._breakers[k].state == "closed"
                and not self._breakers[k].failures]
        forgettable = set(idle)
        for k in (*idle, *(k for k in keyed if k not in forgettable)):
            if self._keyed < self.max_keyed:
                break
            del self._breakers[k]
            self._keyed -= 1

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Each tool's breaker state, by tool name; for a keyed tool the worst of its
        keys' (``keys`` and ``keys_open`` say how many there are and are not closed)."""
        shown: dict[str, dict[str, Any]] = {}
        for (tool, key), breaker in sorted(self._breakers.items()):
            snap = breaker.snapshot()
            if not key:
                shown[tool] = snap
                continue
            entry = shown.setdefault(tool, {"state": "closed", "consecutive_failures": 0,
                                            "opens": 0, "retry_after": 0.0, "keys": 0,
                                            "keys_open": 0})
            entry["keys"] = entry.get("keys", 0) + 1
            if snap["state"] != "closed":
                entry["keys_open"] = entry.get("keys_open", 0) + 1
            if _SEVERITY[snap["state"]] > _SEVERITY[entry["state"]]:
                entry["state"] = snap["state"]
            entry["opens"] += snap["opens"]
            entry["consecutive_failures"] = max(entry["consecutive_failures"],
                                                snap["consecutive_failures"])
            entry["retry_after"] = max(entry["retry_after"], snap["retry_after"])
        return shown
