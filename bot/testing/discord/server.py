"""The fake Discord server: its parts, built once, and their routes, started and stopped."""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType
from typing import Any, Self

from aiohttp import web

from bot.testing.discord.cdn import Cdn
from bot.testing.discord.events import Events
from bot.testing.discord.faults import Faults
from bot.testing.discord.gateway import Gateway
from bot.testing.discord.rest import Rest
from bot.testing.discord.state import State
from bot.testing.discord.wire import (
    API_PREFIX,
    UPLOAD_LIMIT,
    FakeMessage,
    Interaction,
    RestCall,
)
from bot.testing.parts import StateField


class FakeDiscord:
    """The fake Discord server. Use it as an async context manager or via ``fake_discord``.

    It holds its parts: the :class:`State` they share, the scripted
    :class:`Faults`, the :class:`Cdn`, the :class:`Rest` API, the
    :class:`Gateway` and the :class:`Events` users send; its methods are theirs.
    """

    token = StateField[str]()
    calls = StateField[list[RestCall]]()
    messages = StateField[dict[int, FakeMessage]]()
    commands = StateField[list[dict[str, Any]]]()
    identifies = StateField[list[dict[str, Any]]]()
    resumes = StateField[int]()
    guilds = StateField[dict[int, int]]()
    shards_required = StateField[int]()
    user_messages = StateField[dict[int, dict[str, Any]]]()
    interactions = StateField[dict[int, Interaction]]()
    reactions = StateField[dict[int, list[str]]]()
    ack_within = StateField[float]()
    injected = StateField[list[tuple[str, str, str]]]()
    upload_limit = StateField[int]()
    cdn_requests = StateField[list[tuple[str, Mapping[str, str], int]]]()

    def __init__(self, *, token: str = "test-discord-token") -> None:
        self.state = State(token=token)
        faults = Faults(self.state)
        self._cdn = Cdn(self.state)
        self._rest = Rest(self.state, faults, self._cdn)
        self._gateway = Gateway(self.state)
        events = Events(self.state, self._gateway)
        self._runner: web.AppRunner | None = None
        self.settings = self.state.settings
        self.guild_of = self.state.guild_of
        self.add_guild = self.state.add_guild
        self.fail_next = faults.fail_next
        self.inject = faults.inject
        self.chaos = faults.chaos
        self.quiet = faults.quiet
        self.wait_until_quiet = faults.wait_until_quiet
        self.calls_to = faults.calls_to
        self.wait_for_call = faults.wait_for_call
        self.posted = faults.posted
        self.visible = faults.visible
        self.attachment = self._cdn.attachment
        self.expire = self._cdn.expire
        self.fail_cdn = self._cdn.fail_cdn
        self.invalidate_session = self._gateway.invalidate_session
        self.wait_identified = self._gateway.wait_identified
        self.dispatch = self._gateway.dispatch
        self.dispatch_raw = self._gateway.dispatch_raw
        self.send_raw = self._gateway.send_raw
        self.message_payload = events.message_payload
        self.push_message = events.push_message
        self.missed = events.missed
        self.guild_message = events.guild_message
        self.role_mention = events.role_mention
        self.reply_to_bot = events.reply_to_bot
        self.thread_message = events.thread_message
        self.dm = events.dm
        self.bot_message = events.bot_message
        self.malformed = events.malformed
        self.interaction = events.interaction
        self.interaction_payload = events.interaction_payload
        self.interaction_deferred = events.interaction_deferred
        self.press = events.press
        self.edit_message = events.edit_message
        self.delete_message = events.delete_message
        self.user_reaction = events.user_reaction

    @property
    def api_base(self) -> str:
        """The REST base, as ``discord.http.Route.BASE`` expects it."""
        return self.state.api_base

    @property
    def gateway_url(self) -> str:
        """The gateway websocket URL."""
        return self.state.gateway_url

    @property
    def live_shards(self) -> list[tuple[int, int]]:
        """``(shard_id, shard_count)`` of every live gateway session, in connection order."""
        return self._gateway.live_shards

    async def start(self) -> None:
        """Bind to a free port on 127.0.0.1 and start serving."""
        # Bodies past the upload limit must reach the handler, which answers
        # them as Discord does (413, code 40005), not as aiohttp would.
        app = web.Application(client_max_size=8 * UPLOAD_LIMIT)
        app.router.add_get("/gateway", self._gateway.handle)
        app.router.add_get("/attachments/{tail:.*}", self._cdn.handle)
        app.router.add_route("*", API_PREFIX + "/{tail:.*}", self._rest.handle)
        self._runner = web.AppRunner(app, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.state.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        """Close the open gateway sockets, stop serving and release the port."""
        for sock in list(self.state.sockets):
            await sock.ws.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.stop()
