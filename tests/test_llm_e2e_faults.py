"""Whole runs over the real SDK while the model API fails: each chat sees its answer once.

The core's side of the contract: a numbered ``run.retrying`` restarts the
chat's draft, and ``attempt == 0`` (held by the breaker) becomes one notice
per chat.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from bot.contracts.events import RunEvent
from bot.dispatch.delivery import HELD_NOTICE
from bot.resilience.breaker import BreakerPolicy, CircuitBreaker
from bot.testing.anthropic import FakeAnthropic
from bot.testing.app import EventRecorder, settle
from plugins.provider_retry import RetryPolicy
from tests.conftest import AppFactory


async def test_stream_cut_mid_answer_restarts_the_draft_and_the_answer_arrives_once(
    make_app: AppFactory,
) -> None:
    async with FakeAnthropic() as fake:
        fake.faults.inject(1.0, kinds=("stream_cut",), cut_after=3, limit=1)
        fake.reply_text(["One ", "two ", "three ", "four ", "five."], chunk_delay=0.02)
        app, channel, _ = await make_app(
            None,
            stream=True,
            provider="anthropic",
            anthropic_api_key="sk-test",
            anthropic_base_url=fake.base_url,
        )
        await channel.say("count to five")
        await settle(app)

    (draft,) = channel.streams
    # The cut draft showed three words, then started over from the first.
    assert draft[:4] == ["One", "One two", "One two three", "One"]
    assert draft[-1] == "One two three four five."
    assert channel.replies == []
    assert fake.faults.served == ["stream_cut"]


async def test_outage_holds_every_chat_with_one_notice_and_answers_after_recovery(
    make_app: AppFactory,
) -> None:
    async with FakeAnthropic() as fake:
        fake.reply_always("Back.")
        fake.faults.start_outage()
        app, channel, log = await make_app(
            None,
            provider="anthropic",
            anthropic_api_key="sk-test",
            anthropic_base_url=fake.base_url,
        )
        real = await getattr(app.provider, "warm_up")()  # noqa: B009 - LazyProvider
        setattr(real, "retry", RetryPolicy(6, 0.01))  # noqa: B010 - quick backoff
        breaker = CircuitBreaker(BreakerPolicy(base_delay=0.05, max_delay=0.1))
        setattr(real, "breaker", breaker)  # noqa: B010
        for user in ("ann", "bob", "cy"):
            await channel.say(f"hello from {user}", sender=user)
        await held(log, 3)
        await until_probes(breaker, 4)

        fake.faults.end_outage()
        await settle(app, limit=30)

    for user in ("ann", "bob", "cy"):
        texts = [m.text for m in channel.sent if m.chat_id == user]
        assert texts == [HELD_NOTICE, "Back."]


async def held(log: EventRecorder, chats: int) -> None:
    """Wait until ``chats`` runs were told they are held by the breaker."""

    def enough(_: RunEvent) -> bool:
        return sum(_held(e.type, e.payload) for e in log.events) >= chats

    await log.wait_for(enough, limit=30)


async def until_probes(breaker: CircuitBreaker, probes: int) -> None:
    async def poll() -> None:
        while breaker.probes < probes:  # noqa: ASYNC110
            await asyncio.sleep(0.01)

    await asyncio.wait_for(poll(), 30)


def _held(kind: str, payload: Mapping[str, object]) -> bool:
    return kind == "run.retrying" and payload.get("attempt") == 0
