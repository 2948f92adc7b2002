"""Delivering to platforms: retry-after, 5xx backoff, and throttled streaming edits."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from bot.resilience.retry import RetryPolicy

log = logging.getLogger("roost.channels.delivery")

T = TypeVar("T")


class RateLimited(Exception):
    """A platform said to wait ``retry_after`` seconds.

    ``scope`` names what the wait covers (a chat, a method, the whole bot) when
    the adapter knows better than the call's own scope; see ``channels.ratelimit``.
    """

    def __init__(self, retry_after: float, scope: str | None = None) -> None:
        super().__init__(f"rate limited for {retry_after:g}s")
        self.retry_after = retry_after
        self.scope = scope


class Transient(Exception):
    """A platform error worth retrying (5xx, connection reset)."""


DeliveryPolicy = RetryPolicy
"""How often and how patiently a platform call is retried: the shared
:class:`~bot.resilience.retry.RetryPolicy`, whose defaults are the platforms' (5
attempts, 0.5 s doubling to 30 s ±10 %, a ``retry_after`` honoured up to 60 s)."""

_DEFAULT_POLICY = DeliveryPolicy()


async def deliver(call: Callable[[], Awaitable[T]], *, what: str,
                  policy: DeliveryPolicy = _DEFAULT_POLICY,
                  sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> T:
    """Run a platform call, honouring retry-after and backing off on transient errors.

    Adapters translate their SDK's errors into :class:`RateLimited` and
    :class:`Transient`; anything else is not retried. After the last attempt
    the error propagates, and the caller logs the reply as failed.
    """
    for attempt in range(1, policy.attempts + 1):
        try:
            return await call()
        except RateLimited as exc:
            if attempt == policy.attempts:
                raise
            wait = policy.honour(exc.retry_after)
            log.warning("%s: rate limited, retrying in %.1fs", what, wait)
        except Transient as exc:
            if attempt == policy.attempts:
                raise
            wait = policy.delay(attempt)
            log.warning("%s failed (%s), retrying in %.1fs", what, exc, wait)
        await sleep(wait)
    raise AssertionError("unreachable")


class EditStream:
    """A reply streamed into one platform message, edited at most once per ``interval``.

    ``send(text) -> message id`` posts the first version; ``edit(id, text)``
    updates it; ``finalize(id | None, text | None)`` delivers the final reply
    (which may need chunking or markup the drafts did not), removes the draft
    when the reply turns out silent, and returns the id of the message that
    now carries the reply (:attr:`message_id` from then on).
    """

    def __init__(self, *, send: Callable[[str], Awaitable[str]],
                 edit: Callable[[str, str], Awaitable[None]],
                 finalize: Callable[[str | None, str | None], Awaitable[str | None]],
                 limit: int, interval: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._send, self._edit, self._finalize = send, edit, finalize
        self.limit = limit
        self.interval = interval
        self.clock = clock
        self.message_id: str | None = None
        self._last = 0.0
        self._shown = ""
        self._pending: str | None = None
        self._flusher: asyncio.Task[None] | None = None

    async def push(self, text_so_far: str) -> None:
        """Show the draft; edits inside the interval are coalesced into one."""
        draft = text_so_far if len(text_so_far) <= self.limit else \
            text_so_far[: self.limit - 1] + "…"
        if self.message_id is None:
            self.message_id = await self._send(draft)
            self._shown, self._last = draft, self.clock()
            return
        self._pending = draft
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_later())

    async def _flush_later(self) -> None:
        await asyncio.sleep(max(0.0, self._last + self.interval - self.clock()))
        draft, self._pending = self._pending, None
        if draft is not None and draft != self._shown and self.message_id is not None:
            try:
                await self._edit(self.message_id, draft)
            except Exception:
                log.warning("a streaming edit failed; the final reply will still be sent",
                            exc_info=True)
            self._shown, self._last = draft, self.clock()

    async def finish(self, final_text: str | None) -> None:
        """Deliver the final reply (``None``: withdraw the draft)."""
        if self._flusher is not None:
            self._flusher.cancel()
            await asyncio.gather(self._flusher, return_exceptions=True)
        self.message_id = await self._finalize(self.message_id, final_text)
