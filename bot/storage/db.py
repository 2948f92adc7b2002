"""The database: connection settings, applying the schema steps, and the one way to write.

Two backends behind one API: SQLite (aiosqlite, the default: ``sqlite:///path``
or a path) and PostgreSQL (``postgresql://...``, :mod:`bot.storage.postgres`,
whose :class:`~bot.storage.postgres.PgConnection` offers the aiosqlite
connection API the stores use over a pool). :func:`connect` picks one by URL;
:func:`dialect_of` tells a store which it got where their SQL differs.

On SQLite every coroutine shares one connection. Writes that span statements go through
:func:`transaction` (or a :class:`Writer`, which batches them): the transaction
runs in a task of its own under the connection's lock, so cancelling the
caller at any await (``/stop``, a merge, shutdown) can neither leave a
transaction open nor nest one; a failed statement rolls back before the lock
is released.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

import aiosqlite

from bot.storage.schema import MIGRATIONS, POSTGRES_STEPS, RETIRED_COLUMNS

if TYPE_CHECKING:
    from bot.storage.postgres import PgConnection

log = logging.getLogger("roost.storage.db")

Dialect = Literal["sqlite", "postgresql"]

T = TypeVar("T")

DROP_COLUMN_VERSION = (3, 35, 0)
"""The first SQLite with ``ALTER TABLE ... DROP COLUMN``; older ones keep the columns."""


def dialect_of(db: object) -> Dialect:
    """Which backend a connection the stores were given talks to."""
    return "postgresql" if getattr(db, "dialect", "sqlite") == "postgresql" else "sqlite"


def is_postgres_url(target: Path | str) -> bool:
    """Whether ``target`` names a PostgreSQL database (``postgresql://`` or ``postgres://``)."""
    return isinstance(target, str) and target.startswith(("postgresql://", "postgres://"))


def sqlite_path(target: Path | str) -> Path:
    """The file of an SQLite target: a path, or a ``sqlite:///path`` URL."""
    if isinstance(target, Path):
        return target
    if target.startswith("sqlite:///"):
        # As SQLAlchemy: sqlite:///data/roost.db is relative, sqlite:////srv/roost.db absolute.
        return Path(target.removeprefix("sqlite:///"))
    if "://" in target:
        raise ValueError(f"unsupported database URL scheme: {target.split('://', 1)[0]}:// "
                         "(use sqlite:///path or postgresql://...)")
    return Path(target)


async def connect(target: Path | str, pool_size: int = 10,
                  connect_attempts: int = 6) -> aiosqlite.Connection:
    """Open the database (creating an SQLite file), and migrate it.

    ``target``: a path or ``sqlite:///path`` (one connection, tuned for one
    writer), or a ``postgresql://`` URL (a pool of up to ``pool_size``
    connections, :mod:`bot.storage.postgres`, its first connection tried up to
    ``connect_attempts`` times while refused). The PostgreSQL connection offers
    the aiosqlite API the stores use, so it is typed as one here.
    """
    if is_postgres_url(target):
        return cast(aiosqlite.Connection, await connect_postgres(str(target), pool_size,
                                                                connect_attempts))
    path = sqlite_path(target)
    path.parent.mkdir(parents=True, exist_ok=True)
    # isolation_level=None: Roost issues BEGIN/COMMIT itself so a run's flush is
    # exactly one transaction.
    db = await aiosqlite.connect(path, isolation_level=None)
    try:
        await db.execute("PRAGMA journal_mode=WAL")
        await db.execute("PRAGMA synchronous=NORMAL")
        # Checkpoint the WAL every ~16 MB instead of ~4 MB: fewer stalls on the write
        # path (error and session flushes) for a WAL file that stays small on disk.
        await db.execute("PRAGMA wal_autocheckpoint=4000")
        await db.execute("PRAGMA foreign_keys=ON")
        await db.execute("PRAGMA busy_timeout=5000")
        await migrate(db)
    except BaseException:
        await db.close()
        raise
    return db


async def connect_postgres(url: str, pool_size: int = 10,
                           connect_attempts: int = 6) -> PgConnection:
    """A pool on the PostgreSQL database at ``url``, migrated (the first connection
    tried up to ``connect_attempts`` times while refused)."""
    try:
        from bot.storage.postgres import PgConnection
    except ImportError as exc:
        raise RuntimeError("a postgresql:// database needs asyncpg: "
                           "pip install 'roost[postgres]'") from exc
    db = await PgConnection.open(url, pool_size, connect_attempts)
    try:
        await migrate(cast(aiosqlite.Connection, db))
    except BaseException:
        await db.close()
        raise
    return db


MIGRATION_LOCK = 0x526F6F7374
"""The advisory lock key ('Roost') held while PostgreSQL migrates: replicas starting
together apply each step once, in turn."""


def postgres_step(number: int) -> str:
    """Schema step ``number`` (1-based) in PostgreSQL's dialect."""
    from bot.storage.pg_dialect import postgres_ddl

    text = POSTGRES_STEPS.get(number)
    return text if text is not None else postgres_ddl(MIGRATIONS[number - 1])


async def schema_version(db: aiosqlite.Connection) -> int:
    """How many migration steps this database has applied."""
    if dialect_of(db) == "postgresql":
        async with db.execute("SELECT to_regclass('roost_schema') IS NOT NULL") as cur:
            exists = await cur.fetchone()
        if not exists or not exists[0]:
            return 0
        async with db.execute("SELECT version FROM roost_schema") as cur:
            row = await cur.fetchone()
        return int(row[0]) if row else 0
    async with db.execute("PRAGMA user_version") as cur:
        row = await cur.fetchone()
    return int(row[0]) if row else 0


async def migrate(db: aiosqlite.Connection) -> None:
    """Apply the steps this database has not seen, each in its own transaction.

    On PostgreSQL every pending step runs in one transaction holding
    :data:`MIGRATION_LOCK`, so of two replicas starting together one migrates
    and the other then finds nothing left to do.
    """
    if dialect_of(db) == "postgresql":
        await _migrate_postgres(cast("PgConnection", db))
        return
    current = await schema_version(db)
    if current > len(MIGRATIONS):
        raise RuntimeError(
            f"database schema version {current} is newer than this Roost "
            f"({len(MIGRATIONS)}); upgrade Roost"
        )
    for number, script in enumerate(MIGRATIONS[current:], start=current + 1):
        # user_version cannot be bound as a parameter; number is our own int.
        await db.executescript(f"BEGIN;\n{script}\nPRAGMA user_version = {number:d};\nCOMMIT;")


async def _migrate_postgres(db: PgConnection) -> None:
    from bot.storage.postgres import transaction as pg_transaction

    async def body(tx: PgConnection) -> None:
        await tx.execute("SELECT pg_advisory_xact_lock(?)", (MIGRATION_LOCK,))
        await tx.execute("CREATE TABLE IF NOT EXISTS roost_schema (version BIGINT NOT NULL)")
        async with tx.execute("SELECT version FROM roost_schema") as cur:
            row = await cur.fetchone()
        if row is None:
            await tx.execute("INSERT INTO roost_schema (version) VALUES (0)")
        current = int(row[0]) if row else 0
        if current > len(MIGRATIONS):
            raise RuntimeError(
                f"database schema version {current} is newer than this Roost "
                f"({len(MIGRATIONS)}); upgrade Roost"
            )
        for number in range(current + 1, len(MIGRATIONS) + 1):
            await tx.executescript(postgres_step(number))
        if current < len(MIGRATIONS):
            await tx.execute("UPDATE roost_schema SET version = ?", (len(MIGRATIONS),))

    await pg_transaction(db, body)


async def retire_columns(db: aiosqlite.Connection, lock: asyncio.Lock,
                         retired: Sequence[tuple[str, str]] = RETIRED_COLUMNS) -> list[str]:
    """Drop the ``retired`` columns still present, in one transaction; returns them.

    Call it once the plugins' migrations have run. On an SQLite without
    ``DROP COLUMN`` the columns stay, unused (their defaults fill new rows). The
    drop is logged only when a table holding them has rows: a brand-new database's
    steps made them a moment ago, and it never had anything in them to retire.
    """
    if dialect_of(db) == "postgresql" or sqlite3.sqlite_version_info < DROP_COLUMN_VERSION:
        return []  # PostgreSQL databases never had them (see POSTGRES_STEPS)
    present: list[tuple[str, str]] = []
    for table, column in retired:
        async with lock, db.execute(
            "SELECT 1 FROM pragma_table_info(?) WHERE name = ?", (table, column),
        ) as cur:
            if await cur.fetchone() is not None:
                present.append((table, column))
    if not present:
        return []
    held_rows = False
    for table in sorted({table for table, _ in present}):
        async with lock, db.execute(f'SELECT EXISTS (SELECT 1 FROM "{table}")') as cur:
            row = await cur.fetchone()
        held_rows = held_rows or bool(row and row[0])

    async def body(db: aiosqlite.Connection) -> None:
        for table, column in present:
            # Identifiers cannot be bound; these are our own constants, quoted.
            await db.execute(f'ALTER TABLE "{table}" DROP COLUMN "{column}"')

    try:
        await transaction(db, lock, body)
    except sqlite3.Error:
        # Unused columns cost nothing: keep them rather than refuse to start.
        log.exception("could not drop retired columns; they stay, unused")
        return []
    dropped = [f"{table}.{column}" for table, column in present]
    if held_rows:
        log.info("dropped retired columns: %s", ", ".join(dropped))
    return dropped


_IN_FLIGHT: set[asyncio.Task[Any]] = set()


async def transaction(db: aiosqlite.Connection, lock: asyncio.Lock,
                      body: Callable[[aiosqlite.Connection], Awaitable[T]]) -> T:
    """Run ``body(db)`` inside ``BEGIN IMMEDIATE`` … ``COMMIT`` under ``lock``.

    The transaction runs in its own task and the caller awaits it shielded:
    cancelling the caller leaves the transaction to finish (commit, or roll
    back on error) before the lock is released, so the shared connection is
    never left inside a transaction. The caller must not hold ``lock``.

    On PostgreSQL the body runs on a pooled connection of its own (still under
    ``lock``, so a process orders its writes as on SQLite), and a transaction
    whose connection was lost before its commit is run again.
    """
    if dialect_of(db) == "postgresql":
        return await _postgres_transaction(db, lock, body)

    async def run() -> T:
        async with lock:
            if db.in_transaction:
                # Someone broke the discipline; never let it wedge everyone else.
                log.error("a transaction was left open on the shared connection; rolled back")
                await db.execute("ROLLBACK")
            await db.execute("BEGIN IMMEDIATE")
            try:
                result = await body(db)
                await db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    await db.execute("ROLLBACK")
                raise
            return result

    task = asyncio.ensure_future(run())
    _IN_FLIGHT.add(task)
    task.add_done_callback(_finished)
    return await asyncio.shield(task)


async def _postgres_transaction(db: aiosqlite.Connection, lock: asyncio.Lock,
                                body: Callable[[aiosqlite.Connection], Awaitable[T]]) -> T:
    from bot.storage.postgres import transaction as pg_transaction

    async def run() -> T:
        async with lock:
            return await pg_transaction(cast("PgConnection", db),
                                        cast(Callable[["PgConnection"], Awaitable[T]], body))

    task = asyncio.ensure_future(run())
    _IN_FLIGHT.add(task)
    task.add_done_callback(_finished)
    return await asyncio.shield(task)


def _finished(task: asyncio.Task[Any]) -> None:
    _IN_FLIGHT.discard(task)
    if not task.cancelled():
        task.exception()  # retrieved: the caller that wanted it may be gone


async def wait_detached_writes() -> None:
    """Wait for transactions whose callers were cancelled (before closing a connection)."""
    while _IN_FLIGHT:
        await asyncio.gather(*list(_IN_FLIGHT), return_exceptions=True)


Statements = Callable[[aiosqlite.Connection], Awaitable[Any]]


@dataclass(slots=True)
class _Op:
    body: Statements
    after: Callable[[], None] | None
    done: asyncio.Future[Any] | None
    what: str


@dataclass(slots=True)
class Writer:
    """Group commit over one connection.

    Writes queued while a transaction commits go together into the next one,
    so a busy service pays one commit for many writes; each write is still
    all-or-nothing (a batch that fails is written again one by one). ``after``
    runs once a write committed (mirror it into caches there).
    """

    db: aiosqlite.Connection
    lock: asyncio.Lock
    _queue: list[_Op] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None

    async def write(self, body: Statements, *, after: Callable[[], None] | None = None,
                    what: str = "a write") -> Any:
        """Queue ``body`` and wait until it committed; its result is returned.

        Once queued the write completes even if the caller is cancelled.
        """
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._push(_Op(body, after, done, what))
        return await asyncio.shield(done)

    def write_later(self, body: Statements, *, after: Callable[[], None] | None = None,
                    what: str = "a write") -> None:
        """Queue ``body`` without waiting; a failure is logged."""
        self._push(_Op(body, after, None, what))

    async def close(self) -> None:
        """Wait for every queued write."""
        while self._task is not None and not self._task.done():
            await asyncio.shield(self._task)
        await wait_detached_writes()

    def _push(self, op: _Op) -> None:
        self._queue.append(op)
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._drain())

    async def _drain(self) -> None:
        while self._queue:
            batch, self._queue = self._queue, []
            await self._commit(batch)

    async def _commit(self, batch: list[_Op]) -> None:
        results: list[Any] = []

        async def body(db: aiosqlite.Connection) -> None:
            results.clear()
            for op in batch:
                results.append(await op.body(db))

        try:
            await transaction(self.db, self.lock, body)
        except Exception as exc:
            if len(batch) > 1:
                # One bad write must not sink the others: write them one by one.
                for op in batch:
                    await self._commit([op])
                return
            op = batch[0]
            if op.done is None:
                log.error("%s failed: %s", op.what, exc)
            elif not op.done.done():
                op.done.set_exception(exc)
                op.done.exception()  # retrieved: its caller may be gone
            return
        for op, result in zip(batch, results, strict=True):
            if op.after is not None:
                try:
                    op.after()
                except Exception:
                    log.exception("after %s", op.what)
            if op.done is not None and not op.done.done():
                op.done.set_result(result)
