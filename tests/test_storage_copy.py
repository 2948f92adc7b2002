"""``roost db migrate`` and ``roost db copy``: moving a deployment from SQLite to PostgreSQL."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from bot.app.cli import cli
from bot.contracts.llm import ChatMessage
from bot.contracts.messages import InboundMessage, OutboundMessage
from bot.storage.errors import ErrorStore
from bot.storage.inbox import Inbox
from bot.storage.jobs import Job, JobStore
from bot.storage.plugin_tables import migrate_plugin
from bot.storage.sessions import SessionStore
from plugins.memory.index import MemoryIndex
from plugins.memory.state import MIGRATIONS as MEMORY_MIGRATIONS


async def _roost(*args: str, data: Path) -> Result:
    env = {"ROOST_DISABLE_PLUGIN_AUTOLOAD": "1", "ROOST_DATA_DIR": str(data)}
    return await asyncio.to_thread(CliRunner().invoke, cli, list(args), env=env,
                                   catch_exceptions=False)


async def _fill(url: str, workspaces: Path) -> int:
    """A small deployment's worth of rows in every kind of table; returns a session id."""
    store = await SessionStore.open(url)
    try:
        session = await store.get("default:telegram:direct:1")
        await store.append_run(session, "r1", [ChatMessage("user", "hello"),
                                               ChatMessage("assistant", "hi there")])
        other = await store.get("default:telegram:direct:2")
        await store.append_run(other, "r2", [ChatMessage("user", "second")])
        await ErrorStore(store.db, store.lock).store("s", "web", "boom")
        await JobStore(store.db, store.lock).insert(
            Job("j1", "cron", "", "0 9 * * *", "UTC", "standup", owner_id="1",
                channel="telegram", chat_id="1", created_at=1.0))
        inbox = Inbox(store.db, store.lock, store.writer)
        entry = await inbox.add(InboundMessage("telegram", "1", "direct", "1", "hey",
                                               event_id="7"), session.key)
        assert entry is not None
        await store.writer.write(inbox.finish([entry.id], OutboundMessage("telegram", "1",
                                                                          "ok")))
        (workspaces / "u1").mkdir(parents=True)
        (workspaces / "u1" / "MEMORY.md").write_text("Ann drinks green tea.\n")
        await MemoryIndex(store.db, store.lock, workspaces, 100_000).sync(workspaces / "u1")
        return session.id
    finally:
        await store.close()


async def test_copy_moves_every_table_with_its_ids_and_advances_sequences(
        tmp_path: Path, pg_url: str) -> None:
    data = tmp_path / "data"
    source = f"sqlite:///{data / 'roost.db'}"
    assert (await _roost("db", "migrate", "--url", source, data=data)).exit_code == 0
    session_id = await _fill(source, data / "workspaces")

    result = await _roost("db", "copy", "--from", source, "--to", pg_url, data=data)
    assert result.exit_code == 0, result.output
    assert "row counts match" in result.output
    assert "memory_fts: 1 rows" in result.output

    store = await SessionStore.open(pg_url)
    try:
        copied = await store.get("default:telegram:direct:1")
        assert copied.id == session_id
        assert [m.content for m in copied.messages] == ["hello", "hi there"]
        fresh = await store.get("default:telegram:direct:3")
        assert fresh.id > session_id + 1  # the identity sequence moved past the copied ids
        assert len(await ErrorStore(store.db, store.lock).list()) == 1
        assert (await JobStore(store.db, store.lock).get("j1")) is not None
        hits = await MemoryIndex(store.db, store.lock, data / "workspaces", 100_000).search(
            data / "workspaces" / "u1", "tea", 3)
        assert [h.path for h in hits] == ["MEMORY.md"]
    finally:
        await store.close()

    again = await _roost("db", "copy", "--from", source, "--to", pg_url, data=data)
    assert again.exit_code == 1
    assert "already holds rows" in again.output
    forced = await _roost("db", "copy", "--from", source, "--to", pg_url, "--force",
                          data=data)
    assert forced.exit_code == 0, forced.output


async def test_copy_back_from_postgresql_to_sqlite(tmp_path: Path, pg_url: str) -> None:
    data = tmp_path / "data"
    assert (await _roost("db", "migrate", "--url", pg_url, data=data)).exit_code == 0
    session_id = await _fill(pg_url, data / "workspaces")
    target = f"sqlite:///{tmp_path / 'back.db'}"
    result = await _roost("db", "copy", "--from", pg_url, "--to", target, data=data)
    assert result.exit_code == 0, result.output
    store = await SessionStore.open(target)
    try:
        assert (await store.get("default:telegram:direct:1")).id == session_id
    finally:
        await store.close()


async def test_migrate_reports_the_schema_version_and_refuses_an_unknown_scheme(
        tmp_path: Path, pg_url: str) -> None:
    result = await _roost("db", "migrate", "--url", pg_url, data=tmp_path)
    assert result.exit_code == 0
    assert "schema version" in result.output
    refused = await _roost("db", "migrate", "--url", "mysql://x/y", data=tmp_path)
    assert refused.exit_code == 1
    assert "unsupported database URL scheme: mysql://" in refused.output


async def test_admin_commands_use_the_configured_postgresql_database(
        tmp_path: Path, pg_url: str) -> None:
    env = {"ROOST_DISABLE_PLUGIN_AUTOLOAD": "1", "ROOST_DATA_DIR": str(tmp_path / "data"),
           "ROOST_DATABASE_URL": pg_url}

    async def roost(*args: str) -> Result:
        return await asyncio.to_thread(CliRunner().invoke, cli, list(args), env=env,
                                       catch_exceptions=False)

    disabled = await roost("plugins", "disable", "plugins.sql_tool")
    assert disabled.exit_code == 0, disabled.output
    listed = await roost("pairing", "list")
    assert listed.exit_code == 0, listed.output
    errors = await roost("errors", "list")
    assert errors.exit_code == 0, errors.output
    store = await SessionStore.open(pg_url)
    try:
        rows = await store.db.execute_fetchall("SELECT name FROM plugin_state WHERE enabled = 0")
        assert [r[0] for r in rows] == ["plugins.sql_tool"]
    finally:
        await store.close()
    assert not (tmp_path / "data" / "roost.db").exists()


async def test_copy_goes_in_batches_and_keeps_every_row(
        tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from bot.storage import copy as copymod

    monkeypatch.setattr(copymod, "BATCH", 7)
    source = await SessionStore.open(f"sqlite:///{tmp_path / 's.db'}")
    target = await SessionStore.open(pg_url)
    try:
        # SQLite's core step 7 made the memory tables; on PostgreSQL the plugin makes them.
        await migrate_plugin(target.db, target.lock, MEMORY_MIGRATIONS)
        errors = ErrorStore(source.db, source.lock)
        for i in range(30):
            await errors.store(f"s{i}", "t", f"e{i}")
        copied = await copymod.copy_database(source.db, target.db)
        assert {c.table: c.target_rows for c in copied}["agent_errors"] == 30
        ids = {e.id for e in await ErrorStore(target.db, target.lock).list(limit=None)}
        assert ids == {e.id for e in await errors.list(limit=None)}
    finally:
        await source.close()
        await target.close()
