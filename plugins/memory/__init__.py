"""Built-in plugin: memory search and reading, recent notes in the prompt, scheduled flush.

Memory lives in the user's workspace as plain Markdown: ``memory/YYYY-MM-DD.md``
daily notes and ``MEMORY.md``. This plugin adds

* ``memory_search {query, limit?}``: BM25-ranked keyword search over those
  files (:mod:`.index`), returning path, line range and snippet;
* ``memory_get {path, from_line?, lines?}``: a slice of one memory file
  (:mod:`.tools`);
* a full-mode prompt section with today's and yesterday's daily notes (:mod:`.notes`);
* the ``memory_flush`` job (:mod:`.flush`): every ``flush_every_hours``
  it gives each conversation that has been idle for ``flush_idle_minutes``
  and has at least ``flush_min_messages`` messages it has not flushed
  yet one minimal, tool-limited run to store durable memories (the keys of
  its ``[plugins."plugins.memory"]`` table, :mod:`.config`).

Its tables (the search index, the flush's state) are its own, migrated under
the schema name ``memory`` (:mod:`.state`).
"""

from __future__ import annotations

from plugins.memory.config import MemoryConfig
from plugins.memory.flush import MemoryFlushJob, flush_message, scheduled_flush_prompt
from plugins.memory.notes import MAX_DAILY_NOTE_CHARS, roost_prompt_sections, today_utc
from plugins.memory.state import MIGRATIONS
from plugins.memory.tools import memory_tools
from roost import (
    JobSpec,
    Migrations,
    Services,
    Settings,
    Tool,
    hookimpl,
)

__all__ = [
    "MAX_DAILY_NOTE_CHARS",
    "MemoryFlushJob",
    "flush_message",
    "roost_migrations",
    "roost_plugin_config_model",
    "roost_prompt_sections",
    "roost_scheduled_jobs",
    "roost_tools",
    "scheduled_flush_prompt",
    "today_utc",
]


@hookimpl
def roost_plugin_config_model() -> type[MemoryConfig]:
    """The ``[plugins."plugins.memory"]`` table."""
    return MemoryConfig


@hookimpl
def roost_migrations() -> Migrations:
    """The search index and the flush state (disabled or not: the tables must exist)."""
    return MIGRATIONS


@hookimpl
def roost_tools(settings: Settings, services: Services) -> list[Tool]:
    """``memory_search`` and ``memory_get``, over the plugin's FTS5 index."""
    return memory_tools(settings, services)


@hookimpl
def roost_scheduled_jobs(settings: Settings) -> JobSpec | None:
    """The scheduled memory flush (off with ``memory_flush = false``)."""
    if not settings.memory_flush:
        return None
    return MemoryFlushJob(settings).spec()
