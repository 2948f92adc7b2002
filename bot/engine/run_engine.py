"""The run engine: what all runs share (provider, plugins, breakers, compactor); it starts them.

The agents come from outside (:class:`Agents`): the app builds the router, which the
dispatcher uses to route a chat before any run exists.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from bot.agents.router import Agent, JudgeStats
from bot.config.settings import Settings
from bot.contracts.channel import Channel
from bot.contracts.llm import ChatMessage, LLMProvider
from bot.contracts.messages import InboundMessage
from bot.contracts.sanitize import Sanitizer
from bot.contracts.tools import SendFunc, Tool
from bot.engine.compaction import (
    FLUSH_ITERATIONS,
    FLUSH_TIMEOUT,
    FLUSH_TOOLS,
    Compactor,
)
from bot.engine.guard import InputGuard
from bot.engine.history import PruneSettings
from bot.engine.requests import (
    FailureHandler,
    LargeResultHandler,
    Listener,
    RunRequest,
    RunResult,
)
from bot.engine.runloop import Run
from bot.engine.snapshot import PluginSnapshot
from bot.engine.tokens import TokenEstimator
from bot.observability.tracing import SpanExporter
from bot.pluginhost.manager import PluginHost
from bot.storage.sessions import Session, SessionStore
from bot.tools.breakers import Breakers
from bot.tools.metrics import ToolMetricsRegistry

log = logging.getLogger("roost.engine.run_engine")


class Agents(Protocol):
    """The agents as runs need them: :class:`bot.agents.router.AgentRouter` is one.

    The app builds the router (the dispatcher routes chats with it before a run
    exists) and hands it to the engine; the engine never builds one.
    """

    async def get(self, name: str) -> Agent:
        """Agent ``name``, resolved (or cached) for a run."""
        ...

    def stats_for(self, name: str) -> JudgeStats:
        """How agent ``name``'s replies fared with its judges."""
        ...


class RunEngine:
    """Executes runs against one provider with the tools and sanitizers plugins gave."""

    def __init__(
        self,
        settings: Settings,
        host: PluginHost,
        store: SessionStore,
        provider: LLMProvider,
        tools: Mapping[str, Tool],
        sanitizers: Sequence[Sanitizer],
        guard: InputGuard | None = None,
        *,
        agents: Agents,
    ) -> None:
        self.settings = settings
        self.host = host
        self.store = store
        self.provider = provider
        self.plugins = PluginSnapshot.of(
            guard or InputGuard([], settings.guard_mode, settings.guard_modes), tools,
            sanitizers=list(sanitizers))
        """What the enabled plugins offer; replaced whole when plugins change."""
        self.estimator = TokenEstimator(provider.name)
        self._estimators = {provider.name: self.estimator}
        self.compactor = Compactor(settings, store, lambda: self.provider, self.estimator_for,
                                   self._memory_flush)
        self.prune = PruneSettings(soft_ratio=settings.prune_soft_ratio,
                                   hard_ratio=settings.prune_hard_ratio)
        self.exporter: SpanExporter | None = None
        self.breakers = Breakers()
        self.tool_metrics = ToolMetricsRegistry()
        self.on_tool_failure: FailureHandler | None = None
        """Turns a tool failure into what the model reads (the error channel)."""
        self.on_large_result: LargeResultHandler | None = None
        """Stores a large result and returns the preview the model reads."""
        self.deliver: SendFunc | None = None
        """Sends a message through its channel at once (the app sets it); tools get it
        as ``ToolContext.send`` to reach their chat (``send_file``)."""
        self.active_runs = 0
        self.channels: Mapping[str, Channel] = {}
        """The running channels by name (the app's own dict): runs download files with them."""
        self.workspaces_root = settings.workspaces_dir
        """The default agent's workspaces (others: :func:`bot.agents.router.workspaces_root`)."""
        self.agents = agents
        """Resolves each run's agent; judge statistics."""
        self._holds: set[asyncio.Future[Any]] = set()

    @property
    def tools(self) -> Mapping[str, Tool]:
        """The tools of the current plugin state."""
        return self.plugins.tools

    @property
    def sanitizers(self) -> tuple[Sanitizer, ...]:
        """The output sanitizers of the current plugin state, in order."""
        return self.plugins.sanitizers

    @property
    def guard(self) -> InputGuard:
        """The input guard of the current plugin state."""
        return self.plugins.guard

    def estimator_for(self, provider: str) -> TokenEstimator:
        """The token estimator calibrated for ``provider`` (one per provider)."""
        estimator = self._estimators.get(provider)
        if estimator is None:
            estimator = self._estimators[provider] = TokenEstimator(provider)
        return estimator

    async def _memory_flush(self, message: InboundMessage, session: Session, agent: str,
                            history: Sequence[ChatMessage]) -> str:
        """The compactor's memory flush: one minimal, tool-limited run that stores nothing."""
        result = await self.run(RunRequest(
            message, session, mode="minimal", max_iterations=FLUSH_ITERATIONS, agent=agent,
            tools=FLUSH_TOOLS, history=list(history), persist=False, timeout=FLUSH_TIMEOUT,
            kind="memory_flush",
        ))
        return "nothing stored" if result.silent else result.status

    def hold_runs(self, work: asyncio.Future[Any]) -> None:
        """Runs starting before ``work`` is done wait for it (it ends by itself)."""
        self._holds.add(work)
        work.add_done_callback(self._holds.discard)

    async def held(self) -> None:
        """Return once the work passed to :meth:`hold_runs` is done (at once if it is).

        Call it before taking :attr:`plugins` for a run.
        """
        if self._holds:
            await asyncio.wait(set(self._holds))  # a cancelled caller leaves them running

    async def run(self, req: RunRequest, listener: Listener | None = None) -> RunResult:
        """Execute ``req`` to completion; raises ``CancelledError`` if cancelled.

        Waits first for the work passed to :meth:`hold_runs` that is not done yet.
        """
        await self.held()
        run = Run(self, req, listener)
        self.active_runs += 1
        req.session.pins += 1
        try:
            result = await run.execute()
        finally:
            req.session.pins -= 1
            self.active_runs -= 1
        if req.persist and result.status == "completed" and run.agent is not None:
            self.compactor.schedule(req.session, req.message, run.agent)
        return result
