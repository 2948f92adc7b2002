"""The ``jobs`` table: scheduled jobs as rows, and the queries the scheduler needs."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import aiosqlite

from bot.contracts.messages import ChatType
from bot.storage import db as dbmod

JobKind = Literal["cron", "system"]

_CLAIM_BATCH = 400
"""Fire times claimed per statement (two parameters each, well under SQLite's limit)."""


@dataclass(frozen=True, slots=True)
class Job:
    """One row of ``jobs``.

    ``owner_id`` on ``channel`` owns a cron job; ``chat_id``, ``chat_type`` and
    ``thread_id`` say where it was created, which is where it runs and
    replies. ``created_at`` (Unix seconds) anchors the schedule; ``last_fire``
    is the latest claimed fire time. System jobs have empty owner and chat.
    ``paused_at`` is set while an operator paused the job: its fire times are not
    claimed, so it does not run.
    """

    id: str
    kind: JobKind
    name: str
    schedule: str
    timezone: str
    message: str = ""
    owner_id: str = ""
    channel: str = ""
    chat_id: str = ""
    chat_type: ChatType = "direct"
    thread_id: str | None = None
    created_at: float = 0.0
    last_fire: float | None = None
    paused_at: float | None = None
    approved_tools: tuple[str, ...] = ()
    """Tools needing approval an admin pre-approved for the job's runs (nobody is
    there to ask when it fires)."""

    @property
    def label(self) -> str:
        """``id`` plus the name in quotes, when it has one."""
        return f"{self.id} ({self.name!r})" if self.name else self.id


@dataclass(frozen=True, slots=True)
class JobRun:
    """One fire of a job as recorded: when, its run (if it got one) and how it ended
    (``completed``, ``failed``, ``cancelled``...; ``error`` says why it failed);
    ``manual`` when an operator ran it (the Control UI's "run now")."""

    job_id: str
    fired_at: float
    ended_at: float
    run_id: str | None
    status: str
    error: str = ""
    manual: bool = False


_COLUMNS = ("id, kind, name, schedule, timezone, message, owner_id, channel, chat_id, chat_type,"
            " thread_id, created_at, last_fire, paused_at, approved_tools")
_VALUES = ", ".join("?" * (_COLUMNS.count(",") + 1))

KEPT_RUNS = 50
"""Fires of each job kept in ``job_runs`` (older ones go as new ones are recorded)."""


def _row(job: Job) -> tuple[Any, ...]:
    return (job.id, job.kind, job.name, job.schedule, job.timezone, job.message, job.owner_id,
            job.channel, job.chat_id, job.chat_type, job.thread_id, job.created_at,
            job.last_fire, job.paused_at, ",".join(job.approved_tools))


def _job(row: Any) -> Job:
    return Job(id=row[0], kind=row[1], name=row[2], schedule=row[3], timezone=row[4],
               message=row[5], owner_id=row[6], channel=row[7], chat_id=row[8],
               chat_type=row[9], thread_id=row[10], created_at=row[11], last_fire=row[12],
               paused_at=row[13],
               approved_tools=tuple(t for t in str(row[14] or "").split(",") if t))


class JobStore:
    """The ``jobs`` table on the shared connection.

    ``db`` is the session store's connection (``isolation_level=None``) and
    ``lock`` the lock every user of it holds around its statements
    (:attr:`bot.storage.sessions.SessionStore.lock`), as :class:`bot.storage.errors.ErrorStore`.
    """

    def __init__(self, db: aiosqlite.Connection, lock: asyncio.Lock) -> None:
        self.db = db
        self.lock = lock

    async def _fetch(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        async with self.lock:
            return list(await self.db.execute_fetchall(sql, tuple(params)))

    async def _write(self, sql: str, params: Sequence[Any] = ()) -> int:
        async with self.lock:
            cur = await self.db.execute(sql, tuple(params))
            return cur.rowcount

    async def all(self) -> list[Job]:
        """Every job, oldest first."""
        rows = await self._fetch(f"SELECT {_COLUMNS} FROM jobs ORDER BY created_at, id")
        return [_job(r) for r in rows]

    async def page(self, after: tuple[float, str] | None, limit: int) -> list[Job]:
        """Up to ``limit`` jobs created after ``after`` (created_at, id), oldest first."""
        where: str = ""
        params: tuple[Any, ...] = ()
        if after is not None:
            where = " WHERE created_at > ? OR (created_at = ? AND id > ?)"
            params = (after[0], after[0], after[1])
        rows = await self._fetch(f"SELECT {_COLUMNS} FROM jobs{where}"
                                 " ORDER BY created_at, id LIMIT ?", (*params, limit))
        return [_job(r) for r in rows]

    async def get(self, job_id: str) -> Job | None:
        """The job with this ID, or ``None``."""
        rows = await self._fetch(f"SELECT {_COLUMNS} FROM jobs WHERE id = ?", (job_id,))
        return _job(rows[0]) if rows else None

    async def find(self, *, channel: str | None = None, owner_id: str | None = None,
                   kind: JobKind | None = None) -> list[Job]:
        """Jobs matching every filter given, oldest first."""
        clauses, params = [], []
        for clause, value in (("channel = ?", channel), ("owner_id = ?", owner_id),
                              ("kind = ?", kind)):
            if value is not None:
                clauses.append(clause)
                params.append(value)
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        rows = await self._fetch(
            f"SELECT {_COLUMNS} FROM jobs{where} ORDER BY created_at, id", params)
        return [_job(r) for r in rows]

    async def insert(self, job: Job, *, max_per_owner: int | None = None) -> bool:
        """Insert ``job``; ``False`` if its owner already has ``max_per_owner`` cron jobs.

        The count and the insert are one statement, so two adds racing for the
        last free slot cannot both get it. Raises :class:`sqlite3.IntegrityError`
        when the ID is taken.
        """
        placeholders = _VALUES
        if max_per_owner is None:
            return await self._write(
                f"INSERT INTO jobs ({_COLUMNS}) VALUES ({placeholders})", _row(job)) == 1
        return await self._write(
            f"INSERT INTO jobs ({_COLUMNS}) SELECT {placeholders} WHERE (SELECT COUNT(*) FROM"
            " jobs WHERE kind = 'cron' AND channel = ? AND owner_id = ?) < ?",
            (*_row(job), job.channel, job.owner_id, max_per_owner)) == 1

    async def set_approved(self, job_id: str, tools: Sequence[str]) -> bool:
        """Replace the tools pre-approved for a job; whether the job exists."""
        return await self._write("UPDATE jobs SET approved_tools = ? WHERE id = ?",
                                 (",".join(tools), job_id)) == 1

    async def delete(self, job_id: str, *, channel: str | None = None,
                     owner_id: str | None = None) -> bool:
        """Delete a job (only ``owner_id``'s on ``channel``, when given); whether one was."""
        sql, params = "DELETE FROM jobs WHERE id = ?", [job_id]
        if channel is not None and owner_id is not None:
            sql += " AND channel = ? AND owner_id = ?"
            params += [channel, owner_id]
        deleted = await self._write(sql, params) == 1
        if deleted:
            await self._write("DELETE FROM job_runs WHERE job_id = ?", (job_id,))
        return deleted

    async def delete_many(self, job_ids: Iterable[str]) -> None:
        """Delete these jobs (in one transaction)."""
        ids = [(i,) for i in job_ids]
        if not ids:
            return
        async def body(db: aiosqlite.Connection) -> None:
            await db.executemany("DELETE FROM jobs WHERE id = ?", ids)
            await db.executemany("DELETE FROM job_runs WHERE job_id = ?", ids)

        await dbmod.transaction(self.db, self.lock, body)

    async def upsert(self, job: Job) -> None:
        """Insert or replace ``job`` (system jobs, re-registered at every start)."""
        await self._write(f"INSERT OR REPLACE INTO jobs ({_COLUMNS}) VALUES ({_VALUES})",
                          _row(job))

    async def claim(self, fires: Sequence[tuple[str, float]]) -> set[str]:
        """Claim fire times: the IDs whose ``last_fire`` was earlier and is now the given one.

        Each ``(job_id, fire)`` succeeds only if the job still exists and has
        not claimed this or a later fire time, checked and written by one
        statement per batch, so a fire time is claimed at most once whoever asks.
        """
        won: set[str] = set()
        for start in range(0, len(fires), _CLAIM_BATCH):
            batch = fires[start:start + _CLAIM_BATCH]
            # Typed, so PostgreSQL does not read the bare VALUES parameters as text.
            values = ", ".join("(CAST(? AS TEXT), CAST(? AS DOUBLE PRECISION))" for _ in batch)
            params = [v for pair in batch for v in pair]
            rows = await self._fetch(
                f"WITH due(id, fire) AS (VALUES {values}) "
                "UPDATE jobs SET last_fire = due.fire FROM due WHERE jobs.id = due.id"
                " AND jobs.paused_at IS NULL"
                " AND (jobs.last_fire IS NULL OR jobs.last_fire < due.fire) RETURNING jobs.id",
                params)
            won.update(r[0] for r in rows)
        return won

    async def set_paused(self, job_id: str, paused_at: float | None) -> bool:
        """Pause the job (``paused_at``: when) or resume it (``None``); whether it exists."""
        return await self._write("UPDATE jobs SET paused_at = ? WHERE id = ?",
                                 (paused_at, job_id)) == 1

    async def record_run(self, fire: JobRun) -> None:
        """Record a fire's outcome, keeping the job's newest :data:`KEPT_RUNS` fires."""
        async def body(db: aiosqlite.Connection) -> None:
            await db.execute(
                "INSERT INTO job_runs (job_id, fired_at, ended_at, run_id, status, error,"
                " manual) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (fire.job_id, fire.fired_at, fire.ended_at, fire.run_id, fire.status,
                 fire.error, int(fire.manual)))
            await db.execute(
                "DELETE FROM job_runs WHERE job_id = ? AND id <= (SELECT id FROM job_runs"
                " WHERE job_id = ? ORDER BY id DESC LIMIT 1 OFFSET ?)",
                (fire.job_id, fire.job_id, KEPT_RUNS))

        await dbmod.transaction(self.db, self.lock, body)

    async def existing(self, job_ids: Iterable[str]) -> set[str]:
        """Which of ``job_ids`` still have a row."""
        ids = list(job_ids)
        found: set[str] = set()
        for start in range(0, len(ids), _CLAIM_BATCH):
            batch = ids[start:start + _CLAIM_BATCH]
            rows = await self._fetch(
                f"SELECT id FROM jobs WHERE id IN ({', '.join('?' * len(batch))})", batch)
            found.update(r[0] for r in rows)
        return found


