"""Copying a whole Roost database to another backend (``roost db copy``).

Every table, Roost's and the plugins', is copied row for row with its ids, so
sessions keep their messages, the inbox its journal and outbox, and the
memory index its chunks. Both databases must already be migrated (the caller
runs Roost's and the plugins' migrations on each); the schema bookkeeping
(``roost_schema``, ``plugin_schema``) is the target's own and is not copied.
Sequences (PostgreSQL identity columns) are moved past the highest copied id,
so new rows never collide with copied ones. Works in either direction.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import aiosqlite

from bot.storage.db import dialect_of, transaction

SKIPPED = frozenset({"roost_schema", "plugin_schema", "messages_fts"})
"""Schema bookkeeping, which each database keeps its own, and SQLite's message search
index, which its triggers fill from the copied messages."""

FIRST = ("sessions",)
"""Tables other tables refer to (foreign keys), copied before the rest."""

BATCH = 2000
"""Rows per read and per ``executemany``."""


class CopyError(RuntimeError):
    """The copy cannot start or did not arrive whole (the message says why)."""


@dataclass(frozen=True, slots=True)
class Copied:
    """One table's result: rows read from the source and found in the target."""

    table: str
    source_rows: int
    target_rows: int


async def tables(db: aiosqlite.Connection) -> dict[str, list[str]]:
    """The data tables of ``db`` and the columns to copy (insertable ones), by name."""
    found: dict[str, list[str]] = {}
    if dialect_of(db) == "postgresql":
        names = [str(r[0]) for r in await db.execute_fetchall(
            "SELECT table_name FROM information_schema.tables"
            " WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'"
            " ORDER BY table_name")]
        for name in names:
            found[name] = [str(r[0]) for r in await db.execute_fetchall(
                "SELECT column_name FROM information_schema.columns"
                " WHERE table_schema = current_schema() AND table_name = ?"
                " AND is_generated = 'NEVER' ORDER BY ordinal_position", (name,))]
        return found
    rows = list(await db.execute_fetchall(
        "SELECT name, sql FROM sqlite_master WHERE type = 'table'"
        " AND name NOT LIKE 'sqlite_%' ORDER BY name"))
    virtual = [str(r[0]) for r in rows if str(r[1] or "").upper().startswith("CREATE VIRTUAL")]
    for name, _sql in rows:
        name = str(name)
        if any(name.startswith(v + "_") for v in virtual):
            continue  # an FTS5 table's shadow tables: the index rebuilds them
        columns = [str(r[0]) for r in await db.execute_fetchall(
            "SELECT name FROM pragma_table_info(?)", (name,))]
        # A virtual table's rows are named by rowid (memory_fts: memory_chunks.id).
        found[name] = ["rowid", *columns] if name in virtual else columns
    return found


def quoted(name: str) -> str:
    """An identifier quoted for SQL (both dialects): identifiers cannot be bound, and these
    come from the databases' own catalogs."""
    return '"' + name.replace('"', '""') + '"'


async def _count(db: aiosqlite.Connection, table: str) -> int:
    rows = list(await db.execute_fetchall(f"SELECT COUNT(*) FROM {quoted(table)}"))
    return int(rows[0][0])


async def copy_database(source: aiosqlite.Connection, target: aiosqlite.Connection, *,
                        force: bool = False,
                        progress: Callable[[str, int], None] | None = None) -> list[Copied]:
    """Copy every table of ``source`` into ``target``; the per-table row counts.

    Refuses (:class:`CopyError`) when a source table is missing in the target
    (a plugin installed on one side only) or when the target already holds
    rows, unless ``force`` (the target's rows are deleted first). Tables are read
    and written in batches of :data:`BATCH` rows; the counts are compared at the
    end (a copy that failed half way is repeated with ``force``).
    """
    src, dst = await tables(source), await tables(target)
    names = [t for t in src if t not in SKIPPED]
    names.sort(key=lambda t: (t not in FIRST, FIRST.index(t) if t in FIRST else 0, t))
    missing = [t for t in names if t not in dst]
    if missing:
        raise CopyError("the target has no table " + ", ".join(missing) + ": migrate it "
                        "with the same plugins installed (roost db migrate)")
    lock = asyncio.Lock()
    filled = [t for t in names if await _count(target, t)]
    if filled and not force:
        raise CopyError("the target already holds rows (" + ", ".join(filled) +
                        "); use --force to replace them")
    if filled:
        async def clear(db: aiosqlite.Connection) -> None:
            for table in reversed(names):
                await db.execute(f"DELETE FROM {quoted(table)}")
        await transaction(target, lock, clear)

    results = []
    for table in names:
        columns = [c for c in src[table] if c in dst[table]]
        listed = ", ".join(quoted(c) for c in columns)
        marks = ", ".join("?" * len(columns))
        insert = f"INSERT INTO {quoted(table)} ({listed}) VALUES ({marks})"
        select = f"SELECT {listed} FROM {quoted(table)}"
        # Physical order, stable while nothing writes (the service is stopped): batches
        # of BATCH rows, so a table of any size is never held in memory at once.
        order = "rowid" if dialect_of(source) == "sqlite" else "ctid"
        copied = 0
        while True:
            rows = [tuple(r) for r in await source.execute_fetchall(
                f"{select} ORDER BY {order} LIMIT ? OFFSET ?", (BATCH, copied))]
            if not rows:
                break

            async def write(db: aiosqlite.Connection, rows: list[tuple[object, ...]] = rows,
                            insert: str = insert) -> None:
                await db.executemany(insert, rows)

            await transaction(target, lock, write)
            copied += len(rows)
        if dialect_of(target) == "postgresql" and copied:
            await _advance_sequences(target, table, columns)
        if progress is not None:
            progress(table, copied)
        results.append(Copied(table, await _count(source, table), await _count(target, table)))
    wrong = [c for c in results if c.source_rows != c.target_rows]
    if wrong:
        raise CopyError("row counts differ after the copy: " + ", ".join(
            f"{c.table} {c.source_rows} -> {c.target_rows}" for c in wrong))
    return results


async def _advance_sequences(db: aiosqlite.Connection, table: str, columns: list[str]) -> None:
    for column in columns:
        rows = list(await db.execute_fetchall(
            "SELECT pg_get_serial_sequence(?, ?)", (quoted(table), column)))
        sequence = rows[0][0] if rows else None
        if sequence is None:
            continue
        await db.execute(
            f"SELECT setval(?, (SELECT MAX({quoted(column)}) FROM {quoted(table)}))",
            (str(sequence),))
