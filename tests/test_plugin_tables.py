"""Plugins' own tables: versioned migrations per plugin, retired core columns, no raw SQL."""

from __future__ import annotations

import ast
import asyncio
import logging
import re
import sqlite3
from pathlib import Path

import aiosqlite
import pytest

from bot.pluginhost.manager import PluginHost, get_plugin_manager
from bot.storage import db as dbmod
from bot.storage import schema
from bot.storage.plugin_tables import migrate_plugin, schema_version, split_statements
from bot.storage.sessions import SessionStore
from roost import Migrations, hookimpl
from roost.testing import scripted_provider
from tests.conftest import AppFactory

ROOT = Path(__file__).resolve().parent.parent


async def open_db(path: Path) -> tuple[aiosqlite.Connection, asyncio.Lock]:
    return await dbmod.connect(path), asyncio.Lock()


async def rows(db: aiosqlite.Connection, sql: str) -> list[tuple[object, ...]]:
    async with db.execute(sql) as cur:
        return [tuple(r) for r in await cur.fetchall()]


async def columns(db: aiosqlite.Connection, table: str) -> set[str]:
    return {str(r[0]) for r in await rows(db, f"SELECT name FROM pragma_table_info('{table}')")}


async def test_steps_run_in_order_once_each_under_the_plugins_own_version(
        tmp_path: Path) -> None:
    db, lock = await open_db(tmp_path / "r.db")
    seen: list[int] = []

    async def fill(conn: aiosqlite.Connection) -> None:
        async with conn.execute("SELECT COUNT(*) FROM notes_items") as cur:
            seen.append(int((await cur.fetchone() or [0])[0]))
        await conn.execute("INSERT INTO notes_items (text) VALUES ('from step 2')")

    first = Migrations("notes", ["CREATE TABLE notes_items (id INTEGER PRIMARY KEY, text TEXT);"
                                 " INSERT INTO notes_items (text) VALUES ('a; b');", fill])
    try:
        assert await migrate_plugin(db, lock, first) == 2
        assert await migrate_plugin(db, lock, first) == 0  # nothing twice
        later = Migrations("notes", [*first.steps, "ALTER TABLE notes_items ADD COLUMN n INT"])
        assert await migrate_plugin(db, lock, later) == 1
        assert seen == [1]
        assert await rows(db, "SELECT text FROM notes_items ORDER BY id") == [
            ("a; b",), ("from step 2",)]
        assert "n" in await columns(db, "notes_items")
        assert await schema_version(db, lock, "notes") == 3
        assert await schema_version(db, lock, "other") == 0
        # Roost's own schema version is untouched.
        assert await dbmod.schema_version(db) == len(schema.MIGRATIONS)
    finally:
        await db.close()


async def test_a_failing_step_leaves_nothing_behind_and_runs_again_next_time(
        tmp_path: Path) -> None:
    db, lock = await open_db(tmp_path / "r.db")
    broken = Migrations("notes", [
        "CREATE TABLE notes_a (id INTEGER PRIMARY KEY);",
        "CREATE TABLE notes_b (id INTEGER PRIMARY KEY); INSERT INTO nowhere VALUES (1);",
    ])
    try:
        with pytest.raises(sqlite3.OperationalError):
            await migrate_plugin(db, lock, broken)
        assert await schema_version(db, lock, "notes") == 1
        tables = {r[0] for r in await rows(db, "SELECT name FROM sqlite_master")}
        assert "notes_a" in tables and "notes_b" not in tables  # step 2 rolled back whole
        assert not db.in_transaction
        fixed = Migrations("notes", [broken.steps[0],
                                     "CREATE TABLE notes_b (id INTEGER PRIMARY KEY);"])
        assert await migrate_plugin(db, lock, fixed) == 1
        assert await schema_version(db, lock, "notes") == 2
    finally:
        await db.close()


async def test_a_database_migrated_by_a_newer_plugin_is_refused(tmp_path: Path) -> None:
    db, lock = await open_db(tmp_path / "r.db")
    try:
        await migrate_plugin(db, lock, Migrations("notes", ["SELECT 1", "SELECT 2"]))
        with pytest.raises(RuntimeError, match="upgrade it"):
            await migrate_plugin(db, lock, Migrations("notes", ["SELECT 1"]))
    finally:
        await db.close()


def test_scripts_are_cut_where_sqlite_says_a_statement_ends() -> None:
    script = """
        CREATE TABLE t (x TEXT); -- a comment; with a semicolon
        INSERT INTO t VALUES ('1;2');
        CREATE TRIGGER t_ins AFTER INSERT ON t BEGIN
            INSERT INTO t VALUES ('again;'); SELECT 1;
        END;
    """
    parts = split_statements(script)
    assert len(parts) == 3
    assert parts[1] == "-- a comment; with a semicolon\n        INSERT INTO t VALUES ('1;2');"
    assert parts[2].startswith("CREATE TRIGGER") and parts[2].endswith("END;")
    assert split_statements("  ;\n ") == []
    with pytest.raises(ValueError, match="incomplete"):
        split_statements("CREATE TRIGGER x AFTER INSERT ON t BEGIN SELECT 1;")
    with pytest.raises(ValueError, match="need a name"):
        Migrations(" ", [])


async def test_retired_columns_are_dropped_once_and_a_failed_drop_keeps_them(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    db, lock = await open_db(tmp_path / "r.db")
    try:
        await db.execute("CREATE TABLE t (a INTEGER, old INTEGER NOT NULL DEFAULT 0, idx INT)")
        await db.execute("CREATE INDEX t_idx ON t(idx)")
        assert await dbmod.retire_columns(db, lock, [("t", "old")]) == ["t.old"]
        assert await columns(db, "t") == {"a", "idx"}
        assert await dbmod.retire_columns(db, lock, [("t", "old")]) == []
        # SQLite refuses to drop an indexed column: logged, kept, nothing half-done.
        with caplog.at_level(logging.ERROR, logger="roost.storage.db"):
            assert await dbmod.retire_columns(db, lock, [("t", "a"), ("t", "idx")]) == []
        assert "could not drop retired columns" in caplog.text
        assert await columns(db, "t") == {"a", "idx"}
        assert not db.in_transaction
    finally:
        await db.close()


class NotesPlugin:
    """A plugin with a table of its own."""

    @hookimpl
    def roost_migrations(self) -> Migrations:
        return Migrations("notes", ["CREATE TABLE notes_items (id INTEGER PRIMARY KEY)"])


class BrokenPlugin:
    """A plugin whose migration fails."""

    @hookimpl
    def roost_migrations(self) -> list[Migrations]:
        return [Migrations("broken", ["CREATE TABLE sessions (id INTEGER)"])]


class ThiefPlugin:
    """A plugin that claims another plugin's schema name."""

    @hookimpl
    async def roost_migrations(self) -> Migrations:
        return Migrations("notes", ["CREATE TABLE thief (id INTEGER)"])


def host_with(**plugins: object) -> PluginHost:
    host = get_plugin_manager(load_entry_points=False)
    for name, plugin in plugins.items():
        host.register(plugin, name)
    return host


async def test_startup_migrates_every_plugin_and_disables_one_whose_migration_fails(
        make_app: AppFactory) -> None:
    # pluggy calls the plugin registered last first: notes claims its name first.
    app, _, _ = await make_app(scripted_provider([{"reply": "ok"}]), host=host_with(
        thief=ThiefPlugin(), broken=BrokenPlugin(), notes=NotesPlugin()))
    db, host = app.store.db, app.host
    assert await schema_version(db, app.store.lock, "notes") == 1
    assert await schema_version(db, app.store.lock, "broken") == 0
    assert {"broken", "thief"} <= host.disabled and "notes" not in host.disabled
    assert "roost_migrations: OperationalError" in host.errors["broken"]
    assert "already used by plugin 'notes'" in host.errors["thief"]
    tables = {r[0] for r in await rows(db, "SELECT name FROM sqlite_master")}
    assert "notes_items" in tables and "thief" not in tables
    # A plugin may still need the retired columns to copy them: they stay until
    # every plugin migrated.
    assert {c for _, c in schema.RETIRED_COLUMNS} <= await columns(db, "sessions")


async def test_a_disabled_plugin_is_migrated_too(make_app: AppFactory, tmp_path: Path) -> None:
    data = tmp_path / "data"
    store = await SessionStore.open(data / "roost.db")
    await store.db.execute("INSERT INTO plugin_state VALUES ('notes', 0, 0)")
    await store.close()
    app, _, _ = await make_app(scripted_provider([{"reply": "ok"}]),
                               host=host_with(notes=NotesPlugin()), data_dir=data)
    assert "notes" in app.host.disabled
    assert await schema_version(app.store.db, app.store.lock, "notes") == 1
    assert not {c for _, c in schema.RETIRED_COLUMNS} & await columns(app.store.db, "sessions")


async def test_idle_sessions_and_their_message_counts(tmp_path: Path) -> None:
    from bot.contracts.llm import ChatMessage

    store = await SessionStore.open(tmp_path / "r.db")
    try:
        sessions = [await store.get(f"k{i}") for i in range(3)]
        for n, session in enumerate(sessions):
            await store.append_run(session, f"r{n}", [ChatMessage("user", "hi")] * (n + 1))
        stamps = [s.updated_at for s in sessions]
        archived = await store.get("gone")
        await store.append_run(archived, "rg", [ChatMessage("user", "x")])
        await store.reset("gone")

        idle = await store.idle_sessions(before=stamps[1])
        assert [(a.key, a.updated_at) for a in idle] == [("k0", stamps[0]), ("k1", stamps[1])]
        assert [a.key for a in await store.idle_sessions(before=stamps[2], after=stamps[0])] \
            == ["k1", "k2"]
        ids = [s.id for s in sessions]
        many = [*ids, *range(10_000, 11_200), ids[0]]  # more than one batch, a repeat
        assert await store.message_counts(many) == {ids[0]: 1, ids[1]: 2, ids[2]: 3}
        assert await store.message_counts([]) == {}
    finally:
        await store.close()


CORE_TABLES = sorted(
    {name for script in schema.MIGRATIONS
     for name in re.findall(r"CREATE (?:VIRTUAL )?TABLE (\w+)", script)}
    - {"spans_new", "memory_files", "memory_chunks", "memory_fts"})
"""Roost's own tables (the memory index tables step 7 created now belong to the plugin)."""

ALLOWED_CORE_SQL = {
    # The one-time copy of the flush state Roost kept in sessions (step 7).
    ("plugins/memory/state.py", "sessions"),
}


def test_plugins_issue_no_sql_on_roosts_tables() -> None:
    touching = re.compile(
        r"\b(?:FROM|INTO|UPDATE|JOIN|TABLE|pragma_table_info\(')\s*(" + "|".join(CORE_TABLES)
        + r")\b")
    found = set()
    for path in sorted((ROOT / "plugins").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found |= {(rel, m.group(1).lower()) for m in touching.finditer(node.value)}
    assert found <= ALLOWED_CORE_SQL, sorted(found - ALLOWED_CORE_SQL)
    assert "sessions" in CORE_TABLES and "messages" in CORE_TABLES
