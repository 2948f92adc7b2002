"""Tokens spent, per user, group chat and agent, per UTC day and month (schema step 14).

Counted from the usage each provider reports for a model call (input plus output
tokens; input counts every prompt token, those read from or written to the
provider's prompt cache included, which are also counted apart); budgets
(:mod:`bot.engine.budgets`) read these counters before a run calls the model.
Subjects: a user is ``channel:user_id``, a group ``channel:chat_id``, an agent its name,
a model its name, a scheduled job ``cron:<job id>`` or ``heartbeat``.

Reservations (schema step 20): before a call, :meth:`UsageStore.reserve` holds its
worst case against each limited counter in one transaction that first locks those
counters' rows (in one order, so replicas on one PostgreSQL never deadlock), and
:meth:`UsageStore.settle` replaces the hold by what was spent. A hold whose process
died expires. The request-rate window lives in ``request_windows`` the same way.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, cast

import aiosqlite

from bot.storage.db import Writer

Scope = Literal["user", "group", "agent", "model", "job"]
"""Whose counter: budgets limit users, groups and agents; models and scheduled jobs
(``cron:<job id>``, ``heartbeat``) are counted for the Control UI's usage page."""


def day_of(moment: float) -> str:
    """The UTC day of a timestamp: ``2026-11-23``."""
    return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%d")


def month_of(moment: float) -> str:
    """The UTC month of a timestamp: ``2026-11``."""
    return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m")


@dataclass(frozen=True, slots=True)
class Spent:
    """One subject's counters for one period."""

    subject: str
    input_tokens: int
    output_tokens: int
    runs: int
    cost: float = 0.0
    cache_read_tokens: int = 0
    """Of ``input_tokens``, those read from the prompt cache."""
    cache_write_tokens: int = 0
    """Of ``input_tokens``, those written to the prompt cache."""

    @property
    def tokens(self) -> int:
        """Input plus output tokens."""
        return self.input_tokens + self.output_tokens


@dataclass(frozen=True, slots=True)
class Limit:
    """One budget a reservation must fit: a counter and its caps (0: no cap)."""

    scope: Scope
    subject: str
    period: str
    tokens: int = 0
    cost: float = 0.0

    @property
    def row(self) -> tuple[str, str, str]:
        """The counter's key in lock order: (scope, period, subject)."""
        return (self.scope, self.period, self.subject)


@dataclass(frozen=True, slots=True)
class Standing:
    """A counter against its limit: what was spent and what in-flight calls hold."""

    limit: Limit
    spent: int
    cost: float
    held: int = 0
    held_cost: float = 0.0


WARNINGS_KEPT = 62 * 86_400.0
"""Seconds a given 80 % warning is remembered: past its month, and the next."""

_LOCK_ROW = (
    "INSERT INTO usage (scope, subject, period) VALUES (?, ?, ?)"
    " ON CONFLICT (scope, period, subject) DO UPDATE SET runs = usage.runs")
"""Creates a counter's row or locks it (PostgreSQL keeps the row lock to the commit)."""


class UsageStore:
    """The usage counters, on the shared connection and writer."""

    def __init__(self, db: aiosqlite.Connection, lock: Any, writer: Writer,
                 clock: Callable[[], float] = time.time) -> None:
        self.db = db
        self.lock = lock
        self.writer = writer
        self.clock = clock
        """Wall-clock seconds deciding the day and month; tests replace it."""

    def record(self, subjects: list[tuple[Scope, str]], input_tokens: int,
               output_tokens: int, cost: float = 0.0, moment: float | None = None, *,
               cache_read_tokens: int = 0, cache_write_tokens: int = 0, runs: int = 1) -> None:
        """Add tokens (and their cost) to each subject's day and month, without a
        reservation to settle (queued; committed with the next write). The cache counts
        are parts of ``input_tokens``; ``runs`` is added to the run count."""
        moment = self.clock() if moment is None else moment
        rows = [(scope, subject, period, input_tokens, output_tokens, cost, cache_read_tokens,
                 cache_write_tokens, runs)
                for scope, subject in subjects
                for period in (day_of(moment), month_of(moment))]

        async def body(db: aiosqlite.Connection) -> None:
            await db.executemany(
                "INSERT INTO usage (scope, subject, period, input_tokens, output_tokens, cost,"
                " cache_read_tokens, cache_write_tokens, runs)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (scope, period, subject)"
                # Qualified: PostgreSQL reads a bare name here as ambiguous.
                " DO UPDATE SET input_tokens = usage.input_tokens + excluded.input_tokens,"
                " output_tokens = usage.output_tokens + excluded.output_tokens,"
                " cost = usage.cost + excluded.cost,"
                " cache_read_tokens = usage.cache_read_tokens + excluded.cache_read_tokens,"
                " cache_write_tokens = usage.cache_write_tokens + excluded.cache_write_tokens,"
                " runs = usage.runs + excluded.runs",
                rows)

        self.writer.write_later(body, what="counting tokens spent")

    async def flush(self) -> None:
        """Wait until every recorded run is committed."""
        await self.writer.write(_nothing, what="counting tokens spent")

    async def spent(self, scope: Scope, subject: str, period: str) -> int:
        """Tokens ``subject`` spent in ``period`` (a day or a month as :func:`day_of` gives)."""
        async with self.lock, self.db.execute(
            "SELECT input_tokens + output_tokens FROM usage"
            " WHERE scope = ? AND period = ? AND subject = ?", (scope, period, subject),
        ) as cur:
            row = await cur.fetchone()
        return int(row[0]) if row is not None else 0

    async def cost(self, scope: Scope, subject: str, period: str) -> float:
        """What ``subject``'s tokens in ``period`` cost by the price table."""
        async with self.lock, self.db.execute(
            "SELECT cost FROM usage WHERE scope = ? AND period = ? AND subject = ?",
            (scope, period, subject),
        ) as cur:
            row = await cur.fetchone()
        return float(row[0]) if row is not None else 0.0

    async def top(self, scope: Scope, period: str, limit: int = 10) -> list[Spent]:
        """The biggest spenders of ``scope`` in ``period``, most tokens first."""
        async with self.lock, self.db.execute(
            "SELECT subject, input_tokens, output_tokens, runs, cost, cache_read_tokens,"
            " cache_write_tokens FROM usage WHERE scope = ? AND period = ?"
            # A counter only ever reserved against (all its calls refused) spent nothing.
            " AND (input_tokens + output_tokens > 0 OR cost > 0)"
            " ORDER BY input_tokens + output_tokens DESC, subject LIMIT ?",
            (scope, period, limit),
        ) as cur:
            rows = await cur.fetchall()
        return [Spent(str(r[0]), int(r[1]), int(r[2]), int(r[3]), float(r[4]), int(r[5]),
                      int(r[6])) for r in rows]

    async def totals(self, scope: Scope, subject: str, period: str) -> Spent:
        """``subject``'s counters for ``period`` (zeros when it spent nothing)."""
        async with self.lock, self.db.execute(
            "SELECT subject, input_tokens, output_tokens, runs, cost, cache_read_tokens,"
            " cache_write_tokens FROM usage WHERE scope = ? AND period = ? AND subject = ?",
            (scope, period, subject),
        ) as cur:
            r = await cur.fetchone()
        if r is None:
            return Spent(subject, 0, 0, 0)
        return Spent(str(r[0]), int(r[1]), int(r[2]), int(r[3]), float(r[4]), int(r[5]),
                     int(r[6]))


    async def reserve(self, hold: str, limits: list[Limit], tokens: int, cost: float,
                      ttl: float) -> Standing | None:
        """Hold ``tokens`` (and ``cost``) against every limit in ``limits``, or nothing.

        ``None`` once held; else the first limit already reached counting the live
        holds of calls in flight (that call is refused). A limit admits a call while
        it is not reached, so what in-flight calls hold exceeds it by at most one
        call's reservation. Holds expire ``ttl`` seconds from now.
        """
        now = self.clock()
        ordered = sorted({limit.row: limit for limit in limits}.items())

        async def body(db: aiosqlite.Connection) -> Standing | None:
            for _, limit in ordered:
                standing = await _standing(db, limit, now)
                if ((limit.tokens and standing.spent + standing.held >= limit.tokens)
                        or (limit.cost and standing.cost + standing.held_cost >= limit.cost)):
                    return standing
            await db.executemany(
                "INSERT INTO usage_holds (hold, scope, subject, period, tokens, cost,"
                " expires_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(hold, scope, subject, period, tokens, cost, now + ttl)
                 for (scope, period, subject), _ in ordered])
            return None

        return cast("Standing | None", await self.writer.write(body, what="reserving tokens"))

    async def settle(self, hold: str, subjects: list[tuple[Scope, str]], input_tokens: int,
                     output_tokens: int, cost: float, *, cache_read_tokens: int = 0,
                     cache_write_tokens: int = 0, limits: Sequence[Limit] = (),
                     warn_at: float = 0.8, runs: int = 1) -> list[tuple[Standing, str]]:
        """Count one call's spend (``runs``: 1 for a run's first call, else 0) for each
        subject's day and month and drop its hold.

        Returns the limits among ``limits`` this spend took to ``warn_at`` of a cap
        for the first time in their period, with which cap (``tokens`` or ``cost``);
        each is returned once, across replicas.
        """
        now = self.clock()
        counted = input_tokens or output_tokens or cost
        rows = sorted({(scope, period, subject) for scope, subject in subjects
                       for period in (day_of(now), month_of(now))})
        warnable = [limit for limit in limits if limit.tokens or limit.cost]

        async def body(db: aiosqlite.Connection) -> list[tuple[Standing, str]]:
            if counted:
                await db.executemany(
                    "INSERT INTO usage (scope, subject, period, input_tokens, output_tokens,"
                    " cost, cache_read_tokens, cache_write_tokens, runs)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (scope, period, subject)"
                    " DO UPDATE SET input_tokens = usage.input_tokens + excluded.input_tokens,"
                    " output_tokens = usage.output_tokens + excluded.output_tokens,"
                    " cost = usage.cost + excluded.cost,"
                    " cache_read_tokens = usage.cache_read_tokens + excluded.cache_read_tokens,"
                    " cache_write_tokens = usage.cache_write_tokens"
                    " + excluded.cache_write_tokens, runs = usage.runs + excluded.runs",
                    [(scope, subject, period, input_tokens, output_tokens, cost,
                      cache_read_tokens, cache_write_tokens, runs)
                     for scope, period, subject in rows])
            await db.execute("DELETE FROM usage_holds WHERE hold = ?", (hold,))
            if not counted:
                return []
            warned = []
            for limit in warnable:
                standing = await _standing(db, limit, now, holds=False)
                kinds = []
                if limit.tokens and standing.spent >= warn_at * limit.tokens:
                    kinds.append("tokens")
                if limit.cost and standing.cost >= warn_at * limit.cost:
                    kinds.append("cost")
                for kind in kinds:
                    async with db.execute(
                        "INSERT INTO budget_warnings (scope, subject, period, kind, warned_at)"
                        " VALUES (?, ?, ?, ?, ?) ON CONFLICT (scope, period, subject, kind)"
                        " DO NOTHING RETURNING kind",
                        (limit.scope, limit.subject, limit.period, kind, now),
                    ) as cur:
                        if await cur.fetchone() is not None:
                            warned.append((standing, kind))
            return warned

        return cast("list[tuple[Standing, str]]",
                    await self.writer.write(body, what="counting tokens spent"))

    def release(self, hold: str) -> None:
        """Drop reservation ``hold`` without counting anything (queued after any write
        of it already queued, so a reservation still committing is dropped too)."""

        async def body(db: aiosqlite.Connection) -> None:
            await db.execute("DELETE FROM usage_holds WHERE hold = ?", (hold,))

        self.writer.write_later(body, what="releasing a reservation")

    async def drop_expired(self) -> int:
        """Delete every expired reservation (those of counters reserved again are dropped
        then already), and the 80 % warnings of periods over for a month; returns how many
        reservations."""
        now = self.clock()

        async def body(db: aiosqlite.Connection) -> int:
            await db.execute("DELETE FROM budget_warnings WHERE warned_at < ?",
                             (now - WARNINGS_KEPT,))
            async with db.execute("DELETE FROM usage_holds WHERE expires_at <= ?",
                                  (now,)) as cur:
                return int(cur.rowcount)

        return cast("int", await self.writer.write(body, what="deleting expired reservations"))

    async def held(self, scope: Scope, subject: str, period: str) -> int:
        """Tokens that calls in flight hold against ``subject`` in ``period``."""
        async with self.lock, self.db.execute(
            "SELECT COALESCE(SUM(tokens), 0) FROM usage_holds"
            " WHERE scope = ? AND period = ? AND subject = ? AND expires_at > ?",
            (scope, period, subject, self.clock()),
        ) as cur:
            row = await cur.fetchone()
        return int(row[0]) if row is not None else 0

    async def admit_request(self, subject: str, limit: int, window: float) -> float | None:
        """Count one request of ``subject`` if fewer than ``limit`` were made in the last
        ``window`` seconds (``None``); else the seconds until one may be made."""
        now = self.clock()

        async def body(db: aiosqlite.Connection) -> float | None:
            await db.execute(
                "INSERT INTO request_windows (subject, stamps) VALUES (?, '')"
                " ON CONFLICT (subject) DO UPDATE SET stamps = request_windows.stamps",
                (subject,))
            async with db.execute("SELECT stamps FROM request_windows WHERE subject = ?",
                                  (subject,)) as cur:
                row = await cur.fetchone()
            stamps = [float(s) for s in str(row[0] if row else "").split() if s]
            recent = sorted(s for s in stamps if s > now - window)
            if len(recent) >= limit:
                wait = recent[len(recent) - limit] + window - now
            else:
                recent.append(now)
                wait = None
            await db.execute("UPDATE request_windows SET stamps = ? WHERE subject = ?",
                             (" ".join(repr(s) for s in recent), subject))
            return wait

        return cast("float | None", await self.writer.write(body, what="counting a request"))


async def _standing(db: aiosqlite.Connection, limit: Limit, now: float, *,
                    holds: bool = True) -> Standing:
    """``limit``'s counter, its row locked, with its live holds (expired ones dropped)."""
    key = (limit.scope, limit.period, limit.subject)
    await db.execute(_LOCK_ROW, (limit.scope, limit.subject, limit.period))
    async with db.execute(
        "SELECT input_tokens + output_tokens, cost FROM usage"
        " WHERE scope = ? AND period = ? AND subject = ?", key,
    ) as cur:
        row = await cur.fetchone()
    spent, cost = (int(row[0]), float(row[1])) if row is not None else (0, 0.0)
    if not holds:
        return Standing(limit, spent, cost)
    # Only ever changed under this row's lock: counted here, expired ones go.
    await db.execute("DELETE FROM usage_holds WHERE scope = ? AND period = ? AND subject = ?"
                     " AND expires_at <= ?", (*key, now))
    async with db.execute(
        "SELECT COALESCE(SUM(tokens), 0), COALESCE(SUM(cost), 0) FROM usage_holds"
        " WHERE scope = ? AND period = ? AND subject = ?", key,
    ) as cur:
        row = await cur.fetchone()
    held, held_cost = (int(row[0]), float(row[1])) if row is not None else (0, 0.0)
    return Standing(limit, spent, cost, held, held_cost)


async def _nothing(db: aiosqlite.Connection) -> None:
    return None
