"""The ``approvals`` table: tool calls waiting for a person's decision, and every decision.

A row is opened when a run pauses at a tool that needs approval, unique per run
journal (``inbox_id``) and call, so a run resumed after a restart finds its own
pending row instead of asking again. A decision is one conditional ``UPDATE ...
WHERE state = 'pending'``: of two presses (or two replicas) racing, exactly one
decides, and the row keeps who decided what and when, with the call's arguments
masked (:func:`bot.config.masking.mask_tree`).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import aiosqlite

from bot.config.masking import mask_tree, mask_urls
from bot.storage.db import Writer

ApprovalState = Literal["pending", "approved", "session", "denied", "timeout", "cancelled"]
APPROVING: frozenset[str] = frozenset({"approved", "session"})
"""States that let the call run."""

_COLUMNS = ("id, inbox_id, call_id, run_id, session_key, session_id, channel, chat_id,"
            " chat_type, thread_id, requester, tool, arguments, state, prompt_id, decided_by,"
            " decided_at, started, created_at, expires_at")


@dataclass(frozen=True, slots=True)
class Call:
    """Which call of which run asks, and where: what an approval is about."""

    inbox_id: int | None
    """The run's journal (its newest inbox entry); ``None`` for a run without one."""
    call_id: str
    run_id: str
    session_key: str
    session_id: int
    """The session's row: "approve for this session" ends when ``/new`` starts another."""
    channel: str
    chat_id: str
    chat_type: str
    thread_id: str | None
    requester: str
    """Who sent the message the run answers."""
    tool: str


@dataclass(frozen=True, slots=True)
class Asked(Call):
    """What a run asks approval for: the call, with its arguments as the model gave them."""

    arguments: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Approval(Call):
    """One row of ``approvals``."""

    id: str
    arguments: str
    """The call's arguments as JSON, secrets masked."""
    state: ApprovalState
    prompt_id: str | None
    decided_by: str | None
    decided_at: float | None
    started: bool
    created_at: float
    expires_at: float

    @property
    def approved(self) -> bool:
        """Whether the decision lets the call run."""
        return self.state in APPROVING


def masked_arguments(arguments: Mapping[str, Any]) -> str:
    """``arguments`` as JSON for the record: secret-named keys and URL credentials masked."""
    return json.dumps(mask_urls(mask_tree(dict(arguments))), ensure_ascii=False, default=str)


def _approval(row: Any) -> Approval:
    return Approval(
        inbox_id=None if row[1] is None else int(row[1]), call_id=str(row[2]),
        run_id=str(row[3]), session_key=str(row[4]), session_id=int(row[5]),
        channel=str(row[6]), chat_id=str(row[7]), chat_type=str(row[8]), thread_id=row[9],
        requester=str(row[10]), tool=str(row[11]), id=str(row[0]), arguments=str(row[12]),
        state=row[13], prompt_id=row[14], decided_by=row[15],
        decided_at=None if row[16] is None else float(row[16]), started=bool(row[17]),
        created_at=float(row[18]), expires_at=float(row[19]))


class ApprovalStore:
    """Reads and decisions of ``approvals``, written through the store's :class:`Writer`."""

    def __init__(self, db: aiosqlite.Connection, lock: asyncio.Lock, writer: Writer,
                 clock: Callable[[], float] = time.time) -> None:
        self.db = db
        self.lock = lock
        self.writer = writer
        self.clock = clock

    async def open(self, asked: Asked, limit: float) -> Approval:
        """The pending row for ``asked``, expiring ``limit`` seconds from now, or the one
        an earlier life of the run made (whatever its state: a decision taken meanwhile
        stands)."""
        now = self.clock()
        row = (uuid.uuid4().hex[:20], asked.inbox_id, asked.call_id, asked.run_id,
               asked.session_key, asked.session_id, asked.channel, asked.chat_id,
               asked.chat_type, asked.thread_id, asked.requester, asked.tool,
               masked_arguments(asked.arguments), now, now + limit)

        async def body(db: aiosqlite.Connection) -> Any:
            if asked.inbox_id is not None:
                found = await db.execute_fetchall(
                    f"SELECT {_COLUMNS} FROM approvals WHERE inbox_id = ? AND call_id = ?",
                    (asked.inbox_id, asked.call_id))
                if found:
                    return next(iter(found))
            await db.execute(
                "INSERT INTO approvals (id, inbox_id, call_id, run_id, session_key, session_id,"
                " channel, chat_id, chat_type, thread_id, requester, tool, arguments,"
                " created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                row)
            made = await db.execute_fetchall(
                f"SELECT {_COLUMNS} FROM approvals WHERE id = ?", (row[0],))
            return next(iter(made))

        return _approval(await self.writer.write(body, what="recording a pending approval"))

    async def record(self, asked: Asked, state: ApprovalState, by: str) -> Approval:
        """Record a decision taken without asking anyone (a scheduled run's)."""
        now = self.clock()
        ident = uuid.uuid4().hex[:20]
        row = (ident, asked.inbox_id, asked.call_id, asked.run_id, asked.session_key,
               asked.session_id, asked.channel, asked.chat_id, asked.chat_type, asked.thread_id,
               asked.requester, asked.tool, masked_arguments(asked.arguments), state, by,
               now, now, now)
        await self.writer.write(
            lambda db: db.execute(
                "INSERT INTO approvals (id, inbox_id, call_id, run_id, session_key, session_id,"
                " channel, chat_id, chat_type, thread_id, requester, tool, arguments, state,"
                " decided_by, decided_at, created_at, expires_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", row),
            what="recording an approval decision")
        found = await self.get(ident)
        assert found is not None
        return found

    async def find(self, inbox_id: int, call_id: str) -> Approval | None:
        """The row of call ``call_id`` of the run journaled under ``inbox_id``, or ``None``."""
        async with self.lock, self.db.execute(
                f"SELECT {_COLUMNS} FROM approvals WHERE inbox_id = ? AND call_id = ?",
                (inbox_id, call_id)) as cur:
            row = await cur.fetchone()
        return None if row is None else _approval(row)

    async def get(self, ident: str) -> Approval | None:
        """The row ``ident``, or ``None``."""
        async with self.lock, self.db.execute(
                f"SELECT {_COLUMNS} FROM approvals WHERE id = ?", (ident,)) as cur:
            row = await cur.fetchone()
        return None if row is None else _approval(row)

    async def decide(self, ident: str, state: ApprovalState, by: str) -> bool:
        """Decide a pending row; ``False`` if it was decided already (nothing changes)."""
        now = self.clock()

        async def body(db: aiosqlite.Connection) -> bool:
            cur = await db.execute(
                "UPDATE approvals SET state = ?, decided_by = ?, decided_at = ?"
                " WHERE id = ? AND state = 'pending'", (state, by, now, ident))
            return bool(cur.rowcount == 1)

        decided: bool = await self.writer.write(body, what="deciding an approval")
        return decided

    async def prompted(self, ident: str, prompt_id: str | None) -> None:
        """The prompt asking for ``ident`` was shown as message ``prompt_id``."""
        await self.writer.write(
            lambda db: db.execute("UPDATE approvals SET prompt_id = ? WHERE id = ?",
                                  (prompt_id or "", ident)),
            what="recording an approval prompt")

    async def start(self, ident: str) -> None:
        """The approved call is about to run: after a crash from here it counts as
        interrupted, never as approved-but-not-run."""
        await self.writer.write(
            lambda db: db.execute("UPDATE approvals SET started = 1 WHERE id = ?", (ident,)),
            what="marking an approved call started")

    async def session_approved(self, session_id: int, tool: str) -> bool:
        """Whether someone chose "approve for this session" for ``tool`` in the session."""
        async with self.lock, self.db.execute(
                "SELECT 1 FROM approvals WHERE session_id = ? AND tool = ?"
                " AND state = 'session' LIMIT 1", (session_id, tool)) as cur:
            return await cur.fetchone() is not None

    async def recent(self, limit: int = 20) -> list[Approval]:
        """The newest rows, newest first (``/approvals``)."""
        async with self.lock, self.db.execute(
                f"SELECT {_COLUMNS} FROM approvals ORDER BY created_at DESC, id LIMIT ?",
                (limit,)) as cur:
            rows = await cur.fetchall()
        return [_approval(r) for r in rows]

    async def by_code(self, channel: str, chat_id: str, code: str) -> list[Approval]:
        """The rows of the chat whose id starts with ``code`` (lowercase hex; two at
        most: one means the code names a row)."""
        if not code or any(c not in "0123456789abcdef" for c in code):
            return []
        # Ids are hex: every id starting with ``code`` sorts in [code, code + "g").
        async with self.lock, self.db.execute(
                f"SELECT {_COLUMNS} FROM approvals WHERE id >= ? AND id < ?"
                " AND channel = ? AND chat_id = ? LIMIT 2",
                (code, code + "g", channel, chat_id)) as cur:
            rows = await cur.fetchall()
        return [_approval(r) for r in rows]

    async def asking(self, channel: str, chat_id: str) -> bool:
        """Whether a question waits for a decision in the chat."""
        async with self.lock, self.db.execute(
                "SELECT 1 FROM approvals WHERE state = 'pending' AND channel = ?"
                " AND chat_id = ? LIMIT 1", (channel, chat_id)) as cur:
            return await cur.fetchone() is not None

    async def pending(self, limit: int = 100) -> list[Approval]:
        """The rows waiting for a decision, oldest first (the Control UI's live list)."""
        async with self.lock, self.db.execute(
                f"SELECT {_COLUMNS} FROM approvals WHERE state = 'pending'"
                " ORDER BY created_at, id LIMIT ?", (limit,)) as cur:
            rows = await cur.fetchall()
        return [_approval(r) for r in rows]

    async def decided(self, before: tuple[float, str] | None = None,
                      limit: int = 50) -> list[Approval]:
        """Decided rows, newest first, older than the ``(created_at, id)`` cursor."""
        where = ""
        params: tuple[object, ...] = ()
        if before is not None:
            # One range on the created_at index (an OR of two would sort every row).
            where = " AND created_at <= ? AND (created_at < ? OR id < ?)"
            params = (before[0], before[0], before[1])
        async with self.lock, self.db.execute(
                f"SELECT {_COLUMNS} FROM approvals WHERE state <> 'pending'{where}"
                " ORDER BY created_at DESC, id DESC LIMIT ?", (*params, limit)) as cur:
            rows = await cur.fetchall()
        return [_approval(r) for r in rows]
