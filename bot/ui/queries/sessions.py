"""Sessions for the Control UI: the list (newest first, filtered, keyset-paged), the
message search, one session's transcript and its runs.

Every function takes the :class:`~bot.storage.sessions.SessionStore` and returns
frozen dataclasses. Each page costs a bounded number of indexed reads whatever
the store holds: no ``COUNT(*)`` and no ``OFFSET``. The text search uses the
message index of schema step 24: FTS5 on SQLite (``messages_fts``), a stored
``tsv`` column (``to_tsvector('english', content)``) with a GIN index on PostgreSQL.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from bot.contracts.llm import ContentPart, agent_of, decode_parts
from bot.storage.sessions import SessionStore
from bot.ui.queries.reads import (
    dialect,
    fetch,
    like_escaped,
    parse_id_cursor,
    parse_time_cursor,
    time_cursor,
)

PAGE = 50
"""Sessions (or search hits) per page."""
TRANSCRIPT_PAGE = 200
"""Messages per transcript page (the newest; older ones page by ``before``)."""
PREVIEW_CHARS = 300
"""Characters of a message read for a list row."""
MARK_START, MARK_END = "\x02", "\x03"
"""What the search wraps around matched terms in a hit's snippet."""


@dataclass(frozen=True, slots=True)
class SessionFilter:
    """What the list is narrowed to; empty strings mean no filter."""

    text: str = ""
    user: str = ""
    channel: str = ""
    agent: str = ""


@dataclass(frozen=True, slots=True)
class KeyParts:
    """What a session key says: agent, channel, ``direct`` or ``group``, and the user
    (direct) or chat (group, with its thread)."""

    agent: str
    channel: str
    kind: str
    chat: str


def key_parts(key: str) -> KeyParts:
    """The parts of a session key (``agent:channel:direct:user``,
    ``agent:channel:group:chat[:thread]``); an unknown shape keeps the rest as chat."""
    parts = key.split(":", 3)
    while len(parts) < 4:
        parts.append("")
    return KeyParts(parts[0], parts[1], parts[2], parts[3])


@dataclass(frozen=True, slots=True)
class SessionRow:
    """One conversation in the list."""

    id: int
    key: str
    created_at: float
    updated_at: float
    archived_at: float | None
    model: str
    input_tokens: int
    output_tokens: int
    last_role: str
    last_text: str

    @property
    def parts(self) -> KeyParts:
        return key_parts(self.key)


@dataclass(frozen=True, slots=True)
class SessionPage:
    """A page of the list; ``before`` is the cursor of the next (older) page, if any."""

    rows: list[SessionRow]
    before: str | None


@dataclass(frozen=True, slots=True)
class Hit:
    """A message the text search matched; ``snippet`` alternates plain text and matched
    terms (odd indexes are the matches)."""

    message_id: int
    session_id: int
    session_key: str
    role: str
    created_at: float
    snippet: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class HitPage:
    """A page of search hits, newest first; ``before`` as in :class:`SessionPage`."""

    hits: list[Hit]
    before: str | None


def _filters(store: SessionStore, f: SessionFilter) -> tuple[list[str], list[Any]]:
    """SQL conditions on ``s`` (sessions) for the user, channel and agent filters."""
    clauses: list[str] = []
    params: list[Any] = []
    if f.agent:
        # Agent names have no colon (bot.config.agents.AGENT_NAME): a prefix of the key.
        clauses.append("s.key LIKE ? ESCAPE '\\'")
        params.append(like_escaped(f.agent) + ":%")
    if f.channel:
        if dialect(store) == "postgresql":
            clauses.append("split_part(s.key, ':', 2) = ?")
            params.append(f.channel)
        else:
            clauses.append("substr(s.key, instr(s.key, ':') + 1) LIKE ? ESCAPE '\\'")
            params.append(like_escaped(f.channel) + ":%")
    if f.user:
        # Their direct chats, and every conversation (groups) they wrote in.
        clauses.append("(s.key LIKE ? ESCAPE '\\' OR s.id IN"
                       " (SELECT session_id FROM messages WHERE sender_id = ?))")
        params.extend(["%:direct:" + like_escaped(f.user), f.user])
    return clauses, params


_LIST = (
    "SELECT s.id, s.key, s.created_at, s.updated_at, s.archived_at, s.model,"
    " s.input_tokens, s.output_tokens,"
    " (SELECT m.role FROM messages m WHERE m.session_id = s.id ORDER BY m.id DESC LIMIT 1),"
    f" (SELECT substr(m.content, 1, {PREVIEW_CHARS:d}) FROM messages m"
    "   WHERE m.session_id = s.id ORDER BY m.id DESC LIMIT 1)"
    " FROM sessions s"
)


async def list_sessions(store: SessionStore, f: SessionFilter = SessionFilter(),
                        before: str | None = None, limit: int = PAGE) -> SessionPage:
    """Conversations (archived ones too) by latest activity, newest first, filtered by
    ``f``'s user, channel and agent (not its text: see :func:`search`)."""
    clauses, params = _filters(store, f)
    if before:
        stamp, key = parse_time_cursor(before)
        clauses.append("(s.updated_at < ? OR (s.updated_at = ? AND s.id < ?))")
        params.extend([stamp, stamp, parse_id_cursor(key)])
    where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
    rows = await fetch(store, f"{_LIST}{where} ORDER BY s.updated_at DESC, s.id DESC LIMIT ?",
                       [*params, limit + 1])
    out = [SessionRow(int(r[0]), str(r[1]), float(r[2]), float(r[3]),
                      None if r[4] is None else float(r[4]), str(r[5]), int(r[6]), int(r[7]),
                      str(r[8] or ""), str(r[9] or "")) for r in rows[:limit]]
    more = len(rows) > limit and out
    return SessionPage(out, time_cursor(out[-1].updated_at, out[-1].id) if more else None)


def fts_query(text: str) -> str:
    """A safe FTS5 query for ``text``: every term quoted (FTS5 operators in it are just
    words), all of them required."""
    return " ".join('"' + term.replace('"', '""') + '"' for term in text.split())


def _snippet(text: str) -> tuple[str, ...]:
    """``text`` with its match marks as alternating plain/matched pieces (plain first)."""
    first, *rest = text.split(MARK_START)
    pieces = [first]
    for chunk in rest:
        matched, _, plain = chunk.partition(MARK_END)
        pieces.extend([matched, plain])
    return tuple(pieces)


async def search(store: SessionStore, f: SessionFilter, before: str | None = None,
                 limit: int = PAGE) -> HitPage:
    """Messages whose content matches ``f.text`` (every word, stemmed), newest first,
    in sessions that pass ``f``'s other filters."""
    if not f.text.split():
        return HitPage([], None)
    clauses, params = _filters(store, f)
    before_id = parse_id_cursor(before) if before else None
    extra = "".join(f" AND {c}" for c in clauses)
    if dialect(store) == "postgresql":
        rows = await _search_postgres(store, f.text, extra, params, before_id, limit + 1)
    else:
        older = "" if before_id is None else " AND messages_fts.rowid < ?"
        sql = (
            "SELECT m.id, m.session_id, s.key, m.role, m.created_at,"
            " snippet(messages_fts, 0, char(2), char(3), '…', 24)"
            " FROM messages_fts JOIN messages m ON m.id = messages_fts.rowid"
            " JOIN sessions s ON s.id = m.session_id"
            f" WHERE messages_fts MATCH ?{older}{extra}"
            " ORDER BY messages_fts.rowid DESC LIMIT ?")
        rows = await fetch(store, sql, [fts_query(f.text),
                                        *([] if before_id is None else [before_id]),
                                        *params, limit + 1])
    hits = [Hit(int(r[0]), int(r[1]), str(r[2]), str(r[3]), float(r[4]), _snippet(str(r[5])))
            for r in rows[:limit]]
    return HitPage(hits, str(hits[-1].message_id) if len(rows) > limit and hits else None)


NEWEST_WINDOW = 2000
"""On PostgreSQL, the newest messages searched by walking them (a common word's hits)
before the rest is searched through the index (a rare word's)."""

_PG_HEADLINE = (
    "SELECT h.id, h.session_id, h.key, h.role, h.created_at,"
    " ts_headline('english', substr(h.content, 1, 20000), plainto_tsquery('english', ?),"
    "  'StartSel=\x02,StopSel=\x03,MaxWords=24,MinWords=8,MaxFragments=1')"
    " FROM ({hits}) h ORDER BY h.id DESC"
)
"""The snippets of the hits only (computed for the page, not for every match)."""


async def _search_postgres(store: SessionStore, text: str, extra: str, params: list[Any],
                           before_id: int | None, want: int) -> list[Any]:
    """The newest ``want`` hits on PostgreSQL, in two bounded steps.

    The planner cannot tell a common word from a rare one well enough to choose
    between walking the messages newest first (fast for a common word, a walk
    through every message for a rare one) and the GIN index (fast for a rare word,
    every hit fetched and sorted for a common one). So the newest
    :data:`NEWEST_WINDOW` messages are searched by walking them (their stored
    ``tsv``), and only if they hold fewer than ``want`` hits are the older ones
    searched through the index alone (a word that rare has few hits to fetch).
    """
    from bot.storage.postgres import PgConnection
    from bot.storage.postgres import transaction as pg_transaction

    older = "" if before_id is None else " WHERE id < ?"
    bound = [] if before_id is None else [before_id]
    window = (f"(SELECT id, session_id, role, content, created_at, tsv FROM messages{older}"
              " ORDER BY id DESC LIMIT ?)")
    walked = (f"SELECT m.id, m.session_id, s.key, m.role, m.created_at, m.content"
              f" FROM {window} m JOIN sessions s ON s.id = m.session_id"
              f" WHERE m.tsv @@ plainto_tsquery('english', ?){extra}"
              " ORDER BY m.id DESC LIMIT ?")
    rows = await fetch(store, _PG_HEADLINE.format(hits=walked),
                       [text, *bound, NEWEST_WINDOW, text, *params, want])
    if len(rows) >= want:
        return rows
    edge = await fetch(store, f"SELECT MIN(id), COUNT(*) FROM {window} w",
                       [*bound, NEWEST_WINDOW])
    if not edge or edge[0][0] is None or int(edge[0][1]) < NEWEST_WINDOW:
        return rows  # the window held every message there is
    indexed_hits = ("SELECT m.id, m.session_id, s.key, m.role, m.created_at, m.content"
                    " FROM messages m JOIN sessions s ON s.id = m.session_id"
                    f" WHERE m.tsv @@ plainto_tsquery('english', ?) AND m.id + 0 < ?{extra}"
                    " ORDER BY m.id DESC LIMIT ?")

    async def indexed(db: PgConnection) -> list[Any]:
        # Only bitmap scans: the GIN index finds the hits, whatever the estimate
        # (``m.id + 0``: not a bitmap of every older id from the primary key).
        await db.execute("SET LOCAL enable_indexscan = off")
        await db.execute("SET LOCAL enable_seqscan = off")
        return list(await db.execute_fetchall(_PG_HEADLINE.format(hits=indexed_hits), (
            text, text, int(edge[0][0]), *params, want - len(rows))))

    return rows + await pg_transaction(cast(PgConnection, store.db), indexed)


async def newest_activity(store: SessionStore) -> tuple[float, int] | None:
    """The latest (activity time, id) of any session: what the live list watches."""
    rows = await fetch(store, "SELECT updated_at, id FROM sessions"
                              " ORDER BY updated_at DESC, id DESC LIMIT 1")
    return (float(rows[0][0]), int(rows[0][1])) if rows else None


# -- one session -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SessionDetail:
    """One conversation's row: what the model was given besides the messages (the
    latest compaction summary, pinned facts) and its totals."""

    row: SessionRow
    summary: str
    compactions: int
    facts: tuple[str, ...]
    cache_read_tokens: int
    cache_write_tokens: int
    provider: str
    running: int
    """Its inbox entries being answered (on any replica)."""
    queued: int
    """Its inbox entries waiting."""


async def session_detail(store: SessionStore, session_id: int) -> SessionDetail | None:
    """The session with this id (active or archived), or ``None``."""
    rows = await fetch(store, (
        f"{_LIST.replace(' FROM sessions s', '')}, s.summary, s.compactions, s.pins,"
        " s.cache_read_tokens, s.cache_write_tokens, s.provider FROM sessions s WHERE s.id = ?"),
        [session_id])
    if not rows:
        return None
    r = rows[0]
    row = SessionRow(int(r[0]), str(r[1]), float(r[2]), float(r[3]),
                     None if r[4] is None else float(r[4]), str(r[5]), int(r[6]), int(r[7]),
                     str(r[8] or ""), str(r[9] or ""))
    try:
        facts = tuple(str(x) for x in json.loads(r[12]))
    except (ValueError, TypeError):
        facts = ()
    running = queued = 0
    if row.archived_at is None:
        for state, count in await fetch(store, (
                "SELECT state, COUNT(*) FROM inbox WHERE session_key = ?"
                " AND state IN ('pending', 'running') GROUP BY state"), [row.key]):
            if state == "running":
                running = int(count)
            else:
                queued = int(count)
    return SessionDetail(row, str(r[10]), int(r[11]), facts, int(r[13]), int(r[14]), str(r[15]),
                         running, queued)


@dataclass(frozen=True, slots=True)
class ToolCallView:
    """A tool call an assistant turn asked for; ``arguments`` as indented JSON."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class PartView:
    """A file of a message: ``index`` among its parts (the thumbnail route takes it)."""

    index: int
    kind: str
    path: str
    mime_type: str
    width: int
    height: int
    size: int


@dataclass(frozen=True, slots=True)
class MessageView:
    """One stored message as the model saw it (compacted ones were summarized)."""

    id: int
    run_id: str
    role: str
    content: str
    sender_id: str | None
    sender_name: str | None
    tool_calls: tuple[ToolCallView, ...]
    tool_call_id: str | None
    tool_name: str | None
    is_error: bool
    created_at: float
    compacted: bool
    parts: tuple[PartView, ...] = field(default=())


_MESSAGE_COLUMNS = ("id, run_id, role, content, sender_id, sender_name, tool_calls,"
                    " tool_call_id, tool_name, is_error, created_at, compacted, parts")


def _calls(text: str | None) -> tuple[ToolCallView, ...]:
    if not text:
        return ()
    try:
        calls = json.loads(text)
    except ValueError:
        return (ToolCallView("", "?", text),)
    out = []
    for c in calls if isinstance(calls, list) else []:
        if isinstance(c, dict):
            out.append(ToolCallView(str(c.get("id", "")), str(c.get("name", "")),
                                    json.dumps(c.get("arguments"), indent=2,
                                               ensure_ascii=False, default=str)))
    return tuple(out)


def _parts(text: str | None) -> tuple[PartView, ...]:
    try:
        parts = decode_parts(text)
    except (ValueError, TypeError):
        return ()
    return tuple(PartView(i, p.kind, p.path, p.mime_type, p.width, p.height, p.size)
                 for i, p in enumerate(parts))


def _message(r: Sequence[Any]) -> MessageView:
    return MessageView(int(r[0]), str(r[1]), str(r[2]), str(r[3]), r[4], r[5], _calls(r[6]),
                       r[7], r[8], bool(r[9]), float(r[10]), bool(r[11]), _parts(r[12]))


@dataclass(frozen=True, slots=True)
class Transcript:
    """A page of a session's messages, oldest first; ``before`` pages to older ones."""

    messages: list[MessageView]
    before: str | None


async def transcript(store: SessionStore, session_id: int, before: str | None = None,
                     limit: int = TRANSCRIPT_PAGE) -> Transcript:
    """The newest ``limit`` messages of the session (older than ``before``), oldest first."""
    params: list[Any] = [session_id]
    older = ""
    if before:
        older = " AND id < ?"
        params.append(parse_id_cursor(before))
    rows = await fetch(store, f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE session_id = ?"
                              f"{older} ORDER BY id DESC LIMIT ?", [*params, limit + 1])
    messages = [_message(r) for r in reversed(rows[:limit])]
    return Transcript(messages, str(messages[0].id) if len(rows) > limit and messages else None)


async def messages_after(store: SessionStore, session_id: int, after: int,
                         limit: int = TRANSCRIPT_PAGE) -> list[MessageView]:
    """The session's messages stored after message ``after``, oldest first (the live view)."""
    rows = await fetch(store, f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE session_id = ?"
                              " AND id > ? ORDER BY id LIMIT ?", [session_id, after, limit])
    return [_message(r) for r in rows]


async def newest_message_id(store: SessionStore, session_id: int) -> int:
    """The id of the session's newest message (0 for none)."""
    rows = await fetch(store, "SELECT MAX(id) FROM messages WHERE session_id = ?", [session_id])
    return int(rows[0][0]) if rows and rows[0][0] is not None else 0


async def message_part(store: SessionStore, session_id: int, message_id: int,
                       index: int) -> ContentPart | None:
    """File ``index`` of message ``message_id`` of the session, as stored (its workspace
    root and path are the store's; the caller confines them)."""
    rows = await fetch(store, "SELECT parts FROM messages WHERE id = ? AND session_id = ?",
                       [message_id, session_id])
    if not rows:
        return None
    try:
        parts = decode_parts(rows[0][0])
    except (ValueError, TypeError):
        return None
    return parts[index] if 0 <= index < len(parts) else None


@dataclass(frozen=True, slots=True)
class RunBrief:
    """A run as the transcript names it: who answered, with which model, how it ended."""

    id: str
    session_key: str
    status: str
    started_at: float
    ended_at: float
    model: str
    agent: str
    iterations: int
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    error: str


_RUN_COLUMNS = ("r.id, r.session_key, r.status, r.started_at, r.ended_at, r.model,"
                " r.iterations, r.input_tokens, r.output_tokens, r.cache_read_tokens,"
                " r.cache_write_tokens, r.error,"
                " (SELECT p.attributes FROM spans p WHERE p.run_id = r.id AND p.parent_id IS NULL"
                "  ORDER BY p.started_at LIMIT 1)")


def run_brief(r: Sequence[Any]) -> RunBrief:
    """A :class:`RunBrief` of a row of ``_RUN_COLUMNS``."""
    agent = ""
    try:
        attributes = json.loads(r[12]) if r[12] else {}
        agent = str(attributes.get("agent", "")) if isinstance(attributes, dict) else ""
    except ValueError:
        pass
    return RunBrief(str(r[0]), str(r[1]), str(r[2]), float(r[3]), float(r[4]), str(r[5]),
                    agent or agent_of(str(r[1])), int(r[6]), int(r[7]), int(r[8]), int(r[9]),
                    int(r[10]), str(r[11]))


RUN_SELECT = f"SELECT {_RUN_COLUMNS} FROM runs r"
"""The runs query :func:`run_brief` reads (add a WHERE clause)."""


async def runs_of(store: SessionStore, session_key: str, run_ids: Sequence[str] = (),
                  limit: int = 50) -> list[RunBrief]:
    """The session's newest ``limit`` runs, and the runs ``run_ids`` (those of the
    transcript page shown), newest first, each once."""
    rows = await fetch(store, f"{RUN_SELECT} WHERE r.session_key = ?"
                              " ORDER BY r.started_at DESC LIMIT ?", [session_key, limit])
    seen = {str(r[0]) for r in rows}
    wanted = [i for i in dict.fromkeys(run_ids) if i not in seen]
    for start in range(0, len(wanted), 500):
        batch = wanted[start:start + 500]
        marks = ", ".join("?" * len(batch))
        rows.extend(await fetch(store, f"{RUN_SELECT} WHERE r.id IN ({marks})", batch))
    briefs = [run_brief(r) for r in rows]
    briefs.sort(key=lambda b: b.started_at, reverse=True)
    return briefs


async def session_id_of(store: SessionStore, key: str, at: float | None = None) -> int | None:
    """The id of the session ``key`` names: the one active at time ``at`` (the newest
    created before it), else the active one."""
    if at is not None:
        rows = await fetch(store, "SELECT id FROM sessions WHERE key = ? AND created_at <= ?"
                                  " ORDER BY created_at DESC LIMIT 1", [key, at])
        if rows:
            return int(rows[0][0])
    rows = await fetch(store, "SELECT id FROM sessions WHERE key = ? ORDER BY archived_at IS NULL"
                              " DESC, created_at DESC LIMIT 1", [key])
    return int(rows[0][0]) if rows else None
