"""What the fake Discord holds, and where it listens."""

from __future__ import annotations

import asyncio
import itertools
import random
import re
from collections.abc import Mapping
from typing import Any

from bot.testing.discord.wire import (
    API_PREFIX,
    CHANNEL_ID,
    DM_CHANNEL_ID,
    GUILD_ID,
    UPLOAD_LIMIT,
    Failure,
    FakeMessage,
    Interaction,
    RestCall,
    Socket,
)


class State:
    """What the fake Discord holds; every part of :class:`FakeDiscord` reads and writes it."""

    def __init__(self, *, token: str = "test-discord-token") -> None:
        self.token = token
        self.calls: list[RestCall] = []
        """Every REST request, in order."""
        self.messages: dict[int, FakeMessage] = {}
        """Messages the bot created, by id."""
        self.commands: list[dict[str, Any]] = []
        """The global application commands from the last bulk overwrite."""
        self.identifies: list[dict[str, Any]] = []
        """Every IDENTIFY payload's ``d`` (intents, token...)."""
        self.resumes = 0
        self.guilds: dict[int, int] = {GUILD_ID: CHANNEL_ID}
        """The bot's guilds, each with its text channel (:meth:`FakeDiscord.add_guild`)."""
        self.shards_required = 1
        """The fewest shards Discord accepts for this bot: ``/gateway/bot`` recommends it
        and an IDENTIFY with fewer is closed with 4011 (Sharding required)."""
        self.user_messages: dict[int, dict[str, Any]] = {}
        """Messages users sent (pushed live or recorded as missed), by id."""
        self.injected: list[tuple[str, str, str]] = []
        """Every fault served, as ``(method, path, kind)``, in order."""
        self.upload_limit = UPLOAD_LIMIT
        """The most bytes of files one message may carry (413 beyond)."""
        self.cdn_requests: list[tuple[str, Mapping[str, str], int]] = []
        """Every CDN request as ``(path with query, headers, status)``, in order."""
        self.cdn_files: dict[str, tuple[bytes, str, bool]] = {}
        self.cdn_failures: list[int | str] = []
        self.nonces: dict[str, int] = {}
        self.chaos_plan: tuple[float, str | None, re.Pattern[str], tuple[str, ...],
                               random.Random, float, float] | None = None
        self.sockets: list[Socket] = []
        self.session_shards: dict[str, tuple[int, int]] = {}
        self.failures: list[Failure] = []
        self.interactions: dict[int, Interaction] = {}
        self.reactions: dict[int, list[str]] = {}
        """The bot's own reactions on each message (its or a user's), by message id."""
        self.ack_within = 3.0
        """Seconds an interaction may wait for its first callback (Discord's 3 s)."""
        self.ids = itertools.count(900_000)
        self.serving = 0
        self.changed = asyncio.Condition()
        self.port = 0

    @property
    def api_base(self) -> str:
        """The REST base, as ``discord.http.Route.BASE`` expects it."""
        return f"http://127.0.0.1:{self.require_port()}{API_PREFIX}"

    @property
    def gateway_url(self) -> str:
        """The gateway websocket URL."""
        return f"ws://127.0.0.1:{self.require_port()}/gateway"

    def settings(self) -> dict[str, Any]:
        """Roost settings that point the Discord channel at this fake."""
        return {"discord_bot_token": self.token, "discord_api_base": self.api_base,
                "discord_gateway_url": self.gateway_url}

    def guild_of(self, channel_id: int) -> int | None:
        """The guild a channel is in (the test guild for unknown ones), ``None`` for the DM."""
        if channel_id == DM_CHANNEL_ID:
            return None
        return next((g for g, c in self.guilds.items() if c == channel_id), GUILD_ID)

    def add_guild(self, guild_id: int, channel_id: int) -> None:
        """Another guild of the bot with one text channel; sessions that IDENTIFY from now
        on (on its shard) receive it. Its messages: ``guild_message(channel_id=...)``."""
        self.guilds[guild_id] = channel_id

    def require_port(self) -> int:
        """The port the fake listens on; raises if it is not started."""
        if not self.port:
            raise RuntimeError("FakeDiscord is not started")
        return self.port
