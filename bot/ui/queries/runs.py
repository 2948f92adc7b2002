"""One run's trace for the Control UI: its record, its spans laid out as a waterfall,
the delivery of its reply, and the errors stored while it ran.

Spans come from :meth:`~bot.storage.sessions.SessionStore.spans`; the delivery from
the outbox rows of the inbox entries the run answered (schema step 24 indexes
``inbox.run_id``); the errors from the error store's rows of the run's session
within its time span.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bot.observability.tracing import Span
from bot.storage.sessions import SessionStore
from bot.ui.queries.reads import fetch
from bot.ui.queries.sessions import RUN_SELECT, RunBrief, run_brief, session_id_of


@dataclass(frozen=True, slots=True)
class Bar:
    """One row of the waterfall: a span (or the delivery) placed on the run's time axis.

    ``offset`` and ``width`` are percentages of the axis; ``depth`` is how far below
    the root it hangs; ``facts`` the attributes worth showing, in order.
    """

    kind: str
    name: str
    started_at: float
    duration_ms: float
    error: bool
    depth: int
    offset: float
    width: float
    facts: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Delivery:
    """The reply of an inbox entry the run answered, as the outbox holds it."""

    outbox_id: int
    channel: str
    state: str
    attempts: int
    created_at: float
    updated_at: float
    received_at: float


@dataclass(frozen=True, slots=True)
class ErrorRef:
    """A stored error of the run's session written while it ran."""

    id: str
    timestamp: float
    tool_name: str
    short_summary: str


@dataclass(frozen=True, slots=True)
class RunTrace:
    """Everything the run page shows."""

    run: RunBrief
    session_id: int | None
    bars: list[Bar]
    total_ms: float
    deliveries: list[Delivery]
    errors: list[ErrorRef]


_FACTS: dict[str, tuple[str, ...]] = {
    "llm": ("provider", "model", "iteration", "input_tokens", "output_tokens",
            "cache_read_tokens", "cache_write_tokens", "output_preview"),
    "tool": ("name", "call_id", "is_error", "output_preview"),
    "agent": ("agent", "kind", "status", "error_message", "output_preview"),
    "patterns": ("matched",),
    "judge": ("judge", "attempt", "strategy", "threshold", "score", "reasons",
              "aggregate_score", "passed"),
}
"""Per span kind, the attributes shown (others, such as a verbose model input, are not)."""


def _fact(value: Any) -> str:
    return value if isinstance(value, str) else repr(value) if isinstance(value, float) \
        else str(value)


def _bars(spans: list[Span], start: float, total_ms: float) -> list[Bar]:
    parents = {s.span_id: s.parent_id for s in spans}

    def depth(span: Span) -> int:
        level, parent = 0, span.parent_id
        while parent is not None and level < 32:
            level, parent = level + 1, parents.get(parent)
        return level

    axis = max(total_ms, 1e-3)
    bars = []
    for s in spans:
        offset = max(0.0, (s.started_at - start) * 1000)
        facts = tuple((k, _fact(s.attributes[k])) for k in _FACTS.get(s.kind, ())
                      if k in s.attributes and s.attributes[k] not in ("", None))
        bars.append(Bar(s.kind, s.name, s.started_at, s.duration_ms, s.error, depth(s),
                        min(100.0, offset / axis * 100),
                        max(0.5, min(100.0, s.duration_ms / axis * 100)), facts))
    return bars


async def run_trace(store: SessionStore, run_id: str) -> RunTrace | None:
    """The trace of run ``run_id``, or ``None`` when no record of it is stored (it is
    still running, or its trace was pruned)."""
    rows = await fetch(store, f"{RUN_SELECT} WHERE r.id = ?", [run_id])
    if not rows:
        return None
    run = run_brief(rows[0])
    spans = await store.spans(run_id)
    deliveries = [Delivery(int(r[0]), str(r[1]), str(r[2]), int(r[3]), float(r[4]), float(r[5]),
                           float(r[6])) for r in await fetch(store, (
        "SELECT o.id, o.channel, o.state, o.attempts, o.created_at, o.updated_at, i.received_at"
        " FROM inbox i JOIN outbox o ON o.inbox_id = i.id WHERE i.run_id = ? ORDER BY o.id"),
        [run_id])]
    start = min([run.started_at, *(s.started_at for s in spans)])
    end = max([run.ended_at, *(s.started_at + s.duration_ms / 1000 for s in spans),
               *(d.updated_at for d in deliveries if d.state != "pending")])
    total_ms = (end - start) * 1000
    bars = _bars(spans, start, total_ms)
    for d in deliveries:
        if d.state == "pending":
            continue
        offset = max(0.0, (d.created_at - start) * 1000)
        bars.append(Bar("delivery", f"reply via {d.channel}", d.created_at,
                        (d.updated_at - d.created_at) * 1000, d.state == "failed", 1,
                        min(100.0, offset / max(total_ms, 1e-3) * 100),
                        max(0.5, (d.updated_at - d.created_at) * 1000 / max(total_ms, 1e-3)
                            * 100),
                        (("state", d.state), ("attempts", str(d.attempts)))))
    errors = [ErrorRef(str(r[0]), float(r[1]), str(r[2]), str(r[3])) for r in await fetch(
        store, "SELECT id, timestamp, tool_name, short_summary FROM agent_errors"
               " WHERE session_id = ? AND timestamp >= ? AND timestamp <= ?"
               " ORDER BY timestamp, id", [run.session_key, run.started_at, run.ended_at + 1])]
    session_id = await session_id_of(store, run.session_key, run.started_at)
    return RunTrace(run, session_id, bars, total_ms, deliveries, errors)
