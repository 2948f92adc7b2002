"""Memory: search (FTS5/BM25, kept in sync with the files), reading, prompt notes, flush job."""

from __future__ import annotations

import datetime as dt
import math
import os
import time
from pathlib import Path
from typing import Any

import aiosqlite
import pytest

from bot.app.roost import Roost
from bot.contracts.events import RunEvent
from bot.contracts.hookspecs import hookimpl
from bot.contracts.tools import ToolContext, ToolError
from bot.engine.requests import RunOptions
from bot.storage import schema
from bot.storage.plugin_tables import schema_version
from bot.testing.app import scripted, settle, without_summary
from plugins.memory import (
    MAX_DAILY_NOTE_CHARS,
    MemoryFlushJob,
    flush_message,
    today_utc,
)
from plugins.memory.index import CHUNK_CHARS, MemoryIndex, chunk_text, fts_query
from plugins.memory.state import MIGRATIONS, FlushState, FlushStates
from tests.conftest import AppFactory
from workspaces import workspace_dir

TODAY = today_utc().isoformat()
YESTERDAY = (today_utc() - dt.timedelta(days=1)).isoformat()
HOUR = 3600.0


def workspace(app: Roost, user: str = "u1") -> Path:
    return workspace_dir(app.settings.workspaces_dir, "test", user)


def write(ws: Path, rel: str, text: str) -> Path:
    path = ws / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def context(app: Roost, user: str = "u1") -> ToolContext:
    return ToolContext(user_id=user, channel="test", chat_id=user,
                       session_key=f"default:test:direct:{user}", run_id="r",
                       workspace=workspace(app, user), deadline=time.monotonic() + 30)


async def call(app: Roost, tool: str, user: str = "u1", **args: Any) -> str:
    result = await app.engine.tools[tool].execute(context(app, user), args)
    assert isinstance(result, str)
    return result


def last_tool_result(provider: Any) -> str:
    result = [m for m in provider.requests[-1].messages if m.role == "tool"][-1]
    return without_summary(result.content)


# -- search -----------------------------------------------------------------------------------


async def test_search_finds_what_a_run_wrote_and_what_was_edited_by_hand(
    make_app: AppFactory,
) -> None:
    provider = scripted(
        {"match": "^remember", "steps": [
            {"tool_calls": [{"name": "write_file", "arguments": {
                "path": f"memory/{TODAY}.md",
                "content": "# Notes\n- The cat is called Pixel.\n- Likes green tea.\n"}}]},
            {"reply": "noted"}]},
        {"match": "^search ", "steps": [
            {"tool_calls": [{"name": "memory_search", "arguments": {"query": "{message}"}}]},
            {"reply": "searched"}]},
        loop=True)
    app, channel, _ = await make_app(provider)
    await channel.say("remember my cat")
    await settle(app)
    await channel.say("search what is the cat called")
    await settle(app)
    found = last_tool_result(provider)
    assert f"memory/{TODAY}.md lines 1-3" in found
    assert "**cat**" in found and "Pixel" in found

    # By hand: the next search sees the edit, a new MEMORY.md, and no deleted text.
    ws = workspace(app)
    write(ws, f"memory/{TODAY}.md", "# Notes\n- Likes green tea.\n\n"
          "# Health\n- Dentist appointment on Friday.\n")
    write(ws, "MEMORY.md", "Favourite colour: teal.\n")
    await channel.say("search dentist teal Pixel")
    await settle(app)
    found = last_tool_result(provider)
    assert f"memory/{TODAY}.md lines 4-5" in found and "**Dentist**" in found
    assert "MEMORY.md line 1" in found and "**teal**" in found
    assert "Pixel" not in found.split(":", 1)[1]
    assert channel.replies == ["noted", "searched", "searched"]

    (ws / "MEMORY.md").unlink()
    assert "No memory matches" in await call(app, "memory_search", query="teal")


async def test_bm25_ranks_the_best_passage_first_and_stays_in_the_workspace(
    make_app: AppFactory,
) -> None:
    app, _, _ = await make_app(scripted({"reply": "ok"}))
    ws = workspace(app)
    write(ws, "memory/2026-01-01.md", "We talked about tea in general.\n")
    write(ws, "memory/2026-01-02.md",
          "Green tea from Kyoto is the favourite; green tea every morning.\n")
    write(ws, "memory/2026-01-03.md",
          "A long note about the garden, the weather, the car, the neighbours and the "
          "holiday plans, which mentions tea only once in passing near the end.\n")
    write(ws, "memory/2026-01-04.md", "Coffee with Sam on Monday.\n")
    write(workspace(app, "u2"), "memory/2026-01-01.md", "Green tea green tea green tea.\n")
    index = MemoryIndex(app.store.db, app.store.lock, app.settings.workspaces_dir, 1_000_000)

    hits = await index.search(ws, "green tea", 10)
    assert [h.path for h in hits] == ["memory/2026-01-02.md", "memory/2026-01-01.md",
                                      "memory/2026-01-03.md"]
    assert hits[0].score > hits[1].score > hits[2].score > 0
    assert (await index.search(ws, "coffee", 3))[0].path == "memory/2026-01-04.md"
    assert len(await index.search(ws, "green tea", 1)) == 1
    assert await index.search(ws, "kyoto", 5)  # case-insensitive
    assert await index.search(ws, "favourites mornings", 5)  # stemmed
    # FTS5 syntax in user text is just text.
    assert await index.search(ws, 'tea AND "NEAR(' + "x*", 5)
    assert await index.search(ws, "?? --", 5) == []


def test_chunks_follow_paragraphs_and_headings_with_line_numbers() -> None:
    text = "# A\nline one\nline two\n\n\n# B\nthird\n\nfourth\n" + "x" * 50 + "\n"
    chunks = chunk_text(text)
    assert [(c.start, c.end) for c in chunks] == [(1, 3), (6, 10)]
    assert chunks[1].text == "# B\nthird\n\nfourth\n" + "x" * 50
    long = "\n".join(f"word{i} " * 10 for i in range(40))
    sizes = [len(c.text) for c in chunk_text(long)]
    assert len(sizes) > 1 and max(sizes) <= CHUNK_CHARS
    assert chunk_text("\n\n  \n") == []


def test_queries_are_quoted_terms_joined_with_or() -> None:
    assert fts_query('green "tea" 2026-11-20 -- *') == '"green" OR """tea""" OR "2026-11-20"'


# -- memory_get ---------------------------------------------------------------------------------


async def test_memory_get_reads_slices_of_memory_files_only(
    make_app: AppFactory, tmp_path: Path,
) -> None:
    app, _, _ = await make_app(scripted({"reply": "ok"}))
    ws = workspace(app)
    write(ws, "memory/2026-01-01.md", "".join(f"line {i}\n" for i in range(1, 11)))
    write(ws, "MEMORY.md", "long-term\n")
    write(ws, "SOUL.md", "persona\n")
    write(ws, "memory/sub/deep.md", "deep\n")
    (tmp_path / "outside.md").write_text("secret\n")

    assert await call(app, "memory_get", path="memory/2026-01-01.md", from_line=3,
                      lines=2) == ("memory/2026-01-01.md lines 3-4 of 10:\nline 3\nline 4\n"
                                   "[6 more line(s): memory_get from_line=5]")
    whole = await call(app, "memory_get", path="memory/2026-01-01.md")
    assert whole.endswith("line 10") and "more line" not in whole
    assert await call(app, "memory_get", path="MEMORY.md") == \
        "MEMORY.md lines 1-1 of 1:\nlong-term"
    os.symlink(ws / "SOUL.md", ws / "memory/soul.md")
    os.symlink(tmp_path / "outside.md", ws / "memory/out.md")
    for path, code in [("SOUL.md", "INVALID_PATH"), ("memory/soul.md", "INVALID_PATH"),
                       ("memory/../SOUL.md", "INVALID_PATH"), ("memory/out.md", "PATH_ESCAPE"),
                       ("memory/sub/deep.md", "INVALID_PATH"), ("../../outside.md",
                                                                "PATH_ESCAPE"),
                       ("/etc/passwd", "INVALID_PATH"), ("memory/nope.md", "NOT_FOUND")]:
        with pytest.raises(ToolError) as err:
            await call(app, "memory_get", path=path)
        assert err.value.code == code, path
    with pytest.raises(ToolError, match="past the end"):
        await call(app, "memory_get", path="MEMORY.md", from_line=5)
    # Linked files are not memory files for search either.
    assert "No memory matches" in await call(app, "memory_search", query="persona secret")


# -- daily notes in the prompt -------------------------------------------------------------------


async def test_todays_and_yesterdays_notes_are_in_the_full_prompt_cut_to_size(
    make_app: AppFactory,
) -> None:
    provider = scripted({"reply": "ok"}, loop=True)
    app, channel, _ = await make_app(provider)
    ws = workspace(app)
    write(ws, f"memory/{TODAY}.md", "TODAY-START\n" + "- a long day\n" * 1_000)
    write(ws, f"memory/{YESTERDAY}.md", "- YESTERDAY-NOTE\n")
    write(ws, "memory/2020-01-01.md", "- ANCIENT-NOTE\n")
    await channel.say("hi")
    await settle(app)
    system = provider.requests[-1].system
    assert f'<file path="memory/{TODAY}.md" day="today">\nTODAY-START' in system
    assert f"[... truncated: {TODAY}.md is" in system
    assert "YESTERDAY-NOTE" in system and "ANCIENT-NOTE" not in system
    section = system[system.index("## Recent notes"):system.index("YESTERDAY-NOTE")]
    assert len(section) < MAX_DAILY_NOTE_CHARS + 500
    assert "Current time:" in provider.requests[-1].note  # volatile: after the conversation

    done = app.dispatcher.run_scheduled(channel_message("x"), RunOptions(mode="minimal"))
    await done
    assert "## Recent notes" not in provider.requests[-1].system


def channel_message(text: str, user: str = "u1") -> Any:
    from bot.contracts.messages import InboundMessage

    return InboundMessage("test", user, "direct", user, text)


# -- scheduled flush ------------------------------------------------------------------------------


FLUSH: dict[str, Any] = {"match": "^Scheduled memory flush", "steps": [
    {"tool_calls": [{"name": "write_file", "arguments": {
        "path": f"memory/{TODAY}.md", "content": "- flushed\n"}}]},
    {"reply": "NO_REPLY"}]}
CHAT: dict[str, Any] = {"reply": "ack {message}"}


class Clock:
    """Unix time a test sets: starts an hour into the next flush window."""

    def __init__(self, window: float) -> None:
        self.window = window
        self.now = (math.floor(time.time() / window) + 1) * window + HOUR

    def __call__(self) -> float:
        return self.now


class BusyProbe:
    """Records whether the compactor counted a session busy while its flush ran."""

    def __init__(self) -> None:
        self.app: Roost | None = None
        self.seen: list[bool] = []

    @hookimpl
    def roost_run_event(self, event: RunEvent) -> None:
        if event.type == "run.started" and event.payload.get("kind") == "memory_flush":
            assert self.app is not None
            self.seen.append(event.session_key in self.app.engine.compactor.busy)


async def chat(app: Roost, channel: Any, user: str, turns: int) -> None:
    for i in range(turns):
        await channel.say(f"{user} message {i}", sender=user)
        await settle(app)


async def test_the_flush_picks_idle_sessions_with_enough_new_messages_once_per_window(
    make_app: AppFactory,
) -> None:
    provider = scripted(FLUSH, CHAT, loop=True)
    probe = BusyProbe()
    app, channel, _ = await make_app(provider, probe)
    probe.app = app
    await chat(app, channel, "u1", 6)  # 12 messages
    await chat(app, channel, "u2", 2)  # 4 messages
    job = MemoryFlushJob(app.settings, clock := Clock(6 * HOUR))
    real = clock.now
    clock.now = time.time() + 60  # nobody idle yet
    assert await job.flush_due(app.runtime) == []
    clock.now = real

    assert await job.flush_due(app.runtime) == ["default:test:direct:u1"]
    assert probe.seen == [True]  # compaction of it was excluded meanwhile
    assert (workspace(app) / f"memory/{TODAY}.md").read_text() == "- flushed\n"
    flush = provider.requests[-2]
    assert flush.messages[-1].content.startswith("Scheduled memory flush")
    assert [m.content for m in flush.messages[:2]] == ["u1 message 0", "ack u1 message 0"]
    assert {t.name for t in flush.tools} == {"read_file", "write_file"}
    session = await app.store.get("default:test:direct:u1")
    assert len(session.messages) == 12  # the flush wrote nothing into the conversation
    runs = await app.store.runs(session.key)
    assert runs[0].status == "completed" and runs[0].input_tokens > 0  # in the trace

    clock.now += 60  # same window: not again, even with new history
    assert await job.flush_due(app.runtime) == []
    await chat(app, channel, "u1", 5)
    assert await job.flush_due(app.runtime) == []
    clock.now += 6 * HOUR  # next window: the 10 new messages qualify
    asked = len(provider.requests)
    assert await job.flush_due(app.runtime) == ["default:test:direct:u1"]
    flush = provider.requests[asked]
    assert flush.messages[0].content == "u1 message 0"  # the 10 unflushed, not the rest
    assert len(flush.messages) == 11
    clock.now += 6 * HOUR  # nothing new since: nothing to do
    assert await job.flush_due(app.runtime) == []


async def test_the_flush_waits_for_compaction_and_runs_and_retries_a_failure_later(
    make_app: AppFactory,
) -> None:
    failing = {"match": FLUSH["match"], "error": "provider down"}
    provider = scripted(failing, CHAT, loop=True)
    app, channel, _ = await make_app(provider)
    await chat(app, channel, "u1", 5)
    key = "default:test:direct:u1"
    job = MemoryFlushJob(app.settings, clock := Clock(6 * HOUR))

    def flushes() -> int:
        return sum(r.messages[-1].content.startswith("Scheduled") for r in provider.requests)

    app.engine.compactor.busy.add(key)  # being compacted
    assert await job.flush_due(app.runtime) == [] and flushes() == 0
    app.engine.compactor.busy.discard(key)
    assert await job.flush_due(app.runtime) == []  # tried (busy was not recorded) and failed
    assert flushes() == 1 and key not in app.engine.compactor.busy
    assert await job.flush_due(app.runtime) == [] and flushes() == 1  # the failure used the window
    provider.turns[0] = scripted(FLUSH).turns[0]
    clock.now += 6 * HOUR
    assert await job.flush_due(app.runtime) == [key]


def test_background_runs_are_attributed_from_the_session_key() -> None:
    from bot.contracts.llm import ChatMessage

    history = [ChatMessage("user", "hi", sender_id="42", sender_name="Ann"),
               ChatMessage("assistant", "hello")]
    direct = flush_message("default:telegram:direct:42", history, "flush")
    assert direct is not None
    assert (direct.channel, direct.chat_id, direct.chat_type, direct.sender_id,
            direct.sender_name) == ("telegram", "42", "direct", "42", "Ann")
    group = flush_message("default:slack:group:C1:1700.5", history, "flush")
    assert group is not None
    assert (group.chat_id, group.chat_type, group.sender_id, group.thread_id) == (
        "C1", "group", "42", "1700.5")
    assert flush_message("default:slack:group:C1", [], "flush") is None
    assert flush_message("nonsense", history, "flush") is None


# -- the plugin's own tables ----------------------------------------------------------------------


LEGACY = ("memory_flushed_count", "memory_flushed_upto", "memory_flush_window")


async def sessions_columns(app: Roost) -> set[str]:
    async with app.store.db.execute("SELECT name FROM pragma_table_info('sessions')") as cur:
        return {str(r[0]) for r in await cur.fetchall()}


async def test_the_plugin_owns_its_tables_and_sessions_keep_no_flush_state(
    make_app: AppFactory,
) -> None:
    app, _, _ = await make_app(scripted({"reply": "ok"}))
    assert await schema_version(app.store.db, app.store.lock, "memory") == len(MIGRATIONS.steps)
    assert not set(LEGACY) & await sessions_columns(app)
    async with app.store.db.execute("SELECT name FROM sqlite_master") as cur:
        tables = {str(r[0]) for r in await cur.fetchall()}
    assert {"memory_flush_state", "memory_files", "memory_chunks", "memory_fts"} <= tables


async def old_database(path: Path, window: int, idle_at: float) -> None:
    """A database as the Roost before plugin tables left it, flush state in ``sessions``."""
    steps = next(i for i, s in enumerate(schema.MIGRATIONS) if "plugin_schema" in s)
    db = await aiosqlite.connect(path)
    for number, script in enumerate(schema.MIGRATIONS[:steps], start=1):
        await db.executescript(f"BEGIN;\n{script}\nPRAGMA user_version = {number};\nCOMMIT;")
    # user: (messages, flushed count, flushed up to, window last tried)
    old = {"u1": (12, 12, idle_at, window - 1),  # nothing new since its flush
           "u2": (12, 8, idle_at - HOUR, window - 1),  # only 4 new messages
           "u3": (12, 0, 0.0, -1),  # never flushed: the defaults
           "u4": (20, 5, idle_at - HOUR, window)}  # already tried in this window
    for user, (count, flushed, upto, tried) in old.items():
        cur = await db.execute(
            "INSERT INTO sessions (key, created_at, updated_at, memory_flushed_count,"
            " memory_flushed_upto, memory_flush_window) VALUES (?, ?, ?, ?, ?, ?)",
            (f"default:test:direct:{user}", idle_at - HOUR, idle_at, flushed, upto, tried))
        for i in range(count):
            role, sender = ("user", user) if i % 2 == 0 else ("assistant", None)
            await db.execute(
                "INSERT INTO messages (session_id, run_id, role, content, sender_id,"
                " created_at) VALUES (?, 'r', ?, ?, ?, ?)",
                (cur.lastrowid, role, f"{user} message {i}", sender, idle_at - HOUR + i))
    await db.execute("INSERT INTO memory_files VALUES ('test/u1', 'MEMORY.md', 'stamp')")
    await db.commit()
    await db.close()


async def test_an_upgraded_database_keeps_its_flush_state_in_the_plugins_table(
    make_app: AppFactory, tmp_path: Path,
) -> None:
    data = tmp_path / "old"
    data.mkdir()
    clock = Clock(6 * HOUR)
    window = math.floor(clock.now / clock.window)
    idle_at = time.time() - HOUR
    await old_database(data / "roost.db", window, idle_at)

    app, _, _ = await make_app(scripted(FLUSH, loop=True), data_dir=data)
    assert not set(LEGACY) & await sessions_columns(app)
    async with app.store.db.execute(
        "SELECT s.key, f.flushed_count, f.flushed_upto, f.flush_window FROM memory_flush_state f"
        " JOIN sessions s ON s.id = f.session_id ORDER BY s.key",
    ) as cur:
        assert [tuple(r) for r in await cur.fetchall()] == [
            ("default:test:direct:u1", 12, idle_at, window - 1),
            ("default:test:direct:u2", 8, idle_at - HOUR, window - 1),
            ("default:test:direct:u4", 5, idle_at - HOUR, window)]
    async with app.store.db.execute("SELECT workspace FROM memory_files") as cur:
        assert [r[0] for r in await cur.fetchall()] == ["test/u1"]  # the index was adopted

    # Without the carried-over state, all four would be flushed now.
    job = MemoryFlushJob(app.settings, clock)
    assert await job.flush_due(app.runtime) == ["default:test:direct:u3"]
    await app.close()

    # Restarting migrates nothing again and keeps what the flush recorded.
    app, _, _ = await make_app(scripted(FLUSH, loop=True), data_dir=data)
    assert await MemoryFlushJob(app.settings, clock).flush_due(app.runtime) == []
    clock.now += 6 * HOUR
    assert await MemoryFlushJob(app.settings, clock).flush_due(app.runtime) == [
        "default:test:direct:u4"]


async def test_a_failed_flush_is_recorded_for_a_session_never_flushed_before(
    make_app: AppFactory,
) -> None:
    failing = {"match": FLUSH["match"], "error": "provider down"}
    app, channel, _ = await make_app(scripted(failing, CHAT, loop=True))
    await chat(app, channel, "u1", 5)
    session = await app.store.get("default:test:direct:u1")
    clock = Clock(6 * HOUR)
    assert await MemoryFlushJob(app.settings, clock).flush_due(app.runtime) == []
    states = await FlushStates(app.store.db, app.store.lock).get([session.id])
    assert states == {session.id: FlushState(0, 0.0, math.floor(clock.now / clock.window))}
