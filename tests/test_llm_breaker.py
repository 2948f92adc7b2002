"""The circuit breaker on its own, on a manual clock: no sleeping, no timing races."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Coroutine
from typing import Any

import pytest

from bot.resilience.breaker import BreakerPolicy, CircuitBreaker, Ticket

NO_JITTER = BreakerPolicy(threshold=3, base_delay=1.0, max_delay=30.0, jitter=0.0)


class ManualClock:
    """Time moves only when the test calls :meth:`advance`."""

    def __init__(self) -> None:
        self.time = 0.0
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []

    def now(self) -> float:
        return self.time

    async def sleep(self, seconds: float) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (self.time + seconds, future)
        self._sleepers.append(entry)
        try:
            await future
        finally:
            self._sleepers.remove(entry)

    async def advance(self, seconds: float) -> None:
        self.time += seconds
        for due, future in list(self._sleepers):
            if due <= self.time and not future.done():
                future.set_result(None)
        await settle()


async def settle() -> None:
    """Let every task that can run do so."""
    for _ in range(20):
        await asyncio.sleep(0)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def breaker(clock: ManualClock) -> CircuitBreaker:
    return CircuitBreaker(NO_JITTER, clock=clock)


async def fail_until_open(breaker: CircuitBreaker, reason: str = "overloaded (529)") -> None:
    for _ in range(breaker.policy.threshold):
        breaker.record_failure(await breaker.admit(), reason)


class Holds:
    """An ``on_hold`` callback that counts its calls."""

    def __init__(self) -> None:
        self.reasons: list[str] = []

    async def __call__(self, reason: str) -> None:
        self.reasons.append(reason)


def start(coro: Coroutine[Any, Any, Ticket]) -> asyncio.Task[Ticket]:
    return asyncio.ensure_future(coro)


async def test_closed_breaker_admits_at_once_and_two_failures_do_not_open_it(
    breaker: CircuitBreaker,
) -> None:
    for _ in range(2):
        breaker.record_failure(await breaker.admit(), "boom")

    ticket = await breaker.admit()

    assert ticket.probe is False
    assert breaker.state == "closed"


async def test_three_consecutive_failures_open_it_with_the_last_reason_on_one_line(
    breaker: CircuitBreaker, clock: ManualClock
) -> None:
    await fail_until_open(breaker, "Anthropic is overloaded (529):\n  Overloaded")

    assert breaker.state == "open"
    assert breaker.opened == 1
    assert breaker.reason == "Anthropic is overloaded (529): Overloaded"
    assert breaker.next_probe_at == clock.time + 1.0


async def test_an_answer_between_failures_resets_the_count(breaker: CircuitBreaker) -> None:
    for _ in range(2):
        breaker.record_failure(await breaker.admit(), "boom")
    breaker.record_success(await breaker.admit())
    for _ in range(2):
        breaker.record_failure(await breaker.admit(), "boom")

    assert breaker.state == "closed"


async def test_open_breaker_holds_callers_and_tells_each_once(
    breaker: CircuitBreaker, clock: ManualClock
) -> None:
    await fail_until_open(breaker)
    holds = [Holds() for _ in range(5)]
    waiters = [start(breaker.admit(hold)) for hold in holds]
    await settle()
    await clock.advance(0.9)

    assert not any(w.done() for w in waiters)
    assert breaker.waiting == 5
    assert [h.reasons for h in holds] == [["overloaded (529)"]] * 5
    for waiter in waiters:
        waiter.cancel()


async def test_after_the_delay_exactly_one_waiter_is_let_through_as_the_probe(
    breaker: CircuitBreaker, clock: ManualClock
) -> None:
    await fail_until_open(breaker)
    waiters = [start(breaker.admit()) for _ in range(5)]
    await settle()

    await clock.advance(1.0)

    done = [w for w in waiters if w.done()]
    assert len(done) == 1 and done[0].result().probe is True
    assert breaker.state == "half_open" and breaker.probing
    await clock.advance(60.0)  # however long the probe takes, no second one goes out
    assert sum(w.done() for w in waiters) == 1
    for waiter in waiters:
        waiter.cancel()


async def test_probe_success_closes_it_and_releases_every_waiter_at_once(
    breaker: CircuitBreaker, clock: ManualClock
) -> None:
    await fail_until_open(breaker)
    waiters = [start(breaker.admit()) for _ in range(20)]
    await clock.advance(1.0)
    probe = next(w for w in waiters if w.done()).result()

    breaker.record_success(probe)
    await settle()

    assert breaker.state == "closed"
    assert all(w.done() for w in waiters)
    assert sum(w.result().probe for w in waiters) == 1
    assert breaker.waiting == 0


async def test_failed_probes_double_the_delay_up_to_the_maximum(
    breaker: CircuitBreaker, clock: ManualClock
) -> None:
    await fail_until_open(breaker)
    delays = []
    for _ in range(7):
        opened_at = clock.time
        assert breaker.next_probe_at is not None
        delays.append(breaker.next_probe_at - opened_at)
        await clock.advance(breaker.next_probe_at - clock.time)
        probe = await breaker.admit()
        assert probe.probe is True
        breaker.record_failure(probe, "still overloaded")

    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert breaker.probes == 7


async def test_jitter_lengthens_each_delay_by_at_most_its_share(clock: ManualClock) -> None:
    policy = BreakerPolicy(threshold=1, base_delay=1.0, max_delay=30.0, jitter=0.2)
    delays = []
    for seed in range(50):
        breaker = CircuitBreaker(policy, clock=clock, rng=random.Random(seed))
        breaker.record_failure(await breaker.admit(), "boom")
        assert breaker.next_probe_at is not None
        delays.append(breaker.next_probe_at - clock.time)

    assert all(1.0 <= d <= 1.2 for d in delays)
    assert len(set(delays)) > 40


async def test_retry_after_lengthens_the_next_delay(
    breaker: CircuitBreaker, clock: ManualClock
) -> None:
    for _ in range(3):
        breaker.record_failure(await breaker.admit(), "rate limited", retry_after=7.0)

    assert breaker.next_probe_at == clock.time + 7.0


async def test_abandoned_probe_lets_another_waiter_probe_at_once(
    breaker: CircuitBreaker, clock: ManualClock
) -> None:
    await fail_until_open(breaker)
    waiters = [start(breaker.admit()) for _ in range(3)]
    await clock.advance(1.0)
    first = next(w for w in waiters if w.done())

    breaker.record_abandoned(first.result())
    await settle()

    assert sum(w.done() for w in waiters) == 2
    assert breaker.state == "half_open" and breaker.probing
    for waiter in waiters:
        waiter.cancel()


async def test_outcomes_of_attempts_admitted_before_it_opened_are_ignored(
    breaker: CircuitBreaker,
) -> None:
    stale = await breaker.admit()
    await fail_until_open(breaker)

    breaker.record_success(stale)

    assert breaker.state == "open"


async def test_non_retryable_answers_do_not_count_towards_opening(
    breaker: CircuitBreaker,
) -> None:
    # with_retries reports a 400 or 401 as an answer: the provider judged it.
    for _ in range(10):
        breaker.record_success(await breaker.admit())

    assert breaker.state == "closed"
    assert breaker.opened == 0


async def test_a_cancelled_waiter_leaves_the_queue(
    breaker: CircuitBreaker, clock: ManualClock
) -> None:
    await fail_until_open(breaker)
    waiter = start(breaker.admit())
    await settle()
    assert breaker.waiting == 1

    waiter.cancel()
    await settle()

    assert waiter.cancelled()
    assert breaker.waiting == 0
    await clock.advance(1.0)
    assert (await breaker.admit()).probe is True
