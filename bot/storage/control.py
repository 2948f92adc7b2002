"""Commands between replicas: ``NOTIFY roost_control`` and ``NOTIFY roost_invalidate``.

A run lives in the process that runs it, so ``/stop`` received by another
replica must reach that process. :class:`Control` keeps a connection of its
own (``application_name`` ``roost-control:<replica id>``, so the live replicas
can be counted) LISTENing on two channels:

* ``roost_control``: JSON requests ``{"kind": "request", "target": <replica id
  or "*">, "from": ..., "id": <request id>, "command": "stop" | "stopall",
  "session": <session key>}``. The target (every other replica for ``"*"``)
  runs the command locally and answers ``{"kind": "ack", "to": <sender>, "id":
  ..., "runs": n, "dropped": n}``. The caller sends to the session's lease
  holder when one is recorded, else to everyone, and takes the first ack that
  stopped something, or waits for every live replica's ack.
* ``roost_invalidate``: ``{"from": ..., "what": ..., "name": ...}``; every
  other replica reloads what the sender reloaded locally (plugins, an agent,
  the paired-user cache).

On SQLite (one process) there is nobody to tell: :func:`open_control` gives
``None``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiosqlite

from bot.storage.db import dialect_of

log = logging.getLogger("roost.storage.control")

CONTROL = "roost_control"
INVALIDATE = "roost_invalidate"
LISTEN_WAIT = 30.0
"""Seconds the start waits for the control connection before going on without it."""
APPLICATION = "roost-control:"
"""The prefix of the control connections' ``application_name`` (then the replica id)."""

StopHandler = Callable[[str, str], tuple[int, int]]
"""``(command, session key) -> (runs stopped, queued messages dropped)``, run locally."""
InvalidateHandler = Callable[[str, str], Awaitable[None]]
"""``(what, name)``: reload what another replica changed."""


class Control:
    """This replica's end of the control channels (see the module docstring)."""

    def __init__(self, db: aiosqlite.Connection, url: str, replica: str, on_stop: StopHandler,
                 on_invalidate: InvalidateHandler, *, clock: Callable[[], float] = time.time,
                 reconnect_every: float = 1.0) -> None:
        self.db = db
        self.url = url
        self.replica = replica
        self.on_stop = on_stop
        self.on_invalidate = on_invalidate
        self.clock = clock
        self.reconnect_every = reconnect_every
        self.listening = asyncio.Event()
        self._waiting: dict[str, tuple[asyncio.Queue[dict[str, Any]], int]] = {}
        self._tasks: set[asyncio.Future[Any]] = set()
        """The listening loop and the answers and reloads under way."""

    def start(self) -> None:
        """Listen in the background (reconnecting)."""
        self._spawn(self._run())

    async def close(self) -> None:
        """Stop listening; answers and reloads still under way are cancelled too."""
        tasks, self._tasks = list(self._tasks), set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- asking ------------------------------------------------------------------------

    async def stop_elsewhere(self, command: str, session_key: str,
                             wait: float = 4.0) -> tuple[int, int]:
        """Run ``command`` (``stop``/``stopall``) on the replica holding ``session_key``'s run.

        ``(runs stopped, messages dropped)`` summed over the answers; ``(0, 0)``
        when nobody else runs it (or nobody answered within ``wait`` seconds).
        """
        holder = await self._holder(session_key)
        if holder == self.replica:
            return 0, 0
        others = await self._others()
        if holder is None and not others:
            return 0, 0
        target = holder or "*"
        expect = 1 if holder else len(others)
        request_id = secrets.token_hex(8)
        answers: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._waiting[request_id] = (answers, expect)
        runs = dropped = 0
        try:
            await self._notify(CONTROL, {"kind": "request", "target": target,
                                         "from": self.replica, "id": request_id,
                                         "command": command, "session": session_key})
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    for _ in range(expect):
                        ack = await answers.get()
                        runs += int(ack.get("runs", 0))
                        dropped += int(ack.get("dropped", 0))
                        if command == "stop" and runs:
                            break  # /stop stops one run: the first owner that did is enough
        finally:
            self._waiting.pop(request_id, None)
        return runs, dropped

    async def invalidate(self, what: str, name: str = "") -> None:
        """Tell every other replica to reload ``what`` (``plugins``, ``agent``, ``pairing``)."""
        await self._notify(INVALIDATE, {"from": self.replica, "what": what, "name": name})

    async def _holder(self, session_key: str) -> str | None:
        rows = list(await self.db.execute_fetchall(
            "SELECT owner FROM session_leases WHERE session_key = ? AND expires_at > ?",
            (session_key, self.clock())))
        return str(rows[0][0]) if rows else None

    async def _others(self) -> list[str]:
        """The other live replicas (their control connections)."""
        rows = await self.db.execute_fetchall(
            "SELECT application_name FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name LIKE ?", (APPLICATION + "%",))
        names = {str(r[0]).removeprefix(APPLICATION) for r in rows}
        return sorted(names - {self.replica})

    async def _notify(self, channel: str, payload: dict[str, Any]) -> None:
        await self.db.execute("SELECT pg_notify(?, ?)", (channel, json.dumps(payload)))

    # -- answering -------------------------------------------------------------------

    def _deliver(self, _conn: Any, _pid: int, channel: str, payload: str) -> None:
        try:
            message = json.loads(payload)
        except ValueError:
            log.warning("ignored a malformed %s notification", channel)
            return
        if not isinstance(message, dict) or message.get("from") == self.replica:
            return
        if channel == INVALIDATE:
            self._spawn(self.on_invalidate(str(message.get("what", "")),
                                           str(message.get("name", ""))))
        elif message.get("kind") == "ack":
            waiting = self._waiting.get(str(message.get("id")))
            if message.get("to") == self.replica and waiting is not None:
                waiting[0].put_nowait(message)
        elif message.get("kind") == "request" and message.get("target") in (self.replica, "*"):
            self._spawn(self._answer(message))

    async def _answer(self, request: dict[str, Any]) -> None:
        command, key = str(request.get("command")), str(request.get("session"))
        runs, dropped = self.on_stop(command, key) if command in ("stop", "stopall") else (0, 0)
        if runs or dropped:
            log.info("%s of %s asked by replica %s: %d run(s) stopped", command, key,
                     request.get("from"), runs)
        await self._notify(CONTROL, {"kind": "ack", "to": request.get("from"),
                                     "from": self.replica, "id": request.get("id"),
                                     "runs": runs, "dropped": dropped})

    def _spawn(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)  # held until done (the loop keeps weak references)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Future[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("a control message failed", exc_info=task.exception())

    async def _run(self) -> None:
        import asyncpg  # type: ignore[import-untyped]

        from bot.storage.postgres import CONNECTION_LOST

        while True:
            conn: Any = None
            try:
                conn = await asyncpg.connect(
                    self.url, server_settings={"application_name": APPLICATION + self.replica})
                closed = asyncio.Event()
                conn.add_termination_listener(lambda _c, closed=closed: closed.set())
                await conn.add_listener(CONTROL, self._deliver)
                await conn.add_listener(INVALIDATE, self._deliver)
                self.listening.set()
                await closed.wait()
            except (*CONNECTION_LOST, asyncpg.PostgresError) as exc:
                log.warning("control connection failed (%s: %s); retrying",
                            type(exc).__name__, exc)
            finally:
                self.listening.clear()
                if conn is not None:
                    conn.terminate()
            await asyncio.sleep(self.reconnect_every)


async def open_control(db: aiosqlite.Connection, replica: str, on_stop: StopHandler,
                       on_invalidate: InvalidateHandler) -> Control | None:
    """A started :class:`Control` (listening) on PostgreSQL; ``None`` on SQLite."""
    if dialect_of(db) != "postgresql":
        return None
    control = Control(db, str(getattr(db, "url", "")), replica, on_stop, on_invalidate)
    control.start()
    try:
        await asyncio.wait_for(control.listening.wait(), LISTEN_WAIT)
    except TimeoutError:
        # The pool connected, so the server is there: keep trying in the background
        # (logged) rather than holding the start.
        log.warning("the control connection is not up after %.0fs; /stop from other "
                    "replicas reaches this one once it is", LISTEN_WAIT)
    return control
