"""The Slack adapter's state and the Web API plumbing every part of it shares."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

from slack_bolt.app.async_app import AsyncApp
from slack_sdk.signature import SignatureVerifier
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.web.async_slack_response import AsyncSlackResponse
from slack_sdk.webhook.async_client import AsyncWebhookClient

from bot.contracts.channel import READY, Channel, ChannelHealth, InboundHandler, WebRoutes
from bot.resilience.listener import Listener, Throttle
from channels.delivery import DeliveryPolicy, deliver
from channels.slack.common import (
    EVENTS_PATH,
    MESSAGE_LIMIT,
    REMEMBERED,
    RESPONSE_URL_USES,
    T,
    _KeyedLocks,
    _Recent,
    _sdk_log,
    log,
)
from channels.slack.errors import _post_response, delivery_error
from channels.slack.socketmode import _SocketClient
from channels.slack_format import split_for_slack

STANDBY = ChannelHealth(True, "standby: another replica holds the Socket Mode connection")
"""A follower's health: ready to send; the leader receives."""

if TYPE_CHECKING:
    from bot.config.settings import Settings


class _SlackBase(Channel):
    """State shared by the parts of :class:`~channels.slack.SlackChannel`."""

    def __init__(self, settings: Settings, *, host: str = "0.0.0.0",
                 policy: DeliveryPolicy | None = None, edit_interval: float = 1.0,
                 timeout: int = 30) -> None:
        """``timeout`` bounds each Web API call (seconds); an answer that takes
        longer counts as a transient failure."""
        self.settings = settings
        self.timeout = timeout
        self.host = host
        self.policy = policy or DeliveryPolicy()
        self.edit_interval = edit_interval
        self.port: int | None = None
        """The HTTP port actually bound (``slack_port`` may be 0 in tests)."""
        self.bot_user_id = ""
        self.bot_id = ""
        self._handler: InboundHandler | None = None
        self._web: AsyncWebClient | None = None
        self._app: AsyncApp | None = None
        self._listener: Listener | None = None
        """The Events endpoint's own listener (HTTP mode on a port of its own)."""
        self._shared: WebRoutes | None = None
        """Roost's HTTP server, when the Events endpoint is mounted there."""
        self._socket: _SocketClient | None = None
        self._verifier: SignatureVerifier | None = None
        self._refusals = Throttle()
        """Paces the log line about requests with a bad signature."""
        self._handled: _Recent[str] = _Recent(REMEMBERED)
        """Delivery keys the core has recorded (see :func:`_event_key`)."""
        self._handling = _KeyedLocks()
        self._tasks: set[asyncio.Task[None]] = set()
        self._bot_threads: _Recent[tuple[str, str]] = _Recent(REMEMBERED)
        self._dropped: _Recent[tuple[str, str]] = _Recent(REMEMBERED)
        """Drafts the reply was posted in place of (and deleted)."""
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._manifest_logged = False
        self._intake_open = True
        self._standby = False
        """Replicas: another replica holds the Socket Mode connection."""

    def health(self) -> ChannelHealth:
        """Ready once ``auth.test`` passed and the Events endpoint listens or the Socket
        Mode connection is up; not while the socket is down (the SDK reconnects it)."""
        socket = self._socket
        if socket is None and self._standby:
            return STANDBY
        if socket is not None:
            session = socket.current_session
            if socket.closed or socket.stale or session is None or session.closed:
                return ChannelHealth(False, "Socket Mode disconnected; reconnecting")
            return READY
        if self._listener is not None or self._shared is not None:
            return READY
        return ChannelHealth(False, "connecting" if self._intake_open else "stopped")

    @property
    def events_url(self) -> str:
        """The local Events API URL (HTTP mode, once started)."""
        if self.port is None:
            raise RuntimeError("the Slack channel is not listening over HTTP")
        return f"http://127.0.0.1:{self.port}{EVENTS_PATH}"

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _respond(self, response_url: str, text: str) -> None:
        pieces = split_for_slack(text, MESSAGE_LIMIT)
        if len(pieces) > RESPONSE_URL_USES:
            log.warning("Slack: a command reply has %d parts; a response_url takes %d",
                        len(pieces), RESPONSE_URL_USES)
            del pieces[RESPONSE_URL_USES:]
        webhook = AsyncWebhookClient(response_url, retry_handlers=[], logger=_sdk_log)
        for piece in pieces:
            await self._tracked(deliver(functools.partial(_post_response, webhook, piece),
                                        what="Slack response_url", policy=self.policy))

    async def _call(self, method: str, call: Callable[..., Awaitable[AsyncSlackResponse]],
                    policy: DeliveryPolicy, **params: Any) -> AsyncSlackResponse:
        """A Web API call with Slack's errors translated for :func:`deliver`."""
        async def attempt() -> AsyncSlackResponse:
            try:
                return await call(**params)
            except Exception as exc:
                mapped = delivery_error(exc)
                if mapped is exc:
                    raise
                raise mapped from exc

        return await self._tracked(deliver(attempt, what=f"Slack {method}", policy=policy))

    async def _tracked(self, call: Awaitable[T]) -> T:
        # Counted so stop() can let replies in flight finish.
        self._in_flight += 1
        self._idle.clear()
        try:
            return await call
        finally:
            self._in_flight -= 1
            if not self._in_flight:
                self._idle.set()

    def _api(self) -> AsyncWebClient:
        if self._web is None:
            raise RuntimeError("the Slack channel is not started")
        return self._web
