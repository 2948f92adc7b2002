"""Which plugins an admin disabled, persisted in the ``plugin_state`` table."""

from __future__ import annotations

import asyncio
import time

import aiosqlite


async def load_disabled(db: aiosqlite.Connection, lock: asyncio.Lock) -> set[str]:
    """Names of the plugins stored as disabled."""
    async with lock, db.execute("SELECT name FROM plugin_state WHERE enabled = 0") as cur:
        rows = await cur.fetchall()
    return {str(r[0]) for r in rows}


async def save_state(db: aiosqlite.Connection, lock: asyncio.Lock, name: str,
                     enabled: bool) -> None:
    """Record that plugin ``name`` is enabled or disabled."""
    async with lock:
        await db.execute(
            "INSERT INTO plugin_state (name, enabled, updated_at) VALUES (?, ?, ?) "
            "ON CONFLICT(name) DO UPDATE SET enabled = excluded.enabled, "
            "updated_at = excluded.updated_at",
            (name, int(enabled), time.time()))
