"""Plugins' own tables: applying a plugin's :class:`~bot.contracts.migrations.Migrations`.

Roost's own schema is numbered by ``PRAGMA user_version`` on SQLite and the
``roost_schema`` row on PostgreSQL (:mod:`bot.storage.db`);
each plugin's is numbered separately, in a ``plugin_schema`` row under the
name it chose, so plugins can add steps without coordinating with Roost or
with each other.
"""

from __future__ import annotations

import asyncio
import functools
import sqlite3
import time
from collections.abc import Mapping

import aiosqlite

from bot.contracts.migrations import Migrations, Step
from bot.storage.db import MIGRATION_LOCK, dialect_of, transaction


async def schema_version(db: aiosqlite.Connection, lock: asyncio.Lock, name: str) -> int:
    """How many steps of plugin schema ``name`` this database has applied."""
    async with lock, db.execute(
        "SELECT version FROM plugin_schema WHERE plugin = ?", (name,),
    ) as cur:
        row = await cur.fetchone()
    return int(row[0]) if row else 0


async def migrate_plugin(db: aiosqlite.Connection, lock: asyncio.Lock,
                         migrations: Migrations) -> int:
    """Apply the steps of ``migrations`` this database has not run; returns how many ran.

    Each step and the version row that records it commit together, so a step
    that fails leaves the schema and the version as they were (it is tried
    again at the next start). Raises ``RuntimeError`` when the database has
    more steps recorded than ``migrations`` has (a newer version of the
    plugin ran on it), and whatever a failing step raised.
    """
    name, steps = migrations.name, list(migrations.steps)
    current = await schema_version(db, lock, name)
    if current > len(steps):
        raise RuntimeError(f"the database has {current} schema steps of {name!r}, this "
                           f"version of the plugin knows {len(steps)}; upgrade it")
    for number, step in enumerate(steps[current:], start=current + 1):
        await transaction(db, lock, functools.partial(_apply, name, number, step))
    return len(steps) - current


async def _apply(name: str, number: int, step: Step, db: aiosqlite.Connection) -> None:
    dialect = dialect_of(db)
    if dialect == "postgresql":
        # Replicas starting together: one applies the step, the others find it recorded.
        await db.execute("SELECT pg_advisory_xact_lock(?)", (MIGRATION_LOCK,))
    async with db.execute("SELECT version FROM plugin_schema WHERE plugin = ?",
                          (name,)) as cur:
        row = await cur.fetchone()
    if row is not None and int(row[0]) >= number:
        return  # another process applied it meanwhile
    if isinstance(step, Mapping):
        if dialect not in step:
            raise RuntimeError(f"schema step {number} of {name!r} has no {dialect} text")
        await _run_script(db, step[dialect], dialect, translate=False)
    elif isinstance(step, str):
        await _run_script(db, step, dialect, translate=True)
    else:
        await step(db)
    await db.execute(
        "INSERT INTO plugin_schema (plugin, version, updated_at) VALUES (?, ?, ?)"
        " ON CONFLICT(plugin) DO UPDATE SET version = excluded.version,"
        " updated_at = excluded.updated_at",
        (name, number, time.time()))


async def _run_script(db: aiosqlite.Connection, script: str, dialect: str, *,
                      translate: bool) -> None:
    if dialect == "postgresql":
        if translate:
            from bot.storage.pg_dialect import postgres_ddl

            script = postgres_ddl(script)
        # PostgreSQL runs a script's statements in one call (inside the step's transaction).
        await db.executescript(script)
        return
    for statement in split_statements(script):
        await db.execute(statement)


def split_statements(script: str) -> list[str]:
    """The statements of an SQL script, in order.

    ``executescript`` would commit the transaction the step runs in, so the
    script is cut into statements that run one by one inside it. SQLite's own
    ``complete_statement`` decides where one ends, so a ``;`` inside a string,
    a comment or a trigger body does not cut it.
    """
    statements: list[str] = []
    pending = ""
    for piece in script.split(";"):
        pending += piece + ";"
        if sqlite3.complete_statement(pending):
            if pending.strip(" \t\r\n;"):
                statements.append(pending.strip())
            pending = ""
    if pending.strip(" \t\r\n;"):
        raise ValueError(f"incomplete SQL statement: {pending.strip()[:80]!r}")
    return statements
