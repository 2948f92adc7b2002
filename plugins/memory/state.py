"""The memory plugin's own tables: the search index and the scheduled flush's state.

Before plugins owned tables, Roost's schema step 7 created the index tables
and kept the flush state in three ``sessions`` columns. Step 1 here adopts
the index tables (creating them where that step never ran them) and creates
``memory_flush_state``; step 2 copies the old columns' values into it, after
which Roost drops the columns (:data:`bot.storage.db.RETIRED_COLUMNS`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

import aiosqlite

from roost import Migrations

SCHEMA_NAME = "memory"

_TABLES = """
CREATE TABLE IF NOT EXISTS memory_files (
    workspace TEXT NOT NULL,
    path TEXT NOT NULL,
    stamp TEXT NOT NULL,
    PRIMARY KEY (workspace, path)
);
CREATE TABLE IF NOT EXISTS memory_chunks (
    id INTEGER PRIMARY KEY,
    workspace TEXT NOT NULL,
    path TEXT NOT NULL,
    start_line INTEGER NOT NULL,
    end_line INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS memory_chunks_file ON memory_chunks(workspace, path);
CREATE VIRTUAL TABLE IF NOT EXISTS memory_fts USING fts5(
    text, tokenize = 'porter unicode61 remove_diacritics 2'
);
-- Per session: the message count and the activity time its last successful
-- scheduled flush covered, and the window (memory_flush_every_hours, counted
-- from the epoch) it was last tried in. No foreign key: sessions are Roost's.
CREATE TABLE memory_flush_state (
    session_id INTEGER PRIMARY KEY,
    flushed_count INTEGER NOT NULL DEFAULT 0,
    flushed_upto REAL NOT NULL DEFAULT 0,
    flush_window INTEGER NOT NULL DEFAULT -1
);
"""

_LEGACY_COLUMNS = ("memory_flushed_count", "memory_flushed_upto", "memory_flush_window")


async def copy_legacy_flush_state(db: aiosqlite.Connection) -> None:
    """Carry the flush state Roost kept in ``sessions`` over to ``memory_flush_state``.

    The one read of Roost's tables this plugin makes, once, during the
    upgrade; a database whose columns are already gone has nothing to copy.
    """
    async with db.execute("SELECT name FROM pragma_table_info('sessions')") as cur:
        columns = {str(r[0]) for r in await cur.fetchall()}
    if not set(_LEGACY_COLUMNS) <= columns:
        return
    await db.execute(
        "INSERT OR REPLACE INTO memory_flush_state"
        " (session_id, flushed_count, flushed_upto, flush_window)"
        " SELECT id, memory_flushed_count, memory_flushed_upto, memory_flush_window"
        " FROM sessions WHERE memory_flushed_count != 0 OR memory_flushed_upto != 0"
        " OR memory_flush_window != -1")


MIGRATIONS = Migrations(SCHEMA_NAME, [_TABLES, copy_legacy_flush_state])
"""The plugin's schema steps; append, never change a released one."""


@dataclass(frozen=True, slots=True)
class FlushState:
    """What the scheduled flush recorded about one session."""

    flushed_count: int = 0
    """The session's message count when its last scheduled flush succeeded."""
    flushed_upto: float = 0.0
    """The session's ``updated_at`` then: later activity means something new."""
    window: int = -1
    """The flush window the session was last tried in."""


NEVER = FlushState()

_ID_BATCH = 500


class FlushStates:
    """``memory_flush_state`` on the shared connection (``lock`` serializes statements)."""

    def __init__(self, db: aiosqlite.Connection, lock: asyncio.Lock) -> None:
        self.db = db
        self.lock = lock

    async def get(self, session_ids: Sequence[int]) -> dict[int, FlushState]:
        """The recorded state of each of ``session_ids`` that has one."""
        states: dict[int, FlushState] = {}
        ids = list(dict.fromkeys(session_ids))
        for start in range(0, len(ids), _ID_BATCH):
            batch = ids[start:start + _ID_BATCH]
            marks = ", ".join("?" * len(batch))
            async with self.lock, self.db.execute(
                "SELECT session_id, flushed_count, flushed_upto, flush_window"
                f" FROM memory_flush_state WHERE session_id IN ({marks})", batch,
            ) as cur:
                states.update((int(r[0]), FlushState(int(r[1]), float(r[2]), int(r[3])))
                              for r in await cur.fetchall())
        return states

    async def flushed(self, session_id: int, count: int, upto: float, window: int) -> None:
        """Record a successful flush covering ``count`` messages and activity up to ``upto``."""
        async with self.lock:
            await self.db.execute(
                "INSERT INTO memory_flush_state"
                " (session_id, flushed_count, flushed_upto, flush_window) VALUES (?, ?, ?, ?)"
                " ON CONFLICT(session_id) DO UPDATE SET flushed_count = excluded.flushed_count,"
                " flushed_upto = excluded.flushed_upto, flush_window = excluded.flush_window",
                (session_id, count, upto, window))

    async def tried(self, session_id: int, window: int) -> None:
        """Record that a flush was tried in ``window`` (and failed): no retry before the next."""
        async with self.lock:
            await self.db.execute(
                "INSERT INTO memory_flush_state (session_id, flush_window) VALUES (?, ?)"
                " ON CONFLICT(session_id) DO UPDATE SET flush_window = excluded.flush_window",
                (session_id, window))
