"""Budgets and rate limits end to end: the real aiogram against the fake Bot API."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from bot.app.roost import Roost
from bot.config.budgets import BudgetConfig
from bot.config.settings import ConfigError, Settings, load_settings
from bot.contracts.hookspecs import hookimpl
from bot.contracts.messages import InboundMessage
from bot.contracts.tools import Tool, ToolContext
from bot.engine.budgets import next_month
from bot.storage.usage import UsageStore, day_of, month_of
from bot.testing.app import EventRecorder, closing_apps, create_app, scripted, settle
from bot.testing.telegram import ALICE, BOB, FakeTelegram, user
from bot.testing.telegram import fake_telegram as _fake_telegram  # noqa: F401  (the fixture)
from channels.delivery import DeliveryPolicy, Limits
from channels.telegram import TelegramChannel
from plugins.scripted_provider import ScriptedProvider

ADMIN = user(99, "Ada", "ada")
FAST = DeliveryPolicy(attempts=3, base_delay=0.05, max_delay=0.1)
LATE = datetime(2027, 1, 31, 23, 0, tzinfo=UTC).timestamp()
"""An hour before midnight UTC on the last day of a month."""
DAILY = "Your daily limit reached, resets at 00:00 UTC"
GROUP = -1001234567890

App = tuple[Roost, ScriptedProvider, list[float], EventRecorder]
Factory = Callable[..., Awaitable[App]]


@pytest.fixture(name="make_app")
async def make_app(tmp_path: Path, fake_telegram: FakeTelegram) -> AsyncIterator[Factory]:
    """``make_app(**settings)``: Roost on the fake Telegram with Ada as admin, DMs open and
    a clock (``clock[0]``, seconds) the usage counters and the rate limit read."""
    async with closing_apps() as apps:

        async def factory(**settings: Any) -> App:
            settings.setdefault("admins", ["telegram:99"])
            provider = scripted({"reply": "answer to {message}"}, loop=True)
            app, recorder = await create_app(
                provider, data_dir=tmp_path / "data", stream_replies=False,
                telegram_bot_token=fake_telegram.token,
                telegram_api_base=fake_telegram.base_url, **settings)
            apps.append(app)
            clock = [LATE]
            assert app.services.usage is not None
            app.services.usage.clock = lambda: clock[0]
            # No proactive budget (3 calls per 3 s in a chat): not what is tested here.
            await app.add_channel(TelegramChannel(app.settings, polling_timeout=1,
                                                  policy=FAST, limits=Limits()))
            return app, provider, clock, recorder

        yield factory


def usage(app: Roost) -> UsageStore:
    assert app.services.usage is not None
    return app.services.usage


async def dm(fake: FakeTelegram, app: Roost, text: str,
             sender: dict[str, Any] = BOB) -> list[str]:
    """Send ``text`` in ``sender``'s private chat; the texts the bot sent there meanwhile."""
    before = len(fake.sent_texts(sender["id"]))
    update = fake.private_message(text, sender=sender)
    await fake.wait_confirmed(update["update_id"])
    await settle(app)
    return fake.sent_texts(sender["id"])[before:]


async def in_group(fake: FakeTelegram, app: Roost, text: str,
                   sender: dict[str, Any] = BOB) -> list[str]:
    before = len(fake.sent_texts(GROUP))
    update = fake.mention(text, sender=sender)
    await fake.wait_confirmed(update["update_id"])
    await settle(app)
    return fake.sent_texts(GROUP)[before:]


# -- configuration -------------------------------------------------------------------


def test_budgets_default_to_unlimited_and_agents_override_single_fields() -> None:
    settings = Settings()
    assert settings.budgets == BudgetConfig() and not settings.budgets.limited
    settings = Settings(budgets={"user_daily_tokens": 1000, "user_requests_per_minute": 5},
                        agents={"support": {"budgets": {"user_daily_tokens": 10}}})
    support = settings.budgets_for("support")
    assert (support.user_daily_tokens, support.user_requests_per_minute) == (10, 5)
    assert settings.budgets_for("default").user_daily_tokens == 1000
    with pytest.raises(ValueError, match="user_daily_tokens"):
        Settings(budgets={"user_daily_tokens": -1})


def test_budgets_from_roost_toml_with_prices_and_agent_overrides(tmp_path: Path) -> None:
    config = tmp_path / "roost.toml"
    config.write_text(
        '[budgets]\nuser_daily_tokens = 200000\nuser_daily_cost = 0.5\n'
        '[budgets.prices."gpt-4.1"]\ninput = 2.0\noutput = 8.0\n'
        '[agents.support.budgets]\nuser_daily_tokens = 5000\nadmins_exempt = false\n',
        encoding="utf-8")
    settings = load_settings(config)
    assert settings.budgets.prices["gpt-4.1"].cost(1_000_000, 500_000) == 6.0
    support = settings.budgets_for("support")
    assert (support.user_daily_tokens, support.user_daily_cost, support.admins_exempt) == (
        5000, 0.5, False)
    config.write_text("[budgets]\nuser_daily_tokens = -3\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"budgets\.user_daily_tokens"):
        load_settings(config)


def test_periods_are_utc_days_and_months() -> None:
    assert (day_of(LATE), month_of(LATE)) == ("2027-01-31", "2027-01")
    assert (day_of(LATE + 3600), month_of(LATE + 3600)) == ("2027-02-01", "2027-02")
    assert next_month(LATE) == "1 February"
    assert next_month(datetime(2027, 12, 31, tzinfo=UTC).timestamp()) == "1 January"


# -- token budgets ---------------------------------------------------------------------


async def test_daily_limit_refuses_before_the_model_is_called_and_resets_at_midnight_utc(
        make_app: Factory, fake_telegram: FakeTelegram) -> None:
    app, provider, clock, recorder = await make_app(budgets={"user_daily_tokens": 1000})
    assert await dm(fake_telegram, app, "first") == ["answer to first"]
    done = await recorder.wait_for("run.completed")
    spent = done.payload["usage"]["input_tokens"] + done.payload["usage"]["output_tokens"]
    assert spent >= 1000  # one scripted run spends the day's budget (its system prompt alone)
    [refusal] = await dm(fake_telegram, app, "second")
    assert refusal == f"{DAILY} ({spent:,} of 1,000 tokens used)."
    assert len(provider.requests) == 1
    # The refused message is closed, not stored as a turn, and not run later.
    assert await app.inbox.unfinished() == []
    session = await app.store.get("default:telegram:direct:43")
    assert [m.content for m in session.messages] == ["first", "answer to first"]
    # Another user has a budget of their own.
    assert await dm(fake_telegram, app, "mine", ALICE) == ["answer to mine"]
    clock[0] += 3600  # 00:00 UTC, a new day (and month)
    assert await dm(fake_telegram, app, "third") == ["answer to third"]
    assert len(provider.requests) == 3


async def test_monthly_limit_holds_across_days_until_the_next_month(
        make_app: Factory, fake_telegram: FakeTelegram) -> None:
    app, provider, clock, _ = await make_app(budgets={"user_monthly_tokens": 1000})
    clock[0] -= 20 * 86400  # 11 January
    assert await dm(fake_telegram, app, "first") == ["answer to first"]
    clock[0] += 19 * 86400  # 30 January: another day, the same month
    [refusal] = await dm(fake_telegram, app, "second")
    assert refusal.startswith("Your monthly limit reached, resets on 1 February at 00:00 UTC")
    clock[0] += 2 * 86400  # 1 February
    assert await dm(fake_telegram, app, "third") == ["answer to third"]
    assert len(provider.requests) == 2


async def test_group_budget_is_shared_by_everyone_in_the_group(
        make_app: Factory, fake_telegram: FakeTelegram) -> None:
    app, provider, _, _ = await make_app(budgets={"group_daily_tokens": 1000})
    [answer] = await in_group(fake_telegram, app, "hi", BOB)
    assert answer.startswith("answer to")
    [refusal] = await in_group(fake_telegram, app, "me too", ALICE)
    assert refusal.startswith("This group's daily limit reached, resets at 00:00 UTC")
    # Their DMs are not the group's.
    assert await dm(fake_telegram, app, "private", ALICE) == ["answer to private"]
    assert len(provider.requests) == 2


async def test_agent_budget_and_per_agent_overrides(make_app: Factory,
                                                    fake_telegram: FakeTelegram) -> None:
    app, provider, _, _ = await make_app(
        agents={"support": {"budgets": {"agent_daily_tokens": 1000}}},
        bindings=[{"agent": "support", "chat_type": "group"}])
    # DMs go to the default agent, which has no limits.
    assert await dm(fake_telegram, app, "one") == ["answer to one"]
    assert await dm(fake_telegram, app, "two") == ["answer to two"]
    assert (await in_group(fake_telegram, app, "a", BOB))[0].startswith("answer to")
    [refusal] = await in_group(fake_telegram, app, "b", ALICE)
    assert refusal.startswith("This assistant's daily limit reached, resets at 00:00 UTC")
    assert len(provider.requests) == 3


async def test_admins_are_exempt_unless_configured_otherwise(
        make_app: Factory, fake_telegram: FakeTelegram) -> None:
    app, provider, _, _ = await make_app(budgets={"user_daily_tokens": 1000})
    assert await dm(fake_telegram, app, "a", ADMIN) == ["answer to a"]
    assert await dm(fake_telegram, app, "b", ADMIN) == ["answer to b"]
    await app.close()
    app, provider, _, _ = await make_app(
        budgets={"user_daily_tokens": 1000, "admins_exempt": False})
    # Same database: the admin's earlier tokens count today.
    [refusal] = await dm(fake_telegram, app, "c", ADMIN)
    assert refusal.startswith(DAILY)
    assert provider.requests == []


# -- request rate ---------------------------------------------------------------------


async def test_requests_per_minute_limit(make_app: Factory,
                                         fake_telegram: FakeTelegram) -> None:
    app, provider, clock, _ = await make_app(budgets={"user_requests_per_minute": 2})
    assert await dm(fake_telegram, app, "1") == ["answer to 1"]
    clock[0] += 10
    assert await dm(fake_telegram, app, "2") == ["answer to 2"]
    clock[0] += 10
    assert await dm(fake_telegram, app, "3") == [
        "Too many messages: at most 2 per minute. Try again in 40 s."]
    assert await dm(fake_telegram, app, "4", ALICE) == ["answer to 4"]  # per user
    assert len(provider.requests) == 3
    clock[0] += 41  # the first request is a minute old
    assert await dm(fake_telegram, app, "5") == ["answer to 5"]
    # Refused messages did not count: one slot is free again after the second one ages.
    clock[0] += 1
    assert (await dm(fake_telegram, app, "6"))[0].startswith("Too many messages")


# -- counting --------------------------------------------------------------------------


async def test_tokens_are_counted_from_the_providers_usage_and_persisted(
        make_app: Factory, fake_telegram: FakeTelegram) -> None:
    app, _, _, recorder = await make_app()
    await dm(fake_telegram, app, "count me")
    done = await recorder.wait_for("run.completed")
    reported = done.payload["usage"]
    await usage(app).flush()
    day = day_of(LATE)
    spent = await usage(app).spent("user", "telegram:43", day)
    assert spent == reported["input_tokens"] + reported["output_tokens"] > 0
    assert await usage(app).spent("agent", "default", day) == spent
    assert await usage(app).spent("user", "telegram:43", month_of(LATE)) == spent
    [top] = await usage(app).top("user", day)
    assert (top.subject, top.input_tokens, top.output_tokens, top.runs) == (
        "telegram:43", reported["input_tokens"], reported["output_tokens"], 1)
    await app.close()
    again, _, _, _ = await make_app()
    assert await usage(again).spent("user", "telegram:43", day) == spent


async def test_cron_and_heartbeat_runs_count_against_their_owner(
        make_app: Factory, fake_telegram: FakeTelegram) -> None:
    app, provider, _, _ = await make_app(budgets={"user_daily_tokens": 1000})
    job = InboundMessage(channel="telegram", chat_id="43", chat_type="direct",
                         sender_id="43", text="remind me to stretch")
    result = await app.runtime.run_scheduled(job, mode="minimal", kind="cron",
                                             deliver_failed=False)
    assert result.status == "completed"
    await usage(app).flush()
    assert await usage(app).spent("user", "telegram:43", day_of(LATE)) >= 1000
    # The owner's budget is spent: the next scheduled run is skipped before the model,
    # and nothing is posted in the chat for it.
    sent = len(fake_telegram.sent_texts(43))
    skipped = await app.runtime.run_scheduled(job, mode="minimal", kind="heartbeat",
                                              persist=False, deliver_failed=False)
    assert skipped.status == "refused" and skipped.reply is not None
    assert skipped.reply.startswith(DAILY)
    assert len(provider.requests) == 1
    await settle(app)
    assert len(fake_telegram.sent_texts(43)) == sent
    # And the owner's own messages are refused as well.
    [refusal] = await dm(fake_telegram, app, "hello")
    assert refusal.startswith(DAILY)


# -- /status and /usage ------------------------------------------------------------------


async def command(fake: FakeTelegram, app: Roost, text: str,
                  sender: dict[str, Any] = BOB) -> str:
    before = len(fake.sent_texts(sender["id"]))
    update = fake.command(text, sender=sender)
    await fake.wait_confirmed(update["update_id"])
    await settle(app)
    [reply] = fake.sent_texts(sender["id"])[before:]
    return reply


async def test_status_shows_your_spend_against_the_limits(
        make_app: Factory, fake_telegram: FakeTelegram) -> None:
    app, _, _, recorder = await make_app(
        budgets={"user_daily_tokens": 100_000, "user_requests_per_minute": 30})
    await dm(fake_telegram, app, "hi")
    done = await recorder.wait_for("run.completed")
    spent = done.payload["usage"]["input_tokens"] + done.payload["usage"]["output_tokens"]
    status = await command(fake_telegram, app, "/status")
    assert (f"Your tokens: today {spent:,} of 100,000, this month {spent:,} (no limit) (UTC)"
            in status)
    assert "Rate limit: 30 messages per minute" in status
    admin = await command(fake_telegram, app, "/status", ADMIN)
    assert "Your tokens: today 0 of 100,000" in admin
    assert "You are an admin: budgets do not apply to you." in admin


async def test_usage_lists_top_spenders_for_admins_only(
        make_app: Factory, fake_telegram: FakeTelegram) -> None:
    app, _, _, _ = await make_app()
    await dm(fake_telegram, app, "one")
    await dm(fake_telegram, app, "two")
    await dm(fake_telegram, app, "three", ALICE)
    assert await command(fake_telegram, app, "/usage") == "/usage is for admins only."
    report = await command(fake_telegram, app, "/usage", ADMIN)
    lines = report.splitlines()
    assert lines[0] == "Top users today (UTC), tokens in/out:"
    assert lines[1].startswith("  telegram:43: ") and lines[1].endswith("2 run(s)")
    assert lines[2].startswith("  telegram:42: ") and lines[2].endswith("1 run(s)")
    assert "Top agents today (UTC), tokens in/out:" in lines
    assert "Top users this month (UTC), tokens in/out:" in lines


async def test_usage_with_nothing_spent(make_app: Factory,
                                        fake_telegram: FakeTelegram) -> None:
    app, _, _, _ = await make_app()
    assert await command(fake_telegram, app, "/usage", ADMIN) == \
        "No tokens spent today or this month."


# -- cost budgets ------------------------------------------------------------------------


async def test_cost_budget_by_the_price_table(make_app: Factory,
                                              fake_telegram: FakeTelegram) -> None:
    app, provider, clock, recorder = await make_app(
        model="priced-model",
        budgets={"user_daily_cost": 1.0,
                 "prices": {"priced-model": {"input": 500.0, "output": 1000.0}}})
    assert await dm(fake_telegram, app, "first") == ["answer to first"]
    done = await recorder.wait_for("run.completed")
    used = done.payload["usage"]
    cost = (used["input_tokens"] * 500.0 + used["output_tokens"] * 1000.0) / 1_000_000
    assert cost >= 1.0  # one run's system prompt alone is over 2,000 tokens
    await usage(app).flush()
    assert await usage(app).cost("user", "telegram:43", day_of(LATE)) == pytest.approx(cost)
    status = await command(fake_telegram, app, "/status")
    assert f"Your spending: today {cost:.2f} of 1.00, this month {cost:.2f} (no limit)" in status
    [refusal] = await dm(fake_telegram, app, "over")
    assert refusal == (f"Your daily spending limit reached, resets at 00:00 UTC "
                       f"({cost:.2f} of 1.00 spent).")
    calls = len(provider.requests)
    clock[0] += 3600
    assert await dm(fake_telegram, app, "tomorrow") == ["answer to tomorrow"]
    assert len(provider.requests) == calls + 1
    report = await command(fake_telegram, app, "/usage", ADMIN)
    assert ", cost " in report


async def test_a_model_without_a_price_costs_nothing(make_app: Factory,
                                                     fake_telegram: FakeTelegram) -> None:
    app, provider, _, _ = await make_app(
        model="free-model",
        budgets={"user_daily_cost": 0.000001, "prices": {"other": {"input": 1000.0}}})
    assert await dm(fake_telegram, app, "one") == ["answer to one"]
    assert await dm(fake_telegram, app, "two") == ["answer to two"]
    await usage(app).flush()
    assert await usage(app).cost("user", "telegram:43", day_of(LATE)) == 0
    assert len(provider.requests) == 2


class Blocker:
    """A ``block`` tool that waits until the test cancels its run."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()

    async def _block(self, ctx: ToolContext, args: Mapping[str, Any]) -> str:
        self.entered.set()
        await asyncio.Event().wait()  # until cancelled
        return "never"

    @hookimpl
    def roost_tools(self) -> list[Tool]:
        return [Tool("block", "waits", {"type": "object", "properties": {}}, self._block)]


async def test_a_stopped_run_counts_the_tokens_it_spent(roost_app: Any) -> None:
    blocker = Blocker()
    chat = await roost_app(
        [{"steps": [{"tool_calls": [{"name": "block", "arguments": {}}]}, {"reply": "x"}]},
         {"reply": "after"}],
        ("blocker", blocker), budgets={"user_daily_tokens": 1000})
    await chat.say("work", sender="u1")
    await blocker.entered.wait()
    await chat.say("/stop", sender="u1")
    await chat.settle()
    assert chat.replies == ["Stopped."]
    store = chat.app.services.usage
    await store.flush()
    # The model answered once (the tool call) before the stop: that counts.
    spent = await store.spent("user", "console:u1", day_of(store.clock()))
    assert spent >= 1000
    assert (await chat.ask("again", sender="u1"))[0].startswith(DAILY)
    assert len(chat.requests) == 1
