"""The ``channel_state`` table: a channel's durable notes, such as a sync token or the
last mail UID, kept per channel name and shared by the replicas of one database."""

from __future__ import annotations

import asyncio
import time

import aiosqlite

from bot.storage.db import Writer


class ChannelStateStore:
    """One channel's notes (:class:`~bot.contracts.channel.ChannelState`) in the main database."""

    def __init__(self, channel: str, db: aiosqlite.Connection, lock: asyncio.Lock,
                 writer: Writer) -> None:
        self.channel = channel
        self.db = db
        self.lock = lock
        self.writer = writer

    async def get(self, key: str) -> str | None:
        """The value last put under ``key``, or ``None``."""
        async with self.lock, self.db.execute(
                "SELECT value FROM channel_state WHERE channel = ? AND key = ?",
                (self.channel, key)) as cur:
            row = await cur.fetchone()
        return None if row is None else str(row[0])

    async def put(self, key: str, value: str) -> None:
        """Record ``value`` under ``key``; returns once committed."""
        await self.writer.write(
            lambda db: db.execute(
                "INSERT INTO channel_state (channel, key, value, updated_at)"
                " VALUES (?, ?, ?, ?) ON CONFLICT (channel, key) DO UPDATE"
                " SET value = excluded.value, updated_at = excluded.updated_at",
                (self.channel, key, value, time.time())),
            what=f"recording {self.channel}'s {key}")
