"""One leader among the replicas: a PostgreSQL session-level advisory lock.

What must have exactly one receiver per deployment (Telegram long polling:
two ``getUpdates`` callers make Telegram answer one of them with a conflict;
Slack Socket Mode) runs only while this process leads. Leading means holding
``pg_try_advisory_lock(LEADER_LOCK)`` on a connection of the leader's own,
kept open for as long as it leads:

* **Lost connection = lost leadership.** The server releases a session-level
  lock when its connection ends, so a leader killed with ``kill -9`` (the
  kernel closes its socket) or cut off frees the lock at once. The leader
  pings its connection every ``check_every`` seconds; a ping that fails or does
  not answer within ``check_every`` means it may no longer hold the lock, and
  it stops leading before anyone else can take over (the lock's holder is
  checked with the same period by the others).
* **Take over.** A replica that is not leading tries the lock every
  ``check_every`` seconds (by default a fifth of ``lease_seconds``, at most
  5 s), so a lone replica leads within ``check_every`` of its start and another
  replica takes over within ``check_every`` of the leader's connection ending.

On SQLite there is one process: it is always the leader (:class:`Leader` with
no URL).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
from typing import Any

log = logging.getLogger("roost.storage.leader")

LEADER_LOCK = 0x526F6F7374 + 1
"""The advisory lock key the leader holds (next to the migration lock's)."""


def replica_id() -> str:
    """A name for this process unique across replicas: ``hostname-pid-random``."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


def check_period(lease_seconds: float) -> float:
    """How often a replica checks the lock: a fifth of the lease, between 0.2 and 5 s."""
    return min(5.0, max(0.2, lease_seconds / 5))


class Leader:
    """Whether this process leads the deployment, and events for becoming and ceasing to.

    ``url`` ``None`` (SQLite, one process): leading from the start, forever.
    Otherwise :meth:`start` begins contending for the lock in the background.
    """

    def __init__(self, url: str | None, *, check_every: float = 5.0,
                 key: int = LEADER_LOCK) -> None:
        self.url = url
        self.check_every = check_every
        self.key = key
        self._leading = asyncio.Event()
        self._following = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        if url is None:
            self._leading.set()
        else:
            self._following.set()

    @property
    def is_leader(self) -> bool:
        """Whether this process leads now."""
        return self._leading.is_set()

    async def wait_leading(self) -> None:
        """Return once this process leads."""
        await self._leading.wait()

    async def wait_lost(self) -> None:
        """Return once this process no longer leads (never on SQLite)."""
        await self._following.wait()

    def start(self) -> None:
        """Contend for the lock in the background (nothing to do on SQLite)."""
        if self.url is not None and self._task is None:
            self._task = asyncio.ensure_future(self._run(self.url))

    def shares(self, count: int) -> Leases:
        """Leases on ``count`` numbered shares (Discord's shards) among the same replicas.

        On the same database and with the same period as this election; not started.
        """
        return Leases(self.url, count, check_every=self.check_every)

    async def close(self) -> None:
        """Stop contending; a held lock is released with the connection."""
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self.url is not None:  # on SQLite the one process leads to its end, silently
            self._set(False)

    def _set(self, leading: bool) -> None:
        if leading == self._leading.is_set():
            return
        if leading:
            self._following.clear()
            self._leading.set()
            log.info("this replica is the leader now")
        else:
            self._leading.clear()
            self._following.set()
            if self._closing:
                log.info("leadership released (shutting down)")
            else:
                log.warning("this replica is no longer the leader")

    async def _run(self, url: str) -> None:
        import asyncpg  # type: ignore[import-untyped]

        from bot.storage.postgres import CONNECTION_LOST

        while True:
            conn: Any = None
            try:
                conn = await asyncio.wait_for(asyncpg.connect(url), self.check_every * 2)
                await self._hold(conn)
            except (*CONNECTION_LOST, asyncpg.PostgresError, TimeoutError) as exc:
                log.warning("leader election: %s (%s); trying again", type(exc).__name__, exc)
            except Exception:
                # Never give up contending: a replica that stopped would never take over.
                log.exception("leader election failed unexpectedly; trying again")
            finally:
                self._set(False)
                if conn is not None:
                    conn.terminate()  # ends the session: the server releases the lock
            await asyncio.sleep(self.check_every)

    async def _hold(self, conn: Any) -> None:
        """Try the lock every ``check_every`` seconds; while held, ping the connection."""
        while True:
            won = await asyncio.wait_for(
                conn.fetchval("SELECT pg_try_advisory_lock($1)", self.key), self.check_every)
            if won:
                break
            await asyncio.sleep(self.check_every)
        self._set(True)
        while True:
            await asyncio.sleep(self.check_every)
            # No answer within the period: treat the lock as gone before others can take it.
            await asyncio.wait_for(conn.fetchval("SELECT 1"), self.check_every)


SHARD_LOCKS = 0x526F6F7374 + 0x100
"""Leases on numbered shares (Discord's gateway shards): ``SHARD_LOCKS`` is held shared
by every replica that contends (its presence), ``SHARD_LOCKS + 1 + i`` by share i's holder."""

_CENSUS = """SELECT pid, objid::bigint AS low, mode FROM pg_locks
WHERE locktype = 'advisory' AND granted AND objsubid = 1 AND classid::bigint = $1
  AND objid::bigint BETWEEN $2 AND $3
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"""
"""Who holds what among the share locks (advisory locks are per database)."""


class Leases(Leader):
    """Numbered shares (``0..count-1``) spread over the replicas, one advisory lock each.

    All of a replica's locks live on one connection of its own, as the
    :class:`Leader`'s does: a replica that dies (its connection ends) frees them
    at once and :meth:`close` gives them back at once. Each replica also holds a
    shared *presence* lock, so every replica sees (``pg_locks``) who contends and
    how many shares each holds; every ``check_every`` seconds it

    * takes free shares while it holds no more than the least loaded other
      replica (a lone replica takes them all; one never takes a second share
      while another holds none), and
    * gives back its highest share while it holds two more than the least loaded
      other (a replica that joins gets shares within a few periods).

    Holdings end up differing by at most one. ``url`` ``None`` (SQLite, one
    process): every share is held from the start. :attr:`held` is what this
    replica holds; :meth:`wait_changed` returns when that changes.
    """

    def __init__(self, url: str | None, count: int, *, check_every: float = 5.0,
                 base: int = SHARD_LOCKS) -> None:
        super().__init__(url, check_every=check_every, key=base)
        self.count = count
        self.held: frozenset[int] = frozenset(range(count)) if url is None else frozenset()
        self._changed = asyncio.Event()
        self._balanced = asyncio.Event()
        if url is None:
            self._balanced.set()

    async def wait_balanced(self) -> frozenset[int]:
        """Return :attr:`held` once the first round of taking shares is over."""
        await self._balanced.wait()
        return self.held

    async def wait_changed(self) -> frozenset[int]:
        """Return :attr:`held` once it changed since the last call."""
        await self._changed.wait()
        self._changed.clear()
        return self.held

    def _hold_only(self, held: frozenset[int]) -> None:
        if held != self.held:
            self.held = held
            self._changed.set()

    def _set(self, leading: bool) -> None:
        # "Leading" here is being connected; the shares are what counts.
        if not leading:
            self._hold_only(frozenset())

    async def _hold(self, conn: Any) -> None:
        # Presence: shared, so it never waits (nobody takes this key exclusively).
        await asyncio.wait_for(
            conn.fetchval("SELECT pg_advisory_lock_shared($1)", self.key), self.check_every)
        me = conn.get_server_pid()
        while True:
            # No answer within the period: treat the locks as gone before others take them.
            await asyncio.wait_for(self._balance(conn, me), self.check_every)
            await asyncio.sleep(self.check_every)

    async def _balance(self, conn: Any, me: int) -> None:
        high, low = self.key >> 32, self.key & 0xFFFFFFFF
        rows = await conn.fetch(_CENSUS, high, low, low + self.count)
        load = {r["pid"]: 0 for r in rows if r["low"] == low and r["mode"] == "ShareLock"}
        holders = {r["low"] - low - 1: r["pid"] for r in rows
                   if r["low"] != low and r["mode"] == "ExclusiveLock"}
        for pid in holders.values():
            load[pid] = load.get(pid, 0) + 1
        mine = {share for share, pid in holders.items() if pid == me}
        least = min((n for pid, n in load.items() if pid != me), default=self.count)
        if len(mine) > least + 1:
            share = max(mine)
            await conn.fetchval("SELECT pg_advisory_unlock($1)", self.key + 1 + share)
            mine.discard(share)
            log.info("gave back share %d of %d for another replica to take", share,
                     self.count)
        for share in range(self.count):
            if len(mine) > least:
                break
            if share not in holders and await conn.fetchval(
                    "SELECT pg_try_advisory_lock($1)", self.key + 1 + share):
                mine.add(share)
        self._hold_only(frozenset(mine))
        self._balanced.set()
