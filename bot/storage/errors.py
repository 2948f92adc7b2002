"""The error submission channel: full tool errors and large results kept in SQLite.

A failing tool can produce thousands of characters (stack traces, server
dumps). The model is sent a short summary and an ID instead
(:func:`format_failure`); the full error stays in the ``agent_errors`` table,
and the built-in ``get_error_detail`` tool fetches it on demand. Large
successful results work the same way through :class:`ResultStore`
(``tool_results``) and ``get_tool_result``.

Both stores share the session store's connection and its lock. Rows that
arrive while a write is in progress are inserted together in the next
transaction (group commit), so a busy service pays one commit for many errors.
A locked database (another process writing) is retried once, then the error
propagates.

IDs look like ``err_20241121_230334_abc123``: the UTC time of the write and six
random hex digits. Six digits make collisions likely at a few thousand writes
in one second, so IDs are checked against those issued in the same second, and
an ID that collides in the database is replaced and the row written again.
"""

from __future__ import annotations

import asyncio
import builtins
import json
import logging
import secrets
import sqlite3
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import aiosqlite

from bot.contracts.views import ERROR_ID_EXAMPLE as ERROR_ID_EXAMPLE
from bot.contracts.views import ERROR_ID_RE as ERROR_ID_RE
from bot.contracts.views import RESULT_ID_EXAMPLE as RESULT_ID_EXAMPLE
from bot.contracts.views import RESULT_ID_RE as RESULT_ID_RE
from bot.storage import db as dbmod

log = logging.getLogger("roost.storage.errors")

T = TypeVar("T")

SUMMARY_CHARS = 100
"""A summary is the first line of the error, or its first 100 characters."""
CODED_SUMMARY_CHARS = 80
"""With a code prefix (``Code X: ``) the message part gets 80 characters."""
FALLBACK_CHARS = 500
"""Without a store, the model gets the raw error truncated to this many characters."""


_MAX_ID_ATTEMPTS = 5
_SECONDS_PER_DAY = 86_400.0


# -- summaries ------------------------------------------------------------------


def first_line(text: str, max_len: int) -> str:
    """The first line of ``text`` if it ends before ``max_len``, else ``text`` cut there.

    A cut string gets ``...`` appended. A newline at position 0 does not count
    as the end of a first line (the spec's ``extractFirstLine``, unchanged).
    """
    idx = text.find("\n")
    if 0 < idx < max_len:
        return text[:idx]
    if len(text) <= max_len:
        return text
    return text[:max_len] + "..."


def summarize_error(raw: object) -> str:
    """A summary of an error of any shape, at most about 100 characters.

    - a mapping with a non-empty ``code`` and a ``message`` (a structured tool
      error), or an exception with a non-empty string ``code`` attribute
      (:class:`~bot.contracts.tools.ToolError`): ``Code <code>: <first line, 80 max>``;
    - a mapping with a ``message`` but no code: its first line (100 max);
    - an exception: the first line of its message (or its type name when the
      message is empty);
    - a string: its first line;
    - anything else (a mapping without ``message`` included): the first line
      of its JSON or ``str()`` form.
    """
    if isinstance(raw, Mapping) and "message" in raw:
        message = _text(raw["message"])
        code = raw.get("code")
        if code:
            return f"Code {_text(code)}: {first_line(message, CODED_SUMMARY_CHARS)}"
        return first_line(message, SUMMARY_CHARS)
    if isinstance(raw, BaseException):
        message = str(raw) or type(raw).__name__
        code = getattr(raw, "code", None)
        if isinstance(code, str) and code:
            return f"Code {code}: {first_line(message, CODED_SUMMARY_CHARS)}"
        return first_line(message, SUMMARY_CHARS)
    if isinstance(raw, str):
        return first_line(raw, SUMMARY_CHARS)
    if isinstance(raw, Mapping):
        return first_line(json.dumps(raw, ensure_ascii=False, default=str), SUMMARY_CHARS)
    return first_line(str(raw), SUMMARY_CHARS)


def normalize_raw_error(raw: str | Mapping[str, Any]) -> dict[str, Any]:
    """The raw error as a JSON object: a mapping as is, a JSON object string parsed,
    anything else wrapped as ``{"message": raw}``."""
    if isinstance(raw, Mapping):
        return dict(raw)
    try:
        parsed = json.loads(raw)
    except ValueError:
        return {"message": raw}
    return parsed if isinstance(parsed, dict) else {"message": raw}


def _text(value: object) -> str:
    return value if isinstance(value, str) else str(value)


# -- what the model is shown ------------------------------------------------------


def format_failure(tool_name: str, stored: StoredError | None, raw_message: str) -> str:
    """The tool result the model sees for a failure.

    With the error stored: its summary, its ID and how to get the rest. Without
    (``stored`` is ``None``: no store, or the write failed): the raw message
    truncated at 500 characters, and a warning is logged.
    """
    if stored is None:
        log.warning("tool %r failure not stored; sending it truncated to %d characters",
                    tool_name, FALLBACK_CHARS)
        return f"Tool '{tool_name}' failed: {truncate(raw_message, FALLBACK_CHARS)}"
    return (f"Tool '{tool_name}' failed: {stored.short_summary}\n"
            f"[Error ID: {stored.id}]\n"
            "Call get_error_detail with this ID if you need the full error.")


def format_large_result(tool_name: str, result_id: str, content: str, preview_chars: int) -> str:
    """The tool result the model sees for a stored large result: a preview and the reference."""
    log.debug("tool %r result of %d characters stored as %s", tool_name, len(content), result_id)
    return (f"{content[:preview_chars]}\n\n"
            f"[Result stored as {result_id}: {len(content)} characters, the first "
            f"{min(preview_chars, len(content))} shown; call get_tool_result with result_id "
            f"and offset {preview_chars} to read more]")


def truncate(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, ``...`` marking a cut."""
    return text if len(text) <= limit else text[:limit] + "..."


# -- stored records ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StoredError:
    """One stored tool error.

    ``timestamp`` is Unix seconds (UTC); ``raw_error`` is the full error as a
    JSON object; ``short_summary`` is what the model was shown.
    """

    id: str
    timestamp: float
    session_id: str
    tool_name: str
    raw_error: dict[str, Any]
    short_summary: str

    def iso_timestamp(self) -> str:
        """The timestamp as RFC 3339 UTC, e.g. ``2024-11-21T23:03:34Z``."""
        return iso_utc(self.timestamp)


def error_report(error: StoredError) -> str:
    """One stored error in full, as ``roost errors show`` prints it (indented JSON)."""
    return json.dumps({"id": error.id, "timestamp": error.iso_timestamp(),
                       "session": error.session_id, "tool": error.tool_name,
                       "summary": error.short_summary, "error": error.raw_error},
                      indent=2, ensure_ascii=False)


def iso_utc(timestamp: float) -> str:
    """Unix seconds as RFC 3339 UTC, to the second."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(timestamp))


def _id_stamp(timestamp: float) -> str:
    return time.strftime("%Y%m%d_%H%M%S", time.gmtime(timestamp))


def random_suffix() -> str:
    """Six hex digits from the OS's cryptographic source."""
    return secrets.token_hex(3)


def _is_locked(exc: sqlite3.OperationalError) -> bool:
    name = getattr(exc, "sqlite_errorname", "")
    return (isinstance(name, str) and name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED"))) \
        or "database is locked" in str(exc)


def _is_id_collision(exc: sqlite3.IntegrityError) -> bool:
    name = getattr(exc, "sqlite_errorname", "")
    return name == "SQLITE_CONSTRAINT_PRIMARYKEY" or (
        "UNIQUE constraint failed" in str(exc) and ".id" in str(exc))


async def _retry_locked(op: Callable[[], Awaitable[T]], what: str) -> T:
    """Run ``op``; if the database is locked, run it once more, then let the error out."""
    try:
        return await op()
    except sqlite3.OperationalError as exc:
        if not _is_locked(exc):
            raise
        log.warning("database is locked (%s); retrying once", what)
        return await op()


def _timestamp(value: float | datetime | None) -> float | None:
    if value is None or isinstance(value, float | int):
        return value
    return value.timestamp()


# -- group-committed inserts --------------------------------------------------------


@dataclass(slots=True, eq=False)
class _Insert:
    id: str
    timestamp: float
    values: tuple[Any, ...]
    """Every column after ``id``."""
    done: asyncio.Future[str]
    attempts: int = 1


class _GroupWriter:
    """Inserts rows with a fresh ID each; rows that arrive while a write is in
    progress go into the next transaction together."""

    def __init__(self, db: aiosqlite.Connection, lock: asyncio.Lock, table: str, sql: str,
                 prefix: str) -> None:
        self.db = db
        self.lock = lock
        self.table = table
        self.sql = sql
        self.prefix = prefix
        self._pending: list[_Insert] = []
        self._task: asyncio.Task[None] | None = None
        # IDs issued in the current second (``_issued_stamp``): a fresh ID never
        # repeats one of them, so this process never collides with itself.
        self._issued: set[str] = set()
        self._issued_stamp = ""

    def new_id(self, timestamp: float) -> str:
        """A fresh ID for ``timestamp``, distinct from every other this writer issued."""
        stamp = _id_stamp(timestamp)
        if stamp != self._issued_stamp:
            self._issued.clear()
            self._issued_stamp = stamp
        while True:
            candidate = f"{self.prefix}_{stamp}_{random_suffix()}"
            if candidate not in self._issued:
                self._issued.add(candidate)
                return candidate

    async def insert(self, timestamp: float, values: tuple[Any, ...]) -> str:
        """Write one row; its ID once committed. Completes even if the caller is cancelled."""
        item = _Insert(self.new_id(timestamp), timestamp, values,
                       asyncio.get_running_loop().create_future())
        self._pending.append(item)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._drain())
        # The writer task owns the write: cancelling this await cancels only
        # ``item.done``, and the row is still written.
        return await item.done

    async def flush(self) -> None:
        """Wait until every row handed to :meth:`insert` is written (or failed)."""
        while self._task is not None and not self._task.done():
            await asyncio.shield(self._task)

    async def _drain(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            await self._commit(batch)

    async def _commit(self, batch: list[_Insert]) -> None:
        try:
            await self._write(batch)
        except sqlite3.IntegrityError as exc:
            if len(batch) > 1:
                # Which row collided is unknown: write them one by one.
                for item in batch:
                    await self._commit([item])
                return
            item = batch[0]
            if _is_id_collision(exc) and item.attempts < _MAX_ID_ATTEMPTS:
                item.attempts += 1
                item.id = self.new_id(item.timestamp)
                await self._commit([item])
                return
            _fail(batch, exc)
            return
        except Exception as exc:  # locked twice, disk full, closed...: all fail alike
            _fail(batch, exc)
            return
        for item in batch:
            if not item.done.done():
                item.done.set_result(item.id)

    async def _write(self, batch: list[_Insert]) -> None:
        rows = [(item.id, *item.values) for item in batch]
        await _retry_locked(lambda: self._write_once(rows), f"writing {self.table}")

    async def _write_once(self, rows: list[tuple[Any, ...]]) -> None:
        if len(rows) == 1:
            # One statement in autocommit mode is its own transaction.
            async with self.lock:
                await self.db.execute(self.sql, rows[0])
            return

        async def body(db: aiosqlite.Connection) -> None:
            await db.executemany(self.sql, rows)

        await dbmod.transaction(self.db, self.lock, body)


def _fail(batch: list[_Insert], exc: BaseException) -> None:
    for item in batch:
        if not item.done.done():
            item.done.set_exception(exc)
            item.done.exception()  # retrieved: its caller may be gone


class _Store:
    """What both stores share: the connection, its lock, a clock and the writer."""

    def __init__(self, db: aiosqlite.Connection, lock: asyncio.Lock, table: str, sql: str,
                 prefix: str, clock: Callable[[], float]) -> None:
        self.db = db
        self.lock = lock
        self.clock = clock
        self._table = table
        self._writer = _GroupWriter(db, lock, table, sql, prefix)

    async def flush(self) -> None:
        """Wait for writes in progress (call before closing the connection)."""
        await self._writer.flush()

    async def delete_older_than(self, days: float) -> int:
        """Delete rows more than ``days`` days old; how many were deleted."""
        cutoff = self.clock() - days * _SECONDS_PER_DAY

        async def delete() -> int:
            # The table name is one of ours, never input.
            cur = await self.db.execute(
                f"DELETE FROM {self._table} WHERE timestamp < ?", (cutoff,))
            return cur.rowcount

        async with self.lock:
            return await _retry_locked(delete, f"pruning {self._table}")

    async def _fetch(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        async def run() -> list[Any]:
            return list(await self.db.execute_fetchall(sql, params))

        async with self.lock:
            return await _retry_locked(run, f"reading {self._table}")


# -- errors ------------------------------------------------------------------------

_ERROR_COLUMNS = "id, timestamp, session_id, tool_name, raw_error, short_summary"
_INSERT_ERROR = f"INSERT INTO agent_errors ({_ERROR_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)"


class ErrorStore(_Store):
    """Full tool errors in the ``agent_errors`` table.

    ``db`` is the shared connection (opened with ``isolation_level=None``) and
    ``lock`` the lock every user of it holds around its statements
    (:attr:`bot.storage.sessions.SessionStore.lock`). ``clock`` gives Unix seconds.
    """

    def __init__(self, db: aiosqlite.Connection, lock: asyncio.Lock, *,
                 clock: Callable[[], float] = time.time) -> None:
        super().__init__(db, lock, "agent_errors", _INSERT_ERROR, "err", clock)

    async def store(self, session_id: str, tool_name: str, raw_error: str | Mapping[str, Any],
                    *, summary: str | None = None) -> StoredError:
        """Store one error; the stored record, with its new ID.

        ``raw_error`` that is not a JSON object is wrapped as ``{"message": ...}``.
        ``summary`` defaults to :func:`summarize_error` of the raw error.
        """
        raw = normalize_raw_error(raw_error)
        text = json.dumps(raw, ensure_ascii=False, default=str)
        if summary is None:
            summary = summarize_error(raw)
        now = self.clock()
        error_id = await self._writer.insert(now, (now, session_id, tool_name, text, summary))
        return StoredError(error_id, now, session_id, tool_name, json.loads(text), summary)

    async def get(self, error_id: str, *, session_id: str | None = None) -> StoredError | None:
        """The error with this ID, or ``None``; with ``session_id``, only that session's."""
        sql = f"SELECT {_ERROR_COLUMNS} FROM agent_errors WHERE id = ?"
        params: tuple[Any, ...] = (error_id,)
        if session_id is not None:
            sql += " AND session_id = ?"
            params = (error_id, session_id)
        rows = await self._fetch(sql, params)
        return _stored_error(rows[0]) if rows else None

    async def list(self, session_id: str | None = None, tool_name: str | None = None,
                   since: float | datetime | None = None, until: float | datetime | None = None,
                   limit: int | None = 50) -> builtins.list[StoredError]:
        """Errors matching every filter given, newest first.

        ``since`` is inclusive and ``until`` exclusive (Unix seconds or aware
        datetimes); ``limit`` ``None`` or 0 means no limit.
        """
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        clauses: builtins.list[str] = []
        params: builtins.list[Any] = []
        for clause, value in (("session_id = ?", session_id), ("tool_name = ?", tool_name),
                              ("timestamp >= ?", _timestamp(since)),
                              ("timestamp < ?", _timestamp(until))):
            if value is not None:
                clauses.append(clause)
                params.append(value)
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        postgres = dbmod.dialect_of(self.db) == "postgresql"
        # No limit: SQLite takes -1, PostgreSQL NULL. Ties: SQLite's insertion order
        # (rowid); PostgreSQL has none, so the id (its time stamp, then random).
        params.append(limit or (None if postgres else -1))
        order = "id DESC" if postgres else "rowid DESC"
        rows = await self._fetch(
            f"SELECT {_ERROR_COLUMNS} FROM agent_errors{where}"
            f" ORDER BY timestamp DESC, {order} LIMIT ?", tuple(params))
        return [_stored_error(r) for r in rows]


def _stored_error(row: Any) -> StoredError:
    try:
        raw = json.loads(row[4])
    except ValueError:
        raw = None
    if not isinstance(raw, dict):
        raw = {"message": row[4]}
    return StoredError(id=row[0], timestamp=row[1], session_id=row[2], tool_name=row[3],
                       raw_error=raw, short_summary=row[5])


# -- large results -------------------------------------------------------------------

_INSERT_RESULT = ("INSERT INTO tool_results (id, timestamp, session_id, tool_name, content)"
                  " VALUES (?, ?, ?, ?, ?)")


class ResultStore(_Store):
    """Large successful tool results in the ``tool_results`` table, read back in slices.

    Same connection, lock and clock as :class:`ErrorStore`.
    """

    def __init__(self, db: aiosqlite.Connection, lock: asyncio.Lock, *,
                 clock: Callable[[], float] = time.time) -> None:
        super().__init__(db, lock, "tool_results", _INSERT_RESULT, "res", clock)

    async def put(self, session_id: str, tool_name: str, content: str) -> str:
        """Store ``content``; its new ID (``res_...``).

        NUL characters become U+FFFD (SQLite's text functions stop at NUL), so
        lengths and offsets stay those of ``content``.
        """
        now = self.clock()
        return await self._writer.insert(
            now, (now, session_id, tool_name, content.replace("\x00", "\ufffd")))

    async def get_slice(self, result_id: str, offset: int = 0, length: int = 8_000, *,
                        session_id: str | None = None) -> tuple[str, int] | None:
        """``length`` characters from ``offset`` and the total length, or ``None``
        if there is no such result (in ``session_id``, when given)."""
        if offset < 0 or length <= 0:
            raise ValueError(f"need offset >= 0 and length > 0, got {offset} and {length}")
        sql = "SELECT substr(content, ?, ?), length(content) FROM tool_results WHERE id = ?"
        params: tuple[Any, ...] = (offset + 1, length, result_id)
        if session_id is not None:
            sql += " AND session_id = ?"
            params = (*params, session_id)
        rows = await self._fetch(sql, params)
        return (rows[0][0], rows[0][1]) if rows else None
