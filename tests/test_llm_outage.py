"""A model outage seen from the chat: runs are held, each chat is told once, all answered after.

The real anthropic SDK against the fake Messages API in outage mode, behind the
provider's circuit breaker (short delays so the test is quick).
"""

from __future__ import annotations

import asyncio

from bot.config import Settings
from bot.dispatcher import HELD_NOTICE
from bot.llm_breaker import BreakerPolicy, CircuitBreaker
from bot.messages import InboundMessage
from bot.testing.anthropic import FakeAnthropic
from plugins.anthropic_provider import AnthropicProvider
from tests.conftest import AppFactory
from tests.provider_helpers import ANTHROPIC_KEY


async def test_an_outage_holds_runs_tells_each_chat_once_and_answers_all_after(
        make_app: AppFactory) -> None:
    async with FakeAnthropic(api_key=ANTHROPIC_KEY) as fake:
        fake.reply_always("back again")
        breaker = CircuitBreaker(BreakerPolicy(threshold=3, base_delay=0.05, max_delay=0.4))
        provider = AnthropicProvider(
            Settings(anthropic_api_key=ANTHROPIC_KEY, anthropic_base_url=fake.base_url),
            retry_base_delay=0.01, breaker=breaker)
        app, channel, _ = await make_app(provider)
        fake.faults.start_outage()
        for i in range(10):
            await app.dispatcher.submit(InboundMessage(
                channel="test", chat_id=f"u{i}", chat_type="direct", sender_id=f"u{i}",
                text=f"question {i}", event_id=f"q{i}"))
        async with asyncio.timeout(10):
            while sum(m.text == HELD_NOTICE for m in channel.sent) < 10:
                channel.arrived.clear()
                await channel.arrived.wait()
        assert breaker.waiting == 10
        await asyncio.sleep(1.0)  # several probe steps with everyone held
        during = len(fake.requests)
        fake.faults.end_outage()
        await asyncio.wait_for(app.dispatcher.drain(), 10)
    notices = [m for m in channel.sent if m.text == HELD_NOTICE]
    answers = [m for m in channel.sent if m.text == "back again"]
    assert sorted(m.chat_id for m in notices) == sorted(f"u{i}" for i in range(10))
    assert sorted(m.chat_id for m in answers) == sorted(f"u{i}" for i in range(10))
    # Held calls do not hammer the API: a few failures to open the breaker,
    # then one probe per backoff step (0.05 s doubling to 0.4 s).
    assert during <= 10 + 3 + 8, during
    assert fake.busiest(1.0) <= 10 + 4
