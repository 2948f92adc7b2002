"""Reading the shared database for the operations pages (usage, access, outbox, jobs).

On SQLite every coroutine shares one connection, so a read holds the store's lock
(it must not land inside another coroutine's transaction); on PostgreSQL a read
outside a transaction takes a pooled connection of its own. Keyset cursors
(``?before=``) are parsed here: a malformed one is a :class:`BadCursor`, which a
page answers with one line (400).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from bot.storage.db import dialect_of
from bot.storage.sessions import SessionStore

PAGE_SIZE = 50
"""Rows of a list page."""


class BadCursor(ValueError):
    """A ``before``/``after`` cursor that is not one a page handed out."""


async def rows(store: SessionStore, sql: str, params: Sequence[Any] = ()) -> list[Any]:
    """The rows of ``sql`` (SQLite's dialect; translated on PostgreSQL)."""
    shared = store.lock if dialect_of(store.db) == "sqlite" else contextlib.nullcontext()
    async with shared:
        return list(await store.db.execute_fetchall(sql, tuple(params)))


def id_cursor(text: str | None) -> int | None:
    """The row id a ``before`` cursor names (``None``: the first page)."""
    if not text:
        return None
    if not text.isdigit() or len(text) > 18:
        raise BadCursor(f"not a page cursor: {text[:40]!r}")
    return int(text)


def pair_cursor(text: str | None) -> tuple[float, str] | None:
    """The (time, key) a ``time~key`` cursor names (``None``: the first page)."""
    if not text:
        return None
    stamp, sep, key = text.partition("~")
    try:
        value = float(stamp)
    except ValueError:
        raise BadCursor(f"not a page cursor: {text[:40]!r}") from None
    if not sep or not key or value != value or len(key) > 300:
        raise BadCursor(f"not a page cursor: {text[:40]!r}")
    return value, key


def make_pair_cursor(stamp: float, key: str) -> str:
    """The cursor of a row ordered by (time, key)."""
    return f"{stamp!r}~{key}"
