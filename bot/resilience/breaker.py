"""One circuit breaker type, for model providers and for tools alike.

During an incident a dependency fails most calls for a while (a model API
answering 529, 500, 429; a tool's backend down). Each caller retrying on its
own turns that into a request storm. The breaker sits in front of every
attempt and turns an outage into a pause:

* **closed**: attempts go through. ``threshold`` consecutive retryable
  failures open it.
* **open**: no attempt goes through until a delay has passed (``base_delay``
  doubling up to ``max_delay`` after each failed trial, plus up to ``jitter``
  of it, at least the server's ``retry-after``; see :class:`BreakerPolicy`).
* **half_open**: the delay has passed; one *trial* (probe) at a time is let
  through. ``success_threshold`` successful trials in a row close it and
  release every waiter at once; a failed one re-opens it with the next,
  longer delay.

Callers choose how to meet an open breaker: :meth:`CircuitBreaker.admit`
waits (the providers hold calls until the API answers again, or the caller is
cancelled), :meth:`CircuitBreaker.try_admit` answers at once (the tool
executor fails fast). Either returns a :class:`Ticket` to hand back to one
``record_*`` method. The breaker knows nothing about HTTP or SDKs; the caller
says whether a failure was retryable (see :mod:`bot.resilience.retry`). One
event loop only.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from bot.resilience.retry import RetryPolicy

__all__ = [
    "BreakerPolicy",
    "BreakerState",
    "CircuitBreaker",
    "Clock",
    "MonotonicClock",
    "OnHold",
    "Ticket",
]

log = logging.getLogger("roost.resilience.breaker")

BreakerState = Literal["closed", "open", "half_open"]

OnHold = Callable[[str], Awaitable[None]]
"""Called as ``on_hold(reason)`` when :meth:`CircuitBreaker.admit` starts to wait."""


class Clock(Protocol):
    """Where the breaker reads time and sleeps; tests pass a manual clock."""

    def now(self) -> float:
        """Seconds on a monotonic scale."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Return after ``seconds`` on this clock's scale."""
        ...


class MonotonicClock:
    """The real clock: :func:`time.monotonic` and :func:`asyncio.sleep`."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class _ReadingClock:
    """A plain ``() -> seconds`` function as a :class:`Clock` (sleeping really sleeps)."""

    def __init__(self, read: Callable[[], float]) -> None:
        self._read = read

    def now(self) -> float:
        return self._read()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


@dataclass(frozen=True, slots=True)
class BreakerPolicy:
    """When the breaker opens, how long it waits between trials, and when it closes.

    ``threshold`` consecutive retryable failures open it (below 1 means 1).
    Trial ``n`` (0 for the first after opening) waits
    ``min(max_delay, base_delay * 2**n)`` seconds, lengthened by up to
    ``jitter`` of itself so that processes which failed together do not probe
    together, and at least the server's ``retry-after`` (up to ``max_delay``).
    ``success_threshold`` successful trials in a row close it (below 1 means 1).
    The defaults are the model providers': during an outage, requests never
    exceed one per second. A fixed pause is ``base_delay == max_delay``.
    """

    threshold: int = 3
    base_delay: float = 1.0
    max_delay: float = 30.0
    jitter: float = 0.2
    success_threshold: int = 1

    @property
    def backoff(self) -> RetryPolicy:
        """The delays between trials, as a :class:`~bot.resilience.retry.RetryPolicy`."""
        return RetryPolicy(base_delay=self.base_delay, max_delay=self.max_delay,
                           max_retry_after=self.max_delay, jitter=self.jitter,
                           jitter_mode="up")


@dataclass(frozen=True, slots=True)
class Ticket:
    """One admitted attempt; hand it back to exactly one ``record_*`` method.

    ``probe`` is True for a trial let through while the breaker is open;
    ``trial`` numbers it. ``epoch`` tells outcomes of attempts sent before the
    breaker last opened apart from current ones: those describe the past and
    are ignored.
    """

    epoch: int
    probe: bool
    trial: int = 0


class CircuitBreaker:
    """Holds or refuses attempts while a dependency is failing; see the module docstring.

    ``name`` says whose breaker it is in log lines. ``clock`` is a
    :class:`Clock` or a plain ``() -> seconds`` function (default: the
    monotonic clock); ``rng`` draws the jitter.
    """

    def __init__(
        self,
        policy: BreakerPolicy | None = None,
        *,
        name: str = "LLM",
        clock: Clock | Callable[[], float] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.policy = policy or BreakerPolicy()
        self.name = name
        if clock is None:
            clock = MonotonicClock()
        self._clock: Clock = _ReadingClock(clock) if callable(clock) else clock
        self._rng = rng or random.Random()
        self._epoch = 0
        self._failures = 0
        self._successes = 0
        self._open = False
        self._probing = False
        self._trial = 0
        self._step = 0
        self._probe_at = 0.0
        self._opened_at = 0.0
        self._reason = ""
        self._changed = asyncio.Event()
        self.waiting = 0
        """How many callers are waiting in :meth:`admit` right now."""
        self.opened = 0
        """How many times the breaker went from closed to open."""
        self.opens = 0
        """How many times it opened, re-opening after a failed trial included."""
        self.probes = 0
        """How many trials were let through."""

    # -- state ---------------------------------------------------------------

    @property
    def state(self) -> BreakerState:
        """``closed``; ``open`` (waiting for the next trial); ``half_open`` (a trial
        may go, is in flight, or succeeded and the next may go)."""
        if not self._open:
            return "closed"
        if self._probing or self._successes or self._clock.now() >= self._probe_at:
            return "half_open"
        return "open"

    @property
    def is_open(self) -> bool:
        """True while attempts are held (``open`` or ``half_open``)."""
        return self._open

    @property
    def probing(self) -> bool:
        """True while a trial is in flight."""
        return self._probing

    @property
    def failures(self) -> int:
        """Consecutive retryable failures while closed."""
        return self._failures

    @property
    def reason(self) -> str:
        """The last failure that opened or re-opened the breaker, on one line."""
        return self._reason

    @property
    def next_probe_at(self) -> float | None:
        """When the next trial may start (clock time), ``None`` while closed."""
        return self._probe_at if self._open else None

    def retry_after(self) -> float:
        """Seconds until an open breaker lets a trial through (0 unless ``open``)."""
        if self.state != "open":
            return 0.0
        return max(0.0, self._probe_at - self._clock.now())

    def snapshot(self) -> dict[str, Any]:
        """State, failure count, openings and wait, for ``/status`` and observers."""
        return {"state": self.state, "consecutive_failures": self._failures,
                "opens": self.opens, "retry_after": round(self.retry_after(), 3)}

    # -- admission -----------------------------------------------------------

    def try_admit(self) -> Ticket | None:
        """A ticket if an attempt may go now, else ``None`` (open, or a trial in flight)."""
        if not self._open:
            return Ticket(self._epoch, probe=False)
        if self._probing or self._clock.now() < self._probe_at:
            return None
        self._probing = True
        self._trial += 1
        self.probes += 1
        log.info("%s circuit breaker: probe %d goes out", self.name, self.probes)
        return Ticket(self._epoch, probe=True, trial=self._trial)

    async def admit(self, on_hold: OnHold | None = None) -> Ticket:
        """Wait until an attempt may go and return its ticket.

        Returns at once while closed. While open, ``on_hold(reason)`` is awaited
        once before the first wait, then the caller waits until it is chosen
        as the trial or trials close the breaker. Only cancellation ends the
        wait otherwise.
        """
        notified = False
        while True:
            ticket = self.try_admit()
            if ticket is not None:
                return ticket
            if not notified:
                notified = True
                if on_hold is not None:
                    await on_hold(self._reason)
                # The state may have changed while on_hold ran.
                continue
            self.waiting += 1
            try:
                await self._wait(None if self._probing
                                 else self._probe_at - self._clock.now())
            finally:
                self.waiting -= 1

    async def _wait(self, seconds: float | None) -> None:
        """Until the state changes or ``seconds`` pass on the clock (``None``: no limit)."""
        changed = self._changed.wait()
        if seconds is None:
            await changed
            return
        # The injected clock, not asyncio.timeout, decides when time is up.
        waiter = asyncio.ensure_future(changed)
        sleeper = asyncio.ensure_future(self._clock.sleep(seconds))
        try:
            await asyncio.wait({waiter, sleeper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            sleeper.cancel()

    def _notify(self) -> None:
        # A fresh event per change, so waiters that looked at the old state
        # all wake, and later waiters wait for the next change.
        self._changed.set()
        self._changed = asyncio.Event()

    def _current_trial(self, ticket: Ticket) -> bool:
        return ticket.probe and self._probing and ticket.trial == self._trial

    # -- outcomes ------------------------------------------------------------

    def record_success(self, ticket: Ticket) -> None:
        """The attempt got an answer.

        A rejected request (400, 401...) counts too: the dependency is up and
        judged it, so it neither opens the breaker nor keeps it open.
        """
        if ticket.epoch != self._epoch:
            return
        if ticket.probe:
            if self._current_trial(ticket):
                self._probing = False
                self._successes += 1
                if self._successes >= max(1, self.policy.success_threshold):
                    self._close()
                else:
                    self._notify()
        elif not self._open:
            self._failures = 0

    def record_failure(self, ticket: Ticket, reason: str = "",
                       retry_after: float | None = None) -> bool:
        """The attempt failed in a way worth retrying (overload, 5xx, 429, cut stream).

        ``reason`` is kept for :attr:`reason`; ``retry_after`` (the server's
        hint, in seconds) lengthens the next delay. True when this failure
        opened or re-opened the breaker.
        """
        if ticket.epoch != self._epoch:
            return False
        if ticket.probe:
            if not self._current_trial(ticket):
                return False
            # Bounded so the power in the backoff cannot overflow in a long outage.
            self._step = min(self._step + 1, 64)
            self._open_now(reason, retry_after)
            log.warning("%s circuit breaker: probe failed (%s); next probe in %.1f s",
                        self.name, self._reason, self._probe_at - self._clock.now())
            return True
        if self._open:
            return False
        self._failures += 1
        if self._failures < max(1, self.policy.threshold):
            return False
        self._step = 0
        self.opened += 1
        self._opened_at = self._clock.now()
        self._open_now(reason, retry_after)
        log.warning("%s circuit breaker opened after %d failures in a row (%s); "
                    "first probe in %.1f s", self.name, self._failures, self._reason,
                    self._probe_at - self._clock.now())
        return True

    def record_abandoned(self, ticket: Ticket) -> None:
        """The attempt ended without a verdict (cancelled, a bug raised, a
        permanent error that says nothing about the dependency's health).

        An abandoned trial frees the trial slot at once for another caller,
        since nothing was learned.
        """
        if ticket.epoch == self._epoch and self._current_trial(ticket):
            self._probing = False
            self._notify()

    # -- transitions ---------------------------------------------------------

    def _open_now(self, reason: str, retry_after: float | None) -> None:
        delay = self.policy.backoff.delay(self._step + 1, retry_after=retry_after,
                                          rng=self._rng)
        self._open = True
        self._probing = False
        self._successes = 0
        self.opens += 1
        # Attempts admitted before now report on a state that is gone.
        self._epoch += 1
        self._probe_at = self._clock.now() + delay
        self._reason = " ".join(reason.split()) or "the dependency is failing"
        self._notify()

    def _close(self) -> None:
        log.warning("%s circuit breaker closed: an answer came after %.1f s; "
                    "releasing %d held calls", self.name,
                    self._clock.now() - self._opened_at, self.waiting)
        self._open = False
        self._probing = False
        self._failures = 0
        self._successes = 0
        self._step = 0
        self._notify()
