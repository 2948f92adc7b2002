"""DM pairing: the codes unknown users are given and the users an admin approved.

Under ``dm_policy = "pairing"`` a direct message from someone who is neither
an admin, allowlisted nor approved is refused with a code (schema step 14).
One code is pending per user at a time: it is handed out again while valid,
expires after ``pairing_code_ttl`` seconds, and is used once — approving it
records the user in ``paired_users`` and the code can never approve anyone
again. Everything is in the database, so a code survives a restart and
``roost pairing approve`` works from another process.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiosqlite

from bot.storage.db import Writer

CODE_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZ23456789"
"""Upper-case letters and 2-9: no 0 or 1, so nothing reads as O or I (or l)."""
CODE_LENGTH = 8
REMIND_AFTER = 600.0
"""A user who keeps writing is given their pending code again at most this often (s)."""
KEEP_REQUESTS = 7 * 86_400.0
"""Expired, used and revoked requests are deleted this long after they expired (s)."""


def new_code() -> str:
    """A fresh pairing code: 8 characters of ``CODE_ALPHABET`` from ``secrets``."""
    return "".join(secrets.choice(CODE_ALPHABET) for _ in range(CODE_LENGTH))


def normalize_code(code: str) -> str:
    """A code as typed (any case, stray spaces or dashes) in its stored form."""
    return "".join(ch for ch in code.upper() if ch.isalnum())


@dataclass(frozen=True, slots=True)
class PairingRequest:
    """A pending code: who asked, from which chat, until when it is valid."""

    code: str
    channel: str
    user_id: str
    chat_id: str
    display_name: str
    created_at: float
    expires_at: float
    refused: int
    """Messages of this user refused while the code was pending."""

    @property
    def user(self) -> str:
        """``channel:user_id``."""
        return f"{self.channel}:{self.user_id}"


@dataclass(frozen=True, slots=True)
class PairedUser:
    """A user an admin approved."""

    channel: str
    user_id: str
    display_name: str
    approved_by: str
    approved_at: float

    @property
    def user(self) -> str:
        """``channel:user_id``."""
        return f"{self.channel}:{self.user_id}"


@dataclass(frozen=True, slots=True)
class Refusal:
    """What :meth:`AccessStore.refuse` decided: the user's code, and whether to send it now."""

    code: str
    expires_at: float
    notify: bool


class AccessStore:
    """Pairing codes and approved users, on the shared connection and writer."""

    def __init__(self, db: aiosqlite.Connection, lock: Any, writer: Writer, *,
                 ttl: float = 3600.0, clock: Callable[[], float] = time.time) -> None:
        self.db = db
        self.ttl = ttl
        """Seconds a new code stays valid (``pairing_code_ttl``)."""
        self.lock = lock
        self.writer = writer
        self.clock = clock
        """Wall-clock seconds; tests replace it to expire codes."""
        self._paired: set[tuple[str, str]] = set()
        # Users known to be paired: every DM asks, and a read under the shared lock
        # per message would queue behind commits. Only positives are kept, so an
        # approval by `roost pairing approve` from another process is still seen.

    def forget_cached(self) -> None:
        """Drop the cached approvals (another replica revoked one): ask the table again."""
        self._paired.clear()

    async def is_paired(self, channel: str, user_id: str) -> bool:
        """Whether an admin approved ``user_id`` on ``channel`` (and did not revoke it)."""
        if (channel, user_id) in self._paired:
            return True
        async with self.lock, self.db.execute(
            "SELECT 1 FROM paired_users WHERE channel = ? AND user_id = ?", (channel, user_id),
        ) as cur:
            paired = await cur.fetchone() is not None
        if paired:
            self._paired.add((channel, user_id))
        return paired

    async def refuse(self, channel: str, user_id: str, chat_id: str,
                     display_name: str = "") -> Refusal:
        """Record a refused message of an unpaired user; their code, and whether to send it.

        The pending code is reused while valid; a reminder goes out at most once
        per :data:`REMIND_AFTER` seconds. An expired code gives way to a new one.
        """
        now = self.clock()

        async def body(db: aiosqlite.Connection) -> Refusal:
            async with db.execute(
                "SELECT code, expires_at, notified_at FROM pairing_requests"
                " WHERE channel = ? AND user_id = ? AND state = 'pending' AND expires_at > ?"
                " ORDER BY created_at DESC LIMIT 1", (channel, user_id, now),
            ) as cur:
                row = await cur.fetchone()
            if row is not None:
                code, expires_at, notified_at = str(row[0]), float(row[1]), float(row[2])
                notify = now - notified_at >= REMIND_AFTER
                await db.execute(
                    "UPDATE pairing_requests SET refused = refused + 1,"
                    " notified_at = CASE WHEN ? THEN ? ELSE notified_at END WHERE code = ?",
                    (notify, now, code))
                return Refusal(code, expires_at, notify)
            return await self._insert(db, channel, user_id, chat_id, display_name, now)

        result: Refusal = await self.writer.write(body, what="recording a pairing request")
        return result

    async def _insert(self, db: aiosqlite.Connection, channel: str, user_id: str,
                      chat_id: str, display_name: str, now: float) -> Refusal:
        expires_at = now + self.ttl
        # Strangers keep coming: old requests go as new ones are made (paired_users
        # is the record of who was approved).
        await db.execute("DELETE FROM pairing_requests WHERE expires_at < ?",
                         (now - KEEP_REQUESTS,))
        while True:
            code = new_code()
            cur = await db.execute(
                "INSERT OR IGNORE INTO pairing_requests (code, channel, user_id, chat_id,"
                " display_name, created_at, expires_at, notified_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (code, channel, user_id, chat_id, display_name[:100], now, expires_at, now))
            if cur.rowcount == 1:  # 34^8 codes: a collision is all but impossible
                return Refusal(code, expires_at, True)

    async def approve(self, code: str, approved_by: str) -> PairingRequest | None:
        """Approve the pending, unexpired request with ``code``; ``None`` if there is none.

        The code is used up in the same transaction that records the user.
        """
        code, now = normalize_code(code), self.clock()

        async def body(db: aiosqlite.Connection) -> PairingRequest | None:
            async with db.execute(
                "SELECT code, channel, user_id, chat_id, display_name, created_at, expires_at,"
                " refused FROM pairing_requests"
                " WHERE code = ? AND state = 'pending' AND expires_at > ?", (code, now),
            ) as cur:
                row = await cur.fetchone()
            if row is None:
                return None
            request = PairingRequest(str(row[0]), str(row[1]), str(row[2]), str(row[3]),
                                     str(row[4]), float(row[5]), float(row[6]), int(row[7]))
            await db.execute(
                "UPDATE pairing_requests SET state = 'approved', used_at = ? WHERE code = ?",
                (now, code))
            await db.execute(
                "INSERT OR REPLACE INTO paired_users (channel, user_id, display_name,"
                " approved_by, approved_at) VALUES (?, ?, ?, ?, ?)",
                (request.channel, request.user_id, request.display_name, approved_by, now))
            return request

        result: PairingRequest | None = await self.writer.write(
            body, what="approving a pairing code")
        return result

    async def revoke(self, channel: str, user_id: str) -> bool:
        """Forget an approved user (their pending codes too); False if they were not paired."""
        self._paired.discard((channel, user_id))
        async def body(db: aiosqlite.Connection) -> bool:
            cur = await db.execute(
                "DELETE FROM paired_users WHERE channel = ? AND user_id = ?", (channel, user_id))
            await db.execute(
                "UPDATE pairing_requests SET state = 'revoked'"
                " WHERE channel = ? AND user_id = ? AND state = 'pending'", (channel, user_id))
            return cur.rowcount > 0

        result: bool = await self.writer.write(body, what="revoking a paired user")
        return result

    async def deny(self, code: str) -> bool:
        """Refuse the pending request with ``code`` (it can no longer be approved; the
        user's next DM gets a new code); whether one was pending."""
        code = normalize_code(code)

        async def body(db: aiosqlite.Connection) -> bool:
            cur = await db.execute(
                "UPDATE pairing_requests SET state = 'revoked', used_at = ?"
                " WHERE code = ? AND state = 'pending'", (self.clock(), code))
            return int(cur.rowcount) > 0

        result: bool = await self.writer.write(body, what="denying a pairing code")
        return result

    async def pending(self) -> list[PairingRequest]:
        """Requests whose code is still valid, oldest first."""
        async with self.lock, self.db.execute(
            "SELECT code, channel, user_id, chat_id, display_name, created_at, expires_at,"
            " refused FROM pairing_requests WHERE state = 'pending' AND expires_at > ?"
            " ORDER BY created_at", (self.clock(),),
        ) as cur:
            rows = await cur.fetchall()
        return [PairingRequest(str(r[0]), str(r[1]), str(r[2]), str(r[3]), str(r[4]),
                               float(r[5]), float(r[6]), int(r[7])) for r in rows]

    async def paired(self) -> list[PairedUser]:
        """Approved users, in the order they were approved."""
        async with self.lock, self.db.execute(
            "SELECT channel, user_id, display_name, approved_by, approved_at FROM paired_users"
            " ORDER BY approved_at",
        ) as cur:
            rows = await cur.fetchall()
        return [PairedUser(str(r[0]), str(r[1]), str(r[2]), str(r[3]), float(r[4]))
                for r in rows]

    async def find_paired(self, user: str, channel: str) -> list[PairedUser]:
        """Approved users matching ``user``: ``channel:user_id``, or a bare id on ``channel``
        (else on any channel)."""
        users = await self.paired()
        if ":" in user:
            return [u for u in users if u.user == user]
        here = [u for u in users if u.user_id == user and u.channel == channel]
        return here or [u for u in users if u.user_id == user]
