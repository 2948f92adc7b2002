"""Delivering to platforms: retries, rate limits, and throttled streaming edits.

Every platform call goes through :func:`deliver`, which honours a ``retry_after``
(:class:`RateLimited`) and backs off on transient errors (:class:`Transient`);
adapters translate their SDK's errors into these two. A reply streamed into one
message is edited through an :class:`EditStream`.

**Rate limits.**
Platforms punish a client that keeps calling while it was told to wait: a
Telegram 429 covers the whole chat (any method), and calling into the window
only extends it. So every call to a platform goes through :meth:`RateLimiter.slot`:

- after a 429 in a scope (a chat, a method like ``getUpdates``, or the whole
  bot), nothing goes to that scope until ``retry_after`` has passed;
- a proactive budget keeps the documented limits (per chat, per group, per
  bot), so 429s stay rare; only calls that count against those limits
  (``counted``) spend it;
- urgent calls (final replies) wait their turn; the others (streaming drafts,
  typing indicators) are refused when they would have to wait for a window or
  the budget, or when an urgent call is waiting, so they are skipped or
  coalesced instead of queueing ahead of a final reply, and none is ever sent
  inside a 429 window. They also leave part of each budget unused,
  so a final reply rarely waits behind drafts.

Calls to one chat are serialized: a call already in flight when a 429 comes
back would otherwise land inside the window that 429 just opened.

When the bot-wide (``overall``) budget is the bottleneck, urgent calls take it in
the order they became ready for it (once their chat's own limits let them go): a
first-in, first-out line in which each chat has at most its next call, so chats
are served round-robin and each chat's calls stay in order. Only the call at the
head of the line waits for the budget; calls that are not urgent never go while
the line is not empty (typing indicators and drafts are the first to be dropped).

The ``overall`` budget is the bot's, not the process's: replicas sharing one
bot account each pace at their share of it (:attr:`RateLimiter.shared_by`, read
at every counted call, so it follows replicas coming and going).

The module knows nothing about a platform; adapters say what the scope of a
call is and translate their SDK's 429 into :class:`RateLimited`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

from bot.resilience.retry import RetryPolicy

log = logging.getLogger("roost.channels.delivery")

T = TypeVar("T")


class RateLimited(Exception):
    """A platform said to wait ``retry_after`` seconds.

    ``scope`` names what the wait covers (a chat, a method, the whole bot) when
    the adapter knows better than the call's own scope; see :class:`RateLimiter`.
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


BOT = "bot"
"""The bot-wide scope: a 429 there (a global flood) holds every call."""


@dataclass(frozen=True, slots=True)
class Rate:
    """At most ``count`` calls in any ``per`` seconds."""

    count: int
    per: float


@dataclass(frozen=True, slots=True)
class Limits:
    """A platform's documented limits for calls that count (``None``: no limit)."""

    per_chat: Rate | None = None
    per_group: Rate | None = None
    overall: Rate | None = None


TELEGRAM_LIMITS = Limits(per_chat=Rate(3, 3.0), per_group=Rate(20, 60.0),
                         overall=Rate(30, 1.0))
"""Telegram's FAQ: about one message per second in a chat (short bursts are
tolerated, so three per three seconds), 20 per minute in a group, 30 per second
in all. ``sendMessage``, ``editMessageText`` and ``deleteMessage`` count."""

SHARE_BURST = 5
"""Calls a process's share of the overall budget allows at once, at least (fewer when
the whole budget is smaller): below it the share's period is stretched instead, so a
reply split into a few messages is not spaced out and drafts keep part of the share
(a fifth is reserved for urgent calls)."""


def share_of(rate: Rate, sharers: int) -> Rate:
    """One of ``sharers`` processes' part of ``rate``: together they make ``rate``'s pace.

    The count is divided while the share still allows :data:`SHARE_BURST` calls at once;
    beyond that the period grows instead (30/s among 2: 15 per second; among 10: 5 per
    1.67 s). A burst is never more than ``rate`` allows.
    """
    if sharers <= 1:
        return rate
    count = max(rate.count // sharers, min(rate.count, SHARE_BURST))
    return Rate(count, rate.per * count * sharers / rate.count)


class _Window:
    """Timestamps of the counted calls of one scope within its rate's period."""

    __slots__ = ("rate", "times")

    def __init__(self, rate: Rate) -> None:
        self.rate = rate
        self.times: deque[float] = deque()

    def wait(self, now: float, *, urgent: bool) -> float:
        """Seconds until one more call fits (0: now).

        A call that is not urgent may use the budget only up to a reserve kept
        for urgent ones: a draft never takes the slot the final reply needs.
        """
        while self.times and self.times[0] <= now - self.rate.per:
            self.times.popleft()
        allowed = self.rate.count if urgent else \
            self.rate.count - max(1, self.rate.count // 5)
        if allowed <= 0:
            return float("inf")
        if len(self.times) < allowed:
            return 0.0
        return self.times[len(self.times) - allowed] + self.rate.per - now


@dataclass(slots=True)
class _Scope:
    """The calls of one scope: one at a time, and how many urgent ones wait."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0
    urgent_waiting: int = 0


class RateLimiter:
    """Holds calls back per scope; see the module's docstring.

    ``clock`` and ``sleep`` exist for tests (a fake clock advanced by the sleep).
    """

    def __init__(self, limits: Limits = Limits(), *,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 shared_by: Callable[[], int] | None = None) -> None:
        self.limits = limits
        self.clock = clock
        self.sleep = sleep
        self.shared_by = shared_by
        """How many processes share the bot-wide (``overall``) budget now (``None``: this
        one alone); called at every counted call, so it must be cheap and never block."""
        self._share: tuple[Rate | None, int, Rate | None] = (limits.overall, 1, limits.overall)
        # The share last computed, of what and for how many: replaced whole (one
        # assignment), so a reader never sees a count with another count's rate.
        self._until: dict[str, float] = {}
        self._windows: dict[tuple[str, str], _Window] = {}
        self._scopes: dict[str, _Scope] = {}
        self._line: deque[asyncio.Future[None]] = deque()
        """Urgent counted calls waiting for the overall budget, first come first."""

    @property
    def queued(self) -> int:
        """Urgent calls waiting in line for the bot-wide budget now."""
        return len(self._line)

    @property
    def overall(self) -> Rate | None:
        """This process's part of ``limits.overall`` now (:func:`share_of` among
        ``shared_by()`` processes, at least 1); ``None`` when there is no overall limit."""
        whole = self.limits.overall
        sharers = 1 if self.shared_by is None else max(1, self.shared_by())
        of, known, rate = self._share
        if known != sharers or of != whole:
            rate = None if whole is None else share_of(whole, sharers)
            self._share = (whole, sharers, rate)
        return rate

    # -- 429 windows -----------------------------------------------------------

    def block(self, scope: str, retry_after: float) -> None:
        """Hold every call in ``scope`` for ``retry_after`` seconds from now."""
        until = self.clock() + max(0.0, retry_after)
        if until > self._until.get(scope, 0.0):
            self._until[scope] = until

    def blocked_for(self, scope: str) -> float:
        """Seconds left in the 429 window of ``scope`` or of the whole bot (0: none)."""
        now = self.clock()
        left = 0.0
        for key in (scope, BOT):
            until = self._until.get(key)
            if until is None:
                continue
            if until <= now:
                del self._until[key]
            else:
                left = max(left, until - now)
        return left

    # -- slots -------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def slot(self, scope: str = BOT, *, group: bool = False, counted: bool = False,
                   urgent: bool = True) -> AsyncIterator[bool]:
        """Make one call in ``scope``; yields whether it may go ahead.

        Urgent calls wait (for a 429 window to pass, for the budget, for the
        call before them in the scope, in line for the bot-wide budget) and always
        get ``True``. Other calls wait only for the call in flight before them, and
        get ``False`` (they must then skip the call) where they would have to wait
        for a window or the budget, or an urgent call is waiting in the scope or in
        line for the bot-wide budget. A :class:`RateLimited`
        raised in the block opens the window of its scope (``exc.scope``, else
        ``scope``) before the next call can start.
        """
        state = self._scopes.get(scope)
        if state is None:
            state = self._scopes[scope] = _Scope()
        state.users += 1
        try:
            if not urgent:
                if self._gives_way(state, scope, group, counted):
                    yield False
                    return
                # Behind a call in flight it waits its turn, then looks again: an
                # urgent call that came meanwhile, or a 429 that call got, wins.
                async with state.lock:
                    go = not self._gives_way(state, scope, group, counted)
                    if go:
                        self._spend(scope, group, counted)
                    with self._opening_windows(scope):
                        yield go
                return
            state.urgent_waiting += 1
            waiting = True
            try:
                async with state.lock:
                    while True:
                        while (wait := self._wait(scope, group, counted, urgent=True,
                                                  overall=False)) > 0:
                            await self.sleep(wait)
                        if counted and self.overall is not None:
                            await self._take_turn()
                            if self._wait(scope, group, counted, urgent=True,
                                          overall=False) > 0:
                                continue  # a 429 came meanwhile: to the back of the line
                        break
                    state.urgent_waiting -= 1
                    waiting = False
                    self._spend(scope, group, counted)
                    with self._opening_windows(scope):
                        yield True
            finally:
                if waiting:  # cancelled while waiting
                    state.urgent_waiting -= 1
        finally:
            state.users -= 1
            if not state.users:
                # Chats come and go; their state need not outlive their calls.
                del self._scopes[scope]

    def _gives_way(self, state: _Scope, scope: str, group: bool, counted: bool) -> bool:
        """Whether a call that is not urgent must be skipped now."""
        return bool(state.urgent_waiting or self._line) \
            or self._wait(scope, group, counted, urgent=False) > 0

    async def _take_turn(self) -> None:
        """Wait in line for the overall budget (and any bot-wide 429 window); returns at
        the head of the line with room in the budget, the line moved on. The caller
        spends the budget before its next ``await``."""
        ticket: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._line.append(ticket)
        try:
            if self._line[0] is not ticket:
                await ticket  # set when it reaches the head
            while (wait := self._overall_wait()) > 0:
                await self.sleep(wait)
        finally:
            head = bool(self._line) and self._line[0] is ticket
            self._line.remove(ticket)
            if head and self._line and not self._line[0].done():
                self._line[0].set_result(None)

    def _overall_wait(self) -> float:
        wait = self.blocked_for(BOT)
        rate = self.overall
        if rate is not None:
            window = self._overall_window(rate)
            wait = max(wait, window.wait(self.clock(), urgent=True))
        return wait

    @contextlib.contextmanager
    def _opening_windows(self, scope: str) -> Iterator[None]:
        try:
            yield
        except RateLimited as exc:
            self.block(exc.scope or scope, exc.retry_after)
            raise

    def _overall_window(self, rate: Rate) -> _Window:
        window = self._windows.get(("overall", ""))
        if window is None:
            window = self._windows[("overall", "")] = _Window(rate)
        elif window.rate != rate:
            window.rate = rate
        return window

    def _budgets(self, scope: str, group: bool, overall: bool = True) -> list[_Window]:
        found: list[_Window] = []
        for kind, key, rate in (("chat", scope, self.limits.per_chat),
                                ("group", scope, self.limits.per_group if group else None),
                                ("overall", "", self.overall if overall else None)):
            if rate is None:
                continue
            window = self._windows.get((kind, key))
            if window is None:
                window = self._windows[(kind, key)] = _Window(rate)
            elif window.rate != rate:
                # The share changed (a replica came or went): the calls already made in
                # the window count against the new rate from now on.
                window.rate = rate
            found.append(window)
        return found

    def _wait(self, scope: str, group: bool, counted: bool, *, urgent: bool,
              overall: bool = True) -> float:
        wait = self.blocked_for(scope)
        if counted:
            now = self.clock()
            for window in self._budgets(scope, group, overall):
                wait = max(wait, window.wait(now, urgent=urgent))
        return wait

    def _spend(self, scope: str, group: bool, counted: bool) -> None:
        if not counted:
            return
        now = self.clock()
        for window in self._budgets(scope, group):
            window.times.append(now)
        if len(self._windows) > 1024:
            # Drop the budgets of chats quiet for a whole period.
            for key, window in list(self._windows.items()):
                if not window.times or window.times[-1] <= now - window.rate.per:
                    del self._windows[key]


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
