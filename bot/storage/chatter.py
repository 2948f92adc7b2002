"""Group chatter: messages in a group the bot was not addressed in, kept for the
session's next run.

They are stored, not held in memory: the next run takes them whichever replica
received them, and a restart in between keeps them. Each session keeps its newest
``limit``; a run takes (and so deletes) what its session has.
"""

from __future__ import annotations

import aiosqlite

from bot.contracts.messages import InboundMessage
from bot.storage.db import Writer
from bot.storage.inbox import decode_message, encode_message


class GroupChatter:
    """The chatter of every group session, written through ``writer`` (the inbox's)."""

    def __init__(self, writer: Writer) -> None:
        self.writer = writer

    async def keep(self, key: str, message: InboundMessage, limit: int) -> None:
        """Add ``message`` to session ``key``'s chatter, keeping its newest ``limit``."""
        async def body(db: aiosqlite.Connection) -> None:
            await db.execute("INSERT INTO group_chatter (session_key, message) VALUES (?, ?)",
                             (key, encode_message(message)))
            await db.execute(
                "DELETE FROM group_chatter WHERE session_key = ? AND id NOT IN (SELECT id"
                " FROM group_chatter WHERE session_key = ? ORDER BY id DESC LIMIT ?)",
                (key, key, limit))

        await self.writer.write(body, what=f"keeping group chatter of {key}")

    async def take(self, key: str) -> list[InboundMessage]:
        """Session ``key``'s chatter, oldest first, removed from the store."""
        async def body(db: aiosqlite.Connection) -> list[tuple[int, str]]:
            rows = await db.execute_fetchall(
                "DELETE FROM group_chatter WHERE session_key = ? RETURNING id, message", (key,))
            return [(int(r[0]), str(r[1])) for r in rows]

        taken: list[tuple[int, str]] = await self.writer.write(
            body, what=f"taking group chatter of {key}")
        return [decode_message(text) for _, text in sorted(taken)]
