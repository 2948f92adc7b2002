"""A test app's new database (a copy of one migrated once per process) is what Roost makes
on a new data dir: the same schema, version and journal mode, and writable."""

from __future__ import annotations

from pathlib import Path

import aiosqlite

from bot.app.roost import Roost
from bot.config.settings import Settings
from bot.pluginhost.manager import get_plugin_manager
from bot.testing.app import create_app, scripted

SCHEMA = "SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name"


async def shape(path: Path) -> tuple[object, ...]:
    async with aiosqlite.connect(path) as db:
        found = []
        for query in (SCHEMA, "PRAGMA user_version", "PRAGMA journal_mode"):
            async with db.execute(query) as cur:
                found.append([tuple(r) for r in await cur.fetchall()])
        return tuple(found)


async def test_a_new_apps_database_is_the_one_roost_create_makes(tmp_path: Path) -> None:
    made = await Roost.create(Settings(data_dir=tmp_path / "made"),
                              host=get_plugin_manager(load_entry_points=False),
                              provider=scripted({"reply": "hi"}))
    await made.close()
    app, _ = await create_app(scripted({"reply": "hi"}), data_dir=tmp_path / "app")
    try:
        await app.store.db.execute("CREATE TABLE probe (x)")  # the copy is writable
    finally:
        await app.close()
    copy, fresh = await shape(tmp_path / "app" / "roost.db"), \
        await shape(tmp_path / "made" / "roost.db")
    assert [r for r in copy[0] if r[1] != "probe"] == fresh[0]
    assert copy[1:] == fresh[1:] and fresh[1] != [(0,)]


async def test_an_existing_database_is_left_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "roost.db"
    async with aiosqlite.connect(path) as db:
        await db.execute("CREATE TABLE mine (x)")
        await db.execute("PRAGMA user_version = 0")
    app, _ = await create_app(scripted({"reply": "hi"}), data_dir=tmp_path)
    await app.close()
    tables = [r[1] for r in (await shape(path))[0]]
    assert "mine" in tables  # migrated in place, not replaced by the copy
