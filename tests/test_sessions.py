"""The session store: group commit, isolation of a bad run, migrations, LRU."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import aiosqlite
import pytest

from bot.contracts.llm import ChatMessage, ToolCall, Usage
from bot.storage import db as dbmod
from bot.storage import schema
from bot.storage.sessions import Session, SessionStore


def exchange(n: int) -> list[ChatMessage]:
    call = ToolCall(f"c{n}", "list_files", {})
    return [ChatMessage("user", f"q{n}", sender_id="u"),
            ChatMessage("assistant", "", tool_calls=(call,)),
            ChatMessage("tool", "files", tool_call_id=f"c{n}", tool_name="list_files"),
            ChatMessage("assistant", f"a{n}")]


async def test_concurrent_flushes_all_land_and_a_bad_run_does_not_sink_the_batch(
    tmp_path: Path,
) -> None:
    store = await SessionStore.open(tmp_path / "r.db")
    sessions = [await store.get(f"k{i}") for i in range(50)]
    ghost = Session(id=999_999, key="ghost", messages=[], created_at=0, updated_at=0)
    results = await asyncio.gather(
        *(store.append_run(s, f"run{i}", exchange(i), Usage(3, 4)) for i, s in
          enumerate(sessions)),
        store.append_run(ghost, "bad", exchange(99)),  # foreign key violation
        return_exceptions=True,
    )
    assert all(r is None for r in results[:-1])
    assert isinstance(results[-1], aiosqlite.IntegrityError)
    await store.close()
    reopened = await SessionStore.open(tmp_path / "r.db")
    for i in range(50):
        loaded = await reopened.get(f"k{i}")
        assert [m.content for m in loaded.messages] == [f"q{i}", "", "files", f"a{i}"]
        assert loaded.messages[1].tool_calls[0].id == f"c{i}"
        assert (loaded.input_tokens, loaded.output_tokens) == (3, 4)
    await reopened.close()


async def test_the_cache_is_bounded_but_never_evicts_a_session_in_use(tmp_path: Path) -> None:
    store = await SessionStore.open(tmp_path / "r.db", cache_size=3)
    busy = await store.get("busy")
    busy.pins += 1
    for i in range(10):
        await store.get(f"idle{i}")
    assert store.cached_count() == 3
    assert store.cached("busy") is busy
    await store.close()


async def test_migrations_are_versioned_and_a_newer_database_is_refused(tmp_path: Path) -> None:
    store = await SessionStore.open(tmp_path / "r.db")
    assert await dbmod.schema_version(store.db) == len(schema.MIGRATIONS)
    await store.db.execute(f"PRAGMA user_version = {len(schema.MIGRATIONS) + 1}")
    await store.close()
    with pytest.raises(RuntimeError, match="newer than this Roost"):
        await dbmod.connect(tmp_path / "r.db")


async def test_upgrading_an_old_database_keeps_its_spans_and_accepts_judge_spans(
        tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    old = await aiosqlite.connect(path)
    for number, script in enumerate(schema.MIGRATIONS[:9], start=1):
        await old.executescript(f"BEGIN;\n{script}\nPRAGMA user_version = {number};\nCOMMIT;")
    await old.execute("INSERT INTO spans VALUES ('s1', 'r1', NULL, 'llm', 'llm', 1, 2, 0, '{}')")
    await old.commit()
    await old.close()
    db = await dbmod.connect(path)
    try:
        await db.execute(
            "INSERT INTO spans VALUES ('s2', 'r1', NULL, 'judge', 'strict', 1, 2, 0, '{}')")
        async with db.execute("SELECT id, kind FROM spans ORDER BY id") as cur:
            assert await cur.fetchall() == [("s1", "llm"), ("s2", "judge")]
        with pytest.raises(sqlite3.IntegrityError):
            await db.execute(
                "INSERT INTO spans VALUES ('s3', 'r1', NULL, 'bogus', 'x', 1, 2, 0, '{}')")
    finally:
        await db.close()
