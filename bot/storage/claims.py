"""Replicas sharing one inbox: per-session leases, claimed with ``SKIP LOCKED``.

Several Roost processes on one PostgreSQL database share the durable inbox
(:mod:`bot.storage.inbox`; its insert is idempotent on the platform's own id,
so two receivers of one update record it once). Who runs what:

* **Claim.** :meth:`Claims.claim` reads the oldest open entries with
  ``SELECT ... FOR UPDATE SKIP LOCKED`` (two replicas claiming at the same
  moment never wait for or take each other's rows) and takes a lease on each
  of their sessions in the same transaction: an upsert that succeeds only
  where no lease exists, the lease expired, or it is already this replica's.
  A session has one holder, so its messages run in order, one run at a time,
  whichever replica received them.
* **Hold.** The holder renews its leases (:meth:`Claims.renew`) well within
  ``lease_seconds`` and releases a session once its entries are done.
* **Fence.** A run's commit includes :meth:`Claims.fence`: it fails (and the
  whole commit rolls back) if the lease is no longer this replica's, so a
  replica that stalled past its lease cannot record an answer the new holder
  is also producing.
* **Take over.** A replica that dies stops renewing; once its leases expire
  (``ROOST_LEASE_SECONDS``, default 30) the next claim by anyone takes its
  sessions, including entries it left ``running``, which run again under the
  usual durability rules (journal replay, outbox, attempts).
* **Wake.** :meth:`bot.storage.inbox.Inbox.add` sends ``NOTIFY roost_inbox``
  with the session key in the insert's transaction (delivered on commit);
  :func:`listen` calls back at once on every replica, so idle replicas claim
  new work without polling.

Lease times are the replicas' clocks (Unix seconds): keep them in sync (NTP);
skew eats into the lease. On SQLite (one process) the same calls work: the
``BEGIN IMMEDIATE`` transaction serializes claims and ``listen`` is a no-op.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiosqlite

from bot.storage.db import Statements, dialect_of, transaction

log = logging.getLogger("roost.storage.claims")

CHANNEL = "roost_inbox"
"""The NOTIFY channel new inbox entries are announced on (payload: the session key)."""


class LeaseLost(RuntimeError):
    """This replica's lease on a session expired and someone else may hold it now."""


@dataclass(frozen=True, slots=True)
class Claimed:
    """A session this replica now holds, and its open inbox entries, oldest first."""

    session_key: str
    entry_ids: tuple[int, ...]


class Claims:
    """Leases on sessions' open inbox work for replica ``owner`` (see the module docstring)."""

    def __init__(self, db: aiosqlite.Connection, lock: asyncio.Lock, owner: str, *,
                 lease_seconds: float = 30.0, clock: Callable[[], float] = time.time) -> None:
        self.db = db
        self.lock = lock
        self.owner = owner
        self.lease_seconds = lease_seconds
        self.clock = clock
        """Unix seconds; tests replace it to expire leases."""

    async def claim(self, limit: int = 100) -> list[Claimed]:
        """Lease the sessions of up to ``limit`` of the oldest open entries not held by others.

        Returns each session newly leased or still held, with all its open
        entries (not only those among the ``limit`` read).
        """
        now = self.clock()
        until = now + self.lease_seconds
        skip = " FOR UPDATE SKIP LOCKED" if dialect_of(self.db) == "postgresql" else ""

        async def body(db: aiosqlite.Connection) -> list[Claimed]:
            rows = await db.execute_fetchall(
                "SELECT id, session_key FROM inbox WHERE state IN ('pending', 'running')"
                f" ORDER BY id LIMIT ?{skip}", (limit,))
            # Leases are locked in key order (here, in renew and in a run's commit,
            # which updates its inbox rows before its lease): no deadlock between replicas.
            sessions = sorted({str(r[1]) for r in rows})
            held: list[Claimed] = []
            for key in sessions:
                won = await db.execute_fetchall(
                    "INSERT INTO session_leases (session_key, owner, expires_at)"
                    " VALUES (?, ?, ?) ON CONFLICT (session_key) DO UPDATE"
                    " SET owner = excluded.owner, expires_at = excluded.expires_at"
                    " WHERE session_leases.expires_at <= ?"
                    " OR session_leases.owner = excluded.owner RETURNING session_key",
                    (key, self.owner, until, now))
                if not won:
                    continue  # another replica holds it and is alive
                ids = await db.execute_fetchall(
                    "SELECT id FROM inbox WHERE session_key = ?"
                    " AND state IN ('pending', 'running') ORDER BY id", (key,))
                held.append(Claimed(key, tuple(int(r[0]) for r in ids)))
            return held

        claimed: list[Claimed] = await transaction(self.db, self.lock, body)
        return claimed

    async def renew(self, keys: Sequence[str]) -> set[str]:
        """Extend this replica's leases on ``keys``; the keys it still held."""
        until = self.clock() + self.lease_seconds
        kept: set[str] = set()

        async def body(db: aiosqlite.Connection) -> None:
            for key in sorted(keys):
                rows = await db.execute_fetchall(
                    "UPDATE session_leases SET expires_at = ?"
                    " WHERE session_key = ? AND owner = ? RETURNING session_key",
                    (until, key, self.owner))
                kept.update(str(r[0]) for r in rows)

        await transaction(self.db, self.lock, body)
        return kept

    async def release(self, key: str) -> tuple[int, ...]:
        """Give up the lease on ``key`` if its entries are all done; else keep it and
        return the open entries (arrived meanwhile), oldest first, to run next.

        The lease row is locked first, so a replica woken by an entry that
        arrives during the release waits for it and then finds the session
        free: an entry is never left with no holder and nobody awake.
        """
        lock_row = " FOR UPDATE" if dialect_of(self.db) == "postgresql" else ""

        async def body(db: aiosqlite.Connection) -> tuple[int, ...]:
            await db.execute_fetchall(
                "SELECT 1 FROM session_leases WHERE session_key = ? AND owner = ?"
                f"{lock_row}", (key, self.owner))
            rows = await db.execute_fetchall(
                "SELECT id FROM inbox WHERE session_key = ? AND state IN ('pending', 'running')"
                " ORDER BY id", (key,))
            if rows:
                return tuple(int(r[0]) for r in rows)
            await db.execute("DELETE FROM session_leases WHERE session_key = ? AND owner = ?",
                             (key, self.owner))
            return ()

        left: tuple[int, ...] = await transaction(self.db, self.lock, body)
        return left

    def fence(self, key: str) -> Statements:
        """Statements for a run's commit: raise :class:`LeaseLost` (rolling the commit
        back) unless this replica still holds ``key``; the lease is extended.

        Put it last in the commit, after the inbox rows are updated: a claim holds
        inbox rows while it waits for leases, so locking the lease first could
        deadlock with it."""
        owner, lease = self.owner, self.lease_seconds
        clock = self.clock

        async def check(db: aiosqlite.Connection) -> None:
            now = clock()
            rows = await db.execute_fetchall(
                "UPDATE session_leases SET expires_at = ? WHERE session_key = ? AND owner = ?"
                " AND expires_at > ? RETURNING session_key", (now + lease, key, owner, now))
            if not rows:
                raise LeaseLost(f"the lease on {key} is no longer held by {owner}")

        return check

    async def holders(self) -> dict[str, str]:
        """Every live lease: session key -> owner (for status and tests)."""
        async with self.lock:
            rows = await self.db.execute_fetchall(
                "SELECT session_key, owner FROM session_leases WHERE expires_at > ?",
                (self.clock(),))
        return {str(r[0]): str(r[1]) for r in rows}


async def notify(db: aiosqlite.Connection, session_key: str) -> None:
    """Announce a new entry of ``session_key`` (PostgreSQL; delivered when the caller's
    transaction commits). Nothing to do on SQLite."""
    if dialect_of(db) == "postgresql":
        await db.execute("SELECT pg_notify(?, ?)", (CHANNEL, session_key))


class Listener:
    """A connection of its own LISTENing on :data:`CHANNEL`; reconnects when it drops."""

    def __init__(self, url: str, on_wake: Callable[[str], Awaitable[None] | None]) -> None:
        self.url = url
        self.on_wake = on_wake
        self.listening = asyncio.Event()
        """Set while the LISTEN is in place (a notification sent before may be missed)."""
        self._task: asyncio.Task[None] | None = None
        self._callbacks: set[asyncio.Future[Any]] = set()

    def start(self) -> None:
        """Begin listening in the background."""
        self._task = asyncio.ensure_future(self._run())

    async def close(self) -> None:
        """Stop listening."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def _deliver(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        result = self.on_wake(payload)
        if asyncio.iscoroutine(result):
            task = asyncio.ensure_future(result)
            self._callbacks.add(task)  # held until done (the loop keeps weak references)
            task.add_done_callback(self._callbacks.discard)

    async def _run(self) -> None:
        import asyncpg  # type: ignore[import-untyped]

        from bot.storage.postgres import CONNECTION_LOST, RECONNECT

        failures = 0
        while True:
            try:
                conn = await asyncpg.connect(self.url)
            except (*CONNECTION_LOST, asyncpg.PostgresError) as exc:
                # Refused, unreachable or (for now) not allowed: keep trying, loudly.
                failures += 1
                log.warning("LISTEN connection failed (%s: %s); retrying", type(exc).__name__,
                            exc)
                await asyncio.sleep(RECONNECT.delay(min(failures, 6)))
                continue
            closed = asyncio.Event()
            try:
                conn.add_termination_listener(lambda _c, closed=closed: closed.set())
                await conn.add_listener(CHANNEL, self._deliver)
                failures = 0
                self.listening.set()
                # Whatever was announced while reconnecting: wake once to claim it.
                self._deliver(conn, 0, CHANNEL, "")
                await closed.wait()
            finally:
                self.listening.clear()
                conn.terminate()  # a LISTEN connection holds nothing to finish


async def listen(db: aiosqlite.Connection,
                 on_wake: Callable[[str], Awaitable[None] | None]) -> Listener | None:
    """Call ``on_wake(session_key)`` whenever any replica records an entry (PostgreSQL);
    ``None`` on SQLite, where the one process knows of its own entries."""
    if dialect_of(db) != "postgresql":
        return None
    listener = Listener(str(getattr(db, "url", "")), on_wake)
    listener.start()
    await listener.listening.wait()
    return listener
