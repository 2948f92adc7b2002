"""The PostgreSQL backend: an asyncpg pool behind the connection API the stores use.

Roost's stores are written against one SQLite connection (``db.execute(sql,
params)`` giving a cursor with ``fetchone``/``fetchall``/``rowcount``/
``lastrowid``, ``executemany``, ``execute_fetchall``). :class:`PgConnection`
offers exactly that API over a pool, so every store runs unchanged on either
backend, and the SQL is written once:

* ``?`` placeholders become ``$1``, ``$2``... (outside string literals);
* ``INSERT OR IGNORE`` becomes ``INSERT ... ON CONFLICT DO NOTHING`` and
  ``INSERT OR REPLACE`` an upsert on the table's primary key (read from the
  catalog once per table);
* an ``INSERT`` into a table with an identity column returns that id, as
  SQLite's ``lastrowid`` does;
* a parameter whose Python type does not fit the column (an ``int`` bound to
  a ``text`` column, which SQLite stores as given) is converted to the type
  the server expects.

Where the dialects really differ (FTS, JSON functions, the catalog) the
stores ask :func:`bot.storage.db.dialect_of` and give each its own SQL.

Schema steps are SQLite DDL translated by
:func:`bot.storage.pg_dialect.postgres_ddl` (``REAL`` is ``DOUBLE PRECISION``,
``INTEGER`` is ``BIGINT``, an ``INTEGER PRIMARY KEY`` an identity column) unless a
step gives PostgreSQL text of its own. The translations live in
:mod:`bot.storage.pg_dialect`.

Outside a transaction each statement takes a pooled connection and commits
on its own. A statement or a transaction that fails because the connection
was lost (server restart, fail-over, network cut) before anything was
committed is tried again on a fresh connection with backoff
(:data:`RECONNECT`); only then does the error reach the caller.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, TypeVar

import asyncpg  # type: ignore[import-untyped]

from bot.resilience.retry import RetryPolicy
from bot.storage.pg_dialect import (
    Table,
    coerce,
    returns_rows,
    row_count,
    text_safe,
    translate,
)

log = logging.getLogger("roost.storage.postgres")

T = TypeVar("T")

RECONNECT = RetryPolicy(attempts=6, base_delay=0.2, max_delay=5.0, jitter=0.2)
"""Retries of a statement or transaction whose connection was lost (about 10 s in all)."""

CONNECTION_LOST: tuple[type[BaseException], ...] = (
    OSError,
    asyncpg.exceptions.ConnectionDoesNotExistError,
    asyncpg.exceptions.PostgresConnectionError,
    asyncpg.exceptions.CannotConnectNowError,
    asyncpg.exceptions.AdminShutdownError,
    asyncpg.exceptions.ConnectionFailureError,
    asyncpg.exceptions.InterfaceError,
    # A connection the server ended between two statements can fail the next one
    # with a protocol-state error before asyncpg notices it is gone.
    asyncpg.exceptions.InternalClientError,
)
"""What a lost or refused connection raises (not a failed statement)."""

class PgCursor:
    """The result of one statement, shaped like an sqlite3/aiosqlite cursor."""

    def __init__(self, rows: list[Any], rowcount: int, lastrowid: int | None) -> None:
        self._rows = rows
        self._next = 0
        self.rowcount = rowcount
        self.lastrowid = lastrowid

    async def fetchone(self) -> Any:
        """The next row, or ``None``."""
        if self._next >= len(self._rows):
            return None
        self._next += 1
        return self._rows[self._next - 1]

    async def fetchall(self) -> list[Any]:
        """The rows not fetched yet."""
        rows, self._next = self._rows[self._next:], len(self._rows)
        return rows

    async def close(self) -> None:
        """Nothing to release: the rows were fetched with the statement."""

    async def __aenter__(self) -> PgCursor:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None


class _Pending:
    """``db.execute(...)``: awaitable, or used as ``async with db.execute(...) as cur``."""

    __slots__ = ("_coro", "_cursor")

    def __init__(self, coro: Awaitable[PgCursor]) -> None:
        self._coro = coro
        self._cursor: PgCursor | None = None

    def __await__(self) -> Any:
        return self._coro.__await__()

    async def __aenter__(self) -> PgCursor:
        self._cursor = await self._coro
        return self._cursor

    async def __aexit__(self, *exc: object) -> None:
        return None


class PgConnection:
    """The aiosqlite-shaped API over a pool (or, inside a transaction, one connection).

    ``dialect`` is ``"postgresql"`` (:func:`bot.storage.db.dialect_of`).
    """

    dialect = "postgresql"

    def __init__(self, pool: asyncpg.Pool, conn: asyncpg.Connection | None = None, *,
                 catalog: dict[str, Table] | None = None,
                 coerced: set[str] | None = None,
                 translated: dict[str, tuple[str, bool]] | None = None, url: str = "") -> None:
        self.pool = pool
        self._conn = conn
        self._catalog: dict[str, Table] = {} if catalog is None else catalog
        self._coerced: set[str] = set() if coerced is None else coerced
        self._translated: dict[str, tuple[str, bool]] = {} if translated is None else translated
        self.url = url
        """The database's URL (for a connection of its own: LISTEN)."""

    @classmethod
    async def open(cls, url: str, pool_size: int = 10,
                   connect_attempts: int = RECONNECT.attempts) -> PgConnection:
        """A pool of up to ``pool_size`` connections to ``url`` (tried up to
        ``connect_attempts`` times while refused)."""
        async def connect() -> asyncpg.Pool:
            return await asyncpg.create_pool(url, min_size=1, max_size=max(1, pool_size),
                                             command_timeout=60)
        return cls(await with_reconnect(connect, "connecting to PostgreSQL",
                                        attempts=connect_attempts), url=url)

    def bound(self, conn: asyncpg.Connection) -> PgConnection:
        """This API on one connection (a transaction's), sharing the catalog cache."""
        return PgConnection(self.pool, conn, catalog=self._catalog, coerced=self._coerced,
                            translated=self._translated, url=self.url)

    @property
    def in_transaction(self) -> bool:
        """Whether this is a transaction's connection that is inside it."""
        return self._conn is not None and bool(self._conn.is_in_transaction())

    async def close(self) -> None:
        """Close the pool (a transaction's view closes nothing)."""
        if self._conn is None:
            await self.pool.close()

    async def commit(self) -> None:
        """Nothing to do: statements outside a transaction commit on their own."""

    # -- statements --------------------------------------------------------------

    def execute(self, sql: str, parameters: Sequence[Any] = ()) -> _Pending:
        """Run one statement; await the cursor or use it with ``async with``."""
        return _Pending(self._statement(sql, text_safe(parameters)))

    async def execute_fetchall(self, sql: str, parameters: Sequence[Any] = ()) -> list[Any]:
        """Run one statement and return all its rows."""
        cur = await self._statement(sql, text_safe(parameters))
        return await cur.fetchall()

    async def executemany(self, sql: str, seq: Iterable[Sequence[Any]]) -> PgCursor:
        """Run one statement for each parameter tuple (one round trip, pipelined)."""
        rows = [text_safe(p) for p in seq]
        if not rows:
            return PgCursor([], 0, None)
        text, _ = await self._translate(sql, want_id=False)

        async def run(conn: asyncpg.Connection) -> PgCursor:
            if text in self._coerced:
                stmt = await conn.prepare(text)
                types = stmt.get_parameters()
                rows[:] = [coerce(r, types) for r in rows]
            try:
                await conn.executemany(text, rows)
            except asyncpg.exceptions.DataError:
                if text in self._coerced:
                    raise
                self._coerced.add(text)
                return await run(conn)
            return PgCursor([], len(rows), None)

        return await self._on_connection(run)

    async def executescript(self, script: str) -> None:
        """Run several statements without parameters (schema steps)."""
        await self._on_connection(lambda conn: conn.execute(script))

    async def _statement(self, sql: str, params: tuple[Any, ...]) -> PgCursor:
        text, want_id = await self._translate(sql, want_id=True)
        gives_rows = returns_rows(text)

        async def run(conn: asyncpg.Connection) -> PgCursor:
            args = params
            if text in self._coerced:
                stmt = await conn.prepare(text)
                args = coerce(params, stmt.get_parameters())
            try:
                if gives_rows:
                    rows = await conn.fetch(text, *args)
                    lastrowid = rows[-1][0] if want_id and rows else None
                    return PgCursor(rows, len(rows), lastrowid)
                status = await conn.execute(text, *args)
            except asyncpg.exceptions.DataError as exc:
                if text in self._coerced or "invalid input for query argument" not in str(exc):
                    raise
                self._coerced.add(text)  # from now on bound by the server's types
                return await run(conn)
            return PgCursor([], row_count(status), None)

        return await self._on_connection(run)

    async def _on_connection(self, run: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        async def mapped(conn: asyncpg.Connection) -> T:
            try:
                return await run(conn)
            except asyncpg.PostgresError as exc:
                error = as_sqlite_error(exc)
                if error is exc:
                    raise
                raise error from exc

        if self._conn is not None:
            return await mapped(self._conn)  # a transaction retries as a whole

        async def pooled() -> T:
            async with self.pool.acquire() as conn:
                try:
                    return await mapped(conn)
                except CONNECTION_LOST:
                    conn.terminate()  # never handed out again; the pool opens a new one
                    raise

        return await with_reconnect(pooled, "a statement")

    # -- translation -------------------------------------------------------------

    async def _translate(self, sql: str, *, want_id: bool) -> tuple[str, bool]:
        """``sql`` in PostgreSQL's dialect, and whether its first column is a new row id."""
        key = sql if want_id else "\0" + sql
        done = self._translated.get(key)
        if done is not None:
            return done
        done = await translate(sql, want_id=want_id, table=self._table)
        self._translated[key] = done
        return done

    async def _table(self, name: str) -> Table:
        table = self._catalog.get(name)
        if table is not None:
            return table
        rows = await self._on_connection(lambda conn: conn.fetch(
            "SELECT a.attname, a.attidentity <> '' OR pg_get_expr(d.adbin, d.adrelid)"
            " LIKE 'nextval(%' AS generated,"
            " COALESCE(a.attnum = ANY(i.indkey), false) AS key"
            " FROM pg_attribute a"
            " LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum"
            " LEFT JOIN pg_index i ON i.indrelid = a.attrelid AND i.indisprimary"
            " WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped"
            " ORDER BY a.attnum", name))
        columns = [str(r[0]) for r in rows]
        key = [str(r[0]) for r in rows if r[2]]
        identity = next((str(r[0]) for r in rows if r[1]), None)
        table = self._catalog[name] = Table(columns, key, identity)
        return table


def as_sqlite_error(exc: BaseException) -> BaseException:
    """A server error as the sqlite3 exception the stores already handle.

    The stores (and their callers) catch ``sqlite3.IntegrityError`` for a
    taken id and ``sqlite3.Error`` for a failed statement; a PostgreSQL
    constraint violation or statement error reaches them as the same class,
    with the original chained. A primary-key collision carries SQLite's
    ``sqlite_errorname`` so id-collision retries work as on SQLite. Lost
    connections stay asyncpg's (they are retried, see :func:`with_reconnect`).
    """
    if isinstance(exc, CONNECTION_LOST) or not isinstance(exc, asyncpg.PostgresError):
        return exc
    mapped: sqlite3.Error
    if isinstance(exc, asyncpg.exceptions.IntegrityConstraintViolationError):
        mapped = sqlite3.IntegrityError(str(exc))
        constraint = str(getattr(exc, "constraint_name", "") or "")
        if isinstance(exc, asyncpg.exceptions.UniqueViolationError) \
                and constraint.endswith("_pkey"):
            mapped.sqlite_errorname = "SQLITE_CONSTRAINT_PRIMARYKEY"
    else:
        mapped = sqlite3.OperationalError(str(exc))
    mapped.__cause__ = exc
    return mapped


async def with_reconnect(attempt: Callable[[], Awaitable[T]], what: str,
                         attempts: int = RECONNECT.attempts) -> T:
    """``attempt()``, tried again on a fresh connection while the connection is lost
    (``attempts`` tries in all, waiting as :data:`RECONNECT` says between them)."""
    failures = 0
    while True:
        try:
            return await attempt()
        except CONNECTION_LOST as exc:
            failures += 1
            if failures >= attempts:
                raise
            delay = RECONNECT.delay(failures)
            log.warning("PostgreSQL connection lost during %s (%s: %s); retrying in %.1fs",
                        what, type(exc).__name__, exc, delay)
            await asyncio.sleep(delay)


CONFLICT_RETRIES = 5
"""Runs of a transaction the server rolled back for a deadlock or serialization failure."""


async def transaction(db: PgConnection, body: Callable[[PgConnection], Awaitable[T]]) -> T:
    """Run ``body`` in one transaction on a pooled connection; run again if the
    connection was lost before the commit was sent (never after: it may have
    committed) or the server rolled it back for a deadlock (:data:`CONFLICT_RETRIES`)."""
    committing = False

    async def attempt() -> T:
        nonlocal committing
        async with db.pool.acquire() as conn:
            tx = conn.transaction()
            try:
                await tx.start()
                result = await body(db.bound(conn))
            except BaseException as exc:
                if isinstance(exc, CONNECTION_LOST):
                    conn.terminate()  # never handed out again; the pool opens a new one
                elif not conn.is_closed():
                    await tx.rollback()
                raise
            committing = True
            await tx.commit()
            return result

    async def guarded() -> T:
        for conflicts in range(1, CONFLICT_RETRIES + 1):
            try:
                return await attempt()
            except CONNECTION_LOST:
                if committing:
                    raise _CommitUnknown from None
                raise
            except Exception as exc:
                # A deadlock or serialization failure: the server rolled the whole
                # transaction back, so running it again is safe.
                cause = exc if isinstance(exc, asyncpg.PostgresError) else exc.__cause__
                if not isinstance(cause, asyncpg.exceptions.TransactionRollbackError) \
                        or conflicts == CONFLICT_RETRIES:
                    raise
                log.info("transaction rolled back by the server (%s); running it again",
                         type(cause).__name__)
                await asyncio.sleep(RECONNECT.delay(conflicts) / 4)
        raise AssertionError("unreachable")

    try:
        return await with_reconnect(guarded, "a transaction")
    except _CommitUnknown as exc:
        raise ConnectionError("the connection to PostgreSQL was lost while committing; the "
                              "transaction may or may not have been applied") from exc


class _CommitUnknown(Exception):
    """Not retried: the commit may have reached the server."""
