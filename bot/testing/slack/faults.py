"""Scripted failures (statuses and Slack's real fault kinds), and reading the calls back."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

from bot.testing.slack.state import _State
from bot.testing.slack.wire import (
    CHAOS_METHODS,
    FAULTS,
    Call,
    Posted,
    ResponsePost,
    _Chaos,
    _Failure,
)


class _Faults(_State):
    """Failures to serve, and what the Web API received."""

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
        self._failures.setdefault(method, []).append(_Failure(status, times, retry_after, error))

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
        self._failures.setdefault(method, []).append(
            _Failure(status, times, retry_after, error, kind=kind, stall=stall))

    def chaos(self, rate: float, *, methods: tuple[str, ...] = CHAOS_METHODS,
              kinds: tuple[str, ...] = FAULTS, seed: int = 0, retry_after: float = 1.0,
              stall: float = 0.5) -> None:
        """Fail a ``rate`` share of the calls of ``methods`` with a random kind (``0``: off).

        Seeded, so a failing run can be replayed.
        """
        unknown = set(kinds) - set(FAULTS)
        if unknown:
            raise ValueError(f"unknown faults {sorted(unknown)}")
        self._chaos = None if rate <= 0 else _Chaos(rate, frozenset(methods), kinds,
                                                     random.Random(seed), retry_after, stall)

    def calls_of(self, method: str) -> list[Call]:
        """Every call of ``method`` (failed ones included)."""
        return [c for c in self.calls if c.method == method]

    def sent(self, method: str) -> list[Call]:
        """The successful calls of ``method``."""
        return [c for c in self.calls if c.method == method and c.ok]

    def quiet(self) -> bool:
        """Whether every call received so far has been answered (none is stalled)."""
        return all(c.done for c in self.calls)

    def visible(self, channel: str | None = None) -> list[Posted]:
        """The app's messages not deleted, optionally only in ``channel``, in posting order."""
        return [m for m in self.messages.values()
                if not m.deleted and (channel is None or m.channel == channel)]

    async def wait_for(self, method: str, count: int = 1, *, limit: float = 5.0,
                       ok: bool = True) -> list[Call]:
        """Wait until ``count`` calls of ``method`` arrived (successful ones if ``ok``)."""
        def matching() -> list[Call]:
            return self.sent(method) if ok else self.calls_of(method)

        await self.wait_until(lambda: len(matching()) >= count, limit=limit,
                              what=lambda: f"{count} {method} call(s), got {len(matching())}; "
                                           f"calls: {[c.method for c in self.calls]}")
        return matching()

    async def wait_for_responses(self, count: int = 1, *,
                                 limit: float = 5.0) -> list[ResponsePost]:
        """Wait until ``count`` posts to response URLs arrived."""
        await self.wait_until(lambda: len(self.responses) >= count, limit=limit,
                              what=lambda: f"{count} response_url post(s), "
                                           f"got {len(self.responses)}")
        return list(self.responses)

    async def wait_for_ack(self, envelope_id: str, *, limit: float = 5.0) -> dict[str, Any]:
        """Wait for the app's Socket Mode ack of ``envelope_id``; returns the ack frame."""
        await self.wait_until(lambda: envelope_id in self.acks, limit=limit,
                              what=lambda: f"an ack of {envelope_id}; acks: {list(self.acks)}")
        return self.acks[envelope_id]

    async def wait_until(self, predicate: Callable[[], bool], *, limit: float = 5.0,
                         what: Callable[[], str] | str = "the condition") -> None:
        """Wait until ``predicate()`` holds; re-checked whenever the fake records something."""
        try:
            async with asyncio.timeout(limit), self._changed:
                await self._changed.wait_for(predicate)
        except TimeoutError:
            described = what() if callable(what) else what
            raise AssertionError(f"expected {described} within {limit}s") from None
