"""Reading the shared database for the Control UI's session, run and error pages.

On SQLite every coroutine shares one connection, so a read holds the store's
lock (it must not land inside another coroutine's transaction); on PostgreSQL a
read outside a transaction takes a pooled connection of its own and waits for
nothing. Keyset cursors (``?before=``) are parsed here: a malformed one is a
:class:`BadCursor`, which a page answers with one line (400).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from bot.storage.db import Dialect, dialect_of
from bot.storage.sessions import SessionStore


class BadCursor(ValueError):
    """A ``before`` cursor that is not one a page handed out."""


def dialect(store: SessionStore) -> Dialect:
    """Which backend ``store`` talks to."""
    return dialect_of(store.db)


async def fetch(store: SessionStore, sql: str, params: Sequence[Any] = ()) -> list[Any]:
    """The rows of ``sql`` (SQLite's dialect; translated on PostgreSQL)."""
    shared = store.lock if dialect(store) == "sqlite" else contextlib.nullcontext()
    async with shared:
        return list(await store.db.execute_fetchall(sql, tuple(params)))


def like_escaped(text: str) -> str:
    """``text`` as a literal inside a ``LIKE ... ESCAPE '\\'`` pattern."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def time_cursor(stamp: float, key: str | int) -> str:
    """The cursor of a row ordered by (time, key), newest first."""
    return f"{stamp!r}~{key}"


def parse_time_cursor(cursor: str) -> tuple[float, str]:
    """The (time, key) of a :func:`time_cursor`; :class:`BadCursor` if it is not one."""
    stamp, sep, key = cursor.partition("~")
    try:
        value = float(stamp)
    except ValueError:
        raise BadCursor(f"not a page cursor: {cursor[:40]!r}") from None
    if not sep or not key or value != value:  # NaN never names a row
        raise BadCursor(f"not a page cursor: {cursor[:40]!r}")
    return value, key


def parse_id_cursor(cursor: str) -> int:
    """A row id cursor; :class:`BadCursor` if it is not a positive integer."""
    if not cursor.isdigit() or len(cursor) > 18:
        raise BadCursor(f"not a page cursor: {cursor[:40]!r}")
    return int(cursor)
