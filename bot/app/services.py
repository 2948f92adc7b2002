"""The stores one Roost process offers plugins (a :class:`~bot.contracts.services.Services`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bot.contracts.search import SearchBackend
from bot.scheduling.scheduler import Scheduler
from bot.storage.access import AccessStore
from bot.storage.errors import ErrorStore, ResultStore
from bot.storage.inbox import Inbox
from bot.storage.sessions import SessionStore
from bot.storage.usage import UsageStore


@dataclass(slots=True)
class AppServices:
    """What the service offers plugins at tool-building time.

    ``sessions`` is the session store (its ``db`` is the shared SQLite
    connection). Optional services are ``None`` when not configured, and tools
    that depend on them should not be offered then:

    - ``errors``: full tool errors, fetched by ID (``get_error_detail``);
    - ``results``: large tool results, read in slices (``get_tool_result``);
    - ``scheduler``: scheduled jobs (the ``cron`` tool);
    - ``inbox``: the durable inbox, journal and outbox (:mod:`bot.storage.inbox`);
    - ``access``: DM pairing codes and approved users (:mod:`bot.storage.access`);
    - ``usage``: tokens spent per user, group and agent (:mod:`bot.storage.usage`).

    ``search_backends`` are the web search engines plugins offer
    (``roost_search_backends``), asked for just before ``roost_tools``.

    ``plugin_config(name)`` is plugin ``name``'s validated configuration (the
    model it declared with ``roost_plugin_config_model``), or ``None``.
    """

    sessions: SessionStore
    errors: ErrorStore | None = None
    results: ResultStore | None = None
    scheduler: Scheduler | None = None
    inbox: Inbox | None = None
    access: AccessStore | None = None
    usage: UsageStore | None = None
    search_backends: tuple[SearchBackend, ...] = ()
    plugin_configs: dict[str, Any] = field(default_factory=dict)

    def plugin_config(self, name: str) -> Any:
        """Plugin ``name``'s validated configuration object, or ``None``."""
        return self.plugin_configs.get(name)
