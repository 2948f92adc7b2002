"""discord.py's REST and gateway endpoints, pointed at the configured ones while a channel runs.

discord.py reads both from class attributes, so they are process-wide:
:class:`Endpoints` moves them at start and puts them back when the last
channel that moved them stops (several apps in one process, as in tests of
replicas).
"""

from __future__ import annotations

import re

import discord
import yarl

from bot.config.settings import Settings

_API_VERSION = re.compile(r"/api/v\d+$")

_REDIRECTED: list[Endpoints] = []
"""The started channels' endpoints that point discord.py elsewhere, oldest first."""


def api_base(value: str | None) -> str | None:
    """``DISCORD_API_BASE`` as ``Route.BASE``: ``/api/v10`` is added when missing."""
    if not value:
        return None
    base = value.rstrip("/")
    return base if _API_VERSION.search(base) else base + "/api/v10"


class Endpoints:
    """Points discord.py at ``discord_api_base`` and ``discord_gateway_url`` while in use."""

    def __init__(self, settings: Settings) -> None:
        self.api_base = api_base(settings.discord_api_base)
        self.gateway = yarl.URL(settings.discord_gateway_url) \
            if settings.discord_gateway_url else None
        self._saved: tuple[str, yarl.URL] | None = None

    def redirect(self) -> None:
        """Point discord.py at the configured endpoints (nothing if none is set)."""
        if self.api_base is None and self.gateway is None:
            return
        gateway_cls = discord.gateway.DiscordWebSocket
        self._saved = _REDIRECTED[0]._saved if _REDIRECTED else (
            discord.http.Route.BASE, gateway_cls.DEFAULT_GATEWAY)
        _REDIRECTED.append(self)
        if self.api_base is not None:
            discord.http.Route.BASE = self.api_base
        if self.gateway is not None:
            gateway_cls.DEFAULT_GATEWAY = self.gateway

    def restore(self) -> None:
        """Put discord.py's own endpoints back once no other channel needs them moved."""
        if self in _REDIRECTED:
            _REDIRECTED.remove(self)
        if self._saved is not None and not _REDIRECTED:
            discord.http.Route.BASE, discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = \
                self._saved
        self._saved = None
