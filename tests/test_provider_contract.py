"""Behaviour every HTTP provider shares, run against each provider and its fake server.

What differs by wire protocol (request shape, error wording, stream events)
is tested in ``test_anthropic_provider.py`` and ``test_openai_provider.py``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from functools import partial

import pytest

from bot.contracts.llm import ProviderError
from bot.resilience.breaker import BreakerPolicy, CircuitBreaker
from plugins.provider_retry import RetryPolicy
from tests.provider_helpers import RetryLog, Served, request_for, serve

ask = partial(request_for, "test-model")


@pytest.fixture(params=["anthropic", "openai"])
async def served(request: pytest.FixtureRequest) -> AsyncIterator[Served]:
    async with serve(request.param) as pair:
        yield pair


async def test_dropped_connection_before_text_is_retried(served: Served) -> None:
    fake, provider = served.fake, served.provider
    fake.drop_connection()
    fake.reply_text("after the drop")
    retries = RetryLog()

    response = await provider.complete(ask(), on_text=lambda _: None, on_retry=retries)

    assert response.text == "after the drop"
    assert "connection" in retries.calls[0][2]


async def test_stream_cut_mid_answer_is_retried_and_only_the_retry_is_the_answer(
    served: Served,
) -> None:
    fake, provider = served.fake, served.provider
    fake.drop_connection(text_before="Some words")
    fake.reply_text(["The full ", "answer."])
    seen: list[str] = []

    async def on_retry(attempt: int, max_attempts: int, error: str) -> None:
        seen.append(f"<retry {attempt}/{max_attempts}>")

    response = await provider.complete(ask(), on_text=seen.append, on_retry=on_retry)

    # The cut attempt's words reached on_text; on_retry came before the
    # retry's, which start again from the beginning.
    assert "".join(seen) == "Some words<retry 2/6>The full answer."
    assert response.text == "The full answer."
    assert len(fake.requests) == 2


async def test_exhausted_retries_raise_a_retryable_provider_error(served: Served) -> None:
    fake, provider = served.fake, served.provider
    provider.breaker = CircuitBreaker(BreakerPolicy(threshold=10))
    provider.retry = RetryPolicy(3, 0.001)
    for _ in range(3):
        fake.drop_connection(text_before="Some words")

    with pytest.raises(ProviderError) as caught:
        await provider.complete(ask(), on_text=lambda _: None)

    assert caught.value.retryable is True
    assert "3 attempts" in str(caught.value)
    assert len(fake.requests) == 3


async def test_retry_after_header_delays_the_retry(served: Served) -> None:
    fake, provider = served.fake, served.provider
    fake.fail(429, headers={"retry-after": "0.3"})
    fake.reply_text("ok")

    started = time.monotonic()
    await provider.complete(ask())

    assert time.monotonic() - started >= 0.3


async def test_cancelling_a_slow_stream_raises_cancelled_and_closes_the_connection(
    served: Served,
) -> None:
    fake, provider = served.fake, served.provider
    fake.reply_text("this answer trickles in very slowly", chunk_delay=30)
    task = asyncio.create_task(provider.complete(ask(), on_text=lambda _: None))
    await asyncio.wait_for(fake.request_received.wait(), 5)
    await asyncio.sleep(0.1)

    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    await asyncio.wait_for(fake.disconnected.wait(), 2)
    assert fake.disconnects == 1
