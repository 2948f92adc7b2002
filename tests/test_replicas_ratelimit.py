"""Telegram's bot-wide budget (~30 messages/s) shared by the replicas sending for one bot:
each paces at its share (channels/delivery.py, ``RateLimiter.shared_by``), re-counted
with every heartbeat (bot/storage/claims.py), so two live replicas send at 15/s each and
one left alone at 30/s again. Per-chat limits stay each replica's own."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bot.app.roost import Roost
from bot.dispatch.replicas import ReplicaWork
from bot.testing.app import closing_apps, create_app, scripted
from bot.testing.telegram import FakeTelegram
from bot.testing.telegram import fake_telegram as _fake_telegram  # noqa: F401  (the fixture)
from channels.delivery import TELEGRAM_LIMITS, Limits, Rate, RateLimiter, share_of
from channels.telegram import TelegramChannel
from tests.test_channel_helpers import Clock

# -- the limiter, on a clock that only its own waits move --------------------------------


@dataclass
class Replicas:
    """``counts[0]`` live replicas (a list, so a test can change the count)."""

    counts: list[int]

    @property
    def live(self) -> int:
        return self.counts[0]


@dataclass
class Shared:
    """What shares the budget: ``replicas`` as a channel has them."""

    replicas: Replicas | None


def overall_only(sharers: list[int]) -> tuple[RateLimiter, Clock]:
    """A limiter with only Telegram's overall budget, shared by ``sharers[0]`` processes."""
    clock = Clock()
    return RateLimiter(Limits(overall=TELEGRAM_LIMITS.overall), clock=clock,
                       sleep=clock.sleep, shared_by=Shared(Replicas(sharers))), clock


async def calls(limiter: RateLimiter, count: int, *, urgent: bool = True) -> int:
    """``count`` counted calls, each to a chat of its own (only the overall budget
    applies); how many went ahead."""
    went = 0
    for n in range(count):
        async with limiter.slot(f"chat:{n}", counted=True, urgent=urgent) as go:
            went += go
    return went


async def test_two_sharers_each_get_half_the_overall_budget_and_one_left_alone_all_of_it(
        ) -> None:
    sharers = [2]
    limiter, clock = overall_only(sharers)
    assert limiter.overall == Rate(15, 1.0)
    await calls(limiter, 15)
    assert clock.slept == []  # fifteen at once...
    await calls(limiter, 1)
    assert clock.now == 101.0  # ...the sixteenth waits for the second to pass
    sharers[0] = 1  # the other replica's heartbeat expired
    assert limiter.overall == Rate(30, 1.0)
    await calls(limiter, 29)
    assert clock.now == 101.0  # 30 in this second now, the one already made included
    await calls(limiter, 1)
    assert clock.now == 102.0


async def test_drafts_keep_a_fifth_of_the_share_for_final_replies() -> None:
    limiter, clock = overall_only([3])  # 10 per second each
    assert await calls(limiter, 10, urgent=False) == 8
    assert await calls(limiter, 2) == 2 and clock.slept == []


async def test_a_share_below_five_at_once_stretches_its_period_instead() -> None:
    limiter, clock = overall_only([10])  # 3/s each: 5 per 5/3 s, not 3 per second
    assert limiter.overall == Rate(5, 5 / 3)
    await calls(limiter, 6)
    assert clock.now == pytest.approx(100 + 5 / 3)
    # Together the sharers keep the whole budget's pace, whatever their number.
    for sharers in range(1, 70):
        share = share_of(Rate(30, 1.0), sharers)
        assert share.count / share.per * sharers == pytest.approx(30.0)
        assert 1 <= share.count <= 30


async def test_without_sharers_or_with_a_count_of_none_the_budget_is_whole() -> None:
    alone = RateLimiter(TELEGRAM_LIMITS)
    assert alone.overall == TELEGRAM_LIMITS.overall
    assert overall_only([0])[0].overall == Rate(30, 1.0)  # never below one process
    assert RateLimiter(Limits(), shared_by=Shared(Replicas([3]))).overall is None
    assert RateLimiter(TELEGRAM_LIMITS, shared_by=Shared(None)).overall == Rate(30, 1.0)


# -- replicas: two apps on one PostgreSQL database, each with its Telegram channel ----------

Start = Callable[..., Awaitable[tuple[Roost, TelegramChannel]]]


@pytest.fixture
async def start(tmp_path: Path, fake_telegram: FakeTelegram) -> AsyncIterator[Start]:
    """``start(name, **settings)``: a Roost app with a Telegram channel on the fake bot."""
    async with closing_apps() as apps:

        async def make(name: str, **settings: Any) -> tuple[Roost, TelegramChannel]:
            app, _ = await create_app(scripted({"reply": "hi"}), data_dir=tmp_path / name,
                                      telegram_bot_token=fake_telegram.token,
                                      telegram_api_base=fake_telegram.base_url, **settings)
            apps.append(app)
            tg = TelegramChannel(app.settings, polling_timeout=1)
            await app.add_channel(tg)
            await app.recover()  # with replicas: heartbeat sweeps from now on
            return app, tg

        yield make


def work(app: Roost) -> ReplicaWork:
    assert app.dispatcher.replicas is not None
    return app.dispatcher.replicas


async def test_two_live_replicas_pace_at_half_and_the_survivor_at_the_whole_budget(
        start: Start, pg_url: str) -> None:
    a, tg_a = await start("a", database_url=pg_url)
    b, tg_b = await start("b", database_url=pg_url)
    assert tg_a.replicas is work(a)  # set by the app, as leadership is
    await work(a).renew()  # a's heartbeat counts b, started after a's last one
    assert (tg_a.limiter.overall, tg_b.limiter.overall) == (Rate(15, 1.0), Rate(15, 1.0))
    # b dies (no renewal, nothing handed over); a's clock passes b's heartbeat.
    await work(b).halt()
    lease = work(a).claims.lease_seconds
    work(a).claims.clock = lambda: time.time() + lease + 1
    await work(a).renew()
    assert tg_a.limiter.overall == Rate(30, 1.0)
    # Per-chat limits are each replica's own, whatever the count.
    assert tg_b.limiter.limits.per_chat == TELEGRAM_LIMITS.per_chat


async def test_a_replica_shutting_down_gives_its_share_back_without_waiting_a_lease(
        start: Start, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # A lease (and sweep period) far beyond the test: only b's wake-up can make a count again.
    a, tg_a = await start("a", database_url=pg_url, lease_seconds=3600)
    b, _ = await start("b", database_url=pg_url, lease_seconds=3600)
    await work(a).renew()
    assert tg_a.limiter.overall == Rate(15, 1.0)
    renewed = asyncio.Event()
    renew = work(a).claims.renew

    async def renew_and_tell(keys: Sequence[str]) -> set[str]:
        kept = await renew(keys)
        renewed.set()
        return kept

    monkeypatch.setattr(work(a).claims, "renew", renew_and_tell)
    await b.close()  # hands its heartbeat over and wakes a, whose sweep counts again
    while tg_a.limiter.overall != Rate(30, 1.0):
        await asyncio.wait_for(renewed.wait(), 60)
        renewed.clear()


async def test_a_single_process_on_sqlite_keeps_the_whole_budget(start: Start) -> None:
    app, tg = await start("solo")
    assert app.dispatcher.replicas is None and tg.replicas is None
    assert tg.limiter.overall == TELEGRAM_LIMITS.overall
