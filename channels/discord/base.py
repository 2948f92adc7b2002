"""The Discord adapter's state and the plumbing every part of it shares."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any

import discord
import yarl

from bot.config.settings import Settings
from bot.contracts.channel import READY, Channel, ChannelHealth, InboundHandler
from channels.delivery import DeliveryPolicy, deliver
from channels.discord.common import (
    CATCHUP_LIMIT,
    INTERACTION_TIMEOUT,
    RECENT_IDS,
    T,
    _api_base,
    _PendingInteraction,
    _RecentSet,
)
from channels.discord.errors import delivery_error
from channels.discord.gateway import _Client


class _DiscordBase(Channel):
    """State shared by the parts of :class:`~channels.discord.DiscordChannel`."""

    def __init__(self, settings: Settings, *, guild_ready_timeout: float = 1.0,
                 ready_timeout: float = 60.0, delivery: DeliveryPolicy | None = None,
                 edit_interval: float = 1.0,
                 interaction_timeout: float = INTERACTION_TIMEOUT,
                 catchup_limit: int | None = None, call_timeout: float | None = None,
                 max_ratelimit_timeout: float = 30.0) -> None:
        """Read the token and endpoints from ``settings``; nothing connects yet.

        ``guild_ready_timeout`` is how long discord.py waits for further guilds
        before ``on_ready`` (and so :meth:`start`) returns; ``ready_timeout``
        bounds the whole start. ``delivery`` tunes retries of 5xx and connection
        errors; ``edit_interval`` spaces streaming edits. ``catchup_limit``
        bounds the messages read back per chat when catching up (default: the
        ``discord_catchup_limit`` setting if there is one, else 100).
        ``call_timeout``, if set, bounds each REST call, discord.py's own
        queueing for its rate-limit buckets included (so it must be generous;
        without it a stalled call is bounded by aiohttp's 5-minute default).
        discord.py waits out 429s up to ``max_ratelimit_timeout`` seconds by
        itself, longer ones reach :func:`deliver` as :class:`RateLimited`.
        """
        if settings.discord_bot_token is None:
            raise ValueError("DISCORD_BOT_TOKEN is not set")
        self.settings = settings
        self._token = settings.discord_bot_token.get_secret_value()
        self._api_base = _api_base(settings.discord_api_base)
        self._gateway = yarl.URL(settings.discord_gateway_url) \
            if settings.discord_gateway_url else None
        self.guild_ready_timeout = guild_ready_timeout
        self.ready_timeout = ready_timeout
        self.delivery = delivery or DeliveryPolicy()
        self.edit_interval = edit_interval
        self.interaction_timeout = interaction_timeout
        configured = getattr(settings, "discord_catchup_limit", None)
        self.catchup_limit = int(catchup_limit if catchup_limit is not None
                                 else configured if isinstance(configured, int)
                                 else CATCHUP_LIMIT)
        self.call_timeout = call_timeout
        self.max_ratelimit_timeout = max_ratelimit_timeout
        self.client: discord.Client | None = None
        self._handler: InboundHandler | None = None
        self._runner: asyncio.Task[None] | None = None
        self._stopping = False
        self._seen = _RecentSet(RECENT_IDS)
        self._own = _RecentSet(RECENT_IDS)
        self._interactions: dict[str, _PendingInteraction] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._sending = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._saved_endpoints: tuple[str, yarl.URL] | None = None
        self._cursors: dict[int, int] = {}
        """Per channel (or thread), the newest message id the core has (or was
        not meant to get): where a catch-up after a reconnect starts."""
        self._gaps: dict[int, int] = {}
        """Per channel, the id just before the oldest message the handler
        failed on: a catch-up starts there, so that message is read again."""
        self._catching_up: asyncio.Task[None] | None = None
        self._intake_open = True
        self._sessions: dict[int | None, _Client] = {}
        self._runners: dict[int, asyncio.Task[None]] = {}
        self._started = False
        """Whether :meth:`start` returned: until then it reports failures itself."""
        """The gateway sessions this process runs, by shard (``None``: unsharded)."""
        self._health = ChannelHealth(False, "connecting")
        """The health while no session runs: connecting, or (sharded) ready to send
        while other replicas hold every shard."""

    def health(self) -> ChannelHealth:
        """Ready while every gateway session is up (READY or RESUMED since the last drop).

        What ``/readyz`` shows; a shard's problem is named with its shard.
        """
        for shard, client in sorted(self._sessions.items(), key=lambda s: s[0] or 0):
            if not client.health.ready:
                return client.health if shard is None else ChannelHealth(
                    False, f"shard {shard}: {client.health.detail}")
        return READY if self._sessions else self._health

    async def _deliver(self, call: Callable[[], Awaitable[T]], *, what: str) -> T:
        """Run a REST call with :func:`deliver`, translating discord.py's errors.

        discord.py already sleeps through 429s (``retry_after``) and retries
        500/502/504 a few times; what reaches here is a limit longer than its
        ``max_ratelimit_timeout``, another 5xx, a dropped connection, or a
        call that took longer than :attr:`call_timeout`.
        """
        async def translated() -> T:
            try:
                async with asyncio.timeout(self.call_timeout):  # None: no bound
                    return await call()
            except Exception as exc:
                mapped = delivery_error(exc)
                if mapped is exc:
                    raise
                raise mapped from exc

        return await deliver(translated, what=what, policy=self.delivery)

    @contextlib.contextmanager
    def _busy(self) -> Iterator[None]:
        """Count a send in flight, so :meth:`stop` can let it finish."""
        self._sending += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._sending -= 1
            if not self._sending:
                self._idle.set()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task
