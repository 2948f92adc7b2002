"""Discord gateway sharding: the fake speaks it as Discord does (real discord.py clients),
one process runs every shard, replicas on PostgreSQL share the shards through leases
(bot.storage.leader.Leases) and take a dead or stopped replica's over, and a wrong shard
setting (close codes 4010/4011) is one clear line, not a traceback or a reconnect loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import discord
import pytest

from bot.app.roost import Roost
from bot.config.settings import SetupError
from bot.storage.leader import Leases
from bot.testing.app import scripted, settle
from bot.testing.discord import (
    BOT_ID,
    CHANNEL_ID,
    DM_CHANNEL_ID,
    GUILD_ID,
    FakeDiscord,
    shard_of,
    user_payload,
)
from bot.testing.discord import fake_discord as _fake_discord  # noqa: F401  (the fixture)
from channels.discord import DiscordChannel
from channels.discord.shards import snowflake_at
from tests.conftest import AppFactory
from tests.roost_processes import RoostProcess, start_roost, until_logged
from tests.test_cli import clean_env

OTHER_GUILD = (1 << 22) + 7
"""A guild on shard 1 of 2 (``GUILD_ID`` is on shard 0)."""
OTHER_CHANNEL = 3100
REPLY = "hello from roost"


def two_guilds(fake: FakeDiscord) -> None:
    fake.add_guild(OTHER_GUILD, OTHER_CHANNEL)
    assert shard_of(GUILD_ID, 2) == 0 and shard_of(OTHER_GUILD, 2) == 1


async def until(check: Callable[[], bool], limit: float = 20.0) -> None:
    """Wait (polling, with a hang guard) until ``check()`` holds."""
    async with asyncio.timeout(limit):
        # What is checked spans the fake, the apps and the leases: no one event covers it.
        while not check():  # noqa: ASYNC110
            await asyncio.sleep(0.02)


class Recorder(discord.Client):
    """A plain discord.py client that keeps what it receives."""

    def __init__(self, **options: Any) -> None:
        super().__init__(intents=discord.Intents.default(), **options)
        self.received: list[discord.Message] = []
        self.up = asyncio.Event()

    async def on_ready(self) -> None:
        self.up.set()

    async def on_message(self, message: discord.Message) -> None:
        self.received.append(message)


@pytest.fixture
async def clients(fake_discord: FakeDiscord) -> AsyncIterator[list[Recorder]]:
    made: list[Recorder] = []
    saved = discord.http.Route.BASE, discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY
    discord.http.Route.BASE = fake_discord.api_base
    discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = discord.gateway.yarl.URL(
        fake_discord.gateway_url)
    try:
        yield made
    finally:
        for client in made:
            await client.close()
        discord.http.Route.BASE, discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = saved


async def connected(fake: FakeDiscord, made: list[Recorder], client: Recorder) -> Recorder:
    made.append(client)
    task = asyncio.ensure_future(client.start(fake.token))
    up = asyncio.ensure_future(client.up.wait())
    done, _ = await asyncio.wait({task, up}, timeout=10, return_when=asyncio.FIRST_COMPLETED)
    up.cancel()
    if task in done:
        task.result()  # raises what ended it
    assert up in done
    return client


# -- the fake, as discord.py sees it ------------------------------------------------------


async def test_discord_py_shards_get_their_guilds_events_and_shard_0_the_dms(
        fake_discord: FakeDiscord, clients: list[Recorder]) -> None:
    two_guilds(fake_discord)
    zero = await connected(fake_discord, clients, Recorder(shard_id=0, shard_count=2,
                                                           guild_ready_timeout=0.05))
    one = await connected(fake_discord, clients, Recorder(shard_id=1, shard_count=2,
                                                          guild_ready_timeout=0.05))
    assert [d["shard"] for d in fake_discord.identifies] == [[0, 2], [1, 2]]
    assert [g.id for g in zero.guilds] == [GUILD_ID]
    assert [g.id for g in one.guilds] == [OTHER_GUILD]
    first = await fake_discord.guild_message("to shard 0")
    second = await fake_discord.guild_message("to shard 1", channel_id=OTHER_CHANNEL)
    dm = await fake_discord.dm("a DM")
    await until(lambda: len(zero.received) == 2 and len(one.received) == 1)
    assert [m.id for m in zero.received] == [first, dm]
    assert [m.id for m in one.received] == [second]
    assert one.received[0].guild is not None and one.received[0].guild.shard_id == 1


async def test_the_fake_closes_an_invalid_shard_with_4010_and_too_few_with_4011(
        fake_discord: FakeDiscord, clients: list[Recorder]) -> None:
    with pytest.raises(discord.ConnectionClosed) as invalid:
        await connected(fake_discord, clients, Recorder(shard_id=2, shard_count=2))
    assert invalid.value.code == 4010
    fake_discord.shards_required = 2
    with pytest.raises(discord.ConnectionClosed) as required:
        await connected(fake_discord, clients, Recorder())
    assert required.value.code == 4011
    # Asked for the count, discord.py's AutoShardedClient reads /gateway/bot's
    # recommendation and runs that many shards.
    auto = discord.AutoShardedClient(intents=discord.Intents.default(),
                                     guild_ready_timeout=0.05)
    try:
        task = asyncio.ensure_future(auto.start(fake_discord.token))
        await until(lambda: auto.is_ready() or task.done())
        assert auto.shard_count == 2 and sorted(auto.shards) == [0, 1]
        assert sorted(fake_discord.live_shards) == [(0, 2), (1, 2)]
    finally:
        await auto.close()


# -- one process ---------------------------------------------------------------------------


async def start_app(make_app: AppFactory, fake: FakeDiscord, **settings: Any,
                    ) -> tuple[Roost, DiscordChannel]:
    app, _, _ = await make_app(scripted({"reply": REPLY}, loop=True), **fake.settings(),
                               **settings)
    channel = DiscordChannel(app.settings, guild_ready_timeout=0.05)
    await app.add_channel(channel)
    return app, channel


async def test_one_process_runs_every_shard_and_answers_each_guild_and_dm(
        fake_discord: FakeDiscord, make_app: AppFactory) -> None:
    two_guilds(fake_discord)
    app, channel = await start_app(make_app, fake_discord, discord_shard_count=2)
    assert sorted(fake_discord.live_shards) == [(0, 2), (1, 2)]
    assert channel.health().ready
    await fake_discord.guild_message("hi", mention=True)
    await fake_discord.guild_message("hi", mention=True, channel_id=OTHER_CHANNEL)
    await fake_discord.dm("hi")
    await fake_discord.wait_for_call("POST", r"/channels/\d+/messages$", count=3)
    await settle(app)
    for where in (CHANNEL_ID, OTHER_CHANNEL, DM_CHANNEL_ID):
        assert fake_discord.visible(where) == [REPLY]


async def test_a_wrong_shard_setting_is_one_line_without_traceback_and_no_retry_loop(
        fake_discord: FakeDiscord, make_app: AppFactory,
        caplog: pytest.LogCaptureFixture) -> None:
    fake_discord.shards_required = 3
    app, _, _ = await make_app(scripted({"reply": REPLY}), **fake_discord.settings(),
                               discord_shard_count=2)
    with caplog.at_level(logging.INFO, "roost"), pytest.raises(SetupError) as refused:
        await app.add_channel(DiscordChannel(app.settings, guild_ready_timeout=0.05))
    assert str(refused.value) == (
        "Discord refused shard 0 of 2 (close code 4011, Sharding required: the bot is in too "
        "many guilds for 2 shard(s)); set ROOST_DISCORD_SHARD_COUNT to at least 3 (Discord's "
        "recommendation)")
    # Said once, by whoever started the channel (roost run: its one failure line).
    assert not [r for r in caplog.records if r.exc_info or "4011" in r.getMessage()]
    identified = len(fake_discord.identifies)
    assert identified <= 2  # each shard tried once, not again and again
    # The unsharded session is refused the same way.
    fake_discord.shards_required = 2
    unsharded = DiscordChannel(app.settings.model_copy(update={"discord_shard_count": 1}),
                               guild_ready_timeout=0.05)
    with pytest.raises(SetupError, match=r"unsharded session \(close code 4011"):
        await unsharded.start(app.dispatcher.submit)
    assert len(fake_discord.identifies) == identified + 1
    assert not [r for r in caplog.records if r.exc_info]


async def test_a_shard_refused_later_is_one_error_line_and_is_not_retried(
        fake_discord: FakeDiscord, make_app: AppFactory,
        caplog: pytest.LogCaptureFixture) -> None:
    two_guilds(fake_discord)
    _, channel = await start_app(make_app, fake_discord, discord_shard_count=2)
    assert channel.health().ready
    # The bot grew: Discord now wants more shards, and says so on the next IDENTIFY.
    fake_discord.shards_required = 4
    with caplog.at_level(logging.INFO, "roost"):
        await fake_discord.invalidate_session()
        await until(lambda: all(r.done() for r in channel.sessions.runners.values()))
    refused = [r for r in caplog.records if "4011" in r.getMessage()]
    assert [r.levelname for r in refused] == ["ERROR", "ERROR"]  # one line per shard
    assert refused[0].getMessage().startswith("discord: Discord refused shard ")
    assert "ROOST_DISCORD_SHARD_COUNT to at least 4" in refused[0].getMessage()
    assert not [r for r in caplog.records if r.exc_info]
    assert channel.health().detail.endswith("refused by Discord: shard setting; see the log")
    assert len(fake_discord.identifies) == 4  # two at start, one refused try per shard


# -- replicas on PostgreSQL ---------------------------------------------------------------


def held(channel: DiscordChannel) -> set[int]:
    return {shard for shard in channel.sessions.clients if shard is not None}


async def test_leases_spread_the_shards_and_free_a_dead_replicas_at_once(pg_url: str) -> None:
    leases = [Leases(pg_url, 4, check_every=0.2) for _ in range(3)]
    try:
        for lease in leases:
            lease.start()
        await until(lambda: sorted(len(x.held) for x in leases) == [1, 1, 2])
        assert set().union(*(x.held for x in leases)) == {0, 1, 2, 3}
        # The replica holding two dies (its connection ends): the others take them over.
        victim = max(leases, key=lambda x: len(x.held))
        admin = await asyncpg.connect(pg_url)
        try:
            await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory'"
                " AND objid::bigint = $1", (victim.key + 1 + min(victim.held)) & 0xFFFFFFFF)
        finally:
            await admin.close()
        others = [x for x in leases if x is not victim]
        await until(lambda: set().union(*(x.held for x in others)) == {0, 1, 2, 3})
        # Each held one: neither took a second share while the other was left with none.
        await until(lambda: sorted(len(x.held) for x in leases) == [1, 1, 2])
    finally:
        for lease in leases:
            await lease.close()
    assert all(not x.held for x in leases)


async def test_two_replicas_share_the_shards_answer_each_guild_once_and_take_over_on_stop(
        fake_discord: FakeDiscord, make_app: AppFactory, pg_url: str, tmp_path: Path) -> None:
    two_guilds(fake_discord)
    settings = {"database_url": pg_url, "discord_shard_count": 2, "lease_seconds": 1.0}
    first, one = await start_app(make_app, fake_discord, data_dir=tmp_path / "a", **settings)
    await first.recover()
    second, two = await start_app(make_app, fake_discord, data_dir=tmp_path / "b", **settings)
    await second.recover()
    # The first took both alone; the second's presence makes it give one back.
    await until(lambda: len(held(one)) == 1 and len(held(two)) == 1)
    await until(lambda: sorted(fake_discord.live_shards) == [(0, 2), (1, 2)])
    for n in range(3):
        await fake_discord.guild_message(f"hi {n}", mention=True)
        await fake_discord.guild_message(f"hi {n}", mention=True, channel_id=OTHER_CHANNEL)
    await until(lambda: len(fake_discord.visible(CHANNEL_ID)) == 3
                and len(fake_discord.visible(OTHER_CHANNEL)) == 3)
    # A message nobody received (sent as the first stops: its shard has no session):
    # the replica taking the shard over reads it back from the channel's history.
    (moving,) = held(one)
    where = CHANNEL_ID if moving == 0 else OTHER_CHANNEL
    gap = fake_discord.message_payload(f"<@{BOT_ID}> in the gap", channel_id=where,
                                       mentions=[user_payload(BOT_ID, "testbot", bot=True)],
                                       message_id=snowflake_at(time.time()))
    fake_discord.user_messages[int(gap["id"])] = gap
    # Shutting a replica down gives its shard back at once; the other takes it (its
    # session's login fails once, as a Discord outage would: it is opened again).
    fake_discord.fail_next(503, path="^/users/@me$")
    # Hang guards: this test once outlived pytest-timeout's 180 s under -n 3 and -n 6 with
    # the loop alive, and not in 24 runs since; a bound says which step it was.
    async with asyncio.timeout(60):
        await first.close()
    await until(lambda: held(two) == {0, 1})
    await until(lambda: sorted(fake_discord.live_shards) == [(0, 2), (1, 2)])
    await until(lambda: len(fake_discord.visible(where)) == 4)
    await fake_discord.guild_message("still there?", mention=True)
    await fake_discord.guild_message("still there?", mention=True, channel_id=OTHER_CHANNEL)
    await until(lambda: len(fake_discord.visible(CHANNEL_ID)) + len(
        fake_discord.visible(OTHER_CHANNEL)) == 9)
    await settle(second)
    assert [c.status for c in fake_discord.calls_to("GET", "^/users/@me$")][-2:] == [503, 200]
    assert fake_discord.visible(where) == [REPLY] * 5
    assert fake_discord.visible(CHANNEL_ID if where != CHANNEL_ID else OTHER_CHANNEL) == [
        REPLY] * 4


@pytest.mark.e2e
async def test_roost_run_replicas_share_shards_and_one_takes_over_after_kill_9(
        tmp_path: Path, pg_url: str, fake_discord: FakeDiscord) -> None:
    two_guilds(fake_discord)
    (tmp_path / "script.yaml").write_text(f"turns:\n  - reply: '{REPLY}'\nloop: true\n")
    env = clean_env(
        ROOST_PROVIDER="scripted", ROOST_SCRIPT=str(tmp_path / "script.yaml"),
        ROOST_STREAM_REPLIES="false", ROOST_MERGE_WINDOW_MS="0", ROOST_DM_POLICY="open",
        ROOST_DATABASE_URL=pg_url, ROOST_LEASE_SECONDS="3", ROOST_DISCORD_SHARD_COUNT="2",
        DISCORD_BOT_TOKEN=fake_discord.token, DISCORD_API_BASE=fake_discord.api_base,
        DISCORD_GATEWAY_URL=fake_discord.gateway_url)
    async with processes() as procs:
        first = await procs(tmp_path / "a", env)
        await until_logged(first, b"roost ready")
        second = await procs(tmp_path / "b", env)
        await until_logged(second, b"roost ready")
        # The first gives one shard back (it held both alone); the second takes it.
        lines = await until_logged(second, b"discord: took shard")
        moved = int(lines[-1].split(b"took shard ")[1].split()[0])
        await until(lambda: sorted(fake_discord.live_shards) == [(0, 2), (1, 2)], 30)
        await fake_discord.guild_message("hi", mention=True)
        await fake_discord.guild_message("hi", mention=True, channel_id=OTHER_CHANNEL)
        await until(lambda: len(fake_discord.visible(CHANNEL_ID)) == 1
                    and len(fake_discord.visible(OTHER_CHANNEL)) == 1, 30)
        second.kill()  # kill -9: its lease connection drops and its shard's lock with it
        await second.wait()
        await until_logged(first, f"took shard {moved} of 2".encode())
        where = CHANNEL_ID if moved == 0 else OTHER_CHANNEL
        await until(lambda: len(fake_discord.live_shards) == 2, 30)
        await fake_discord.guild_message("still there?", mention=True, channel_id=where)
        await until(lambda: len(fake_discord.visible(where)) == 2, 30)
        assert fake_discord.visible(CHANNEL_ID) + fake_discord.visible(OTHER_CHANNEL) == [
            REPLY] * 3
        first.send_signal(signal.SIGTERM)  # gives its shards back and exits cleanly
        assert await asyncio.wait_for(first.wait(), 30) == 0


@contextlib.asynccontextmanager
async def processes() -> AsyncIterator[Callable[[Path, dict[str, str]],
                                                Awaitable[RoostProcess]]]:
    """``roost run`` processes started through it, killed at the end if still running."""
    started: list[RoostProcess] = []

    async def start(cwd: Path, env: dict[str, str]) -> RoostProcess:
        started.append(await start_roost(cwd, env))
        return started[-1]

    try:
        yield start
    finally:
        for proc in started:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
