"""The Control UI's accounts, login sessions and audit log (schema step 23).

Rows only: hashing passwords and session tokens is the caller's
(:mod:`bot.ui.accounts`); this store never sees a password or a session token in
clear. Every query runs on SQLite and PostgreSQL, so on a PostgreSQL deployment
every replica shares the accounts, the logins and the audit log.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aiosqlite

from bot.storage.db import Writer

ROLES = ("viewer", "operator", "admin")
"""The roles, least first: each one may do what the ones before it may."""
MAX_NAME = 64
"""Characters an account name may have."""
NAME_RULE = f"1 to {MAX_NAME} printable characters, not 'local'"
"""What :func:`valid_name` admits, for the line that refuses a name."""


def valid_name(name: str) -> bool:
    """Whether ``name`` (already stripped) can name an account (see :data:`NAME_RULE`)."""
    return 0 < len(name) <= MAX_NAME and name.isprintable() and name != "local"


@dataclass(frozen=True, slots=True)
class UiAccount:
    """One account: its name, role and stored password hash."""

    name: str
    role: str
    password_hash: str
    created_at: float


@dataclass(frozen=True, slots=True)
class UiLogin:
    """One login session: whose it is, its CSRF token and when it ends."""

    user_name: str
    role: str
    csrf: str
    expires_at: float


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One action taken in the UI: who did what to which target, when."""

    id: int
    at: float
    user_name: str
    action: str
    target: str
    detail: str


class UiAccountStore:
    """Accounts, login sessions and the audit log on the shared connection and writer."""

    def __init__(self, db: aiosqlite.Connection, lock: Any, writer: Writer) -> None:
        self.db = db
        self.lock = lock
        self.writer = writer

    # -- accounts ------------------------------------------------------------------

    async def has_accounts(self) -> bool:
        """Whether at least one account exists."""
        async with self.lock, self.db.execute("SELECT 1 FROM ui_users LIMIT 1") as cur:
            return await cur.fetchone() is not None

    async def account(self, name: str) -> UiAccount | None:
        """The account called ``name``, or ``None``."""
        async with self.lock, self.db.execute(
            "SELECT name, role, password_hash, created_at FROM ui_users WHERE name = ?",
            (name,),
        ) as cur:
            row = await cur.fetchone()
        return None if row is None else UiAccount(str(row[0]), str(row[1]), str(row[2]),
                                                  float(row[3]))

    async def accounts(self) -> list[UiAccount]:
        """Every account, by name."""
        async with self.lock, self.db.execute(
            "SELECT name, role, password_hash, created_at FROM ui_users ORDER BY name",
        ) as cur:
            rows = await cur.fetchall()
        return [UiAccount(str(r[0]), str(r[1]), str(r[2]), float(r[3])) for r in rows]

    async def add_account(self, name: str, role: str, password_hash: str, now: float) -> bool:
        """Create an account; ``False`` (nothing written) if the name is taken."""

        async def body(db: aiosqlite.Connection) -> bool:
            cur = await db.execute(
                "INSERT OR IGNORE INTO ui_users (name, role, password_hash, created_at,"
                " updated_at) VALUES (?, ?, ?, ?, ?)", (name, role, password_hash, now, now))
            return bool(cur.rowcount == 1)

        added: bool = await self.writer.write(body, what="adding a UI account")
        return added

    async def set_password(self, name: str, password_hash: str, now: float) -> bool:
        """Replace an account's password hash and end its logins; ``False`` if no such account."""

        async def body(db: aiosqlite.Connection) -> bool:
            cur = await db.execute(
                "UPDATE ui_users SET password_hash = ?, updated_at = ? WHERE name = ?",
                (password_hash, now, name))
            await db.execute("DELETE FROM ui_sessions WHERE user_name = ?", (name,))
            return bool(cur.rowcount == 1)

        changed: bool = await self.writer.write(body, what="changing a UI password")
        return changed

    async def remove_account(self, name: str) -> bool:
        """Delete an account and its logins; ``False`` if there was none."""

        async def body(db: aiosqlite.Connection) -> bool:
            await db.execute("DELETE FROM ui_sessions WHERE user_name = ?", (name,))
            cur = await db.execute("DELETE FROM ui_users WHERE name = ?", (name,))
            return bool(cur.rowcount == 1)

        removed: bool = await self.writer.write(body, what="removing a UI account")
        return removed

    # -- login sessions -----------------------------------------------------------

    async def add_login(self, token_hash: str, user_name: str, csrf: str, now: float,
                        expires_at: float) -> None:
        """Record a login session by the hash of its token; expired ones are swept."""

        async def body(db: aiosqlite.Connection) -> None:
            await db.execute("DELETE FROM ui_sessions WHERE expires_at < ?", (now,))
            await db.execute(
                "INSERT INTO ui_sessions (token_hash, user_name, csrf, created_at, expires_at)"
                " VALUES (?, ?, ?, ?, ?)", (token_hash, user_name, csrf, now, expires_at))

        await self.writer.write(body, what="recording a UI login")

    async def login(self, token_hash: str, now: float) -> UiLogin | None:
        """The unexpired login session whose token hashes to ``token_hash``, with its role."""
        async with self.lock, self.db.execute(
            "SELECT s.user_name, u.role, s.csrf, s.expires_at FROM ui_sessions s"
            " JOIN ui_users u ON u.name = s.user_name"
            " WHERE s.token_hash = ? AND s.expires_at > ?", (token_hash, now),
        ) as cur:
            row = await cur.fetchone()
        return None if row is None else UiLogin(str(row[0]), str(row[1]), str(row[2]),
                                                float(row[3]))

    async def end_login(self, token_hash: str) -> None:
        """Forget one login session (logout)."""

        async def body(db: aiosqlite.Connection) -> None:
            await db.execute("DELETE FROM ui_sessions WHERE token_hash = ?", (token_hash,))

        await self.writer.write(body, what="ending a UI login")

    # -- audit log ---------------------------------------------------------------

    async def audit(self, at: float, user_name: str, action: str, target: str,
                    detail: str) -> None:
        """Append one entry to the audit log."""

        async def body(db: aiosqlite.Connection) -> None:
            await db.execute(
                "INSERT INTO ui_audit (at, user_name, action, target, detail)"
                " VALUES (?, ?, ?, ?, ?)", (at, user_name, action, target, detail))

        await self.writer.write(body, what="writing the UI audit log")

    async def audit_page(self, before: int | None, limit: int) -> list[AuditEntry]:
        """Up to ``limit`` entries, newest first, older than id ``before`` when given."""
        sql = "SELECT id, at, user_name, action, target, detail FROM ui_audit"
        params: tuple[Any, ...] = (limit,)
        if before is not None:
            sql += " WHERE id < ?"
            params = (before, limit)
        async with self.lock, self.db.execute(f"{sql} ORDER BY id DESC LIMIT ?", params) as cur:
            rows = await cur.fetchall()
        return [AuditEntry(int(r[0]), float(r[1]), str(r[2]), str(r[3]), str(r[4]), str(r[5]))
                for r in rows]
