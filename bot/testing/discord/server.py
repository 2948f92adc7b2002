"""The fake Discord server, started and stopped."""

from __future__ import annotations

from types import TracebackType
from typing import Self

from aiohttp import web

from bot.testing.discord.events import _Events
from bot.testing.discord.wire import API_PREFIX, UPLOAD_LIMIT


class FakeDiscord(_Events):
    """The fake Discord server. Use it as an async context manager or via ``fake_discord``."""

    async def start(self) -> None:
        """Bind to a free port on 127.0.0.1 and start serving."""
        # Bodies past the upload limit must reach the handler, which answers
        # them as Discord does (413, code 40005), not as aiohttp would.
        app = web.Application(client_max_size=8 * UPLOAD_LIMIT)
        app.router.add_get("/gateway", self._gateway)
        app.router.add_get("/attachments/{tail:.*}", self._cdn_get)
        app.router.add_route("*", API_PREFIX + "/{tail:.*}", self._rest)
        self._runner = web.AppRunner(app, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self._port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        """Close the open gateway sockets, stop serving and release the port."""
        for sock in list(self._sockets):
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
