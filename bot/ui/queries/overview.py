"""What the Overview page shows: readiness, replicas, queues, breakers, runs, errors, spend.

Every count reads an index (the open inbox and pending outbox partial indexes,
``runs_ended``, the errors' timestamp index, the usage key), so the page costs the
same with a million rows as with ten.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bot.app.http import gauges
from bot.storage.usage import day_of
from bot.ui.queries.reads import fetch

if TYPE_CHECKING:
    from bot.app.roost import Roost


@dataclass(frozen=True, slots=True)
class Part:
    """One channel (or other part) and whether it is ready."""

    name: str
    ready: bool
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Replica:
    """One live replica: its id, since when, and whether it is this process."""

    id: str
    started_at: float
    here: bool


@dataclass(frozen=True, slots=True)
class Queue:
    """Entries waiting and when the oldest of them arrived (``None``: empty)."""

    depth: int
    oldest: float | None

    def age(self, now: float) -> float | None:
        """Seconds the oldest entry has waited."""
        return None if self.oldest is None else max(0.0, now - self.oldest)


@dataclass(frozen=True, slots=True)
class Overview:
    """Everything on the Overview page, read at ``now``."""

    now: float
    ready: bool
    parts: list[Part]
    problems: list[str]
    """The lines ``/readyz`` answers with (empty when ready)."""
    replicas: list[Replica]
    leading: bool
    """Whether this process is the leader (always on SQLite)."""
    inbox: Queue
    outbox: Queue
    breakers: dict[str, str]
    queued: int
    active_runs: int
    runs_last_minute: int
    errors_last_hour: int
    input_tokens: int
    output_tokens: int
    cost: float
    notes: list[str] = field(default_factory=list)


async def _one(app: Roost, sql: str, params: tuple[Any, ...] = ()) -> tuple[Any, ...]:
    found = await fetch(app.store, sql, params)
    return tuple(found[0]) if found else ()


async def read_overview(app: Roost, now: float | None = None) -> Overview:
    """Read the Overview's facts from the running app and its store."""
    now = time.time() if now is None else now
    server = app.http
    problems = await server.problems() if server is not None else []
    names = list(dict.fromkeys([*(server.expected if server is not None else []),
                                *app.channels]))
    parts = []
    for name in names:
        line = next((p for p in problems if p.startswith(f"{name}: ")), None)
        parts.append(Part(name, line is None, "" if line is None else line[len(name) + 2:]))
    live_replicas = await fetch(app.store, "SELECT id, started_at FROM replicas"
                                           " WHERE expires_at > ? ORDER BY started_at", (now,))
    replicas = [Replica(str(r[0]), float(r[1]), str(r[0]) == app.replica)
                for r in live_replicas]
    inbox = await _one(app, "SELECT COUNT(*), MIN(received_at) FROM inbox"
                            " WHERE state IN ('pending', 'running')")
    outbox = await _one(app, "SELECT COUNT(*), MIN(created_at) FROM outbox"
                             " WHERE state = 'pending'")
    runs = await _one(app, "SELECT COUNT(*) FROM runs WHERE ended_at > ?", (now - 60,))
    errors = await _one(app, "SELECT COUNT(*) FROM agent_errors WHERE timestamp > ?",
                        (now - 3600,))
    spent = await _one(app, "SELECT COALESCE(SUM(input_tokens), 0),"
                            " COALESCE(SUM(output_tokens), 0), COALESCE(SUM(cost), 0)"
                            " FROM usage WHERE scope = 'agent' AND period = ?", (day_of(now),))
    live = gauges(app)
    return Overview(
        now=now, ready=not problems, parts=parts, problems=problems, replicas=replicas,
        leading=app.leader.is_leader,
        inbox=Queue(int(inbox[0]), None if inbox[1] is None else float(inbox[1])),
        outbox=Queue(int(outbox[0]), None if outbox[1] is None else float(outbox[1])),
        breakers=dict(sorted(live.breakers.items())), queued=live.queued,
        active_runs=live.active_runs, runs_last_minute=int(runs[0]),
        errors_last_hour=int(errors[0]), input_tokens=int(spent[0]),
        output_tokens=int(spent[1]), cost=float(spent[2]))

