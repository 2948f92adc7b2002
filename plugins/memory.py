"""Built-in plugin: memory search and reading, recent notes in the prompt, scheduled flush.

Memory lives in the user's workspace as plain Markdown: ``memory/YYYY-MM-DD.md``
daily notes and ``MEMORY.md``. This plugin adds

* ``memory_search {query, limit?}``: BM25-ranked keyword search over those
  files (:mod:`bot.storage.memory_index`), returning path, line range and snippet;
* ``memory_get {path, from_line?, lines?}``: a slice of one memory file;
* a full-mode prompt section with today's and yesterday's daily notes;
* the ``memory_flush`` job: every ``memory_flush_every_hours`` it gives each
  conversation that has been idle for ``memory_flush_idle_minutes`` and has at
  least ``memory_flush_min_messages`` messages it has not flushed yet one
  minimal, tool-limited run to store durable memories.

Dates are UTC, like the pre-compaction flush's ``memory/<today>.md``, so the
notes one writes are the notes the other shows.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

# Built-in: the memory flush runs a background turn through the run engine and
# shares compaction's limits; the search index is the core's.
from bot.engine.compaction import FLUSH_ITERATIONS, FLUSH_TIMEOUT, FLUSH_TOOLS
from bot.engine.history import repair_pairing
from bot.engine.runloop import RunRequest
from bot.storage.memory_index import MemoryIndex, memory_target, read_memory_text
from bot.storage.sessions import agent_of
from roost import (
    ChatMessage,
    InboundMessage,
    JobSpec,
    Order,
    PromptContext,
    PromptSection,
    Services,
    Settings,
    Tool,
    ToolContext,
    ToolError,
    check_keys,
    hookimpl,
    int_arg,
    str_arg,
)
from workspaces import read_cached, resolve_in_workspace

if TYPE_CHECKING:
    from roost import Runtime

log = logging.getLogger("roost.plugins.memory")

DEFAULT_RESULTS = 5
MAX_RESULTS = 20
DEFAULT_GET_LINES = 200
MAX_GET_LINES = 1_000
MAX_GET_CHARS = 20_000
"""``memory_get`` stops at a line boundary before this many characters."""

MAX_DAILY_NOTE_CHARS = 3_000
"""Each of today's and yesterday's notes is cut to this many characters in the prompt."""
DAILY_NOTES_ORDER = Order.TIME + 10
"""Right after the time line: both change during the day, so prompt caching loses nothing."""

SCHEDULED_FLUSH_MESSAGES = 40
"""The scheduled flush shows the model at most this many of the unflushed messages."""


# -- tools ---------------------------------------------------------------------------------


@hookimpl
def roost_tools(settings: Settings, services: Services) -> list[Tool]:
    """``memory_search`` and ``memory_get``, over the shared database's FTS5 index."""
    store = services.sessions
    index = MemoryIndex(store.db, store.lock, settings.workspaces_dir, settings.max_file_bytes)
    cap = settings.max_file_bytes

    async def memory_search(context: ToolContext, args: Mapping[str, Any]) -> str:
        check_keys(args, required=("query",), optional=("limit",))
        query = str_arg(args, "query").strip()
        limit = min(int_arg(args, "limit", DEFAULT_RESULTS, minimum=1), MAX_RESULTS)
        if not query:
            raise ToolError("'query' must not be empty", code="INVALID_ARGUMENT")
        hits = await index.search(context.workspace, query, limit)
        if not hits:
            return (f"No memory matches {query!r}. Try other words (names, topics, dates "
                    "like 2026-11-20), or list_files memory/.")
        lines = [f"{len(hits)} match(es) for {query!r}, best first:"]
        for n, hit in enumerate(hits, 1):
            span = (f"line {hit.start_line}" if hit.start_line == hit.end_line
                    else f"lines {hit.start_line}-{hit.end_line}")
            lines.append(f"{n}. {hit.path} {span} (score {hit.score:.2f})\n   {hit.snippet}")
        lines.append("Read more with memory_get (path, from_line).")
        return "\n".join(lines)

    async def memory_get(context: ToolContext, args: Mapping[str, Any]) -> str:
        check_keys(args, required=("path",), optional=("from_line", "lines"))
        target, display = memory_target(context.workspace, str_arg(args, "path"))
        start = int_arg(args, "from_line", 1, minimum=1)
        count = min(int_arg(args, "lines", DEFAULT_GET_LINES, minimum=1), MAX_GET_LINES)
        text, _ = await asyncio.to_thread(read_memory_text, target, display, cap)
        return _slice(display, text.splitlines(), start, count)

    return [
        Tool(
            name="memory_search",
            description=(
                "Keyword search of your memory (MEMORY.md, memory/*.md). Returns the best "
                "passages first: path, line range, snippet. Use before answering about past "
                "conversations, people, decisions, preferences or dates."
            ),
            input_schema={
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "Keywords."},
                    "limit": {"type": "integer", "minimum": 1, "maximum": MAX_RESULTS,
                              "description": f"Default {DEFAULT_RESULTS}."},
                },
                "required": ["query"],
                "additionalProperties": False,
            },
            execute=memory_search,
        ),
        Tool(
            name="memory_get",
            description=(
                "Read lines of MEMORY.md or memory/<name>.md (e.g. a memory_search hit). "
                "For other files use read_file."
            ),
            input_schema={
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "e.g. 'memory/2026-01-31.md'."},
                    "from_line": {"type": "integer", "minimum": 1,
                                  "description": "First line (default 1)."},
                    "lines": {"type": "integer", "minimum": 1, "maximum": MAX_GET_LINES,
                              "description": f"Default {DEFAULT_GET_LINES}."},
                },
                "required": ["path"],
                "additionalProperties": False,
            },
            execute=memory_get,
        ),
    ]


def _slice(display: str, lines: Sequence[str], start: int, count: int) -> str:
    total = len(lines)
    if not total:
        return f"({display} is empty)"
    if start > total:
        raise ToolError(f"from_line {start} is past the end of {display} ({total} lines)",
                        code="INVALID_ARGUMENT")
    shown: list[str] = []
    size = 0
    for line in lines[start - 1:start - 1 + count]:
        if shown and size + len(line) + 1 > MAX_GET_CHARS:
            break
        shown.append(line)
        size += len(line) + 1
    end = start + len(shown) - 1
    text = "\n".join(shown)
    if len(text) > MAX_GET_CHARS:  # one enormous line
        text = text[:MAX_GET_CHARS] + " [... line cut]"
    footer = (f"\n[{total - end} more line(s): memory_get from_line={end + 1}]"
              if end < total else "")
    return f"{display} lines {start}-{end} of {total}:\n{text}{footer}"


# -- recent notes in the prompt --------------------------------------------------------------


def today_utc() -> dt.date:
    """Today's date in UTC: the day daily notes are filed under."""
    return dt.datetime.now(dt.UTC).date()


@hookimpl
def roost_prompt_sections(prompt: PromptContext) -> PromptSection | None:
    """Today's and yesterday's daily notes, each cut to :data:`MAX_DAILY_NOTE_CHARS` (full mode)."""
    if prompt.mode != "full":
        return None
    today = today_utc()
    blocks = []
    for day, label in ((today, "today"), (today - dt.timedelta(days=1), "yesterday")):
        rel = f"memory/{day.isoformat()}.md"
        if not os.path.lexists(os.path.join(prompt.workspace, rel)):
            continue  # the common case, for one syscall instead of a full resolve
        try:
            # Resolving costs a few lstat calls; it keeps a symlinked "note" that
            # points outside the workspace out of the prompt.
            path = resolve_in_workspace(prompt.workspace, rel)
        except ToolError:
            continue
        body = read_cached(os.fspath(path), MAX_DAILY_NOTE_CHARS)
        if body:
            blocks.append(f'<file path="{rel}" day="{label}">\n{body}\n</file>')
    if not blocks:
        return None
    return PromptSection("daily_notes", "\n".join([
        "## Recent notes",
        "Your daily notes for today and yesterday (UTC dates), as you wrote them. Older "
        "notes and MEMORY.md are not shown: search them when the past matters.",
        *blocks,
    ]), DAILY_NOTES_ORDER)


# -- scheduled memory flush ----------------------------------------------------------------


def scheduled_flush_prompt(today: dt.date) -> str:
    """The instruction of the scheduled memory flush."""
    return (f"Scheduled memory flush: this conversation has been quiet for a while. Store "
            f"durable memories from it now (facts, preferences, decisions, open tasks) by "
            f"appending them to memory/{today.isoformat()}.md with write_file (read it first "
            f"if it exists; create memory/ if needed). Skip what your notes already say. If "
            f"nothing is worth storing, reply with NO_REPLY.")


@dataclass(frozen=True, slots=True)
class FlushCandidate:
    """A session the scheduled flush selected, as the database saw it."""

    session_id: int
    key: str
    updated_at: float
    total: int
    """Messages of the session so far, compacted ones included (only ever grows)."""
    flushed: int
    """``total`` when the last scheduled flush of it succeeded."""


class MemoryFlushJob:
    """The scheduled memory flush: which sessions qualify, the flush run, the record.

    A session qualifies when it has been idle for ``memory_flush_idle_minutes``,
    has at least ``memory_flush_min_messages`` messages since its last
    successful scheduled flush, and was not tried yet in the current window
    (``memory_flush_every_hours``, counted from the Unix epoch, so a restart
    or a late fire inside the same window does not flush it twice). It is
    skipped, and not recorded, while it has a run in flight or queued, or while
    it is being compacted. ``clock`` returns Unix time (tests move it).
    """

    def __init__(self, settings: Settings, clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.clock = clock
        self.window = settings.memory_flush_every_hours * 3600

    def spec(self) -> JobSpec:
        """The job, for ``roost_scheduled_jobs``."""
        return JobSpec("memory_flush", every(self.window), self.run)

    async def run(self, app: Runtime) -> None:
        """One tick of the job (what the scheduler calls)."""
        await self.flush_due(app)

    async def flush_due(self, app: Runtime) -> list[str]:
        """Flush every qualifying session, one at a time; returns the keys flushed."""
        now = self.clock()
        window = math.floor(now / self.window)
        flushed = []
        for candidate in await self.candidates(app, now, window):
            key = candidate.key
            if app.compacting(key) or app.running_count(key) or app.queue_length(key):
                log.info("memory flush of %s skipped: the session is busy", key)
                continue
            # Post-run compaction of this session waits meanwhile, and we never
            # start while a compaction runs.
            with app.hold_compaction(key):
                if await self.flush(app, candidate, window):
                    flushed.append(key)
        return flushed

    async def candidates(self, app: Runtime, now: float, window: int) -> list[FlushCandidate]:
        """Sessions idle long enough, with enough unflushed messages, not tried this window."""
        s = self.settings
        idle_before = now - s.memory_flush_idle_minutes * 60
        store = app.store
        # updated_at > memory_flushed_upto skips the message count for every session
        # without activity since its last flush, which is most of them.
        async with store.lock, store.db.execute(
            "SELECT s.id, s.key, s.updated_at, COUNT(m.id), s.memory_flushed_count"
            " FROM sessions s JOIN messages m ON m.session_id = s.id"
            " WHERE s.archived_at IS NULL AND s.updated_at <= ?"
            " AND s.updated_at > s.memory_flushed_upto AND s.memory_flush_window < ?"
            " GROUP BY s.id HAVING COUNT(m.id) - s.memory_flushed_count >= ?"
            " ORDER BY s.updated_at",
            (idle_before, window, s.memory_flush_min_messages),
        ) as cur:
            rows = await cur.fetchall()
        return [FlushCandidate(r[0], r[1], r[2], r[3], r[4]) for r in rows]

    async def flush(self, app: Runtime, candidate: FlushCandidate, window: int) -> bool:
        """Run the flush for one session and record it; returns whether it succeeded.

        Its own run rather than ``Compactor.memory_flush``: that one marks the
        compaction cycle as flushed (so the flush before the next compaction
        would be skipped), shows only the last 10 messages, and tells the model
        the history is about to be summarized, which is not the case here.
        """
        session = await app.store.get(candidate.key)
        if session.id != candidate.session_id:
            return False  # reset since the query: a new conversation, nothing to flush
        unflushed = candidate.total - candidate.flushed
        history = session.messages[-min(unflushed, SCHEDULED_FLUSH_MESSAGES):]
        while history and history[0].role != "user":
            history = history[1:]
        message = flush_message(session.key, session.messages,
                                scheduled_flush_prompt(today_utc()))
        ok = False
        if message is not None and history:
            try:
                result = await app.run_turn(RunRequest(
                    message, session, mode="minimal", agent=agent_of(session.key),
                    max_iterations=FLUSH_ITERATIONS, tools=FLUSH_TOOLS,
                    history=repair_pairing(history), persist=False, timeout=FLUSH_TIMEOUT,
                    kind="memory_flush",
                ))
                ok = result.status == "completed"
                log.info("scheduled memory flush for %s: %s", session.key,
                         "nothing stored" if result.silent else result.status)
            except Exception:
                log.exception("scheduled memory flush for %s failed", session.key)
        await self._record(app, candidate, window, ok)
        return ok

    async def _record(self, app: Runtime, candidate: FlushCandidate, window: int,
                      ok: bool) -> None:
        # A failure only uses up the window: the same messages are tried again in
        # the next one, instead of on every tick while the provider is down.
        store = app.store
        async with store.lock:
            if ok:
                await store.db.execute(
                    "UPDATE sessions SET memory_flushed_count = ?, memory_flushed_upto = ?,"
                    " memory_flush_window = ? WHERE id = ?",
                    (candidate.total, candidate.updated_at, window, candidate.session_id))
            else:
                await store.db.execute(
                    "UPDATE sessions SET memory_flush_window = ? WHERE id = ?",
                    (window, candidate.session_id))


def flush_message(key: str, messages: Sequence[ChatMessage],
                  text: str) -> InboundMessage | None:
    """The message a background run of session ``key`` is attributed to.

    Keys look like ``agent:channel:direct:user`` or
    ``agent:channel:group:chat[:thread]``. The sender (whose workspace the run
    writes to) is the direct chat's user, or in a group the author of the
    latest user message, like the pre-compaction flush. A direct chat's
    ``chat_id`` is taken to be the user id: nothing is delivered, so it only
    labels the run. ``None`` when there is no sender to attribute it to.
    """
    parts = key.split(":")
    if len(parts) < 4:
        return None
    _, channel, kind, *rest = parts
    last = next((m for m in reversed(messages) if m.role == "user" and m.sender_id), None)
    if kind == "direct":
        user = ":".join(rest)
        name = (last.sender_name or "") if last is not None and last.sender_id == user else ""
        return InboundMessage(channel, user, "direct", user, text, sender_name=name)
    if kind == "group" and last is not None and last.sender_id:
        thread = ":".join(rest[1:]) or None
        return InboundMessage(channel, rest[0], "group", last.sender_id, text,
                              sender_name=last.sender_name or "", thread_id=thread)
    return None


def every(seconds: float) -> str:
    """A job schedule (``every <N>s|m|h``) for an interval, in the largest exact unit."""
    whole = max(1, round(seconds))
    for unit, size in (("h", 3600), ("m", 60)):
        if whole % size == 0:
            return f"every {whole // size}{unit}"
    return f"every {whole}s"


@hookimpl
def roost_scheduled_jobs(settings: Settings) -> JobSpec | None:
    """The scheduled memory flush (off with ``memory_flush = false``)."""
    if not settings.memory_flush:
        return None
    return MemoryFlushJob(settings).spec()


# -- argument checks (the same contract as the file tools) -----------------------------------





