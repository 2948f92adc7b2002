"""A provider-wide circuit breaker for LLM calls.

During an incident a model API fails most calls for a while (529 overloaded,
500, 429). Each run retrying on its own turns that into a request storm, and
runs give up while the provider is about to recover. The breaker sits in
front of every attempt of one provider instance and turns an outage into one
held queue:

* **closed**: attempts go through. ``threshold`` consecutive retryable
  failures open it.
* **open**: no attempt reaches the API. Callers wait in :meth:`CircuitBreaker.admit`
  until a backoff delay (``base_delay`` doubling up to ``max_delay``, plus up
  to ``jitter`` of it) has passed; then exactly one caller is let through as
  the *probe* (the breaker is **probing** while it is in flight).
* A probe that succeeds closes the breaker and releases every waiter at once;
  one that fails re-opens it with the next, longer delay.

Waiting has no deadline of its own: it ends when the provider recovers or the
caller is cancelled (the core cancels runs that exceed their timeout). The
breaker knows nothing about HTTP or SDKs; the caller says whether a failure
was retryable (see :mod:`plugins.provider_retry`). One event loop only.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal, Protocol

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

BreakerState = Literal["closed", "open", "probing"]

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


@dataclass(frozen=True, slots=True)
class BreakerPolicy:
    """When the breaker opens and how long it waits between probes.

    ``threshold`` consecutive retryable failures open it (below 1 means 1).
    Probe ``n`` (0 for the first after opening) waits
    ``min(max_delay, base_delay * 2**n)`` seconds, lengthened by up to
    ``jitter`` of itself so that processes which failed together do not probe
    together, and at least the server's ``retry-after`` (up to ``max_delay``).
    With the defaults, requests during an outage never exceed one per second.
    """

    threshold: int = 3
    base_delay: float = 1.0
    max_delay: float = 30.0
    jitter: float = 0.2


@dataclass(frozen=True, slots=True)
class Ticket:
    """One admitted attempt; hand it back to exactly one ``record_*`` method.

    ``probe`` is True for the single attempt let through while the breaker is
    open. ``epoch`` tells outcomes of attempts sent before the breaker last
    opened apart from current ones: those describe the past and are ignored.
    """

    epoch: int
    probe: bool


class CircuitBreaker:
    """Holds attempts while a provider is failing; see the module docstring.

    ``clock`` defaults to the monotonic clock; ``rng`` draws the jitter.
    """

    def __init__(
        self,
        policy: BreakerPolicy | None = None,
        *,
        clock: Clock | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.policy = policy or BreakerPolicy()
        self._clock: Clock = clock or MonotonicClock()
        self._rng = rng or random.Random()
        self._epoch = 0
        self._failures = 0
        self._open = False
        self._probing = False
        self._step = 0
        self._probe_at = 0.0
        self._opened_at = 0.0
        self._reason = ""
        self._changed = asyncio.Event()
        self.waiting = 0
        """How many callers are waiting in :meth:`admit` right now."""
        self.opened = 0
        """How many times the breaker went from closed to open."""
        self.probes = 0
        """How many probes were let through."""

    # -- state ---------------------------------------------------------------

    @property
    def state(self) -> BreakerState:
        """``closed``, ``open`` (waiting for the next probe) or ``probing``."""
        if not self._open:
            return "closed"
        return "probing" if self._probing else "open"

    @property
    def is_open(self) -> bool:
        """True while attempts are held (``open`` or ``probing``)."""
        return self._open

    @property
    def reason(self) -> str:
        """The last failure that opened or re-opened the breaker, on one line."""
        return self._reason

    @property
    def next_probe_at(self) -> float | None:
        """When the next probe may start (clock time), ``None`` while closed."""
        return self._probe_at if self._open else None

    # -- admission -----------------------------------------------------------

    async def admit(self, on_hold: OnHold | None = None) -> Ticket:
        """Wait until an attempt may go to the API and return its ticket.

        Returns at once while closed. While open, ``on_hold(reason)`` is awaited
        once before the first wait, then the caller waits until it is chosen
        as the probe or a probe closes the breaker. Only cancellation ends the
        wait otherwise.
        """
        notified = False
        while True:
            if not self._open:
                return Ticket(self._epoch, probe=False)
            now = self._clock.now()
            if not self._probing and now >= self._probe_at:
                self._probing = True
                self.probes += 1
                log.info("LLM circuit breaker: probe %d goes out", self.probes)
                return Ticket(self._epoch, probe=True)
            if not notified:
                notified = True
                if on_hold is not None:
                    await on_hold(self._reason)
                # The state may have changed while on_hold ran.
                continue
            self.waiting += 1
            try:
                await self._wait(None if self._probing else self._probe_at - now)
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

    # -- outcomes ------------------------------------------------------------

    def record_success(self, ticket: Ticket) -> None:
        """The attempt got an answer from the provider.

        A rejected request (400, 401...) counts too: the provider is up and
        judged it, so it neither opens the breaker nor keeps it open.
        """
        if ticket.epoch != self._epoch:
            return
        if ticket.probe:
            if self._probing:
                self._close()
        elif not self._open:
            self._failures = 0

    def record_failure(self, ticket: Ticket, reason: str, retry_after: float | None = None) -> None:
        """The attempt failed in a way worth retrying (overload, 5xx, 429, cut stream).

        ``reason`` is kept for :attr:`reason`; ``retry_after`` (the server's
        hint, in seconds) lengthens the next delay.
        """
        if ticket.epoch != self._epoch:
            return
        if ticket.probe:
            if self._probing:
                # Bounded so the power below cannot overflow in a long outage.
                self._step = min(self._step + 1, 64)
                self._open_now(reason, retry_after)
                log.warning(
                    "LLM circuit breaker: probe failed (%s); next probe in %.1f s",
                    self._reason,
                    self._probe_at - self._clock.now(),
                )
        elif not self._open:
            self._failures += 1
            if self._failures >= max(1, self.policy.threshold):
                self._step = 0
                self.opened += 1
                self._opened_at = self._clock.now()
                self._open_now(reason, retry_after)
                log.warning(
                    "LLM circuit breaker opened after %d failures in a row (%s); "
                    "holding calls, first probe in %.1f s",
                    self._failures,
                    self._reason,
                    self._probe_at - self._clock.now(),
                )

    def record_abandoned(self, ticket: Ticket) -> None:
        """The attempt ended without an outcome (cancelled, or a bug raised).

        An abandoned probe frees the probe slot at once for another waiter,
        since nothing was learned about the provider.
        """
        if ticket.probe and self._probing and ticket.epoch == self._epoch:
            self._probing = False
            self._notify()

    # -- transitions ---------------------------------------------------------

    def _open_now(self, reason: str, retry_after: float | None) -> None:
        policy = self.policy
        delay = min(policy.max_delay, policy.base_delay * 2.0**self._step)
        delay *= 1.0 + max(0.0, policy.jitter) * self._rng.random()
        if retry_after is not None:
            delay = max(delay, min(retry_after, policy.max_delay))
        self._open = True
        self._probing = False
        # Attempts admitted before now report on a provider state that is gone.
        self._epoch += 1
        self._probe_at = self._clock.now() + delay
        self._reason = " ".join(reason.split()) or "the provider is failing"
        self._notify()

    def _close(self) -> None:
        log.warning(
            "LLM circuit breaker closed: the provider answered after %.1f s; "
            "releasing %d held calls",
            self._clock.now() - self._opened_at,
            self.waiting,
        )
        self._open = False
        self._probing = False
        self._failures = 0
        self._step = 0
        self._notify()
