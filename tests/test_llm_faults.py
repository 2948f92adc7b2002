"""Injected faults of the real APIs, through the real SDKs: every kind is retried and succeeds.

The fakes fail calls the way the services do during incidents (529 or 503
overloaded, 500, 429 with ``retry-after``, a stream cut by the network after
some deltas); the providers must turn each into a clean retry whose answer is
the only one returned.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import partial

import pytest

from bot.contracts.llm import ChatMessage, ToolCall
from bot.resilience.breaker import BreakerPolicy, CircuitBreaker
from bot.testing.anthropic import FAULT_KINDS, FakeAnthropic, FaultKind, ToolUse
from bot.testing.openai import FakeOpenAI, FunctionCall
from tests.provider_helpers import Served, anthropic_for, openai_for, request_for, serve

ask = partial(request_for, "test-model")

QUICK_BREAKER = BreakerPolicy(threshold=3, base_delay=0.02, max_delay=0.1)
"""Fast probes, so a run of injected faults that opens the breaker costs little time."""


@pytest.fixture(params=["anthropic", "openai"])
async def served(request: pytest.FixtureRequest) -> AsyncIterator[Served]:
    async with serve(request.param) as pair:
        pair.provider.breaker = CircuitBreaker(QUICK_BREAKER)
        yield pair


class Transcript:
    """on_text fragments and on_retry calls, interleaved in arrival order."""

    def __init__(self) -> None:
        self.items: list[str | tuple[int, int]] = []

    def text(self, fragment: str) -> None:
        self.items.append(fragment)

    async def retry(self, attempt: int, max_attempts: int, error: str) -> None:
        self.items.append((attempt, max_attempts))

    def after_last_retry(self) -> str:
        last = max(i for i, item in enumerate(self.items) if isinstance(item, tuple))
        return "".join(item for item in self.items[last + 1 :] if isinstance(item, str))


@pytest.mark.parametrize("kind", FAULT_KINDS)
async def test_each_injected_fault_is_retried_through_the_sdk_and_succeeds(
    served: Served, kind: FaultKind
) -> None:
    fake, provider = served.fake, served.provider
    fake.faults.inject(1.0, kinds=(kind,), retry_after=0.01, limit=1)
    fake.reply_text("The answer after the fault.")
    log = Transcript()

    response = await provider.complete(ask(), on_text=log.text, on_retry=log.retry)

    assert response.text == "The answer after the fault."
    assert fake.faults.served == [kind]
    assert len(fake.requests) == 2
    assert (2, 6) in log.items
    assert log.after_last_retry() == "The answer after the fault."


async def test_rate_limit_fault_waits_at_least_its_retry_after(served: Served) -> None:
    fake, provider = served.fake, served.provider
    fake.faults.inject(1.0, kinds=("rate_limit",), retry_after=0.3, limit=1)
    fake.reply_text("ok")

    await provider.complete(ask())

    assert fake.arrivals[1] - fake.arrivals[0] >= 0.3


async def test_stream_cut_mid_answer_streams_the_answer_again_after_on_retry(
    served: Served,
) -> None:
    fake, provider = served.fake, served.provider
    fake.faults.inject(1.0, kinds=("stream_cut",), cut_after=2, limit=1)
    fake.reply_text(["One ", "two ", "three ", "four."])
    log = Transcript()

    response = await provider.complete(ask(), on_text=log.text, on_retry=log.retry)

    # The network cut the first attempt after two deltas; on_retry came
    # before the retry, which streamed the whole answer from its start.
    assert log.items == ["One ", "two ", (2, 6), "One ", "two ", "three ", "four."]
    assert response.text == "One two three four."


async def test_cut_attempt_leaves_no_trace_in_the_final_tool_calls() -> None:
    async with FakeAnthropic() as fake:
        fake.faults.inject(1.0, kinds=("stream_cut",), cut_after=4, limit=1)
        # The cut falls after the whole tool_use block, inside the text after it.
        fake.reply(
            ToolUse("read_file", {"path": "a.txt"}, id="toolu_1"), ["Reading ", "it ", "now."]
        )
        provider = anthropic_for(fake)
        try:
            response = await provider.complete(ask(), on_text=lambda _: None)
        finally:
            await provider.aclose()

    assert fake.faults.served == ["stream_cut"]
    assert response.tool_calls == (ToolCall("toolu_1", "read_file", {"path": "a.txt"}),)
    assert response.text == "Reading it now."


async def test_cut_openai_attempt_leaves_no_trace_in_the_final_tool_calls() -> None:
    async with FakeOpenAI() as fake:
        fake.faults.inject(1.0, kinds=("stream_cut",), cut_after=4, limit=1)
        fake.reply(["Reading ", "it."], [FunctionCall("read_file", {"path": "a.txt"}, id="call_1")])
        provider = openai_for(fake)
        try:
            response = await provider.complete(ask(), on_text=lambda _: None)
        finally:
            await provider.aclose()

    assert fake.faults.served == ["stream_cut"]
    assert response.tool_calls == (ToolCall("call_1", "read_file", {"path": "a.txt"}),)
    assert response.text == "Reading it."


async def test_a_fifth_of_calls_failing_in_every_way_still_answers_every_call(
    served: Served,
) -> None:
    fake, provider = served.fake, served.provider
    fake.faults.inject(0.2, retry_after=0.01, seed=12)
    fake.reply_always(["Always ", "answered."])
    history = (ChatMessage("user", "hi"),)

    # One call after another, so the seeded draw gives every run the same
    # faults in the same places.
    answers = [
        (await provider.complete(ask(*history), on_text=lambda _: None)).text for _ in range(40)
    ]

    assert answers == ["Always answered."] * 40
    assert set(fake.faults.served) == set(FAULT_KINDS)
    assert len(fake.requests) == 40 + len(fake.faults.served)
