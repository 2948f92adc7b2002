"""Scripted failures (statuses and Slack's real fault kinds), and reading the calls back."""

from __future__ import annotations

import random
from typing import Any

from bot.testing.slack.state import State
from bot.testing.slack.wire import (
    CHAOS_METHODS,
    FAULTS,
    Call,
    Chaos,
    Failure,
    Posted,
    ResponsePost,
)


class Faults:
    """Failures to serve, and what the Web API received (both kept in ``state``)."""

    def __init__(self, state: State) -> None:
        self._state = state

    def fail(self, method: str, status: int = 429, *, times: int = 1,
             retry_after: float = 1.0, error: str = "") -> None:
        """Make the next ``times`` calls of ``method`` fail.

        429 answers ``{"ok": false, "error": "ratelimited"}`` with a
        ``Retry-After`` header (whole seconds, as Slack sends); 5xx answers an
        ``ok: false`` envelope with that status; 200 with ``error`` is an API
        error such as ``channel_not_found``. ``method`` may be
        ``"response_url"`` to fail posts to slash commands' response URLs.
        """
        if not error:
            error = "ratelimited" if status == 429 else "fatal_error" if status >= 500 \
                else "invalid_arguments"
        self._state.failures.setdefault(method, []).append(
            Failure(status, times, retry_after, error))

    def inject(self, kind: str, method: str = "*", *, times: int = 1, retry_after: float = 1.0,
               stall: float = 0.5) -> None:
        """Serve the fault ``kind`` (one of :data:`FAULTS`) to the next ``times`` calls.

        ``method`` is a Web API method or ``"*"`` for any (``auth.test`` and
        ``apps.connections.open`` included). Queued faults of the method come
        before ``"*"`` ones.
        """
        if kind not in FAULTS:
            raise ValueError(f"unknown fault {kind!r}; one of {FAULTS}")
        status = {"500": 500, "502": 502, "429": 429}.get(kind, 0)
        error = {"500": "internal_error", "429": "ratelimited"}.get(kind, "")
        self._state.failures.setdefault(method, []).append(
            Failure(status, times, retry_after, error, kind=kind, stall=stall))

    def chaos(self, rate: float, *, methods: tuple[str, ...] = CHAOS_METHODS,
              kinds: tuple[str, ...] = FAULTS, seed: int = 0, retry_after: float = 1.0,
              stall: float = 0.5) -> None:
        """Fail a ``rate`` share of the calls of ``methods`` with a random kind (``0``: off).

        Seeded, so a failing run can be replayed.
        """
        unknown = set(kinds) - set(FAULTS)
        if unknown:
            raise ValueError(f"unknown faults {sorted(unknown)}")
        self._state.chaos_plan = None if rate <= 0 else Chaos(
            rate, frozenset(methods), kinds, random.Random(seed), retry_after, stall)

    def take_failure(self, method: str) -> Failure | None:
        """The failure to serve to a call of ``method``, if any (counted as served)."""
        for key in (method, "*"):
            queue = self._state.failures.get(key)
            if not queue:
                continue
            failure = queue[0]
            failure.remaining -= 1
            if failure.remaining <= 0:
                queue.pop(0)
            return failure
        chaos = self._state.chaos_plan
        if chaos is not None and method in chaos.methods and chaos.rng.random() < chaos.rate:
            kind = chaos.rng.choice(chaos.kinds)
            status = {"500": 500, "502": 502, "429": 429}.get(kind, 0)
            return Failure(status, 1, chaos.retry_after, "", kind=kind, stall=chaos.stall)
        return None

    def calls_of(self, method: str) -> list[Call]:
        """Every call of ``method`` (failed ones included)."""
        return [c for c in self._state.calls if c.method == method]

    def sent(self, method: str) -> list[Call]:
        """The successful calls of ``method``."""
        return [c for c in self._state.calls if c.method == method and c.ok]

    def quiet(self) -> bool:
        """Whether every call received so far has been answered (none is stalled)."""
        return all(c.done for c in self._state.calls)

    def visible(self, channel: str | None = None) -> list[Posted]:
        """The app's messages not deleted, optionally only in ``channel``, in posting order."""
        return [m for m in self._state.messages.values()
                if not m.deleted and (channel is None or m.channel == channel)]

    async def wait_for(self, method: str, count: int = 1, *, limit: float = 5.0,
                       ok: bool = True) -> list[Call]:
        """Wait until ``count`` calls of ``method`` arrived (successful ones if ``ok``)."""
        def matching() -> list[Call]:
            return self.sent(method) if ok else self.calls_of(method)

        await self._state.wait_until(lambda: len(matching()) >= count, limit=limit,
                                     what=lambda: f"{count} {method} call(s), got "
                                                  f"{len(matching())}; calls: "
                                                  f"{[c.method for c in self._state.calls]}")
        return matching()

    async def wait_for_responses(self, count: int = 1, *,
                                 limit: float = 5.0) -> list[ResponsePost]:
        """Wait until ``count`` posts to response URLs arrived."""
        await self._state.wait_until(lambda: len(self._state.responses) >= count, limit=limit,
                                     what=lambda: f"{count} response_url post(s), "
                                           f"got {len(self._state.responses)}")
        return list(self._state.responses)

    async def wait_for_ack(self, envelope_id: str, *, limit: float = 5.0) -> dict[str, Any]:
        """Wait for the app's Socket Mode ack of ``envelope_id``; returns the ack frame."""
        acks = self._state.acks
        await self._state.wait_until(lambda: envelope_id in acks, limit=limit,
                                     what=lambda: f"an ack of {envelope_id}; acks: {list(acks)}")
        return self._state.acks[envelope_id]
