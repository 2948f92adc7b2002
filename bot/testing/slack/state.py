"""What the fake Slack holds, and where it listens."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp import web

from bot.testing.slack.wire import (
    APP_TOKEN,
    BOT_ID,
    BOT_TOKEN,
    BOT_USER_ID,
    CHANNEL,
    DM_CHANNEL,
    SIGNING_SECRET,
    TEAM_ID,
    Call,
    Chaos,
    Failure,
    Posted,
    ResponsePost,
    SharedFile,
    SlackFile,
)


class State:
    """What the fake Slack holds; every part of :class:`FakeSlack` reads and writes it."""

    def __init__(self, *, bot_token: str = BOT_TOKEN, app_token: str = APP_TOKEN,
                 signing_secret: str = SIGNING_SECRET) -> None:
        self.bot_token = bot_token
        self.app_token = app_token
        self.signing_secret = signing_secret
        self.team_id = TEAM_ID
        self.bot_user_id = BOT_USER_ID
        self.bot_id = BOT_ID
        self.channel = CHANNEL
        self.dm_channel = DM_CHANNEL
        self.events_url: str | None = None
        self.calls: list[Call] = []
        """Every Web API call, in order (failed ones too)."""
        self.messages: dict[str, Posted] = {}
        """The app's messages by ``ts``, in posting order."""
        self.responses: list[ResponsePost] = []
        """POSTs to slash commands' response URLs, in order."""
        self.acks: dict[str, dict[str, Any]] = {}
        """Socket Mode acks by envelope id (the whole frame the app sent)."""
        self.socket_connections = 0
        """How many Socket Mode connections were opened so far."""
        self.scopes: set[str] = {"files:read", "files:write", "reactions:read",
                                 "reactions:write"}
        """The bot token's file and reaction scopes; remove one to see Slack refuse."""
        self.user_messages: set[tuple[str, str]] = set()
        """``(channel, ts)`` of the people's messages built by the fake (reactable)."""
        self.reactions: dict[tuple[str, str], list[str]] = {}
        """The app's own reactions (emoji names) on each message, by ``(channel, ts)``."""
        self.denial = "redirect"
        """How ``url_private`` refuses a request: ``"redirect"`` (302 to the login
        page, as Slack does) or ``"403"``."""
        self.files: dict[str, SlackFile] = {}
        """Files by id."""
        self.shared: list[SharedFile] = []
        """Files shared by ``files.completeUploadExternal``, in order."""
        self.file_requests: list[tuple[str, dict[str, str], int]] = []
        """Every ``url_private`` request as ``(path, headers, status)``, in order."""
        self.failures: dict[str, list[Failure]] = {}
        self.chaos_plan: Chaos | None = None
        self.injected: list[tuple[str, str]] = []
        """Every fault served, as ``(method, kind)``, in order."""
        self.last_ts = 0.0
        self.sockets: list[web.WebSocketResponse] = []
        self.changed = asyncio.Condition()
        self.ids = itertools.count(1)
        self.session: aiohttp.ClientSession | None = None
        self.port = 0

    @property
    def url(self) -> str:
        """``http://127.0.0.1:{port}`` (no trailing slash)."""
        if not self.port:
            raise RuntimeError("FakeSlack is not started")
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """The Web API base for ``AsyncWebClient(base_url=...)``; the trailing slash matters."""
        return f"{self.url}/api/"

    def settings(self, *, socket_mode: bool = False, port: int = 0) -> dict[str, Any]:
        """Roost settings pointing the Slack channel at this fake.

        HTTP mode (bot token + signing secret) listens on ``port`` (0: any free
        one); Socket Mode uses the app token instead of the signing secret.
        """
        values: dict[str, Any] = {"slack_bot_token": self.bot_token,
                                  "slack_api_base": self.base_url, "slack_port": port}
        if socket_mode:
            values["slack_app_token"] = self.app_token
        else:
            values["slack_signing_secret"] = self.signing_secret
        return values

    async def notify(self) -> None:
        """Wake everything waiting for the fake to record something."""
        async with self.changed:
            self.changed.notify_all()

    def next_ts(self) -> str:
        """A fresh Slack timestamp: the clock, strictly increasing (``"1763900000.123456"``)."""
        self.last_ts = max(round(time.time(), 6), round(self.last_ts + 0.000001, 6))
        return f"{self.last_ts:.6f}"

    async def wait_until(self, predicate: Callable[[], bool], *, limit: float = 5.0,
                         what: Callable[[], str] | str = "the condition") -> None:
        """Wait until ``predicate()`` holds; re-checked whenever the fake records something."""
        try:
            async with asyncio.timeout(limit), self.changed:
                await self.changed.wait_for(predicate)
        except TimeoutError:
            described = what() if callable(what) else what
            raise AssertionError(f"expected {described} within {limit}s") from None
