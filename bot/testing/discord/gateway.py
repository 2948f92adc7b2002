"""The gateway websocket: HELLO, IDENTIFY and READY, RESUME, dispatches."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import WSMsgType, web

from bot.testing.discord.state import State
from bot.testing.discord.wire import APP_ID, BOT_ID, Socket, guild_create, shard_of, user_payload


class Gateway:
    """Gateway sessions (kept in ``state``) and what is dispatched to them."""

    def __init__(self, state: State) -> None:
        self._state = state

    async def handle(self, request: web.Request) -> web.WebSocketResponse:
        """Serve one gateway websocket until the client closes it."""
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        sock = Socket(ws)
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
            if sock in self._state.sockets:
                self._state.sockets.remove(sock)
            async with self._state.changed:
                self._state.changed.notify_all()
        return ws

    async def _on_gateway(self, sock: Socket, payload: dict[str, Any]) -> None:
        op = payload.get("op")
        if op == 1:
            await sock.send({"op": 11})
        elif op == 2:
            identify = dict(payload.get("d") or {})
            self._state.identifies.append(identify)
            shard = _shard(identify.get("shard", [0, 1]))
            if shard is None:
                await sock.ws.close(code=4010, message=b"Invalid shard")
                return
            if shard[1] < self._state.shards_required:
                await sock.ws.close(code=4011, message=b"Sharding required")
                return
            sock.shard = shard
            self._state.session_shards[f"session-{len(self._state.identifies)}"] = shard
            guilds = [g for g in self._state.guilds if shard_of(g, shard[1]) == shard[0]]
            ready: dict[str, Any] = {
                "v": 10, "user": user_payload(BOT_ID, "testbot", bot=True),
                "guilds": [{"id": str(g), "unavailable": True} for g in guilds],
                "session_id": f"session-{len(self._state.identifies)}",
                "resume_gateway_url": self._state.gateway_url,
                "application": {"id": str(APP_ID), "flags": 0},
                "private_channels": [], "relationships": [],
            }
            if "shard" in identify:
                ready["shard"] = list(shard)
            await sock.dispatch("READY", ready)
            for guild in guilds:
                data = guild_create(guild, self._state.guilds[guild])
                for channel in data["channels"]:
                    # As on Discord: the newest message's id, which a client may read from.
                    channel["last_message_id"] = max(
                        (m for m, d in self._state.user_messages.items()
                         if d["channel_id"] == channel["id"]), default=None)
                    if channel["last_message_id"] is not None:
                        channel["last_message_id"] = str(channel["last_message_id"])
                await sock.dispatch("GUILD_CREATE", data)
            await self._activate(sock)
        elif op == 6:
            self._state.resumes += 1
            session = (payload.get("d") or {}).get("session_id")
            sock.shard = self._state.session_shards.get(str(session), (0, 1))
            await sock.dispatch("RESUMED", {})
            await self._activate(sock)

    async def _activate(self, sock: Socket) -> None:
        async with self._state.changed:
            self._state.sockets.append(sock)
            self._state.changed.notify_all()

    async def invalidate_session(self) -> None:
        """Send INVALID_SESSION (not resumable) to every live session: the client IDENTIFYs anew."""
        for sock in list(self._state.sockets):
            self._state.sockets.remove(sock)
            await sock.send({"op": 9, "d": False})

    async def wait_identified(self, count: int = 1, limit: float = 5.0) -> None:
        """Wait until ``count`` IDENTIFYs arrived and a session is live."""
        async def wait() -> None:
            async with self._state.changed:
                await self._state.changed.wait_for(
                    lambda: len(self._state.identifies) >= count and bool(self._state.sockets))

        await asyncio.wait_for(wait(), limit)

    async def dispatch(self, event: str, data: Any) -> None:
        """Send a dispatch (op 0) ``event`` to the live gateway sessions it is for.

        As on Discord, an event of a guild (``data["guild_id"]``) goes to the sessions
        of that guild's shard (:func:`shard_of`), any other (DMs) to shard 0's.
        """
        if not self._state.sockets:
            raise AssertionError("no gateway session: start the Discord channel first")
        guild = data.get("guild_id") if isinstance(data, dict) else None
        guild_id = int(guild) if isinstance(guild, str) and guild.isdigit() else None
        for sock in list(self._state.sockets):
            if shard_of(guild_id, sock.shard[1]) == sock.shard[0]:
                await sock.dispatch(event, data)

    @property
    def live_shards(self) -> list[tuple[int, int]]:
        """``(shard_id, shard_count)`` of every live gateway session, in connection order."""
        return [sock.shard for sock in self._state.sockets]

    async def dispatch_raw(self, event: str, data: str) -> None:
        """Dispatch ``event`` whose ``d`` is the JSON text ``data``, spliced in verbatim.

        For payloads no Python object serializes to (nesting past any
        decoder's depth); the frame gets its sequence number like any other.
        """
        if not self._state.sockets:
            raise AssertionError("no gateway session: start the Discord channel first")
        for sock in list(self._state.sockets):
            sock.seq += 1
            await sock.ws.send_str(f'{{"op": 0, "t": {json.dumps(event)}, "s": {sock.seq}, '
                                   f'"d": {data}}}')

    async def send_raw(self, frame: str) -> None:
        """Send ``frame`` verbatim as a text frame (e.g. something that is not JSON)."""
        for sock in list(self._state.sockets):
            await sock.ws.send_str(frame)


def _shard(value: Any) -> tuple[int, int] | None:
    """IDENTIFY's ``shard`` as ``(id, count)``, or ``None`` if Discord would reject it."""
    if (isinstance(value, list) and len(value) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
            and 0 <= value[0] < value[1]):
        return value[0], value[1]
    return None
