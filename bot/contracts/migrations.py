"""Tables a plugin owns: its schema steps, as the ``roost_migrations`` hook returns them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeAlias

import aiosqlite

Step: TypeAlias = str | Mapping[str, str] | Callable[[aiosqlite.Connection], Awaitable[None]]
"""One schema step: SQL text (portable), SQL per dialect (``{"sqlite": ..., "postgresql":
...}``), or a coroutine function given the connection."""


@dataclass(frozen=True, slots=True)
class Migrations:
    """A plugin's own tables in Roost's database: ordered schema steps under one name.

    ``name`` identifies the plugin's schema (pick one unique to your plugin,
    e.g. its distribution name); the ``plugin_schema`` table records how many
    of ``steps`` have run under it. At startup, before anything else uses the
    database, Roost runs the steps not yet recorded, in order, each in its own
    transaction together with its record, so a step runs completely once or
    not at all.

    A step is SQL text (one or more statements; no ``BEGIN``/``COMMIT``), a
    mapping of dialect to SQL text (``{"sqlite": ..., "postgresql": ...}``) where
    the backends differ, or an ``async def step(db)`` given the connection, for
    data moves that need logic. Plain text is written for SQLite and runs on
    PostgreSQL with its types translated (``INTEGER`` → ``BIGINT``, ``REAL`` →
    ``DOUBLE PRECISION``, ``INTEGER PRIMARY KEY`` → an identity column). Steps
    only ever get appended: a released step never changes. Name your tables
    after your plugin (``myplugin_...``) and keep them to yourself; never
    change Roost's own tables.
    """

    name: str
    steps: Sequence[Step]

    def __post_init__(self) -> None:
        if not self.name.strip():
            raise ValueError("Migrations need a name")
