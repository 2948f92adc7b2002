"""A channel's durable notes (ChannelContext.state) and GET routes on the shared server:
what a channel plugin such as Matrix (sync token), email (last UID) or WhatsApp
(webhook verification) builds on."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from bot.app.http import HealthServer
from bot.config.settings import SetupError
from bot.contracts.channel import ALONE, Channel, ChannelContext, InboundHandler
from bot.storage.channel_state import ChannelStateStore
from bot.storage.sessions import SessionStore
from bot.testing.app import create_app, scripted


class Noting(Channel):
    """A channel that notes a position when it starts."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.seen: str | None = None

    async def start(self, handler: InboundHandler) -> None:
        self.seen = await self.state.get("next_batch")
        await self.state.put("next_batch", f"after-{self.seen}")


async def test_notes_survive_a_restart_and_are_kept_per_channel(tmp_path: Path) -> None:
    for expected in (None, "after-None"):
        app, _ = await create_app(scripted({"reply": "hi"}, loop=True), data_dir=tmp_path)
        try:
            first, other = Noting("matrixish"), Noting("mailish")
            await app.add_channel(first)
            await app.add_channel(other)
            assert first.seen == expected
            assert other.seen == expected  # one channel's key is not another's
        finally:
            await app.close()


async def test_a_channel_started_alone_keeps_its_notes_in_memory() -> None:
    channel = Noting("alone")

    async def ignore(_event: object) -> None:
        return None

    await channel.begin(ignore, ALONE)
    assert channel.seen is None
    assert await channel.state.get("next_batch") == "after-None"
    assert ALONE.state is None  # the shared default is not written into


async def test_replicas_share_one_channels_notes(pg_url: str) -> None:
    one, two = await SessionStore.open(pg_url), await SessionStore.open(pg_url)
    try:
        mine = ChannelStateStore("email", one.db, one.lock, one.writer)
        theirs = ChannelStateStore("email", two.db, two.lock, two.writer)
        await mine.put("uid", "41")
        await theirs.put("uid", "42")  # an upsert, not a second row
        assert await mine.get("uid") == "42"
        assert await ChannelStateStore("matrix", one.db, one.lock, one.writer).get("uid") is None
    finally:
        await one.close()
        await two.close()


async def test_a_channel_serves_get_on_the_shared_server(tmp_path: Path) -> None:
    app, _ = await create_app(scripted({"reply": "hi"}, loop=True), data_dir=tmp_path)
    server = HealthServer(app, "127.0.0.1", 0)
    await server.start()
    try:
        async def challenge(request: web.Request) -> web.Response:
            return web.Response(text=request.query.get("hub.challenge", ""))

        server.add_get("/hook", challenge)
        for taken in ("/hook", "/healthz", "/ui/login"):
            with pytest.raises(SetupError):
                server.add_get(taken, challenge)
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{server.url}/hook?hub.challenge=77") as answer:
                assert (answer.status, await answer.text()) == (200, "77")
            async with http.get(f"{server.url}/healthz") as answer:
                assert answer.status == 200
            server.remove_get("/hook")
            async with http.get(f"{server.url}/hook") as answer:
                assert answer.status == 404
    finally:
        await server.close()
        await app.close()


def test_context_carries_no_state_unless_given() -> None:
    assert ChannelContext().state is None
