"""A test app's new SQLite database, copied from one migrated once per process.

Migrating a new database applies every schema step (about 20 ms of CPU); a test app on a
new data dir starts instead from a byte copy of a database this process migrated with
the same code (:func:`bot.storage.db.connect`), which is the same file. Tests of the
migrations themselves open their databases directly and still migrate them.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from bot.config.settings import Settings
from bot.storage import schema
from bot.storage.db import is_postgres_url, sqlite_path
from bot.storage.sessions import SessionStore

__all__ = ["seed_database"]

_MIGRATED: dict[tuple[str, ...], bytes] = {}
"""The migrated database's bytes per list of schema steps, made on first use."""


async def migrated_database() -> bytes:
    """The bytes of a new SQLite database with Roost's schema (made once per process)."""
    steps = tuple(schema.MIGRATIONS)
    if steps not in _MIGRATED:
        with tempfile.TemporaryDirectory(prefix="roost-schema-") as folder:
            path = Path(folder) / "roost.db"
            store = await SessionStore.open(path)
            await store.close()
            _MIGRATED[steps] = path.read_bytes()
    return _MIGRATED[steps]


async def seed_database(settings: Settings) -> None:
    """Put a migrated copy where ``settings``' SQLite database would be created; an
    existing database (or a PostgreSQL one) is left alone."""
    target = settings.database
    if is_postgres_url(target):
        return
    path = sqlite_path(target)
    if path.exists():
        return
    data = await migrated_database()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
