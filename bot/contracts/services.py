"""Shared objects that plugins may need when they build tools."""

from __future__ import annotations

from typing import Any, Protocol

from bot.contracts.search import SearchBackend
from bot.contracts.views import (
    AccessView,
    ErrorsView,
    InboxView,
    ResultsView,
    SchedulerView,
    SessionsView,
    UsageView,
)


class Services(Protocol):
    """What the service offers plugins at tool-building time.

    ``sessions`` is the session store (its ``db`` is the shared database
    connection). Optional services are ``None`` when not configured, and tools
    that depend on them should not be offered then:

    - ``errors``: full tool errors, fetched by ID (``get_error_detail``);
    - ``results``: large tool results, read in slices (``get_tool_result``);
    - ``scheduler``: scheduled jobs (the ``cron`` tool);
    - ``inbox``: the durable inbox, journal and outbox;
    - ``access``: DM pairing codes and approved users (``/pair``);
    - ``usage``: tokens spent per user, group and agent (``/usage``).

    ``search_backends`` are the web search engines plugins offer
    (``roost_search_backends``), asked for just before ``roost_tools``.
    """

    @property
    def sessions(self) -> SessionsView: ...
    @property
    def errors(self) -> ErrorsView | None: ...
    @property
    def results(self) -> ResultsView | None: ...
    @property
    def scheduler(self) -> SchedulerView | None: ...
    @property
    def inbox(self) -> InboxView | None: ...
    @property
    def access(self) -> AccessView | None: ...
    @property
    def usage(self) -> UsageView | None: ...
    @property
    def search_backends(self) -> tuple[SearchBackend, ...]: ...

    def plugin_config(self, name: str) -> Any:
        """Plugin ``name``'s validated configuration object (the model it declared with
        ``roost_plugin_config_model``), or ``None``."""
        ...
