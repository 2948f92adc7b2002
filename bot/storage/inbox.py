"""The durable inbox, the run journal and the outbox.

What makes an acknowledged message survive the process:

* **Inbox.** Every inbound message the dispatcher accepts is committed here
  before its platform is told it arrived; the row is unique on the platform's
  own delivery id, so a redelivery (after a restart, a retried webhook) is
  recognised and dropped. A run marks its entries ``running`` when it starts
  and ``done`` in the same commit as its history. Entries still open at start
  are run again, in order per session; one that was interrupted
  ``max_attempts`` times is given up with a notice.
* **Journal.** A run records each model turn that calls tools before the
  tools run, and each tool result as it completes. A run resumed after a
  crash replays that exchange to the model instead of calling the model and
  the tools again: a finished call is never executed twice, and a call that
  was cut off mid-way is reported to the model as interrupted rather than
  run again (it may have taken effect).
* **Outbox.** A run's reply is written in the run's own commit and marked
  delivered, with the platform's message id, once the platform took it;
  replies still pending at start are sent again (replacing their draft when
  one is known). With replicas (:attr:`Inbox.owner`) a reply is its committer's
  to send, marked ``sending`` from just before the platform call until the
  outcome is recorded (:meth:`Inbox.sending`); replies of a
  replica that died are taken over by the others
  (:meth:`bot.storage.claims.Claims.take_replies`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import aiosqlite

from bot.contracts.llm import ChatMessage, ToolCall
from bot.contracts.messages import (
    Attachment,
    Button,
    InboundMessage,
    OutboundFile,
    OutboundMessage,
)
from bot.contracts.tools import ToolResult
from bot.storage.claims import notify
from bot.storage.db import Statements, Writer, dialect_of

EntryKind = Literal["message", "command"]
Change = Literal["edit", "delete"]
"""What an entry that changes an earlier one records (see :meth:`Inbox.add`)."""

NOTICE_ID = "roost-notice:"
"""Journal ids of notices already sent (:meth:`RunJournal.notice`); tool call ids never
look like this."""
MAX_ERROR_CHARS = 2000
"""Characters of a failed delivery's error kept with the reply (``last_error``)."""
INTERRUPTED = ("This call was interrupted when Roost restarted before it finished. It was "
               "not run again because it may already have taken effect: check its effect "
               "before repeating it.")
"""The result a resumed run gives the model for a tool call cut off by a crash."""


@dataclass(slots=True)
class InboxEntry:
    """One recorded inbound message."""

    id: int
    message: InboundMessage
    kind: EntryKind
    session_key: str
    state: str = "pending"
    attempts: int = 0
    run_id: str | None = None
    draft_id: str | None = None
    change: Change | None = None
    """Set on an edit or a deletion of entry :attr:`edit_of` (its ``message`` is the
    edited one): applied by the session's holder, not run as it is."""
    edit_of: int | None = None


@dataclass(slots=True)
class OutboxEntry:
    """A reply committed but not yet confirmed by its platform."""

    id: int
    message: OutboundMessage
    draft_id: str | None
    attempts: int
    attempt_note: str | None = None
    """What the adapter noted before an earlier attempt's platform call (see
    :meth:`Inbox.sending`)."""


@dataclass(slots=True)
class RunJournal:
    """The tool exchange of one run, recorded as it happens (see the module docstring).

    ``head`` is the inbox entry the journal belongs to (the newest of a
    merged run's entries). ``replay`` holds what an earlier, interrupted life
    of the same run recorded: model turns with tool calls, in order, and the
    results that completed.
    """

    inbox: Inbox
    head: int
    turns: list[ChatMessage] = field(default_factory=list)
    results: dict[str, ToolResult] = field(default_factory=dict)
    seq: int = 0

    def next_turn(self) -> ChatMessage | None:
        """The next recorded model turn to replay instead of calling the model."""
        return self.turns.pop(0) if self.turns else None

    def recorded(self, calls: Sequence[ToolCall]) -> dict[str, ToolResult]:
        """The recorded results of those of ``calls`` that have one."""
        return {c.id: self.results[c.id] for c in calls if c.id in self.results}

    async def turn(self, message: ChatMessage) -> None:
        """Record a model turn that calls tools; returns once committed (before they run)."""
        self.seq += 1
        payload = json.dumps({"text": message.content, "calls": [
            {"id": c.id, "name": c.name, "arguments": dict(c.arguments)}
            for c in message.tool_calls]}, ensure_ascii=False, default=str)
        seq, head = self.seq, self.head
        await self.inbox.writer.write(
            lambda db: db.execute("INSERT OR REPLACE INTO journal VALUES (?, ?, 'assistant', ?)",
                                  (head, seq, payload)),
            what="journaling a model turn")

    def result(self, call_id: str, result: ToolResult) -> None:
        """Record a finished tool call (queued; committed with the next write)."""
        self.seq += 1
        payload = json.dumps({"id": call_id, "content": result.content,
                              "is_error": result.is_error}, ensure_ascii=False)
        seq, head = self.seq, self.head
        self.inbox.writer.write_later(
            lambda db: db.execute("INSERT OR REPLACE INTO journal VALUES (?, ?, 'result', ?)",
                                  (head, seq, payload)),
            what="journaling a tool result")


    async def notice(self, text: str) -> bool:
        """Whether Roost's own notice ``text`` (a refused file, say) is to be sent now.

        ``False`` when an earlier life of the run already sent it. Recorded and
        committed before it is sent, so a notice goes out at most once per
        message, however often the run is repeated after a crash. Kept as a
        'result' row under an id no tool call has (the journal's kinds are fixed).
        """
        key = NOTICE_ID + hashlib.sha256(text.encode()).hexdigest()[:24]
        if key in self.results:
            return False
        self.results[key] = ToolResult(text)
        self.result(key, self.results[key])
        await self.sync()
        return True

    async def sync(self) -> None:
        """Wait until every recorded result is committed (before the model is asked again)."""
        await self.inbox.writer.write(_nothing, what="journaling tool results")


async def _nothing(db: aiosqlite.Connection) -> None:
    return None


class Inbox:
    """The inbox, journal and outbox tables, written through the store's :class:`Writer`."""

    def __init__(self, db: aiosqlite.Connection, lock: Any, writer: Writer,
                 clock: Callable[[], float] = time.time, *, owner: str | None = None) -> None:
        self.db = db
        self.lock = lock
        self.writer = writer
        self.clock = clock
        self.owner = owner
        """With replicas: this replica's id, written with each reply it commits (the
        reply is its to send); ``None`` for a single process."""

    # -- intake ------------------------------------------------------------------

    async def add(self, message: InboundMessage, session_key: str,
                  kind: EntryKind = "message", *, running: bool = False,
                  change: Change | None = None, edit_of: int | None = None,
                  ) -> InboxEntry | None:
        """Record ``message``; ``None`` if its delivery id was recorded before.

        ``running``: its run starts at once, so the entry is recorded as started
        (one commit instead of two on the usual path). ``change``: ``message`` is an
        edit (or a deletion) of entry ``edit_of``, recorded to be applied in order.
        A message (not a change) is found later by its platform id (:meth:`original`).
        """
        event_id = message.event_id or f"~{uuid.uuid4().hex}"
        state, attempts = ("running", 1) if running else ("pending", 0)
        found_by = (message.message_id or None) if change is None else None
        row = (message.channel, event_id, session_key, message.chat_id, kind,
               encode_message(message), self.clock(), state, attempts, found_by, change,
               edit_of)

        async def body(db: aiosqlite.Connection) -> int | None:
            cur = await db.execute(
                "INSERT OR IGNORE INTO inbox (channel, event_id, session_key, chat_id, kind,"
                " message, received_at, state, attempts, message_id, change, edit_of)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", row)
            if cur.rowcount != 1:
                return None
            if dialect_of(db) == "postgresql":  # other replicas wake when this commits
                await notify(db, session_key)
            return cur.lastrowid

        entry_id = await self.writer.write(body, what="recording an inbound message")
        if entry_id is None:
            return None
        return InboxEntry(entry_id, message, kind, session_key, state, attempts,
                          change=change, edit_of=edit_of)

    async def original(self, channel: str, chat_id: str, message_id: str) -> InboxEntry | None:
        """The newest message entry recorded for platform message ``message_id`` of the
        chat (what an edit or a deletion of it changes); ``None`` when none was."""
        async with self.lock, self.db.execute(
            "SELECT id, kind, session_key, state, attempts, run_id, draft_id, message"
            " FROM inbox WHERE channel = ? AND chat_id = ? AND message_id = ?"
            " ORDER BY id DESC LIMIT 1", (channel, chat_id, message_id),
        ) as cur:
            row = await cur.fetchone()
        if row is None:
            return None
        return InboxEntry(row[0], decode_message(row[7]), row[1], row[2], row[3], row[4],
                          row[5], row[6])

    async def state_of(self, entry: int) -> tuple[str, InboundMessage] | None:
        """Entry ``entry``'s state and message as committed (``None``: no such entry)."""
        async with self.lock, self.db.execute(
            "SELECT state, message FROM inbox WHERE id = ?", (entry,),
        ) as cur:
            row = await cur.fetchone()
        return None if row is None else (str(row[0]), decode_message(row[1]))

    async def revise(self, entry: int, message: InboundMessage, *,
                     close: Sequence[int] = (), if_open: bool = False) -> bool:
        """Entry ``entry`` now holds ``message`` (an edit applied to it), and the change
        entries ``close`` are done, in one commit; whether it was. ``if_open``: only
        while the entry is not finished (else nothing is written)."""
        encoded, now = encode_message(message), self.clock()
        only = " AND state IN ('pending', 'running')" if if_open else ""

        async def body(db: aiosqlite.Connection) -> bool:
            cur = await db.execute(f"UPDATE inbox SET message = ? WHERE id = ?{only}",
                                   (encoded, entry))
            if cur.rowcount != 1:
                return False
            await _close(db, now, "done", [(i,) for i in close])
            return True

        return cast("bool", await self.writer.write(body, what="applying an edit"))

    async def become(self, entry: int, message: InboundMessage) -> None:
        """Change entry ``entry`` becomes an ordinary message (``message``): it is run
        (and recovered) like one from now on."""
        encoded = encode_message(message)
        await self.writer.write(
            lambda db: db.execute("UPDATE inbox SET message = ?, change = NULL WHERE id = ?",
                                  (encoded, entry)),
            what="recording a correction")

    async def started(self, ids: Sequence[int], run_id: str, *, fresh: bool = False) -> None:
        """The entries' run started; returns once that is committed.

        Counted before the run does anything, so a message that kills the
        process as soon as its run starts is still given up in the end.
        ``fresh``: started again on an edited text (not counted again), what the
        entries' earlier run journaled (and the approvals it asked for) forgotten.
        """
        params = [(run_id, i) for i in ids]
        count = "attempts" if fresh else "attempts + 1"

        async def body(db: aiosqlite.Connection) -> None:
            await db.executemany(
                f"UPDATE inbox SET state = 'running', attempts = {count}, run_id = ?"
                " WHERE id = ? AND state IN ('pending', 'running')", params)
            if fresh:
                await db.executemany("DELETE FROM journal WHERE inbox_id = ?",
                                     [(i,) for i in ids])
                # The earlier run's approval questions stay on record, no longer as this
                # journal's (the new run asks again instead of finding their outcome).
                await db.executemany("UPDATE approvals SET inbox_id = NULL WHERE inbox_id = ?",
                                     [(i,) for i in ids])

        await self.writer.write(body, what="marking a run started")

    def set_draft(self, ids: Sequence[int], draft_id: str) -> None:
        """The run showed a draft with this platform id (replaced if the run is redone)."""
        params = [(draft_id, i) for i in ids]
        self.writer.write_later(
            lambda db: db.executemany("UPDATE inbox SET draft_id = ? WHERE id = ?", params),
            what="recording a draft")

    def close(self, ids: Sequence[int], state: Literal["done", "given_up"] = "done") -> None:
        """The entries need no run (a command ran, ``/stop``, given up)."""
        now, params = self.clock(), [(i,) for i in ids]
        self.writer.write_later(
            lambda db: _close(db, now, state, params), what="closing inbox entries")

    def requeue(self, ids: Sequence[int]) -> None:
        """Shutdown cancelled the entries' run: they run after the next start, uncounted."""
        params = [(i,) for i in ids]
        self.writer.write_later(
            lambda db: db.executemany(
                "UPDATE inbox SET state = 'pending',"
                " attempts = CASE WHEN attempts > 0 THEN attempts - 1 ELSE 0 END"
                " WHERE id = ? AND state = 'running'", params),
            what="returning interrupted runs to the inbox")

    def finish(self, ids: Sequence[int], reply: OutboundMessage | None,
               draft_id: str | None = None, run_id: str | None = None) -> Statements:
        """Statements for a run's commit: its entries done (answered by ``run_id``), its
        reply into the outbox.

        The statements return the outbox id (``None`` without a reply).
        """
        now, params = self.clock(), [(i,) for i in ids]
        head = ids[-1] if ids else None
        encoded = encode_outbound(reply) if reply is not None else None
        owner = self.owner

        async def body(db: aiosqlite.Connection) -> int | None:
            await _close(db, now, "done", params, run_id)
            if encoded is None or reply is None:
                return None
            cur = await db.execute(
                "INSERT INTO outbox (inbox_id, channel, chat_id, message, draft_id, created_at,"
                " updated_at, owner) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (head, reply.channel, reply.chat_id, encoded, draft_id, now, now, owner))
            return cur.lastrowid

        return body

    # -- recovery ----------------------------------------------------------------

    async def unfinished(self, ids: Sequence[int] | None = None) -> list[InboxEntry]:
        """Entries whose run did not finish, oldest first (only those of ``ids`` if given)."""
        only = "" if ids is None else f" AND id IN ({', '.join('?' * len(ids))})"
        if ids is not None and not ids:
            return []
        async with self.lock, self.db.execute(
            "SELECT id, kind, session_key, state, attempts, run_id, draft_id, message, change,"
            f" edit_of FROM inbox WHERE state IN ('pending', 'running'){only} ORDER BY id",
            tuple(ids or ()),
        ) as cur:
            rows = await cur.fetchall()
        entries = []
        for r in rows:
            entries.append(InboxEntry(r[0], decode_message(r[7]), r[1], r[2], r[3], r[4],
                                      r[5], r[6], r[8], r[9]))
        return entries

    async def messages_of(self, ids: Sequence[int]) -> list[InboundMessage]:
        """The messages of entries ``ids`` (those still kept), oldest first."""
        if not ids:
            return []
        async with self.lock, self.db.execute(
            f"SELECT message FROM inbox WHERE id IN ({', '.join('?' * len(ids))}) ORDER BY id",
            tuple(ids),
        ) as cur:
            rows = await cur.fetchall()
        return [decode_message(r[0]) for r in rows]

    async def reply_run(self, channel: str, chat_id: str,
                        platform_id: str) -> tuple[str, str] | None:
        """``(run_id, session_key)`` of the run whose reply was delivered as message
        ``platform_id`` in chat (or thread) ``chat_id``; ``None`` if no kept reply was."""
        async with self.lock, self.db.execute(
            "SELECT i.run_id, i.session_key, o.chat_id, o.message FROM outbox o"
            " JOIN inbox i ON i.id = o.inbox_id WHERE o.channel = ? AND o.platform_id = ?"
            " AND i.run_id IS NOT NULL ORDER BY o.id DESC LIMIT 8", (channel, platform_id),
        ) as cur:
            rows = await cur.fetchall()
        for run_id, session_key, to_chat, message in rows:
            if to_chat == chat_id or decode_outbound(message).thread_id == chat_id:
                return str(run_id), str(session_key)
        return None

    async def journal(self, head: int) -> RunJournal:
        """The journal of entry ``head`` as an earlier life of its run left it."""
        async with self.lock, self.db.execute(
            "SELECT seq, kind, payload FROM journal WHERE inbox_id = ? ORDER BY seq", (head,),
        ) as cur:
            rows = await cur.fetchall()
        journal = RunJournal(self, head)
        for seq, kind, payload in rows:
            data = json.loads(payload)
            journal.seq = max(journal.seq, seq)
            if kind == "assistant":
                calls = tuple(ToolCall(c["id"], c["name"], c["arguments"]) for c in data["calls"])
                journal.turns.append(ChatMessage("assistant", data["text"], tool_calls=calls))
            else:
                journal.results[data["id"]] = ToolResult(data["content"], data["is_error"])
        return journal

    async def cursors(self, channel: str, since: float, limit: int) -> dict[str, str]:
        """The newest recorded delivery id per conversation of ``channel`` active since ``since``.

        For platforms that cannot redeliver (Discord): the adapter reads each
        conversation's history after it. Keys are the chat id, and
        ``chat_id:thread_id`` for a thread with messages of its own; numeric ids
        (snowflakes) compare as numbers. At most ``limit`` chats, the most
        recently active first.
        """
        thread = ("json_extract(message, '$.thread_id')" if dialect_of(self.db) == "sqlite"
                  else "CAST(message AS jsonb) ->> 'thread_id'")
        async with self.lock, self.db.execute(
            f"SELECT chat_id, {thread}, event_id FROM inbox"
            " WHERE channel = ? AND received_at >= ? AND event_id NOT LIKE '~%'"
            " AND edit_of IS NULL"  # an edit's delivery id is no place in the history
            " ORDER BY id DESC", (channel, since),
        ) as cur:
            rows = await cur.fetchall()
        newest: dict[str, str] = {}
        chats: list[str] = []
        for chat_id, thread_id, event_id in rows:
            if chat_id not in chats:
                if len(chats) >= limit:
                    continue
                chats.append(chat_id)
            key = f"{chat_id}:{thread_id}" if thread_id else chat_id
            known = newest.get(key)
            if known is None or _later(str(event_id), known):
                newest[key] = str(event_id)
        return newest

    # -- outbox ------------------------------------------------------------------

    async def undelivered(self) -> list[OutboxEntry]:
        """Replies committed but not confirmed delivered, oldest first (a single process's
        start; replicas take a dead owner's replies with ``Claims.take_replies``)."""
        sql = ("SELECT id, message, draft_id, attempts, attempt_note FROM outbox"
               " WHERE state = 'pending' ORDER BY id")
        params: tuple[str | float, ...] = ()
        async with self.lock, self.db.execute(sql, params) as cur:
            rows = await cur.fetchall()
        return [OutboxEntry(r[0], decode_outbound(r[1]), r[2], r[3], r[4]) for r in rows]

    async def sending(self, outbox_id: int, on: bool = True, note: str | None = None, *,
                      forget: bool = False) -> None:
        """About to hand the reply to the platform; returns once that is committed.

        With replicas, a reply whose owner died after this mark is not sent again by
        another replica (the platform may have shown it: at most once wins), while one
        committed but not yet marked is (it was certainly never shown). Marking at the
        commit instead lost the replies of a replica killed between its commit and its
        send; adapters that can (:attr:`bot.contracts.channel.Channel.marks_sending`)
        mark only once their own rate-limit waits are over. ``on=False`` takes the
        mark back: the platform refused the call, so the reply was not shown. A
        single process (no owner) writes nothing but the adapter's ``note`` (see
        :func:`bot.contracts.channel.marked_send`), kept in every case; ``forget`` clears
        it (taking the mark back after a note was kept).
        """
        if (note is not None or forget) and self.owner is None:
            await self.note_attempt(outbox_id, note)
            return
        if note is not None or forget:
            await self.writer.write(
                lambda db: db.execute("UPDATE outbox SET sending = ?, attempt_note = ?"
                                      " WHERE id = ?", (int(on), note, outbox_id)),
                what="marking a reply as being sent" if on else "unmarking a refused reply")
            return
        if self.owner is None:
            return
        await self.writer.write(
            lambda db: db.execute("UPDATE outbox SET sending = ? WHERE id = ?",
                                  (int(on), outbox_id)),
            what="marking a reply as being sent" if on else "unmarking a refused reply")

    async def note_attempt(self, outbox_id: int, note: str | None) -> None:
        """Keep what the adapter noted before a reply's first platform call (``None``:
        forget it); returns once committed (see :func:`bot.contracts.channel.marked_send`)."""
        await self.writer.write(
            lambda db: db.execute("UPDATE outbox SET attempt_note = ? WHERE id = ?",
                                  (note, outbox_id)),
            what="noting how to find out whether a reply was shown")

    def delivered(self, outbox_id: int, platform_id: str | None) -> None:
        """The platform took the reply."""
        now = self.clock()
        self.writer.write_later(
            lambda db: db.execute(
                "UPDATE outbox SET state = 'delivered', platform_id = ?, updated_at = ?,"
                " sending = 0 WHERE id = ?", (platform_id, now, outbox_id)),
            what="marking a reply delivered")

    def not_delivered(self, outbox_id: int, *, final: bool, error: str = "") -> None:
        """A delivery attempt failed (``error``: why, already masked); ``final`` gives the
        reply up."""
        now, state = self.clock(), "failed" if final else "pending"
        self.writer.write_later(
            lambda db: db.execute(
                "UPDATE outbox SET state = ?, attempts = attempts + 1, updated_at = ?,"
                " sending = 0, last_error = ? WHERE id = ?",
                (state, now, error[:MAX_ERROR_CHARS], outbox_id)),
            what="recording a failed delivery")

    async def still_to_send(self, outbox_id: int) -> bool:
        """Whether the reply is still pending and this process's to send (with replicas:
        this replica owns it)."""
        sql = "SELECT 1 FROM outbox WHERE id = ? AND state = 'pending'"
        params: tuple[int | str, ...] = (outbox_id,)
        if self.owner is not None:
            sql += " AND owner = ?"
            params = (outbox_id, self.owner)
        async with self.lock, self.db.execute(sql, params) as cur:
            return await cur.fetchone() is not None

    async def retry(self, outbox_id: int) -> OutboxEntry | None:
        """Make a pending or given-up reply due again now; ``None`` when it was delivered,
        dropped or is being sent.

        Its owner is cleared and every replica woken: one of them takes it over and
        sends it at once (:meth:`bot.storage.claims.Claims.take_replies`), and an
        attempt its old owner had waiting finds it no longer its own. A single process
        sends it itself (the caller schedules it).
        """
        now = self.clock()

        async def body(db: aiosqlite.Connection) -> OutboxEntry | None:
            rows = await db.execute_fetchall(
                "UPDATE outbox SET state = 'pending', owner = NULL, sending = 0,"
                " updated_at = ? WHERE id = ? AND state IN ('pending', 'failed')"
                " AND sending = 0 RETURNING id, message, draft_id, attempts, attempt_note",
                (now, outbox_id))
            if not rows:
                return None
            await notify(db, "")
            r = next(iter(rows))
            return OutboxEntry(int(r[0]), decode_outbound(str(r[1])), r[2], int(r[3]), r[4])

        return cast("OutboxEntry | None",
                    await self.writer.write(body, what="retrying a reply"))

    async def drop(self, outbox_id: int) -> bool:
        """Delete a reply not delivered (pending or given up, not being sent); whether
        one was."""
        async def body(db: aiosqlite.Connection) -> bool:
            cur = await db.execute(
                "DELETE FROM outbox WHERE id = ? AND state IN ('pending', 'failed')"
                " AND sending = 0", (outbox_id,))
            return int(cur.rowcount) > 0

        return cast("bool", await self.writer.write(body, what="dropping a reply"))

    async def prune(self, days: float) -> int:
        """Delete finished entries and delivered replies older than ``days``."""
        cutoff = self.clock() - days * 86_400

        async def body(db: aiosqlite.Connection) -> int:
            cur = await db.execute(
                "DELETE FROM inbox WHERE state IN ('done', 'given_up') AND finished_at < ?",
                (cutoff,))
            deleted = cur.rowcount
            await db.execute("DELETE FROM outbox WHERE state != 'pending' AND updated_at < ?",
                             (cutoff,))
            return deleted

        deleted: int = await self.writer.write(body, what="pruning the inbox")
        return deleted


def _later(a: str, b: str) -> bool:
    """Whether delivery id ``a`` comes after ``b`` (as numbers when both are)."""
    if a.isdigit() and b.isdigit():
        return int(a) > int(b)
    return a > b


async def _close(db: aiosqlite.Connection, now: float, state: str,
                 params: list[tuple[int]], run_id: str | None = None) -> None:
    # The run that answered: a message that ran at once was recorded without one.
    await db.executemany(
        "UPDATE inbox SET state = ?, finished_at = ?, run_id = COALESCE(?, run_id) WHERE id = ?",
        [(state, now, run_id, i) for (i,) in params])
    # A finished run's exchange is in its history now.
    await db.executemany("DELETE FROM journal WHERE inbox_id = ?", params)


# -- (de)serialization -------------------------------------------------------------


def encode_message(message: InboundMessage) -> str:
    """``message`` as JSON (without the platform's raw object)."""
    data = {f.name: getattr(message, f.name) for f in dataclasses.fields(message)
            if f.name != "raw"}
    data["attachments"] = [dataclasses.asdict(a) for a in message.attachments]
    return json.dumps(data, ensure_ascii=False)


def decode_message(text: str) -> InboundMessage:
    """The inverse of :func:`encode_message`."""
    data: dict[str, Any] = json.loads(text)
    data["attachments"] = tuple(
        Attachment(**{k: v for k, v in a.items() if k in _ATTACHMENT_FIELDS})
        for a in data.get("attachments", ()))
    known = {f.name for f in dataclasses.fields(InboundMessage)}
    return InboundMessage(**{k: v for k, v in data.items() if k in known})


def encode_outbound(message: OutboundMessage) -> str:
    """``message`` as JSON (a file's open ``source`` is not stored: only its path)."""
    if any(f.source is not None for f in message.files):
        message = dataclasses.replace(message, files=tuple(
            dataclasses.replace(f, source=None) for f in message.files))
    data = dataclasses.asdict(message)
    for file in data["files"]:
        file.pop("source", None)
    return json.dumps(data, ensure_ascii=False)


def decode_outbound(text: str) -> OutboundMessage:
    """The inverse of :func:`encode_outbound`."""
    data: dict[str, Any] = json.loads(text)
    data["files"] = tuple(OutboundFile(**{k: v for k, v in f.items() if k in _FILE_FIELDS})
                          for f in data.get("files", ()))
    data["buttons"] = tuple(tuple(Button(**b) for b in row) for row in data.get("buttons", ()))
    known = {f.name for f in dataclasses.fields(OutboundMessage)}
    return OutboundMessage(**{k: v for k, v in data.items() if k in known})


_ATTACHMENT_FIELDS = frozenset(f.name for f in dataclasses.fields(Attachment))
_FILE_FIELDS = frozenset(f.name for f in dataclasses.fields(OutboundFile))


def grouped(entries: Iterable[InboxEntry]) -> list[list[InboxEntry]]:
    """Entries of one session that one run had merged, kept together, in order of their first.

    Other sessions' entries may lie between them in the inbox: they are grouped
    by the run that took them up, not by being adjacent.
    """
    groups: list[list[InboxEntry]] = []
    by_run: dict[tuple[str, str], list[InboxEntry]] = {}
    for entry in entries:
        key = (entry.session_key, entry.run_id) if entry.run_id is not None else None
        group = by_run.get(key) if key is not None else None
        if group is None:
            group = [entry]
            groups.append(group)
            if key is not None:
                by_run[key] = group
        else:
            group.append(entry)
    return groups
