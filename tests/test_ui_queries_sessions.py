"""The Control UI's query layer for sessions, runs and errors, on SQLite and PostgreSQL:
keyset pages that cover every row once, the filters, the message search (schema step
24's index, kept in step with new messages), transcripts and run traces."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiosqlite
import pytest

from bot.contracts.llm import ChatMessage, ToolCall
from bot.storage import db as dbmod
from bot.storage.schema import MIGRATIONS
from bot.storage.sessions import RunRecord, SessionStore
from bot.ui.queries import errors as eq
from bot.ui.queries import runs as rq
from bot.ui.queries import sessions as sq
from bot.ui.queries.reads import BadCursor
from tests.ui_sessions_seed import Seeded, seed, session_key


@pytest.fixture
async def seeded(database_url: str) -> AsyncIterator[tuple[SessionStore, Seeded]]:
    store = await SessionStore.open(database_url)
    try:
        info = await seed(store.db, store.lock, sessions=60, messages=1800, runs=300,
                          errors=120)
        yield store, info
    finally:
        await store.close()


async def _all_pages(store: SessionStore, f: sq.SessionFilter) -> list[sq.SessionRow]:
    rows: list[sq.SessionRow] = []
    before = None
    while True:
        page = await sq.list_sessions(store, f, before, limit=7)
        rows.extend(page.rows)
        if page.before is None:
            return rows
        before = page.before


async def test_the_list_pages_every_session_once_newest_first(
        seeded: tuple[SessionStore, Seeded]) -> None:
    store, info = seeded
    rows = await _all_pages(store, sq.SessionFilter())
    assert [r.id for r in rows] == list(reversed(info.session_ids))
    assert rows[0].last_role == "tool" and rows[0].last_text
    assert rows[0].parts.agent == "default" or rows[0].parts.agent == "support"
    # Two sessions active at the same instant: the id breaks the tie, nothing is lost.
    await store.db.execute("UPDATE sessions SET updated_at = ? WHERE id IN (?, ?)",
                           (1.0, 5, 6))
    again = await _all_pages(store, sq.SessionFilter())
    assert sorted(r.id for r in again) == sorted(info.session_ids)
    assert [r.id for r in again[-2:]] == [6, 5]


async def test_filters_by_agent_channel_and_user(seeded: tuple[SessionStore, Seeded]) -> None:
    store, info = seeded
    keys = {i + 1: session_key(i) for i in range(info.sessions)}
    support = await _all_pages(store, sq.SessionFilter(agent="support"))
    assert {r.id for r in support} == {i for i, k in keys.items() if k.startswith("support:")}
    slack = await _all_pages(store, sq.SessionFilter(channel="slack"))
    assert {r.id for r in slack} == {i for i, k in keys.items() if k.split(":")[1] == "slack"}
    both = await _all_pages(store, sq.SessionFilter(channel="slack", agent="default"))
    assert {r.id for r in both} == {i for i, k in keys.items()
                                   if k.startswith("default:slack:")}
    # LIKE wildcards in a filter are literal.
    assert await _all_pages(store, sq.SessionFilter(agent="%")) == []
    assert await _all_pages(store, sq.SessionFilter(channel="_lack")) == []
    # A user: their direct chat, and the group they wrote in.
    direct = keys[3].rsplit(":", 1)[1]
    assert [r.id for r in await _all_pages(store, sq.SessionFilter(user=direct))] == [3]
    group_writer = "u28_4"  # the seed's sender in group session 5 (index 4)
    assert [r.id for r in await _all_pages(store, sq.SessionFilter(user=group_writer))] == [5]


async def test_search_finds_words_and_pages_hits(seeded: tuple[SessionStore, Seeded]) -> None:
    store, info = seeded
    page = await sq.search(store, sq.SessionFilter(text=info.rare_word))
    assert [h.session_id for h in page.hits] == [info.sessions] and page.before is None
    assert info.rare_word in page.hits[0].snippet[1::2]
    # Every word is required; FTS5 syntax in the text is just words.
    assert (await sq.search(store, sq.SessionFilter(text=f"{info.rare_word} nowhereword"))
            ).hits == []
    for hostile in ('"', "NEAR(a b", "a OR", "*", "col:x", "'; DROP TABLE messages; --"):
        await sq.search(store, sq.SessionFilter(text=hostile))
    # A common word pages by message id, newest first, without repeats.
    seen: list[int] = []
    before = None
    for _ in range(3):
        hits = await sq.search(store, sq.SessionFilter(text="invoice"), before, limit=20)
        seen.extend(h.message_id for h in hits.hits)
        before = hits.before
        assert before is not None
    assert seen == sorted(set(seen), reverse=True) and len(seen) == 60
    # Filters narrow the hits.
    narrowed = await sq.search(store, sq.SessionFilter(text="invoice", agent="support"))
    assert narrowed.hits and all(h.session_key.startswith("support:") for h in narrowed.hits)


async def test_search_follows_new_and_deleted_messages(
        seeded: tuple[SessionStore, Seeded]) -> None:
    store, _ = seeded
    session = await store.get("default:console:direct:newcomer")
    await store.append_run(session, "r-new", [
        ChatMessage("user", "where is my parcel <script>", sender_id="newcomer"),
        ChatMessage("assistant", "Checking the parcels now.")])
    hits = (await sq.search(store, sq.SessionFilter(text="parcel"))).hits
    assert [h.session_id for h in hits] == [session.id, session.id]
    assert [h.session_id for h in (await sq.search(
        store, sq.SessionFilter(text="parcel", user="newcomer"))).hits] == [session.id] * 2
    await store.db.execute("DELETE FROM messages WHERE session_id = ?", (session.id,))
    assert (await sq.search(store, sq.SessionFilter(text="parcel"))).hits == []


async def test_bad_cursors_are_refused(seeded: tuple[SessionStore, Seeded]) -> None:
    store, _ = seeded
    for cursor in ("x", "1.5", "nan~3", "1.0~x", "-1"):
        with pytest.raises(BadCursor):
            await sq.list_sessions(store, sq.SessionFilter(), cursor)
    with pytest.raises(BadCursor):
        await sq.transcript(store, 1, "1; DROP")
    with pytest.raises(BadCursor):
        await eq.list_errors(store, eq.ErrorFilter(), "zzz")


async def test_transcript_pages_and_decodes_tool_calls(
        seeded: tuple[SessionStore, Seeded]) -> None:
    store, info = seeded
    sid = info.session_ids[0]
    first = await sq.transcript(store, sid, limit=10)
    assert len(first.messages) == 10 and first.before is not None
    ids = [m.id for m in first.messages]
    assert ids == sorted(ids)
    older = await sq.transcript(store, sid, first.before, limit=100)
    assert [m.id for m in older.messages][-1] < ids[0] and older.before is None
    whole = [m.id for m in older.messages] + ids
    assert len(whole) == 30 and whole == sorted(whole)
    call = next(m for m in first.messages if m.tool_calls)
    assert call.tool_calls[0].name == "shell"
    assert json.loads(call.tool_calls[0].arguments)["command"].startswith("echo ")
    assert await sq.newest_message_id(store, sid) == ids[-1]
    assert await sq.messages_after(store, sid, ids[-1]) == []
    assert [m.id for m in await sq.messages_after(store, sid, ids[-3])] == ids[-2:]
    detail = await sq.session_detail(store, sid)
    assert detail is not None and detail.row.key == session_key(0)
    assert await sq.session_detail(store, 10_000) is None
    runs = await sq.runs_of(store, session_key(0), [m.run_id for m in first.messages])
    assert {m.run_id for m in first.messages} <= {r.id for r in runs}
    assert all(r.agent in ("default", "support") for r in runs)


async def test_run_trace_lays_out_spans_and_delivery(
        seeded: tuple[SessionStore, Seeded]) -> None:
    store, info = seeded
    run_id = info.run_ids[5]
    now = time.time()
    await store.db.execute(
        "INSERT INTO inbox (id, channel, event_id, session_key, chat_id, kind, message, state,"
        " run_id, received_at) VALUES (1, 'telegram', 'e1', 'k', 'c', 'message', '{}', 'done',"
        " ?, ?)", (run_id, now))
    await store.db.execute(
        "INSERT INTO outbox (id, inbox_id, channel, chat_id, message, state, attempts,"
        " created_at, updated_at) VALUES (1, 1, 'telegram', 'c', '{}', 'delivered', 2, ?, ?)",
        (now, now + 0.2))
    trace = await rq.run_trace(store, run_id)
    assert trace is not None and trace.run.id == run_id
    assert [b.kind for b in trace.bars] == ["agent", "llm", "delivery"]
    llm = trace.bars[1]
    assert llm.depth == 1 and dict(llm.facts)["cache_read_tokens"] == "600"
    assert 0 < llm.offset < 100 and 0 < llm.width <= 100
    assert trace.deliveries[0].attempts == 2 and trace.session_id is not None
    assert await rq.run_trace(store, "no-such-run") is None


async def test_error_list_filters_pages_and_details(
        seeded: tuple[SessionStore, Seeded]) -> None:
    store, info = seeded
    rows: list[eq.ErrorRow] = []
    before = None
    while True:
        page = await eq.list_errors(store, eq.ErrorFilter(), before, limit=25)
        rows.extend(page.rows)
        before = page.before
        if before is None:
            break
    assert sorted(r.id for r in rows) == sorted(info.error_ids)
    assert [(r.timestamp, r.id) for r in rows] == sorted(
        ((r.timestamp, r.id) for r in rows), reverse=True)
    timeouts = (await eq.list_errors(store, eq.ErrorFilter(kind="timeout"), limit=500)).rows
    assert len(timeouts) == 24 and {r.kind for r in timeouts} == {"timeout"}
    sql = (await eq.list_errors(store, eq.ErrorFilter(tool="sql"), limit=500)).rows
    assert len(sql) == 24 and {r.tool_name for r in sql} == {"sql"}
    user = session_key(0).rsplit(":", 1)[1]
    mine = (await eq.list_errors(store, eq.ErrorFilter(user=user), limit=500)).rows
    assert mine and {r.session_key for r in mine} == {session_key(0)}
    assert await eq.tool_names(store) == sorted({"shell", "web_fetch", "read_file", "sql",
                                                 "memory_search"})
    detail = await eq.error_detail(store, info.error_ids[0])
    assert detail is not None and detail.kind == "timeout" and detail.session_id == 1
    assert json.loads(detail.report)["id"] == info.error_ids[0]
    assert await eq.error_detail(store, "err_nothing") is None


async def test_migrating_indexes_the_messages_already_stored(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    db = await aiosqlite.connect(path, isolation_level=None)
    for number, script in enumerate(MIGRATIONS[:-1], start=1):
        await db.executescript(f"BEGIN;\n{script}\nPRAGMA user_version = {number:d};\nCOMMIT;")
    await db.execute("INSERT INTO sessions (id, key, created_at, updated_at)"
                     " VALUES (1, 'default:console:direct:old', 1, 1)")
    await db.execute("INSERT INTO messages (session_id, run_id, role, content, created_at)"
                     " VALUES (1, 'r', 'user', 'an archaeological remark', 1)")
    await db.close()
    store = await SessionStore.open(path)
    try:
        assert await dbmod.schema_version(store.db) == len(MIGRATIONS)
        hits = (await sq.search(store, sq.SessionFilter(text="archaeological"))).hits
        assert [h.session_id for h in hits] == [1]
    finally:
        await store.close()


async def test_a_failed_run_and_its_record_show_up(database_url: str) -> None:
    store = await SessionStore.open(database_url)
    try:
        session = await store.get("default:console:direct:ann")
        now = time.time()
        await store.append_run(
            session, "r1", [ChatMessage("user", "hi", sender_id="ann"),
                            ChatMessage("assistant", "", tool_calls=(
                                ToolCall("c1", "shell", {"command": "<b>x</b>"}),)),
                            ChatMessage("tool", "out", tool_call_id="c1", tool_name="shell")],
            record=RunRecord("r1", session.key, "failed", now, now + 1, error="kaput"))
        runs = await sq.runs_of(store, session.key)
        assert [(r.id, r.status, r.error) for r in runs] == [("r1", "failed", "kaput")]
        page = await sq.transcript(store, session.id)
        assert [m.role for m in page.messages] == ["user", "assistant", "tool"]
        assert json.loads(page.messages[1].tool_calls[0].arguments) == {"command": "<b>x</b>"}
    finally:
        await store.close()


async def test_a_copied_database_searches_its_messages_once(tmp_path: Path,
                                                            pg_url: str) -> None:
    from bot.storage.copy import copy_database

    source = await SessionStore.open(tmp_path / "a.db")
    copies = [await SessionStore.open(tmp_path / "b.db"), await SessionStore.open(pg_url)]
    try:
        info = await seed(source.db, source.lock, sessions=5, messages=50, runs=10, errors=2)
        for table in ("memory_fts", "memory_chunks", "memory_files"):  # the memory plugin's
            await source.db.execute(f"DROP TABLE {table}")
        for target in copies:
            await copy_database(source.db, target.db)
            hits = (await sq.search(target, sq.SessionFilter(text=info.rare_word))).hits
            assert [h.session_id for h in hits] == [5]
    finally:
        for store in (source, *copies):
            await store.close()


async def _all_hits(store: SessionStore, f: sq.SessionFilter) -> list[int]:
    ids: list[int] = []
    before = None
    while True:
        page = await sq.search(store, f, before, limit=40)
        ids.extend(h.message_id for h in page.hits)
        if page.before is None:
            return ids
        before = page.before


async def test_a_search_past_the_newest_window_finds_the_same_hits(
        seeded: tuple[SessionStore, Seeded], monkeypatch: pytest.MonkeyPatch) -> None:
    store, info = seeded
    wide = await _all_hits(store, sq.SessionFilter(text="invoice"))
    rare = await _all_hits(store, sq.SessionFilter(text=info.rare_word, agent="support"))
    assert len(wide) > 100 and len(rare) == 1
    # PostgreSQL searches the newest messages by walking them, the rest by the index.
    monkeypatch.setattr(sq, "NEWEST_WINDOW", 10)
    assert await _all_hits(store, sq.SessionFilter(text="invoice")) == wide
    assert await _all_hits(store, sq.SessionFilter(text=info.rare_word, agent="support")) \
        == rare
    narrowed = await _all_hits(store, sq.SessionFilter(text="invoice", user="u2_2"))
    assert narrowed and set(narrowed) < set(wide)


async def test_migrating_postgres_indexes_the_messages_already_stored(pg_url: str) -> None:
    from bot.storage.postgres import PgConnection

    db = await PgConnection.open(pg_url, 2)
    try:
        for number in range(1, len(MIGRATIONS)):
            await db.executescript(dbmod.postgres_step(number))
        await db.execute("CREATE TABLE roost_schema (version BIGINT NOT NULL)")
        await db.execute("INSERT INTO roost_schema (version) VALUES (?)", (len(MIGRATIONS) - 1,))
        await db.execute("INSERT INTO sessions (id, key, created_at, updated_at)"
                         " VALUES (1, 'default:console:direct:old', 1, 1)")
        await db.execute("INSERT INTO messages (session_id, run_id, role, content, created_at)"
                         " VALUES (1, 'r', 'user', 'an archaeological remark', 1)")
    finally:
        await db.close()
    store = await SessionStore.open(pg_url)
    try:
        assert await dbmod.schema_version(store.db) == len(MIGRATIONS)
        hits = (await sq.search(store, sq.SessionFilter(text="archaeology"))).hits
        assert [h.session_id for h in hits] == [1]
    finally:
        await store.close()
