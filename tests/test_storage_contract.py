"""The storage contract, run against both backends: SQLite and a real PostgreSQL server.

Every store is used through the same calls the service makes; each test runs
twice (``database_url``: an SQLite file, then a fresh PostgreSQL database).
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot.app.services import AppServices as Services
from bot.contracts.llm import ChatMessage, ToolCall, Usage
from bot.contracts.messages import InboundMessage, OutboundMessage
from bot.contracts.migrations import Migrations
from bot.contracts.tools import ToolResult
from bot.observability.tracing import Span
from bot.pluginhost.state import load_disabled, save_state
from bot.storage import db as dbmod
from bot.storage.access import AccessStore
from bot.storage.errors import ErrorStore, ResultStore
from bot.storage.inbox import Inbox
from bot.storage.jobs import Job, JobStore
from bot.storage.plugin_tables import migrate_plugin
from bot.storage.retention import prune_stores
from bot.storage.sessions import RunRecord, SessionStore
from bot.storage.usage import UsageStore, day_of, month_of
from plugins.memory.index import MemoryIndex
from plugins.memory.state import MIGRATIONS as MEMORY_MIGRATIONS
from plugins.memory.state import FlushStates


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[SessionStore]:
    opened = await SessionStore.open(database_url)
    try:
        yield opened
    finally:
        await opened.close()


def _message(text: str, event_id: str = "", chat: str = "c1",
             thread: str | None = None) -> InboundMessage:
    return InboundMessage("telegram", chat, "direct", "u1", text, event_id=event_id,
                          thread_id=thread)


async def test_history_runs_and_spans_survive_a_reopen(database_url: str) -> None:
    store = await SessionStore.open(database_url)
    session = await store.get("default:telegram:direct:1")
    started = time.time()
    record = RunRecord("run-1", session.key, "completed", started, started + 1, iterations=2,
                       input_tokens=10, output_tokens=5, model="m")
    span = Span("run-1", "tool", "read_file", started)
    await store.append_run(
        session, "run-1",
        [ChatMessage("user", "hi", sender_id="1"),
         ChatMessage("assistant", "", tool_calls=(ToolCall("c1", "read_file", {"p": 1}),)),
         ChatMessage("tool", "ok", tool_call_id="c1", tool_name="read_file", is_error=True),
         ChatMessage("assistant", "done")],
        usage=Usage(10, 5), model="m", provider="p", record=record, spans=[span])
    await store.record_run(record, [span])  # written again: replaced, not doubled
    await store.set_facts(session, ["likes tea"])
    await store.close()

    reopened = await SessionStore.open(database_url)
    try:
        again = await reopened.get(session.key)
        assert again.id == session.id
        assert [m.content for m in again.messages] == ["hi", "", "ok", "done"]
        assert again.messages[1].tool_calls[0].arguments == {"p": 1}
        assert again.messages[2].is_error is True
        assert (again.input_tokens, again.output_tokens, again.model) == (10, 5, "m")
        assert again.facts == ["likes tea"]
        runs = await reopened.runs(session.key)
        assert [(r.run_id, r.iterations) for r in runs] == [("run-1", 2)]
        assert [s.name for s in await reopened.spans("run-1")] == ["read_file"]
        fresh = await reopened.reset(session.key)
        assert fresh.id != session.id and fresh.messages == []
        counts = await reopened.message_counts([session.id, fresh.id])
        assert counts.get(session.id) == 4
    finally:
        await reopened.close()


async def test_compaction_keeps_the_summary_and_the_tail(store: SessionStore) -> None:
    session = await store.get("k")
    await store.append_run(session, "r", [ChatMessage("user", str(i)) for i in range(5)])
    await store.compact(session, 3, "summary of 0-2")
    store._cache.clear()
    again = await store.get("k")
    assert again.summary == "summary of 0-2"
    assert [m.content for m in again.messages] == ["3", "4"]


async def test_errors_and_large_results_round_trip_and_expire(store: SessionStore) -> None:
    clock = [1_000_000.0]
    errors = ErrorStore(store.db, store.lock, clock=lambda: clock[0])
    results = ResultStore(store.db, store.lock, clock=lambda: clock[0])
    stored = await asyncio.gather(*(errors.store("s1", "web", {"message": f"boom {i}"})
                                    for i in range(20)))
    assert len({e.id for e in stored}) == 20
    got = await errors.get(stored[0].id, session_id="s1")
    assert got is not None and got.raw_error == {"message": "boom 0"}
    assert await errors.get(stored[0].id, session_id="other") is None
    assert len(await errors.list(session_id="s1", tool_name="web", limit=None)) == 20
    big = "x" * 200_000
    result_id = await results.put("s1", "fetch", big)
    piece = await results.get_slice(result_id, 100, 50)
    assert piece is not None and piece[0] == "x" * 50
    clock[0] += 40 * 86_400
    assert await errors.delete_older_than(30) == 20
    assert await results.delete_older_than(30) == 1


async def test_cron_claims_are_atomic_and_capped(store: SessionStore) -> None:
    jobs = JobStore(store.db, store.lock)
    job = Job("j1", "cron", "", "* * * * *", "UTC", "hi", owner_id="u1", channel="telegram",
              chat_id="c1", created_at=1.0)
    assert await jobs.insert(job, max_per_owner=1)
    second = Job("j2", "cron", "", "* * * * *", "UTC", "hi", owner_id="u1",
                 channel="telegram", chat_id="c1", created_at=2.0)
    assert not await jobs.insert(second, max_per_owner=1)
    with pytest.raises(sqlite3.IntegrityError):
        await jobs.insert(job)
    await jobs.upsert(Job("sys", "system", "retention", "@daily", "UTC", created_at=3.0))
    await jobs.upsert(Job("sys", "system", "retention", "@hourly", "UTC", created_at=3.0))
    assert (await jobs.get("sys")).schedule == "@hourly"  # type: ignore[union-attr]
    # Two schedulers (replicas) claiming the same fire time: exactly one wins.
    wins = await asyncio.gather(*(jobs.claim([("j1", 60.0), ("sys", 60.0)])
                                  for _ in range(4)))
    assert sorted(i for won in wins for i in won) == ["j1", "sys"]
    assert await jobs.claim([("j1", 60.0)]) == set()
    assert await jobs.claim([("j1", 120.0), ("gone", 120.0)]) == {"j1"}
    assert await jobs.existing(["j1", "gone"]) == {"j1"}
    assert [j.id for j in await jobs.find(channel="telegram", owner_id="u1")] == ["j1"]
    assert await jobs.delete("j1", channel="telegram", owner_id="u1")
    await jobs.delete_many(["sys"])
    assert await jobs.all() == []


async def test_plugin_state_and_plugin_migrations(store: SessionStore) -> None:
    await save_state(store.db, store.lock, "plugins.web", False)
    await save_state(store.db, store.lock, "plugins.sql", False)
    await save_state(store.db, store.lock, "plugins.sql", True)
    assert await load_disabled(store.db, store.lock) == {"plugins.web"}

    steps = Migrations("demo", [
        "CREATE TABLE demo_items (id INTEGER PRIMARY KEY, name TEXT NOT NULL, size REAL)",
        {"sqlite": "CREATE INDEX demo_items_name ON demo_items(name COLLATE NOCASE)",
         "postgresql": "CREATE INDEX demo_items_name ON demo_items(lower(name))"},
    ])
    assert await migrate_plugin(store.db, store.lock, steps) == 2
    assert await migrate_plugin(store.db, store.lock, steps) == 0
    cur = await store.db.execute("INSERT INTO demo_items (name, size) VALUES (?, ?)", ("a", 0.5))
    assert cur.lastrowid == 1
    unknown = Migrations("other", [{"oracle": "CREATE TABLE x (y INT)"}])
    with pytest.raises(RuntimeError, match=r"no (sqlite|postgresql) text"):
        await migrate_plugin(store.db, store.lock, unknown)


async def test_two_processes_migrating_a_plugin_together_apply_each_step_once(
        database_url: str) -> None:
    first, second = (await SessionStore.open(database_url), await SessionStore.open(database_url))
    try:
        steps = Migrations("race", ["CREATE TABLE race_t (id INTEGER PRIMARY KEY)",
                                    "ALTER TABLE race_t ADD COLUMN v TEXT"])
        ran = await asyncio.gather(migrate_plugin(first.db, first.lock, steps),
                                   migrate_plugin(second.db, second.lock, steps))
        # Neither failed on a table the other created: a step found recorded is skipped.
        assert len(ran) == 2
        assert await migrate_plugin(first.db, first.lock, steps) == 0
        await first.db.execute("INSERT INTO race_t (v) VALUES (?)", ("x",))
    finally:
        await first.close()
        await second.close()


async def test_pairing_approval_and_revocation(store: SessionStore) -> None:
    access = AccessStore(store.db, store.lock, store.writer, ttl=3600)
    refusal = await access.refuse("telegram", "42", "42", "Ann")
    again = await access.refuse("telegram", "42", "42", "Ann")
    assert again.code == refusal.code and again.notify is False
    approved = await access.approve(refusal.code, "admin")
    assert approved is not None and approved.user_id == "42"
    assert await access.approve(refusal.code, "admin") is None  # used once
    assert await access.is_paired("telegram", "42")
    assert [u.user_id for u in await access.paired()] == ["42"]
    assert await access.revoke("telegram", "42")
    assert not await access.revoke("telegram", "42")


async def test_usage_counters_add_up_per_day_and_month(store: SessionStore) -> None:
    usage = UsageStore(store.db, store.lock, store.writer, clock=lambda: 1_795_000_000.0)
    for _ in range(3):
        usage.record([("user", "telegram:1"), ("agent", "default")], 100, 20, cost=0.25)
    usage.record([("user", "telegram:2")], 5, 5)
    await usage.flush()
    day, month = day_of(1_795_000_000.0), month_of(1_795_000_000.0)
    assert await usage.spent("user", "telegram:1", day) == 360
    assert await usage.spent("agent", "default", month) == 360
    assert await usage.cost("user", "telegram:1", day) == pytest.approx(0.75)
    top = await usage.top("user", day)
    assert [(s.subject, s.tokens, s.runs) for s in top] == [("telegram:1", 360, 3),
                                                            ("telegram:2", 10, 1)]


async def test_inbox_is_idempotent_and_replays_its_journal(store: SessionStore) -> None:
    inbox = Inbox(store.db, store.lock, store.writer, clock=lambda: 1_000.0)
    first = await inbox.add(_message("hi", "101"), "k")
    assert first is not None
    assert await inbox.add(_message("hi", "101"), "k") is None  # a redelivery
    second = await inbox.add(_message("more", "102", thread="t9"), "k", running=True)
    assert second is not None and second.state == "running"
    await inbox.started([first.id], "run-1")
    journal = await inbox.journal(first.id)
    await journal.turn(ChatMessage("assistant", "", tool_calls=(ToolCall("c", "t", {}),)))
    journal.result("c", ToolResult("done"))
    await journal.sync()
    replay = await inbox.journal(first.id)
    assert replay.next_turn() is not None and replay.results["c"].content == "done"
    inbox.requeue([first.id])
    await inbox.writer.write(lambda db: asyncio.sleep(0))
    open_entries = await inbox.unfinished()
    assert [(e.id, e.state, e.attempts) for e in open_entries] == [
        (first.id, "pending", 0), (second.id, "running", 1)]
    assert await inbox.cursors("telegram", 0, 10) == {"c1": "101", "c1:t9": "102"}
    outbox_id = await store.writer.write(
        inbox.finish([first.id, second.id], OutboundMessage("telegram", "c1", "answer")))
    assert await inbox.unfinished() == []
    pending = await inbox.undelivered()
    assert [(o.id, o.message.text) for o in pending] == [(outbox_id, "answer")]
    inbox.delivered(outbox_id, "m-77")
    await inbox.writer.write(lambda db: asyncio.sleep(0))
    assert await inbox.undelivered() == []
    inbox.clock = lambda: 1_000.0 + 10 * 86_400
    assert await inbox.prune(7) == 2


async def test_old_runs_and_their_spans_are_pruned_and_kept_traces_stay_whole(
        store: SessionStore, caplog: pytest.LogCaptureFixture) -> None:
    day = 86_400.0
    now = time.time()
    key = "default:telegram:direct:1"

    async def run(run_id: str, started: float, ended: float) -> None:
        await store.record_run(RunRecord(run_id, key, "completed", started, ended),
                               [Span(run_id, "agent", "agent", started),
                                Span(run_id, "tool", "read_file", started + 1)])

    for i in range(5):
        await run(f"old-{i}", now - 11 * day, now - 10 * day + i)
    # Started before the cut-off but ended after it: kept, its early spans with it.
    await run("long", now - 8 * day, now - day)
    await run("recent", now - 60, now - 30)

    assert await store.prune_runs(now - 7 * day, batch=2) == (5, 10)
    assert [r.run_id for r in await store.runs(key)] == ["recent", "long"]
    for kept in ("long", "recent"):
        assert [s.name for s in await store.spans(kept)] == ["agent", "read_file"]
    assert await store.spans("old-0") == []

    await run("old-again", now - 11 * day, now - 10 * day)
    with caplog.at_level("INFO", logger="roost.storage.retention"):
        await prune_stores(Services(store), 30, trace_days=7)
    assert [r.run_id for r in await store.runs(key)] == ["recent", "long"]
    assert await store.spans("old-again") == []
    assert "deleted 1 runs and 2 spans older than 7 days" in caplog.text


async def test_memory_search_ranks_alike_on_both_backends(store: SessionStore,
                                                          tmp_path: Path) -> None:
    await migrate_plugin(store.db, store.lock, MEMORY_MIGRATIONS)
    root = tmp_path / "ws"
    workspace = root / "u1"
    (workspace / "memory").mkdir(parents=True)
    (workspace / "MEMORY.md").write_text(
        "# Drinks\nAnn likes green tea with honey. Tea in the morning, tea at night.\n\n"
        "# Work\nAnn writes Python at a bank.\n")
    (workspace / "memory" / "2026-11-22.md").write_text("# Lunch\nWe talked about tea once.\n")
    (workspace / "memory" / "2026-11-23.md").write_text("# Lunch\nWe talked about tea once.\n")
    index = MemoryIndex(store.db, store.lock, root, 100_000)
    hits = await index.search(workspace, "tea", 5)
    # Most occurrences first; equal scores newest file first.
    assert [(h.path, h.start_line) for h in hits] == [
        ("MEMORY.md", 1), ("memory/2026-11-23.md", 1), ("memory/2026-11-22.md", 1)]
    assert "**tea**" in hits[0].snippet.lower()
    assert hits[0].score > hits[1].score
    stemmed = await index.search(workspace, "writing banks", 5)
    assert [(h.path, h.start_line) for h in stemmed] == [("MEMORY.md", 4)]
    (workspace / "memory" / "2026-11-23.md").unlink()
    assert [h.path for h in await index.search(workspace, "tea", 5)] == [
        "MEMORY.md", "memory/2026-11-22.md"]
    assert await index.search(workspace, "AND OR NEAR *", 5) == []
    flush = FlushStates(store.db, store.lock)
    await flush.flushed(7, 12, 99.5, 3)
    await flush.tried(8, 4)
    states = await flush.get([7, 8, 9])
    assert (states[7].flushed_count, states[7].flushed_upto, states[8].window) == (12, 99.5, 4)


async def test_a_failed_transaction_leaves_nothing_behind(store: SessionStore) -> None:
    async def insert_then_fail(db: object) -> None:
        conn = db  # the transaction's own connection
        await conn.execute(  # type: ignore[attr-defined]
            "INSERT INTO plugin_state (name, enabled, updated_at) VALUES (?, ?, ?)",
            ("p", 1, 1.0))
        raise ValueError("half way")

    with pytest.raises(ValueError, match="half way"):
        await dbmod.transaction(store.db, store.lock, insert_then_fail)
    assert await load_disabled(store.db, store.lock) == set()
    async with store.lock, store.db.execute("SELECT COUNT(*) FROM plugin_state") as cur:
        assert (await cur.fetchone())[0] == 0  # type: ignore[index]
