"""What plugins, commands and jobs may do with the running service.

Hooks (``roost_startup``/``roost_shutdown``), command handlers
(``CommandContext.app``) and scheduled jobs (``JobSpec.func``) receive a
:class:`Runtime`, not the service object itself: the operations below are the
supported surface, and the service's internals can change behind them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Collection, Mapping
from contextlib import AbstractContextManager
from typing import Any, Protocol

from bot.contracts.commands import Command
from bot.contracts.llm import LLMProvider, Usage
from bot.contracts.messages import InboundMessage, OutboundMessage
from bot.contracts.services import Services
from bot.contracts.settings import SettingsModel
from bot.contracts.views import (
    AgentsView,
    OfferView,
    PluginsView,
    SchedulerView,
    SessionsView,
    SnapshotSource,
)

NO_REPLY = "NO_REPLY"
"""A reply that is exactly this token is not delivered (a scheduled turn with nothing to say)."""


class RunOutcome(Protocol):
    """How a turn ended: ``reply`` is what was delivered or is to be (``None``: silent)."""

    @property
    def run_id(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def reply(self) -> str | None: ...
    @property
    def usage(self) -> Usage: ...
    @property
    def error(self) -> str: ...
    @property
    def silent(self) -> bool:
        """True when nothing is to be delivered."""
        ...


class Runtime(Protocol):
    """The running Roost service as plugins, commands and jobs see it."""

    @property
    def settings(self) -> SettingsModel:
        """The service's settings (read-only by convention)."""
        ...

    @property
    def services(self) -> Services:
        """The stores tools use: sessions, stored errors and results, scheduler, inbox."""
        ...

    @property
    def store(self) -> SessionsView:
        """The session store: ``get(key)``, ``reset``, ``set_facts``, ``append_run``."""
        ...

    @property
    def scheduler(self) -> SchedulerView | None:
        """Scheduled jobs (``None`` when the scheduler is not running)."""
        ...

    @property
    def provider(self) -> LLMProvider:
        """The default agent's LLM provider."""
        ...

    @property
    def agents(self) -> AgentsView:
        """The configured agents: ``get(name)``, ``peek``, ``invalidate``, ``stats_for``."""
        ...

    @property
    def plugins(self) -> PluginsView:
        """Loaded plugins: their info, errors, disabled set and per-plugin hook calls."""
        ...

    @property
    def snapshot(self) -> OfferView:
        """What the enabled plugins offer now (tools, sanitizers, guard, judges)."""
        ...

    @property
    def commands(self) -> Mapping[str, Command]:
        """Every command by name and alias."""
        ...

    @property
    def channels(self) -> Collection[str]:
        """Names of the channels running now."""
        ...

    @property
    def active_runs(self) -> int:
        """Runs in flight across all chats."""
        ...

    @property
    def tool_metrics(self) -> SnapshotSource:
        """Per-tool call counts, failures and latency."""
        ...

    @property
    def breakers(self) -> SnapshotSource:
        """The tools' circuit breakers."""
        ...

    def plugin_config(self, name: str) -> Any:
        """Plugin ``name``'s validated configuration object, or ``None``."""
        ...

    def background(self, work: Awaitable[Any], what: str) -> None:
        """Run ``work`` in the background; failures are logged, shutdown cancels it."""
        ...

    def hold_runs(self, work: Awaitable[Any], what: str) -> None:
        """Run ``work`` in the background like :meth:`background`; runs that start
        before it ends wait for it first (a plugin's tools still being listed, say).
        ``work`` must end by itself within a bound of its own."""
        ...

    async def deliver(self, message: OutboundMessage) -> str | None:
        """Send ``message`` through its channel; the platform message id, if any.

        Raises ``LookupError`` when the channel is not running.
        """
        ...

    def run_scheduled(self, message: InboundMessage, *, deliver_failed: bool = True,
                      **options: Any) -> Awaitable[RunOutcome]:
        """Queue a turn no person sent (cron, heartbeat) in ``message``'s chat.

        It waits its turn behind the chat's messages and its reply is delivered
        there; ``options`` go to ``roost.RunRequest``.
        """
        ...

    async def run_turn(self, request: Any) -> RunOutcome:
        """Run one turn directly, outside any chat's queue, delivering nothing.

        ``request`` is a ``roost.RunRequest``.
        """
        ...

    async def spending(self, message: InboundMessage, agent: str) -> list[str]:
        """Lines for ``/status``: the sender's tokens today and this month against the
        budgets in force for ``agent`` (none when usage is not counted)."""
        ...

    async def prune_stores(self) -> None:
        """Delete answered inbox entries, stored errors and results older than
        ``error_retention_days`` and run traces older than ``trace_retention_days``."""
        ...

    def key_for(self, message: InboundMessage) -> str:
        """The session ``message`` belongs to, under the agent its chat is bound to."""
        ...

    def running_count(self, key: str) -> int:
        """Runs in flight for session ``key``."""
        ...

    def queue_length(self, key: str) -> int:
        """Messages waiting in session ``key``'s queue."""
        ...

    def compacting(self, key: str) -> bool:
        """True while session ``key``'s history is being compacted."""
        ...

    def hold_compaction(self, key: str) -> AbstractContextManager[None]:
        """Keep session ``key`` from being compacted while the block runs.

        For background work that reads a session's history (a memory flush):
        a compaction starting meanwhile waits until the block ends.
        """
        ...

    def stop_oldest(self, key: str) -> bool:
        """Cancel the session's oldest run (``/stop``); False when none runs."""
        ...

    def stop_all(self, key: str) -> tuple[int, int]:
        """Cancel every run of a session and drop its queue: (runs, dropped messages)."""
        ...

    async def stop_elsewhere(self, key: str, command: str) -> tuple[int, int]:
        """Run ``/stop`` or ``/stopall`` (``command``) on the replica that runs session
        ``key`` (PostgreSQL replicas): (runs, dropped messages); ``(0, 0)`` on SQLite."""
        ...

    async def invalidate_everywhere(self, what: str, name: str = "") -> None:
        """Tell the other replicas to reload ``what`` (``agent`` ``name``, ``plugins``,
        ``pairing``) as this process just did; nothing to do on SQLite."""
        ...

    async def set_plugin_enabled(self, name: str, enabled: bool) -> str:
        """Enable or disable plugin ``name`` now and persist it; returns what happened."""
        ...

    async def refresh_tools(self) -> None:
        """Ask every enabled plugin for its tools again (``roost_tools``) and offer them.

        For a plugin whose tools change while Roost runs (an MCP server's list);
        runs in flight keep what they started with.
        """
        ...
