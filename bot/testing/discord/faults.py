"""Scripted REST failures (statuses and Discord's real fault kinds), and reading the calls back."""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import Sequence

from bot.testing.discord.state import State
from bot.testing.discord.wire import (
    CHAOS_PATHS,
    FAULT_STATUS,
    FAULTS,
    Failure,
    FakeMessage,
    RestCall,
)


class Faults:
    """Failures to serve, and what the REST API received (both kept in ``state``)."""

    def __init__(self, state: State) -> None:
        self._state = state

    def fail_next(self, status: int, count: int = 1, *, retry_after: float = 0.2,
                  method: str | None = None, path: str | None = None,
                  html: bool = False) -> None:
        """Answer the next ``count`` matching REST calls with ``status``.

        ``path`` is a regular expression searched in the path below ``/api/v10``
        and ``method`` an HTTP method; both default to any. A 429 carries
        ``Retry-After`` and JSON ``retry_after`` = ``retry_after`` seconds, plus
        the ``Via`` header without which discord.py takes a 429 for a
        Cloudflare ban and gives up. ``html`` answers an HTML error page
        instead of Discord's JSON.
        """
        self._state.failures.append(Failure(status, count, retry_after, method,
                                            re.compile(path) if path else None, html=html))

    def inject(self, kind: str, count: int = 1, *, method: str | None = None,
               path: str | None = None, retry_after: float = 0.2,
               stall: float = 0.5) -> None:
        """Serve the fault ``kind`` (one of :data:`FAULTS`) to the next ``count`` matching calls.

        Note that discord.py retries 500, 502 (and 504) by itself after 1, 3,
        5... seconds, and sleeps through 429s up to its ``max_ratelimit_timeout``.
        """
        if kind not in FAULTS:
            raise ValueError(f"unknown fault {kind!r}; one of {FAULTS}")
        self._state.failures.append(Failure(FAULT_STATUS.get(kind, 0), count, retry_after, method,
                                            re.compile(path) if path else None, kind=kind,
                                            stall=stall))

    def chaos(self, rate: float, *, method: str | None = None, path: str = CHAOS_PATHS,
              kinds: Sequence[str] = FAULTS, seed: int = 0, retry_after: float = 0.2,
              stall: float = 0.5) -> None:
        """Fail a ``rate`` share of the matching calls with a random kind (``0``: off)."""
        unknown = set(kinds) - set(FAULTS)
        if unknown:
            raise ValueError(f"unknown faults {sorted(unknown)}")
        self._state.chaos_plan = None if rate <= 0 else (
            rate, method, re.compile(path), tuple(kinds), random.Random(seed), retry_after, stall)

    def take_failure(self, method: str, path: str) -> Failure | None:
        """The failure to serve to a call of ``method`` to ``path``, if any (counted as served)."""
        failure = next((f for f in self._state.failures if f.matches(method, path)), None)
        if failure is not None:
            failure.remaining -= 1
            if failure.remaining <= 0:
                self._state.failures.remove(failure)
            return failure
        if self._state.chaos_plan is not None:
            rate, only, pattern, kinds, rng, retry_after, stall = self._state.chaos_plan
            if ((only is None or only == method) and pattern.search(path)
                    and rng.random() < rate):
                kind = rng.choice(kinds)
                return Failure(FAULT_STATUS.get(kind, 0), 1, retry_after, None, None,
                               kind=kind, stall=stall)
        return None

    def quiet(self) -> bool:
        """Whether no REST call is being answered right now (none is stalled)."""
        return self._state.serving == 0

    async def wait_until_quiet(self, limit: float = 10.0) -> None:
        """Wait until no REST call is being answered (a stalled one has landed)."""
        async def wait() -> None:
            async with self._state.changed:
                await self._state.changed.wait_for(self.quiet)

        await asyncio.wait_for(wait(), limit)

    def calls_to(self, method: str, path: str = "") -> list[RestCall]:
        """Recorded calls with ``method`` whose path matches the regex ``path``."""
        pattern = re.compile(path)
        return [c for c in self._state.calls if c.method == method and pattern.search(c.path)]

    async def wait_for_call(self, method: str, path: str = "", *, count: int = 1,
                            status: int | None = 200, limit: float = 5.0) -> RestCall:
        """Wait until ``count`` calls matched (and answered ``status``, if given); the last."""
        def found() -> list[RestCall]:
            return [c for c in self.calls_to(method, path)
                    if status is None or c.status == status]

        async def wait() -> RestCall:
            async with self._state.changed:
                await self._state.changed.wait_for(lambda: len(found()) >= count)
                return found()[count - 1]

        return await asyncio.wait_for(wait(), limit)

    def posted(self, channel_id: int | None = None) -> list[FakeMessage]:
        """Messages the bot created (in ``channel_id``), oldest first, deleted ones included."""
        return [m for m in self._state.messages.values()
                if channel_id is None or m.channel_id == channel_id]

    def visible(self, channel_id: int | None = None) -> list[str]:
        """What a user sees: the current text of every message not deleted."""
        return [m.content for m in self.posted(channel_id) if not m.deleted]
