"""Updates Telegram POSTs to a webhook: on Roost's own HTTP server when the port is
its, else on a hardened listener of the channel's own."""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from aiogram.methods import SetWebhook

from bot.contracts.channel import READY, WebRoutes
from bot.resilience.listener import Limits as ListenerLimits
from bot.resilience.listener import Listener
from channels.telegram.client import BotApi, describe_error
from channels.telegram.malformed import UPDATE_ID
from channels.telegram.receiving import ALLOWED_UPDATES, Updates, parse_update

if TYPE_CHECKING:
    from aiohttp import web

    from bot.config.settings import Settings

log = logging.getLogger("roost.channels.telegram")


class Webhook:
    """Receives updates on ``telegram_webhook_url`` (checked with the secret-token
    header) and hands them to :class:`Updates`; answers 503 once intake stopped."""

    def __init__(self, settings: Settings, api: BotApi, updates: Updates) -> None:
        self.settings = settings
        self.api = api
        self.updates = updates
        self._listener: Listener | None = None
        self._shared: WebRoutes | None = None
        """Roost's HTTP server, when the webhook is mounted there (same port)."""

    @property
    def receiving(self) -> bool:
        """Whether the webhook is mounted (on a listener of its own or Roost's server)."""
        return self._listener is not None or self._shared is not None

    async def start(self, url: str, shared: WebRoutes | None) -> None:
        """Mount the endpoint (on ``shared`` when it listens on the webhook's port), then
        ``setWebhook``; unmounted again if that fails."""
        secret_setting = self.settings.telegram_webhook_secret
        # Without a secret anyone who learns the URL could inject updates, so
        # one is made up when none is configured: Telegram echoes it back.
        secret = secret_setting.get_secret_value() if secret_setting else \
            secrets.token_urlsafe(32)
        path = urlsplit(url).path or "/"
        if shared is not None and shared.port == self.settings.telegram_webhook_port:
            # telegram_webhook_port is Roost's own HTTP port: mounted on that server.
            shared.add_post(path, self._handler(secret))
            self._shared = shared
            try:
                await self.api.deliver(SetWebhook(url=url, secret_token=secret,
                                                  allowed_updates=ALLOWED_UPDATES),
                                       "setWebhook")
            except BaseException:
                shared.remove_post(path)
                self._shared = None
                raise
            self.updates.report(READY)
            return
        # Webhook mode only: long polling never loads the server.
        listener = Listener(None, self.settings.telegram_webhook_port,
                            ListenerLimits.from_settings(self.settings), name="Telegram webhook")
        listener.app.router.add_post(path, self._handler(secret))
        await listener.start()
        self._listener = listener
        try:
            await self.api.deliver(SetWebhook(url=url, secret_token=secret,
                                              allowed_updates=ALLOWED_UPDATES), "setWebhook")
        except BaseException:
            await listener.close()
            self._listener = None
            raise
        self.updates.report(READY)

    async def close(self) -> None:
        """Stop listening (or unmount from Roost's server)."""
        if self._listener is not None:
            await self._listener.close()
        if self._shared is not None and self.settings.telegram_webhook_url:
            shared, self._shared = self._shared, None
            shared.remove_post(urlsplit(self.settings.telegram_webhook_url).path or "/")

    def _handler(self, secret: str) -> Callable[[web.Request], Awaitable[web.Response]]:
        from aiohttp import web

        async def handle(request: web.Request) -> web.Response:
            given = request.headers.get("X-Telegram-Bot-Api-Secret-Token", "")
            if not secrets.compare_digest(given.encode(), secret.encode()):
                return web.Response(status=HTTPStatus.UNAUTHORIZED, text="Unauthorized")
            if self.updates.stopped:
                # Shutting down: not taken, so Telegram keeps the update and
                # delivers it again to the next instance.
                return web.Response(status=HTTPStatus.SERVICE_UNAVAILABLE,
                                    text="Shutting down")
            body = await request.text()
            try:
                raw = json.loads(body)
            except (ValueError, RecursionError) as exc:
                # Telegram would retry a non-2xx answer for ever: acknowledged.
                found = UPDATE_ID.search(body)
                log.warning("telegram: webhook update %s is not decodable JSON (%s); "
                            "acknowledged and skipped", found.group(1)[:24] if found else "?",
                            type(exc).__name__)
                return web.json_response({})
            update = parse_update(raw, self.api.required())
            if update is None:
                return web.json_response({})
            try:
                await self.updates.process(update)
            except Exception as exc:
                log.warning("telegram: update %d was not taken (%s); answering 500 so "
                            "Telegram delivers it again", update.update_id, describe_error(exc))
                return web.json_response({}, status=HTTPStatus.INTERNAL_SERVER_ERROR)
            return web.json_response({})

        return handle
