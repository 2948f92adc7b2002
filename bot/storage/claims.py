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
* **Lease check.** A run's commit includes :meth:`Claims.lease_check`: it fails (and the
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
  new work without polling. An empty payload means "anything may be free now"
  (a replica handed its work over, :meth:`Claims.hand_over`).
* **Bounded.** A claim reads at most ``limit`` open entries (in id order, through
  a partial index of the open ones, skipping sessions others hold) and at most
  ``per_session`` entries of each session; :attr:`Claimed.complete` says whether
  it saw them all. A backlog costs the claim what it returns, not its size.
* **Replies of the dead.** Each replica renews a heartbeat row (``replicas``)
  with its leases. A reply is its committer's to send (``outbox.owner``);
  :meth:`Claims.take_replies` moves pending replies of replicas whose heartbeat
  expired to the caller: rows read ``FOR UPDATE SKIP LOCKED``, then an ``UPDATE``
  that checks the owner again, so two live replicas never both take one. A taken reply whose send
  was under way when its owner died (``sending``) is not sent again unless it
  replaces a draft (editing is idempotent): it may have been shown, and at most
  once wins.

Lease times are the replicas' clocks (Unix seconds): keep them in sync (NTP);
skew eats into the lease. On SQLite (one process) the same calls work: the
``BEGIN IMMEDIATE`` transaction serializes claims and ``listen`` is a no-op.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiosqlite

from bot.storage.db import Statements, dialect_of, transaction

log = logging.getLogger("roost.storage.claims")

CHANNEL = "roost_inbox"
"""The NOTIFY channel new inbox entries are announced on (payload: the session key)."""
PER_SESSION = 50
"""Open entries of one session a claim or a release returns at most (the rest later)."""
APPLICATION_NAME_BYTES = 63
"""PostgreSQL cuts ``application_name`` (and every identifier) to this many bytes."""
REPLICA_ID_MAX = APPLICATION_NAME_BYTES - len("roost-control:")
"""The longest replica id that survives as ``roost-control:<id>`` (bot.storage.control
counts the live replicas by that name and must find its own unchanged)."""


class LeaseLost(RuntimeError):
    """This replica's lease on a session expired and someone else may hold it now."""


@dataclass(frozen=True, slots=True)
class Claimed:
    """A session this replica now holds, and its open inbox entries, oldest first."""

    session_key: str
    entry_ids: tuple[int, ...]
    complete: bool = True
    """Whether ``entry_ids`` are all its open entries (else the first ``per_session``)."""
    taken_from: str | None = None
    """The replica whose expired lease this claim took over, if any."""


@dataclass(frozen=True, slots=True)
class TakenReply:
    """A pending reply of a dead replica, now this replica's (:meth:`Claims.take_replies`)."""

    id: int
    message: str
    """The reply as :func:`bot.storage.inbox.encode_outbound` wrote it."""
    draft_id: str | None
    attempts: int
    send: bool
    """``False``: its owner died while sending it and it replaces no draft, so it is
    not sent again (marked ``failed``)."""


def fit_replica_id(name: str) -> str:
    """``name`` as a replica id PostgreSQL keeps whole: printable ASCII, at most
    :data:`REPLICA_ID_MAX` characters.

    A long host name is cut in the middle (its start and end stay readable, a
    pod name's unique suffix included); the ``-pid-random`` tail of
    :func:`bot.storage.leader.replica_id` is kept whole, so ids stay unique.
    """
    clean = re.sub(r"[^A-Za-z0-9._:-]", "_", name)
    if len(clean) <= REPLICA_ID_MAX:
        return clean
    host, _, tail = clean.rpartition("-")
    host, _, pid = host.rpartition("-")
    if not host or len(pid) + len(tail) + 2 > REPLICA_ID_MAX // 2:
        host, tail = clean, ""  # not hostname-pid-random: cut the whole
    else:
        tail = f"-{pid}-{tail}"
    mark = hashlib.sha256(host.encode()).hexdigest()[:4]
    room = REPLICA_ID_MAX - len(tail) - len(mark) - 2
    head, end = host[: room - room // 2], host[len(host) - room // 2:]
    return f"{head}~{mark}~{end}{tail}"[:REPLICA_ID_MAX]


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
        self.live = 1
        """Replicas whose heartbeat had not expired at the last :meth:`renew`, this one
        included (at least 1)."""

    async def claim(self, limit: int = 100, per_session: int = PER_SESSION,
                    mine: Sequence[str] = ()) -> list[Claimed]:
        """Lease the sessions of up to ``limit`` of the oldest open entries nobody holds
        (or whose lease expired), and renew ``mine`` (sessions this replica holds and
        wants the open entries of).

        Returns each session newly leased or still held, with its open entries
        (up to ``per_session`` of them, oldest first; not only those among the
        ``limit`` read). Entries of held sessions, this replica's included, are
        skipped in the read, so a backlog never crowds out free work.
        """
        now = self.clock()
        until = now + self.lease_seconds
        skip = " FOR UPDATE OF i SKIP LOCKED" if dialect_of(self.db) == "postgresql" else ""

        async def body(db: aiosqlite.Connection) -> list[Claimed]:
            rows = await db.execute_fetchall(
                "SELECT i.id, i.session_key, l.owner FROM inbox i"
                " LEFT JOIN session_leases l ON l.session_key = i.session_key"
                " WHERE i.state IN ('pending', 'running')"
                " AND (l.owner IS NULL OR l.expires_at <= ?)"
                f" ORDER BY i.id LIMIT ?{skip}", (now, limit))
            before: dict[str, str | None] = dict.fromkeys(mine)
            before.update((str(r[1]), None if r[2] in (None, self.owner) else str(r[2]))
                          for r in rows)
            # Leases are locked in key order (here, in renew and in a run's commit,
            # which updates its inbox rows before its lease): no deadlock between replicas.
            held: list[Claimed] = []
            for key in sorted(before):
                won = await db.execute_fetchall(
                    "INSERT INTO session_leases (session_key, owner, expires_at)"
                    " VALUES (?, ?, ?) ON CONFLICT (session_key) DO UPDATE"
                    " SET owner = excluded.owner, expires_at = excluded.expires_at"
                    " WHERE session_leases.expires_at <= ?"
                    " OR session_leases.owner = excluded.owner RETURNING session_key",
                    (key, self.owner, until, now))
                if not won:
                    continue  # another replica took it since the read, and is alive
                ids = await _open_ids(db, key, per_session + 1)
                held.append(Claimed(key, ids[:per_session], len(ids) <= per_session,
                                    before[key]))
            return held

        claimed: list[Claimed] = await transaction(self.db, self.lock, body)
        return claimed

    async def renew(self, keys: Sequence[str]) -> set[str]:
        """Extend this replica's heartbeat and its leases on ``keys``; the keys it still held.

        Also counts the live replicas (:attr:`live`)."""
        now = self.clock()
        until = now + self.lease_seconds
        kept: set[str] = set()

        async def body(db: aiosqlite.Connection) -> int:
            await db.execute(
                "INSERT INTO replicas (id, started_at, expires_at) VALUES (?, ?, ?)"
                " ON CONFLICT (id) DO UPDATE SET expires_at = excluded.expires_at",
                (self.owner, now, until))
            for key in sorted(keys):
                rows = await db.execute_fetchall(
                    "UPDATE session_leases SET expires_at = ?"
                    " WHERE session_key = ? AND owner = ? RETURNING session_key",
                    (until, key, self.owner))
                kept.update(str(r[0]) for r in rows)
            # Counted with the heartbeat (no round trip of its own): bot-wide send limits
            # are divided among the live replicas (Channel.replicas).
            async with db.execute("SELECT count(*) FROM replicas WHERE expires_at > ?",
                                  (now,)) as cursor:
                row = await cursor.fetchone()
            return max(1, int(row[0]) if row is not None else 1)

        self.live = await transaction(self.db, self.lock, body)
        return kept

    async def open_before(self, key: str, entry_id: int,
                          limit: int = PER_SESSION) -> tuple[int, ...]:
        """The open entries of session ``key`` older than ``entry_id`` (at most ``limit``,
        oldest first): what must run before it, whichever replica recorded them."""
        async with self.lock:
            rows = await self.db.execute_fetchall(
                "SELECT id FROM inbox WHERE session_key = ? AND state IN ('pending', 'running')"
                " AND id < ? ORDER BY id LIMIT ?", (key, entry_id, limit))
        return tuple(int(r[0]) for r in rows)

    async def release(self, key: str, per_session: int = PER_SESSION) -> tuple[int, ...]:
        """Give up the lease on ``key`` if its entries are all done; else keep it and
        return the open entries (arrived meanwhile; at most ``per_session``), oldest
        first, to run next.

        The lease row is locked first, so a replica woken by an entry that
        arrives during the release waits for it and then finds the session
        free: an entry is never left with no holder and nobody awake.
        """
        lock_row = " FOR UPDATE" if dialect_of(self.db) == "postgresql" else ""

        async def body(db: aiosqlite.Connection) -> tuple[int, ...]:
            await db.execute_fetchall(
                "SELECT 1 FROM session_leases WHERE session_key = ? AND owner = ?"
                f"{lock_row}", (key, self.owner))
            ids = await _open_ids(db, key, per_session)
            if ids:
                return ids
            await db.execute("DELETE FROM session_leases WHERE session_key = ? AND owner = ?",
                             (key, self.owner))
            return ()

        left: tuple[int, ...] = await transaction(self.db, self.lock, body)
        return left

    async def hand_over(self) -> int:
        """Give up every lease and the heartbeat of this replica (it stops), and wake the
        others: its sessions and its pending replies are theirs at once, not after
        the lease. Returns how many leases were released."""

        async def body(db: aiosqlite.Connection) -> int:
            cur = await db.execute("DELETE FROM session_leases WHERE owner = ?", (self.owner,))
            await db.execute("DELETE FROM replicas WHERE id = ?", (self.owner,))
            await notify(db, "")
            return int(cur.rowcount)

        released: int = await transaction(self.db, self.lock, body)
        return released

    async def take_replies(self, limit: int = 50) -> list[TakenReply]:
        """Take over up to ``limit`` pending replies, oldest first, whose owner is dead
        (its heartbeat expired or is gone) or unknown (written by a single process).

        Each reply is taken by one replica only: the rows are read ``FOR UPDATE SKIP
        LOCKED`` and moved to this owner in the same transaction. Replies to send are
        left unmarked (this replica marks each just before it sends it, see
        :meth:`bot.storage.inbox.Inbox.sending`); those not to be sent again
        (see :class:`TakenReply`) are marked ``failed``. Heartbeats expired for a
        whole lease are deleted on the way.
        """
        now = self.clock()
        skip = " FOR UPDATE SKIP LOCKED" if dialect_of(self.db) == "postgresql" else ""

        async def body(db: aiosqlite.Connection) -> list[TakenReply]:
            await db.execute("DELETE FROM replicas WHERE expires_at < ?",
                             (now - self.lease_seconds,))
            dead = ("NOT EXISTS (SELECT 1 FROM replicas r WHERE r.id = o.owner"
                    " AND r.expires_at > ?)")
            rows = await db.execute_fetchall(
                f"SELECT o.id FROM outbox o WHERE o.state = 'pending' AND {dead}"
                f" ORDER BY o.id LIMIT ?{skip}", (now, limit))
            if not rows:
                return []
            # Locked now; checked again in a statement of its own, which sees a take
            # another replica committed between the read and the lock.
            ids = [int(r[0]) for r in rows]
            again = "sending = 0 OR owner IS NULL OR draft_id IS NOT NULL"
            taken = await db.execute_fetchall(
                f"UPDATE outbox AS o SET owner = ?, updated_at = ?,"
                f" state = CASE WHEN {again} THEN 'pending' ELSE 'failed' END,"
                f" sending = 0"
                f" WHERE o.id IN ({', '.join('?' * len(ids))}) AND o.state = 'pending'"
                f" AND {dead} RETURNING id, message, draft_id, attempts, state",
                (self.owner, now, *ids, now))
            # Sent again: never attempted, or a draft to replace. Else at most once wins.
            return [TakenReply(int(r[0]), str(r[1]), r[2], int(r[3]), r[4] == "pending")
                    for r in sorted(taken, key=lambda r: int(r[0]))]

        replies: list[TakenReply] = await transaction(self.db, self.lock, body)
        return replies

    def lease_check(self, key: str) -> Statements:
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


async def _open_ids(db: aiosqlite.Connection, key: str, limit: int) -> tuple[int, ...]:
    """The first ``limit`` open entries of session ``key`` (index ``inbox_open_session``)."""
    rows = await db.execute_fetchall(
        "SELECT id FROM inbox WHERE session_key = ? AND state IN ('pending', 'running')"
        " ORDER BY id LIMIT ?", (key, limit))
    return tuple(int(r[0]) for r in rows)


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
