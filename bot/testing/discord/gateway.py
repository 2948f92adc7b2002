"""The gateway websocket: HELLO, IDENTIFY and READY, RESUME, dispatches."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import WSMsgType, web

from bot.testing.discord.rest import _Rest
from bot.testing.discord.wire import APP_ID, BOT_ID, GUILD_ID, _guild, _Socket, user_payload


class _Gateway(_Rest):
    """Gateway sessions and what is dispatched to them."""

    async def _gateway(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        sock = _Socket(ws)
        await sock.send({"op": 10, "d": {"heartbeat_interval": 30_000}})
        try:
            async for frame in ws:
                if frame.type is not WSMsgType.TEXT:
                    continue
                try:
                    payload = json.loads(frame.data)
                except ValueError:
                    continue
                await self._on_gateway(sock, payload)
        finally:
            if sock in self._sockets:
                self._sockets.remove(sock)
            async with self._changed:
                self._changed.notify_all()
        return ws

    async def _on_gateway(self, sock: _Socket, payload: dict[str, Any]) -> None:
        op = payload.get("op")
        if op == 1:
            await sock.send({"op": 11})
        elif op == 2:
            self.identifies.append(dict(payload.get("d") or {}))
            await sock.dispatch("READY", {
                "v": 10, "user": user_payload(BOT_ID, "testbot", bot=True),
                "guilds": [{"id": str(GUILD_ID), "unavailable": True}],
                "session_id": f"session-{len(self.identifies)}",
                "resume_gateway_url": self.gateway_url,
                "application": {"id": str(APP_ID), "flags": 0},
                "private_channels": [], "relationships": [],
            })
            await sock.dispatch("GUILD_CREATE", _guild())
            await self._activate(sock)
        elif op == 6:
            self.resumes += 1
            await sock.dispatch("RESUMED", {})
            await self._activate(sock)

    async def _activate(self, sock: _Socket) -> None:
        async with self._changed:
            self._sockets.append(sock)
            self._changed.notify_all()

    async def wait_identified(self, count: int = 1, limit: float = 5.0) -> None:
        """Wait until ``count`` IDENTIFYs arrived and a session is live."""
        async def wait() -> None:
            async with self._changed:
                await self._changed.wait_for(
                    lambda: len(self.identifies) >= count and bool(self._sockets))

        await asyncio.wait_for(wait(), limit)

    async def dispatch(self, event: str, data: Any) -> None:
        """Send a dispatch (op 0) ``event`` to every live gateway session."""
        if not self._sockets:
            raise AssertionError("no gateway session: start the Discord channel first")
        for sock in list(self._sockets):
            await sock.dispatch(event, data)

    async def dispatch_raw(self, event: str, data: str) -> None:
        """Dispatch ``event`` whose ``d`` is the JSON text ``data``, spliced in verbatim.

        For payloads no Python object serializes to (nesting past any
        decoder's depth); the frame gets its sequence number like any other.
        """
        if not self._sockets:
            raise AssertionError("no gateway session: start the Discord channel first")
        for sock in list(self._sockets):
            sock.seq += 1
            await sock.ws.send_str(f'{{"op": 0, "t": {json.dumps(event)}, "s": {sock.seq}, '
                                   f'"d": {data}}}')

    async def send_raw(self, frame: str) -> None:
        """Send ``frame`` verbatim as a text frame (e.g. something that is not JSON)."""
        for sock in list(self._sockets):
            await sock.ws.send_str(frame)
