"""An LLM outage through the real SDKs: the breaker holds calls, probes alone, and releases them.

The fakes' outage mode answers every call as overloaded until it is switched
off. Requests are counted from the fakes' own arrival log, and timing is only
ever checked from below (the gaps between probes), never with an upper bound.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Callable
from functools import partial

import pytest

from bot.contracts.llm import ChatMessage, LLMResponse, ProviderError
from bot.resilience.breaker import BreakerPolicy, CircuitBreaker
from bot.testing.anthropic import FakeAnthropic, busiest
from tests.provider_helpers import (
    ANTHROPIC_KEY,
    RetryLog,
    Served,
    anthropic_for,
    request_for,
    serve,
)

ask = partial(request_for, "test-model")

QUICK_BREAKER = BreakerPolicy(threshold=3, base_delay=0.02, max_delay=0.08)


@pytest.fixture(params=["anthropic", "openai"])
async def served(request: pytest.FixtureRequest) -> AsyncIterator[Served]:
    async with serve(request.param) as pair:
        pair.provider.breaker = CircuitBreaker(QUICK_BREAKER)
        yield pair


async def until(condition: Callable[[], bool]) -> None:
    """Wait for ``condition``; the timeout only keeps a broken test from hanging."""

    async def poll() -> None:
        # The breaker's counters have no event of their own to wait on.
        while not condition():  # noqa: ASYNC110
            await asyncio.sleep(0.005)

    await asyncio.wait_for(poll(), 30)


def message(n: int) -> ChatMessage:
    return ChatMessage("user", f"message {n}")


def holds(log: RetryLog) -> list[str]:
    """The reasons of the 'held by the breaker' signals (attempt 0) in ``log``."""
    return [error for attempt, total, error in log.calls if (attempt, total) == (0, 0)]


@pytest.mark.slow
async def test_twenty_calls_held_through_an_outage_stay_within_the_request_bounds() -> None:
    # Half the default base delay, so the default's bound of one request per
    # second becomes two here: exactly the target for the whole process.
    policy = BreakerPolicy(threshold=3, base_delay=0.5, max_delay=1.0)
    async with FakeAnthropic(api_key=ANTHROPIC_KEY) as fake:
        provider = anthropic_for(fake)
        provider.breaker = breaker = CircuitBreaker(policy)
        fake.reply_always("Back again.")
        fake.faults.start_outage()
        logs = [RetryLog() for _ in range(23)]

        def call(n: int) -> asyncio.Task[LLMResponse]:
            return asyncio.create_task(provider.complete(ask(message(n)), on_retry=logs[n]))

        try:
            # Three messages meet the outage first and open the breaker...
            tasks = [call(n) for n in range(3)]
            await until(lambda: breaker.is_open and breaker.waiting == 3)
            sent_before = len(fake.requests)
            # ...twenty more arrive while it lasts, and wait without a request.
            tasks += [call(n) for n in range(3, 23)]
            await until(lambda: breaker.waiting + breaker.probing == 23)
            await asyncio.sleep(2.0)
            fake.faults.end_outage()
            ended = time.monotonic()
            answers = await asyncio.gather(*tasks)
        finally:
            await provider.aclose()

    assert [a.text for a in answers] == ["Back again."] * 23
    during = [at for at in fake.arrivals[sent_before:] if at < ended]
    assert during, "the breaker sent no probe in two seconds"
    # One request per backoff step in all (so at most one per waiting
    # message), never two within base_delay, never more than two a second.
    assert all(later - earlier >= 0.5 for earlier, later in itertools.pairwise(during))
    assert busiest(during, 1.0) <= 2
    assert len(during) <= breaker.probes
    # After recovery every held call made exactly one request, and succeeded.
    after = [at for at in fake.arrivals if at >= ended]
    assert len(after) == 23
    # Each call was told once that it is held, with the provider's reason.
    assert all(len(holds(log)) == 1 for log in logs)
    assert "overloaded" in holds(logs[10])[0].lower()


async def test_calls_in_flight_when_the_outage_starts_are_held_and_all_answered(
    served: Served,
) -> None:
    fake, provider = served.fake, served.provider
    breaker = provider.breaker
    fake.reply_always("Answered after the outage.")
    fake.faults.start_outage()
    logs = [RetryLog() for _ in range(20)]
    tasks = [
        asyncio.create_task(provider.complete(ask(message(n)), on_retry=logs[n])) for n in range(20)
    ]
    await until(lambda: breaker.is_open and breaker.probes >= 3)

    fake.faults.end_outage()
    answers = await asyncio.gather(*tasks)

    assert [a.text for a in answers] == ["Answered after the outage."] * 20
    assert breaker.state == "closed"
    # Twenty first tries, at most two retries before the third failure opened
    # the breaker, then only probes: no request storm.
    assert fake.faults.served.count("outage") <= 20 + 2 + breaker.probes
    assert all(len(holds(log)) <= 1 for log in logs)
    assert any(holds(log) for log in logs)


async def test_a_held_call_is_told_once_however_many_probes_fail(served: Served) -> None:
    fake, provider = served.fake, served.provider
    fake.reply_always("Finally.")
    fake.faults.start_outage()
    retries = RetryLog()
    task = asyncio.create_task(provider.complete(ask(), on_retry=retries))
    await until(lambda: provider.breaker.probes >= 4)

    fake.faults.end_outage()
    response = await task

    assert response.text == "Finally."
    assert [(a, m) for a, m, _ in retries.calls] == [(2, 6), (3, 6), (0, 0)]


async def test_a_probe_whose_stream_began_ends_the_hold_even_if_it_is_cut_later(
    served: Served,
) -> None:
    fake, provider = served.fake, served.provider
    fake.reply_always(["One ", "two ", "three ", "four."])
    fake.faults.start_outage()
    seen: list[str | tuple[int, int]] = []

    async def on_retry(attempt: int, max_attempts: int, error: str) -> None:
        seen.append((attempt, max_attempts))

    task = asyncio.create_task(provider.complete(ask(), on_text=seen.append, on_retry=on_retry))
    await until(lambda: provider.breaker.state == "open" and (0, 0) in seen)
    fake.faults.end_outage()
    fake.faults.inject(1.0, kinds=("stream_cut",), cut_after=2, limit=1)

    response = await task

    # The probe's stream began, so the provider was back and the breaker
    # closed; the cut that followed is an ordinary failure: attempt 4 of 6,
    # announced before the retry so the chat drops the probe's words.
    assert seen == [
        (2, 6),
        (3, 6),
        (0, 0),
        "One ",
        "two ",
        (4, 6),
        "One ",
        "two ",
        "three ",
        "four.",
    ]
    assert response.text == "One two three four."
    assert provider.breaker.state == "closed"


async def test_held_calls_are_released_when_the_probe_stream_begins_not_when_it_ends(
    served: Served,
) -> None:
    fake, provider = served.fake, served.provider
    fake.faults.start_outage()
    probe_and_other = [asyncio.create_task(provider.complete(ask(message(n)))) for n in range(2)]
    await until(lambda: provider.breaker.waiting == 2)
    # Whichever call probes gets the long, slow answer; the other a quick one.
    fake.reply_text(["slowly "] * 100, chunk_delay=0.05)
    fake.reply_text("quick")
    fake.faults.end_outage()

    done, pending = await asyncio.wait(probe_and_other, return_when=asyncio.FIRST_COMPLETED)

    assert [t.result().text for t in done] == ["quick"]
    assert len(pending) == 1
    slow = pending.pop()
    slow.cancel()
    with pytest.raises(asyncio.CancelledError):
        await slow


async def test_non_retryable_errors_neither_open_the_breaker_nor_hold(served: Served) -> None:
    fake, provider = served.fake, served.provider
    for status in (400, 401, 403, 404, 400, 400):
        fake.fail(status)
    retries = RetryLog()

    for _ in range(6):
        with pytest.raises(ProviderError) as caught:
            await provider.complete(ask(), on_retry=retries)
        assert caught.value.retryable is False

    assert provider.breaker.state == "closed"
    assert provider.breaker.opened == 0
    assert retries.calls == []
    assert len(fake.requests) == 6


async def test_a_held_call_ends_when_its_caller_cancels_it(served: Served) -> None:
    fake, provider = served.fake, served.provider
    fake.faults.start_outage()
    task = asyncio.create_task(provider.complete(ask()))
    await until(lambda: provider.breaker.waiting == 1)

    task.cancel()

    with pytest.raises(asyncio.CancelledError):
        await task
    assert provider.breaker.waiting == 0
    assert provider.breaker.is_open
