"""Sessions: conversation history in the database with an in-memory LRU in front.

A run does not write its history while it works (only its tool exchange goes
to the journal, :mod:`bot.storage.inbox`). It hands everything it produced to
:meth:`SessionStore.append_run`, which writes it in one transaction, so
concurrent runs cannot interleave half-finished history and a crash mid-run
leaves no partial history behind.

The cache is validated, not trusted: every write to a session bumps its
``version`` in the same transaction, and :meth:`SessionStore.get` reads the
session's row (one indexed read) and reloads the history when the row is
newer than the cached copy. So a replica, or another process on the same
database, that committed a turn meanwhile is never missed. A message's
``messages`` row and back: :func:`message_row`, :func:`row_message`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiosqlite

from bot.contracts.llm import STALE as STALE
from bot.contracts.llm import ChatMessage, ToolCall, Usage, decode_parts, encode_parts
from bot.contracts.llm import Session as Session
from bot.contracts.llm import SessionActivity as SessionActivity
from bot.contracts.llm import agent_of as agent_of
from bot.contracts.llm import session_key as session_key
from bot.observability.tracing import RunRecord as RunRecord
from bot.observability.tracing import Span, attributes_of, run_row, span_row
from bot.storage import db as dbmod

_INSERT_MESSAGE = (
    "INSERT INTO messages (session_id, run_id, role, content, sender_id, sender_name,"
    " tool_calls, tool_call_id, tool_name, is_error, created_at, parts)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_UPDATE_SESSION = (
    "UPDATE sessions SET updated_at = ?, input_tokens = input_tokens + ?,"
    " output_tokens = output_tokens + ?, cache_read_tokens = cache_read_tokens + ?,"
    " cache_write_tokens = cache_write_tokens + ?, model = CASE WHEN ? = '' THEN model ELSE ? END,"
    " provider = CASE WHEN ? = '' THEN provider ELSE ? END, version = version + 1"
    " WHERE id = ? RETURNING version"
)
_SELECT_SESSION = (
    "SELECT id, version, created_at, updated_at, model, provider, input_tokens,"
    " output_tokens, summary, compactions, flushed_compaction, pins,"
    " cache_read_tokens, cache_write_tokens"
    " FROM sessions WHERE key = ? AND archived_at IS NULL"
)
_SELECT_MESSAGES = (
    # One statement, so the version read with the messages is the one they belong to;
    # the outer join gives one row (no message) to a session without messages.
    "SELECT s.version, m.role, m.content, m.sender_id, m.sender_name, m.tool_calls,"
    " m.tool_call_id, m.tool_name, m.is_error, m.created_at, m.parts"
    " FROM sessions s LEFT JOIN messages m ON m.session_id = s.id AND m.compacted = 0"
    " WHERE s.id = ? ORDER BY m.id"
)
_LOAD_TRIES = 5
"""Loads of one session that may find it written between their two reads."""
_INSERT_SPAN = (
    "INSERT OR REPLACE INTO spans (id, run_id, parent_id, kind, name, started_at, duration_ms,"
    " error, attributes) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_INSERT_RUN = (
    "INSERT OR REPLACE INTO runs (id, session_key, status, started_at, ended_at, iterations,"
    " input_tokens, output_tokens, model, error, cache_read_tokens, cache_write_tokens)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


_ID_BATCH = 500
"""Session ids per ``IN (...)`` query: well under SQLite's bound-parameter limit."""

_PRUNE_BATCH = 500
"""Runs deleted per transaction by :meth:`SessionStore.prune_runs`."""


class SessionStore:
    """Loads sessions on demand, caches up to ``cache_size``, writes runs atomically."""

    def __init__(self, db: aiosqlite.Connection, cache_size: int = 1000) -> None:
        self.db = db
        self.cache_size = cache_size
        self._cache: OrderedDict[str, Session] = OrderedDict()
        self._loading: dict[str, asyncio.Task[Session]] = {}
        # One connection serves every coroutine; a transaction must not have
        # another coroutine's statements slip into it between awaits.
        self._lock = asyncio.Lock()
        self.writer = dbmod.Writer(db, self._lock)
        """Every multi-statement write to this connection goes through here."""

    @property
    def lock(self) -> asyncio.Lock:
        """Serializes statements on :attr:`db`.

        Other stores that share the connection hold it around every statement
        or transaction of theirs, so none slips into another's transaction.
        """
        return self._lock

    @classmethod
    async def open(cls, path: Path | str, cache_size: int = 1000,
                   pool_size: int = 10, connect_attempts: int = 6) -> SessionStore:
        """Open (and migrate) the database at ``path``: a file, ``sqlite:///...`` or
        ``postgresql://...`` (a pool of ``pool_size`` connections, the first tried up to
        ``connect_attempts`` times while refused)."""
        return cls(await dbmod.connect(path, pool_size, connect_attempts), cache_size)

    async def close(self) -> None:
        """Finish pending writes and close the database."""
        await self.writer.close()
        await self.db.close()

    def cached(self, key: str) -> Session | None:
        """The cached session for ``key``, without touching the database."""
        return self._cache.get(key)

    def cached_count(self) -> int:
        """How many sessions are held in memory."""
        return len(self._cache)

    async def get(self, key: str) -> Session:
        """The active session for ``key`` as committed: from cache, from disk, or new.

        A cached copy is checked against the session's row first (one read): when
        another process or replica wrote the session since (a turn, a compaction,
        ``/pin``, ``/reset``), the session is loaded again. The load runs in a task
        of its own that every caller awaits shielded: a caller cancelled meanwhile
        (a merge, ``/stop``) neither cancels the load nor passes its cancellation
        to the others waiting for it.
        """
        loading = self._loading.get(key)
        row = None
        if loading is None:
            session = self._cache.get(key)
            row = await self._row(key)
            if session is not None and row is not None and row[0] == session.id \
                    and row[1] <= session.version:  # lower: read before a write of ours
                if self._cache.get(key) is session:
                    self._cache.move_to_end(key)
                return session
            if session is not None and self._cache.get(key) is session:
                del self._cache[key]
            loading = self._loading.get(key)  # one may have started while we read
        if loading is None:
            loading = self._loading[key] = asyncio.ensure_future(self._load(key, row))
            # Retrieved even when every caller was cancelled before it ended.
            loading.add_done_callback(lambda t: t.cancelled() or t.exception())
        return await asyncio.shield(loading)

    async def _row(self, key: str) -> Any:
        # On PostgreSQL a read outside a transaction has a pooled connection of its own:
        # it need not wait for this process's write in progress (SQLite's one must).
        shared = self._lock if dbmod.dialect_of(self.db) == "sqlite" else contextlib.nullcontext()
        async with shared, self.db.execute(_SELECT_SESSION, (key,)) as cur:
            return await cur.fetchone()

    async def _load(self, key: str, row: Any) -> Session:
        try:
            session = await self._load_or_create(key, row)
            self._remember(session)
            return session
        finally:
            del self._loading[key]

    async def append_run(
        self,
        session: Session,
        run_id: str,
        messages: Sequence[ChatMessage],
        usage: Usage | None = None,
        model: str = "",
        provider: str = "",
        record: RunRecord | None = None,
        spans: Sequence[Span] = (),
        same_transaction: dbmod.Statements | None = None,
    ) -> Any:
        """Write everything one run produced, and its trace, atomically.

        ``same_transaction`` runs in the same transaction (the dispatcher marks the run's
        inbox entries done and queues its reply in the outbox there); its
        result is returned. Flushes that arrive while a write is in progress
        are batched into the next transaction (group commit): each run is
        still all-or-nothing. Once called, the write completes even if the
        caller is cancelled.
        """
        flush = _Flush(session, run_id, tuple(messages), usage or Usage(), model, provider,
                       record, tuple(spans), time.time())

        async def body(db: aiosqlite.Connection) -> Any:
            await flush.write(db)
            return await same_transaction(db) if same_transaction is not None else None

        return await self.writer.write(body, after=flush.apply, what=f"run {run_id[:8]}")

    async def record_run(self, record: RunRecord, spans: Sequence[Span] = (),
                         same_transaction: dbmod.Statements | None = None) -> Any:
        """Write a run's trace on its own (runs that flush no history)."""
        rows = [span_row(s) for s in spans]

        async def body(db: aiosqlite.Connection) -> Any:
            await db.execute(_INSERT_RUN, run_row(record))
            await db.executemany(_INSERT_SPAN, rows)
            return await same_transaction(db) if same_transaction is not None else None

        return await self.writer.write(body, what=f"trace of run {record.run_id[:8]}")

    async def spans(self, run_id: str) -> list[Span]:
        """The stored spans of one run, root first."""
        async with self._lock, self.db.execute(
            "SELECT id, run_id, parent_id, kind, name, started_at, duration_ms, error, attributes"
            " FROM spans WHERE run_id = ? ORDER BY started_at, parent_id IS NOT NULL", (run_id,),
        ) as cur:
            rows = await cur.fetchall()
        return [Span(run_id=r[1], kind=r[3], name=r[4], started_at=r[5], span_id=r[0],
                     parent_id=r[2], duration_ms=r[6], error=bool(r[7]),
                     attributes=dict(attributes_of(r[8]))) for r in rows]

    async def prune_runs(self, before: float, batch: int = _PRUNE_BATCH) -> tuple[int, int]:
        """Delete the trace records of runs that ended before ``before``, with their spans.

        Returns how many runs and spans were deleted. A run's row and spans are
        written together once it ended, so a run in progress has none yet, and
        spans go by their run, never by their own age: a kept run's trace stays
        whole. Each ``batch`` of runs is a transaction of its own through the
        writer, so a first prune of a large table never holds the write lock long.
        """
        runs = spans = 0
        while True:
            async def body(db: aiosqlite.Connection) -> tuple[int, int, int]:
                rows = await db.execute_fetchall(
                    "SELECT id FROM runs WHERE ended_at < ? ORDER BY ended_at LIMIT ?",
                    (before, batch))
                ids = [r[0] for r in rows]
                if not ids:
                    return 0, 0, 0
                marks = ", ".join("?" * len(ids))
                cur = await db.execute(f"DELETE FROM spans WHERE run_id IN ({marks})", ids)
                gone_spans = cur.rowcount
                cur = await db.execute(f"DELETE FROM runs WHERE id IN ({marks})", ids)
                return len(ids), cur.rowcount, gone_spans

            found, gone_runs, gone_spans = await self.writer.write(body, what="pruning traces")
            runs += gone_runs
            spans += gone_spans
            if found < batch:
                return runs, spans

    async def compact(self, session: Session, count: int, summary: str) -> bool:
        """Replace the oldest ``count`` messages of ``session`` by ``summary``.

        The messages stay in the database (marked compacted) but leave the
        active history; the compaction counter goes up by one. Nothing changes
        (returns ``False``) when the stored session is not the one summarized:
        another process compacted it meanwhile, or its oldest ``count`` active
        messages are not ``session``'s.
        """
        summarized = [(m.role, m.created_at) for m in session.messages[:count]]

        async def body(db: aiosqlite.Connection) -> int | None:
            rows = list(await db.execute_fetchall(
                "SELECT s.compactions, m.id, m.role, m.created_at FROM sessions s"
                " LEFT JOIN messages m ON m.session_id = s.id AND m.compacted = 0"
                " WHERE s.id = ? ORDER BY m.id LIMIT ?", (session.id, count)))
            if not rows or rows[0][0] != session.compactions \
                    or [(r[2], r[3]) for r in rows] != summarized:
                return None
            # The oldest ``count`` active ones: every active one up to the last of them.
            await db.execute("UPDATE messages SET compacted = 1 WHERE session_id = ?"
                             " AND compacted = 0 AND id <= ?", (session.id, rows[-1][1]))
            return _version(await db.execute_fetchall(
                "UPDATE sessions SET summary = ?, compactions = compactions + 1,"
                " version = version + 1 WHERE id = ? RETURNING version", (summary, session.id)))

        version = await self.writer.write(body, what=f"compacting {session.key}")
        if version is None:
            return False
        del session.messages[:count]
        session.summary = summary
        session.compactions += 1
        session.advance(version)
        return True

    async def mark_flushed(self, session: Session) -> None:
        """Record that the memory flush ran for the current compaction cycle."""
        async with self._lock:
            version = _version(await self.db.execute_fetchall(
                "UPDATE sessions SET flushed_compaction = ?, version = version + 1"
                " WHERE id = ? RETURNING version", (session.compactions, session.id)))
        session.flushed_compaction = session.compactions
        session.advance(version)

    async def set_facts(self, session: Session, facts: Sequence[str]) -> None:
        """Replace the session's pinned facts."""
        async with self._lock:
            version = _version(await self.db.execute_fetchall(
                "UPDATE sessions SET pins = ?, version = version + 1 WHERE id = ?"
                " RETURNING version", (json.dumps(list(facts)), session.id)))
        session.facts = list(facts)
        session.advance(version)

    async def runs(self, session_key: str, limit: int = 50) -> list[RunRecord]:
        """The newest trace records of a session, newest first."""
        async with self._lock, self.db.execute(
            "SELECT id, session_key, status, started_at, ended_at, iterations, input_tokens,"
            " output_tokens, model, error, cache_read_tokens, cache_write_tokens"
            " FROM runs WHERE session_key = ?"
            " ORDER BY started_at DESC LIMIT ?",
            (session_key, limit),
        ) as cur:
            return [RunRecord(*row) for row in await cur.fetchall()]

    async def idle_sessions(self, before: float, after: float = 0.0) -> list[SessionActivity]:
        """Active sessions whose latest activity lies in (``after``, ``before``], oldest first.

        For background work over quiet conversations (the memory plugin's
        scheduled flush); ``updated_at`` is the time of the latest stored run.
        """
        async with self._lock, self.db.execute(
            "SELECT id, key, updated_at FROM sessions WHERE archived_at IS NULL"
            " AND updated_at <= ? AND updated_at > ? ORDER BY updated_at",
            (before, after),
        ) as cur:
            rows = await cur.fetchall()
        return [SessionActivity(r[0], r[1], r[2]) for r in rows]

    async def message_counts(self, session_ids: Sequence[int]) -> dict[int, int]:
        """How many messages each session has stored, compacted ones included.

        Sessions without messages are absent. The count only ever grows, so
        it marks how far a conversation has gone.
        """
        counts: dict[int, int] = {}
        ids = list(dict.fromkeys(session_ids))
        for start in range(0, len(ids), _ID_BATCH):
            batch = ids[start:start + _ID_BATCH]
            marks = ", ".join("?" * len(batch))
            async with self._lock, self.db.execute(
                f"SELECT session_id, COUNT(*) FROM messages WHERE session_id IN ({marks})"
                " GROUP BY session_id", batch,
            ) as cur:
                counts.update((int(r[0]), int(r[1])) for r in await cur.fetchall())
        return counts

    async def reset(self, key: str) -> Session:
        """Archive the active session for ``key`` and start an empty one."""
        now = time.time()

        async def body(db: aiosqlite.Connection) -> Session:
            await db.execute(
                "UPDATE sessions SET archived_at = ? WHERE key = ? AND archived_at IS NULL",
                (now, key),
            )
            return await _insert(db, key, now)

        session: Session = await self.writer.write(body, what=f"resetting {key}")
        self._cache.pop(key, None)
        self._remember(session)
        return session

    async def _load_or_create(self, key: str, row: Any = None) -> Session:
        """The session's row (``row`` if already read) and its active messages, as of
        one version: read again if a write committed between the two reads."""
        for _ in range(_LOAD_TRIES):
            if row is None:
                row = await self._row(key)
            if row is None:
                new: Session = await self.writer.write(
                    functools.partial(_insert, key=key, now=time.time()),
                    what=f"creating session {key}")
                return new
            async with self._lock, self.db.execute(_SELECT_MESSAGES, (row[0],)) as cur:
                rows = list(await cur.fetchall())
            if rows and rows[0][0] == row[1]:
                return Session(
                    id=row[0], key=key, messages=[row_message(tuple(r)[1:]) for r in rows
                                                  if r[1] is not None],
                    created_at=row[2], updated_at=row[3], model=row[4], provider=row[5],
                    input_tokens=row[6], output_tokens=row[7], summary=row[8],
                    compactions=row[9], flushed_compaction=row[10],
                    facts=list(json.loads(row[11])), cache_read_tokens=row[12],
                    cache_write_tokens=row[13], version=row[1])
            row = None  # written meanwhile (or archived): read the row again
        raise RuntimeError(f"session {key} kept changing while it was being loaded")

    def _remember(self, session: Session) -> None:
        self._cache[session.key] = session
        self._cache.move_to_end(session.key)
        if len(self._cache) <= self.cache_size:
            return
        for key in list(self._cache):
            if len(self._cache) <= self.cache_size:
                break
            if self._cache[key].pins == 0:
                del self._cache[key]


@dataclass(slots=True)
class _Flush:
    """One run's write."""

    session: Session
    run_id: str
    messages: tuple[ChatMessage, ...]
    usage: Usage
    model: str
    provider: str
    record: RunRecord | None
    spans: tuple[Span, ...]
    now: float
    version: int | None = None
    """The session's version this write committed as (set by :meth:`write`)."""

    async def write(self, db: aiosqlite.Connection) -> None:
        await db.executemany(_INSERT_MESSAGE,
                             [message_row(self.session.id, self.run_id, m) for m in self.messages])
        self.version = _version(await db.execute_fetchall(_UPDATE_SESSION, (
            self.now, self.usage.input_tokens, self.usage.output_tokens,
            self.usage.cache_read_tokens, self.usage.cache_write_tokens, self.model,
            self.model, self.provider, self.provider, self.session.id)))
        if self.record is not None:
            await db.execute(_INSERT_RUN, run_row(self.record))
        if self.spans:
            await db.executemany(_INSERT_SPAN, [span_row(s) for s in self.spans])

    def apply(self) -> None:
        """Mirror the committed write into the cached session."""
        s = self.session
        s.messages.extend(self.messages)
        s.updated_at = self.now
        s.input_tokens += self.usage.input_tokens
        s.output_tokens += self.usage.output_tokens
        s.cache_read_tokens += self.usage.cache_read_tokens
        s.cache_write_tokens += self.usage.cache_write_tokens
        s.model = self.model or s.model
        s.provider = self.provider or s.provider
        s.advance(self.version)


async def _insert(db: aiosqlite.Connection, key: str, now: float) -> Session:
    # Two loads of one key can race only across processes; the partial unique
    # index then refuses the second insert, and its run fails cleanly.
    cur = await db.execute(
        "INSERT INTO sessions (key, created_at, updated_at) VALUES (?, ?, ?)",
        (key, now, now),
    )
    assert cur.lastrowid is not None
    return Session(id=cur.lastrowid, key=key, messages=[], created_at=now, updated_at=now)


def _version(rows: Iterable[Any]) -> int | None:
    """The version an ``UPDATE ... RETURNING version`` set (``None``: no such session)."""
    for row in rows:
        return int(row[0])
    return None


# -- how a chat message is stored: a ``messages`` row and back -----------------------------
def message_row(session_id: int, run_id: str, m: ChatMessage) -> tuple[Any, ...]:
    """The ``messages`` row of ``m``, in the order of the columns the session store inserts."""
    calls = json.dumps([{"id": c.id, "name": c.name, "arguments": dict(c.arguments)}
                        for c in m.tool_calls]) if m.tool_calls else None
    return (session_id, run_id, m.role, m.content, m.sender_id, m.sender_name, calls,
            m.tool_call_id, m.tool_name, int(m.is_error), m.created_at, encode_parts(m.parts))


def row_message(r: Any) -> ChatMessage:
    """The message of a ``messages`` row read back (role through parts)."""
    calls = tuple(ToolCall(c["id"], c["name"], c["arguments"]) for c in json.loads(r[4])) \
        if r[4] else ()
    return ChatMessage(
        role=r[0], content=r[1], sender_id=r[2], sender_name=r[3], tool_calls=calls,
        tool_call_id=r[5], tool_name=r[6], is_error=bool(r[7]), created_at=r[8],
        parts=decode_parts(r[9]),
    )
