"""What the fake Discord holds, and where it listens."""

from __future__ import annotations

import asyncio
import itertools
import random
import re
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from bot.testing.discord.wire import (
    API_PREFIX,
    UPLOAD_LIMIT,
    FakeMessage,
    RestCall,
    _Failure,
    _Interaction,
    _Socket,
)


class _State:
    """The fake's state; the parts of :class:`FakeDiscord` build on it."""

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
        self.user_messages: dict[int, dict[str, Any]] = {}
        """Messages users sent (pushed live or recorded as missed), by id."""
        self.injected: list[tuple[str, str, str]] = []
        """Every fault served, as ``(method, path, kind)``, in order."""
        self.upload_limit = UPLOAD_LIMIT
        """The most bytes of files one message may carry (413 beyond)."""
        self.cdn_requests: list[tuple[str, Mapping[str, str], int]] = []
        """Every CDN request as ``(path with query, headers, status)``, in order."""
        self._cdn: dict[str, tuple[bytes, str, bool]] = {}
        self._cdn_failures: list[int | str] = []
        self._nonces: dict[str, int] = {}
        self._chaos: tuple[float, str | None, re.Pattern[str], tuple[str, ...],
                           random.Random, float, float] | None = None
        self._sockets: list[_Socket] = []
        self._failures: list[_Failure] = []
        self._interactions: dict[int, _Interaction] = {}
        self._ids = itertools.count(900_000)
        self._serving = 0
        self._changed = asyncio.Condition()
        self._runner: web.AppRunner | None = None
        self._port = 0

    @property
    def api_base(self) -> str:
        """The REST base, as ``discord.http.Route.BASE`` expects it."""
        return f"http://127.0.0.1:{self._require_port()}{API_PREFIX}"

    @property
    def gateway_url(self) -> str:
        """The gateway websocket URL."""
        return f"ws://127.0.0.1:{self._require_port()}/gateway"

    def settings(self) -> dict[str, Any]:
        """Roost settings that point the Discord channel at this fake."""
        return {"discord_bot_token": self.token, "discord_api_base": self.api_base,
                "discord_gateway_url": self.gateway_url}

    def _require_port(self) -> int:
        if not self._port:
            raise RuntimeError("FakeDiscord is not started")
        return self._port
