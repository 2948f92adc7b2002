"""The :class:`~bot.contracts.runtime.Runtime` plugins, commands and jobs receive."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Collection, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from bot.agents.router import AgentRouter
from bot.app.services import AppServices
from bot.config.settings import Settings
from bot.contracts.commands import Command
from bot.contracts.llm import METER, LLMProvider
from bot.contracts.messages import InboundMessage, OutboundMessage
from bot.engine.budgets import Budgets
from bot.engine.requests import PluginSnapshot, RunOptions, RunRequest, RunResult
from bot.pluginhost.manager import PluginHost
from bot.scheduling.scheduler import Scheduler
from bot.storage.retention import prune_stores
from bot.storage.sessions import SessionStore
from bot.tools.breakers import Breakers
from bot.tools.metrics import ToolMetricsRegistry

if TYPE_CHECKING:
    from bot.app.roost import Roost


class AppRuntime:
    """Delegates the :class:`~bot.contracts.runtime.Runtime` operations to one service.

    A facade rather than the service itself, so plugins depend on these
    operations only and the wiring behind them can change.
    """

    __slots__ = ("__weakref__", "_app")

    def __init__(self, app: Roost) -> None:
        self._app = app

    @property
    def settings(self) -> Settings:
        return self._app.settings

    @property
    def services(self) -> AppServices:
        return self._app.services

    @property
    def store(self) -> SessionStore:
        return self._app.store

    @property
    def scheduler(self) -> Scheduler | None:
        return self._app.services.scheduler

    @property
    def provider(self) -> LLMProvider:
        return self._app.engine.provider

    @property
    def agents(self) -> AgentRouter:
        return self._app.router

    @property
    def plugins(self) -> PluginHost:
        return self._app.host

    @property
    def snapshot(self) -> PluginSnapshot:
        return self._app.engine.plugins

    @property
    def commands(self) -> Mapping[str, Command]:
        return self._app.commands

    @property
    def channels(self) -> Collection[str]:
        return self._app.channels.keys()

    @property
    def active_runs(self) -> int:
        return self._app.engine.active_runs

    @property
    def tool_metrics(self) -> ToolMetricsRegistry:
        return self._app.engine.tool_metrics

    @property
    def breakers(self) -> Breakers:
        return self._app.engine.breakers

    def plugin_config(self, name: str) -> Any:
        return self._app.plugin_config(name)

    def background(self, work: Awaitable[Any], what: str) -> None:
        self._app.background(work, what)

    def hold_runs(self, work: Awaitable[Any], what: str) -> None:
        self._app.hold_runs(work, what)

    async def deliver(self, message: OutboundMessage) -> str | None:
        channel = self._app.channels.get(message.channel)
        if channel is None:
            raise LookupError(f"channel {message.channel!r} is not running")
        return await channel.send(message)

    def run_scheduled(self, message: InboundMessage, *, deliver_failed: bool = True,
                      **options: Any) -> asyncio.Future[RunResult]:
        # Typed here, at the plugin boundary: an unknown option is a TypeError.
        return self._app.dispatcher.run_scheduled(message, RunOptions(**options),
                                                  deliver_failed=deliver_failed)

    async def run_turn(self, request: RunRequest) -> RunResult:
        if METER.get() is not None:  # a turn inside a run: its owner pays
            return await self._app.engine.run(request)
        # A background turn (the scheduled memory flush) counts against its message's sender.
        dispatcher = self._app.dispatcher
        token = METER.set(dispatcher.budgets.meter(
            request.message, request.agent))
        try:
            return await self._app.engine.run(request)
        finally:
            METER.reset(token)

    async def spending(self, message: InboundMessage, agent: str) -> list[str]:
        usage = self._app.services.usage
        if usage is None:
            return []
        return await Budgets(self._app.settings, usage).describe(message, agent)

    async def prune_stores(self) -> None:
        settings = self._app.settings
        await prune_stores(self._app.services, settings.error_retention_days,
                           trace_days=settings.trace_retention_days)

    def key_for(self, message: InboundMessage) -> str:
        return self._app.dispatcher.key_for(message)

    def running_count(self, key: str) -> int:
        return self._app.dispatcher.running_count(key)

    def queue_length(self, key: str) -> int:
        return self._app.dispatcher.queue_length(key)

    def compacting(self, key: str) -> bool:
        return key in self._app.engine.compactor.busy

    @contextlib.contextmanager
    def hold_compaction(self, key: str) -> Iterator[None]:
        busy = self._app.engine.compactor.busy
        busy.add(key)
        try:
            yield
        finally:
            busy.discard(key)

    def stop_oldest(self, key: str) -> bool:
        return self._app.dispatcher.stop_oldest(key)

    def stop_all(self, key: str) -> tuple[int, int]:
        return self._app.dispatcher.stop_all(key)

    async def stop_elsewhere(self, key: str, command: str) -> tuple[int, int]:
        control = self._app.control
        return (0, 0) if control is None else await control.stop_elsewhere(command, key)

    async def invalidate_everywhere(self, what: str, name: str = "") -> None:
        if self._app.control is not None:
            await self._app.control.invalidate(what, name)

    async def set_plugin_enabled(self, name: str, enabled: bool) -> str:
        return await self._app.set_plugin_enabled(name, enabled)

    async def refresh_tools(self) -> None:
        await self._app.refresh_tools()
