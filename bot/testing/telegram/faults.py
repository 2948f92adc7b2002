"""Failures the fake injects: scripted per method, at random, and 429 windows."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence
from typing import Any

from bot.testing.telegram.state import State
from bot.testing.telegram.wire import FAULT_KINDS, ApiError, Call, Failure, RandomFaults


class Faults:
    """``fail``, ``inject_faults`` and the flood-wait windows a 429 opens."""

    def __init__(self, state: State) -> None:
        self.state = state
        self._failures: dict[str, list[Failure]] = {}
        self._random: RandomFaults | None = None
        self._windows: dict[str, tuple[float, int]] = {}

    def fail(self, method: str, status: int = 500, *, description: str | None = None,
             retry_after: int | None = None, times: int = 1, kind: str = "status",
             seconds: float = 0.0, migrate_to_chat_id: int | None = None) -> None:
        """Make the next ``times`` calls of ``method`` fail.

        ``kind`` is how: ``"status"`` answers ``status`` with the JSON error
        envelope (429 defaults to ``retry_after=1`` and opens a window on the
        call's chat; 400 defaults to "can't parse entities"; ``migrate_to_chat_id``
        adds that parameter, as for a group upgraded to a supergroup);
        ``"html"`` answers ``status`` with nginx's HTML error page, as Telegram
        does during incidents; ``"reset_before"`` closes the connection without
        doing anything; ``"reset_after"`` does the call, then closes the
        connection without answering; ``"stall"`` waits ``seconds`` before
        doing and answering the call (a client that gives up first cancels it);
        ``"hold_after"`` does the call, then waits ``seconds`` before answering
        (a test kills the client meanwhile).
        Failures for one method are used in the order they were added.
        """
        if status == 429 and retry_after is None:
            retry_after = 1
        if description is None:
            description = {
                400: "Bad Request: can't parse entities: Unsupported start tag \"x\" at "
                     "byte offset 0",
                401: "Unauthorized",
                403: "Forbidden: bot was blocked by the user",
                404: "Not Found",
                409: "Conflict: terminated by other getUpdates request",
                413: "Request Entity Too Large",
                429: f"Too Many Requests: retry after {retry_after}",
                502: "Bad Gateway",
            }.get(status, "Internal Server Error")
        parameters: dict[str, Any] = {}
        if migrate_to_chat_id is not None:
            parameters["migrate_to_chat_id"] = migrate_to_chat_id
            if description.startswith("Internal"):
                description = "Bad Request: group chat was upgraded to a supergroup chat"
        self._failures.setdefault(method.lower(), []).append(
            Failure(status, description, retry_after, times, kind, seconds, parameters))

    def inject_faults(self, rate: float, *, kinds: Sequence[str] = FAULT_KINDS,
                      methods: Sequence[str] | None = None, retry_after: int = 1,
                      stall: float = 1.0, seed: int | None = None) -> None:
        """Fail a share ``rate`` of calls, each in one of ``kinds`` drawn at random.

        ``kinds`` are those of :data:`FAULT_KINDS`: a 500 with the JSON
        envelope, a 502 HTML page, a 429 with ``retry_after`` (scoped to the
        call's chat, or to the bot for calls without one), a reset before or
        after the call took effect, a stall of ``stall`` seconds. ``methods``
        limits the faults to those methods. ``rate=0`` turns them off.
        Scripted :meth:`fail` entries are used first.
        """
        unknown = set(kinds) - set(FAULT_KINDS)
        if unknown:
            raise ValueError(f"unknown fault kinds: {sorted(unknown)}")
        self._random = None if rate <= 0 else RandomFaults(
            rate, tuple(kinds), None if methods is None else frozenset(m.lower() for m in methods),
            retry_after, stall, random.Random(seed))

    def _random_fault(self, method: str) -> Failure | None:
        faults = self._random
        if faults is None or (faults.methods is not None and method not in faults.methods):
            return None
        if faults.rng.random() >= faults.rate:
            return None
        kind = faults.rng.choice(faults.kinds)
        if kind == "500":
            return Failure(500, "Internal Server Error", None, 1)
        if kind == "html":
            return Failure(502, "Bad Gateway", None, 1, "html")
        if kind == "429":
            return Failure(429, f"Too Many Requests: retry after {faults.retry_after}",
                            faults.retry_after, 1)
        return Failure(0, "", None, 1, kind, faults.stall)

    @property
    def faults(self) -> dict[str, int]:
        """How many calls got each injected fault (``"window"``: calls inside a 429 window)."""
        counts: dict[str, int] = {}
        for call in self.state.calls:
            if call.fault:
                counts[call.fault] = counts.get(call.fault, 0) + 1
        return counts

    def open_window(self, scope: str, retry_after: int) -> None:
        until = time.monotonic() + retry_after
        if until > self._windows.get(scope, (0.0, 0))[0]:
            self._windows[scope] = (until, retry_after)

    def check_window(self, call: Call, scope: str) -> None:
        """A call inside an open 429 window is refused again, and the wait starts over."""
        now = time.monotonic()
        for key in {scope, "bot"}:
            until, retry_after = self._windows.get(key, (0.0, 0))
            if now < until:
                call.fault = "window"
                self.state.violations.append(call)
                # As Telegram does: calling into the flood wait extends it.
                self._windows[key] = (now + retry_after, retry_after)
                raise ApiError(429, f"Too Many Requests: retry after {retry_after}",
                                max(1, math.ceil(retry_after)))

    def take_failure(self, method: str) -> Failure | None:
        queue = self._failures.get(method)
        if not queue:
            return self._random_fault(method)
        failure = queue[0]
        failure.times -= 1
        if failure.times <= 0:
            queue.pop(0)
        return failure
