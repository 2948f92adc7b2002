"""The error store for the Control UI: the list (filtered by tool, error kind, user and
session; newest first, keyset-paged) and one error in full.

The detail is :func:`bot.storage.errors.error_report` of
:meth:`~bot.storage.errors.ErrorStore.get`: exactly what ``roost errors show`` prints.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from bot.storage.errors import ErrorStore, StoredError, error_report
from bot.storage.sessions import SessionStore
from bot.tools.error_patterns import ERROR_TYPES
from bot.ui.queries.reads import fetch, like_escaped, parse_time_cursor, time_cursor
from bot.ui.queries.sessions import session_id_of

PAGE = 50
"""Errors per page."""

KINDS = tuple(sorted(ERROR_TYPES))
"""The error kinds a tool error is classified as (its ``error_type``)."""


@dataclass(frozen=True, slots=True)
class ErrorFilter:
    """What the list is narrowed to; empty strings mean no filter."""

    tool: str = ""
    kind: str = ""
    user: str = ""
    session: str = ""


@dataclass(frozen=True, slots=True)
class ErrorRow:
    """One stored error in the list."""

    id: str
    timestamp: float
    session_key: str
    tool_name: str
    short_summary: str
    kind: str


@dataclass(frozen=True, slots=True)
class ErrorPage:
    """A page of the list; ``before`` is the cursor of the next (older) page, if any."""

    rows: list[ErrorRow]
    before: str | None


def kind_of(raw: str) -> str:
    """The ``error_type`` of a stored raw error (``""`` when it has none)."""
    try:
        parsed = json.loads(raw)
    except ValueError:
        return ""
    kind = parsed.get("error_type") if isinstance(parsed, dict) else None
    return kind if isinstance(kind, str) else ""


async def list_errors(store: SessionStore, f: ErrorFilter = ErrorFilter(),
                      before: str | None = None, limit: int = PAGE) -> ErrorPage:
    """Stored errors matching every filter of ``f``, newest first.

    ``user`` matches the errors of that user's direct chats (a group's session
    key does not name who was speaking).
    """
    clauses: list[str] = []
    params: list[Any] = []
    if f.tool:
        clauses.append("tool_name = ?")
        params.append(f.tool)
    if f.session:
        clauses.append("session_id = ?")
        params.append(f.session)
    if f.user:
        clauses.append("session_id LIKE ? ESCAPE '\\'")
        params.append("%:direct:" + like_escaped(f.user))
    if f.kind:
        # The store writes the raw error with json.dumps' default separators.
        clauses.append("raw_error LIKE ? ESCAPE '\\'")
        params.append('%"error_type": ' + like_escaped(json.dumps(f.kind)) + "%")
    if before:
        stamp, error_id = parse_time_cursor(before)
        clauses.append("(timestamp < ? OR (timestamp = ? AND id < ?))")
        params.extend([stamp, stamp, error_id])
    where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
    rows = await fetch(store, (
        "SELECT id, timestamp, session_id, tool_name, short_summary, raw_error"
        f" FROM agent_errors{where} ORDER BY timestamp DESC, id DESC LIMIT ?"),
        [*params, limit + 1])
    out = [ErrorRow(str(r[0]), float(r[1]), str(r[2]), str(r[3]), str(r[4]), kind_of(str(r[5])))
           for r in rows[:limit]]
    more = len(rows) > limit and out
    return ErrorPage(out, time_cursor(out[-1].timestamp, out[-1].id) if more else None)


async def tool_names(store: SessionStore) -> list[str]:
    """Every tool with a stored error (the tool filter's choices)."""
    return [str(r[0]) for r in await fetch(
        store, "SELECT DISTINCT tool_name FROM agent_errors ORDER BY tool_name")]


@dataclass(frozen=True, slots=True)
class ErrorDetail:
    """One error in full: the record, the text ``roost errors show`` prints, and where it
    happened (its session's id, and the run a run failure names)."""

    error: StoredError
    report: str
    kind: str
    session_id: int | None
    run_id: str


async def error_detail(store: SessionStore, error_id: str) -> ErrorDetail | None:
    """The error with this ID, or ``None``."""
    found = await ErrorStore(store.db, store.lock).get(error_id)
    if found is None:
        return None
    run_id = found.raw_error.get("run_id")
    kind = found.raw_error.get("error_type")
    return ErrorDetail(found, error_report(found), kind if isinstance(kind, str) else "",
                       await session_id_of(store, found.session_id, found.timestamp),
                       run_id if isinstance(run_id, str) else "")
