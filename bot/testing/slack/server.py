"""The fake Slack server, started and stopped; its websocket and response URLs."""

from __future__ import annotations

import contextlib
import json
import time
from types import TracebackType
from typing import Self

import aiohttp
from aiohttp import web

from bot.testing.slack.files import _Files
from bot.testing.slack.wire import APP_ID, ResponsePost


class FakeSlack(_Files):
    """An aiohttp server on 127.0.0.1 that behaves like Slack to one app.

    ``events_url`` is where :meth:`post_event` and friends send requests (the
    app's ``/slack/events`` endpoint); set it once the app listens.
    """

    async def start(self) -> None:
        """Bind to a free port on 127.0.0.1 and start serving."""
        # Uploads may be large: the upload URL takes what Slack's would.
        app = web.Application(client_max_size=256 * 1024 * 1024)
        app.router.add_post("/api/{method}", self._api)
        app.router.add_get("/api/{method}", self._api)  # conversations.history and .replies
        app.router.add_get("/socket", self._socket)
        app.router.add_post("/response/{id}", self._response_url)
        app.router.add_get("/files-pri/{tail:.*}", self._file_get)
        app.router.add_post("/upload/v1/{key}", self._upload_post)
        app.router.add_get("/", self._login_page)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self._port = self._runner.addresses[0][1]
        self._session = aiohttp.ClientSession()

    async def stop(self) -> None:
        """Close sockets and the client session, release the port."""
        for ws in list(self._sockets):
            with contextlib.suppress(Exception):
                await ws.close(code=aiohttp.WSCloseCode.GOING_AWAY)
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.stop()

    async def _socket(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        self._sockets.append(ws)
        self.socket_connections += 1
        await ws.send_str(json.dumps({
            "type": "hello", "num_connections": 1,
            "debug_info": {"host": "fake-slack", "approximate_connection_time": 3600},
            "connection_info": {"app_id": APP_ID}}))
        await self._notify()
        try:
            async for msg in ws:
                if msg.type != aiohttp.WSMsgType.TEXT:
                    continue
                with contextlib.suppress(ValueError):
                    frame = json.loads(msg.data)
                    if isinstance(frame, dict) and "envelope_id" in frame:
                        self.acks[str(frame["envelope_id"])] = frame
                        await self._notify()
        finally:
            self._sockets.remove(ws)
            await self._notify()
        return ws

    async def _response_url(self, request: web.Request) -> web.Response:
        url = f"{self.url}{request.path}"
        failure = self._take_failure("response_url")
        if failure is not None:
            headers = {"Retry-After": str(max(1, round(failure.retry_after)))} \
                if failure.status == 429 else {}
            return web.Response(status=failure.status, text=failure.error, headers=headers)
        try:
            body = await request.json()
        except ValueError:
            return web.Response(status=400, text="invalid_payload")
        self.responses.append(ResponsePost(url, body if isinstance(body, dict) else {},
                                           time.perf_counter()))
        await self._notify()
        return web.Response(text="ok")
