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
from bot.contracts import hookspecs
from bot.contracts.channel import Channel
from bot.contracts.llm import ChatMessage, LLMProvider, Sanitizer
from bot.contracts.messages import InboundMessage
from bot.contracts.tools import Tool
from bot.engine.approvals import Approvals
from bot.engine.compaction import (
    FLUSH_ITERATIONS,
    FLUSH_TIMEOUT,
    FLUSH_TOOLS,
    Compactor,
)
from bot.engine.context import Estimators, PruneSettings, TokenEstimator, compaction_due
from bot.engine.gates import GateChain, InputGuard, run_gates
from bot.engine.requests import (
    CurrentPlugins,
    PluginSnapshot,
    RunRequest,
    RunResult,
    RunSink,
)
from bot.engine.runloop import Run
from bot.pluginhost.manager import PluginHost
from bot.storage.sessions import Session, SessionStore
from bot.tools.breakers import Breakers
from bot.tools.metrics import ToolMetricsRegistry
from bot.tools.outcomes import describe_error

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
        plugins: CurrentPlugins | None = None,
        channels: Mapping[str, Channel] | None = None,
        sink: RunSink | None = None,
        gates: GateChain | None = None,
        estimators: Estimators | None = None,
        approvals: Approvals | None = None,
    ) -> None:
        """``plugins`` is the shared plugin state (else one made of ``tools``,
        ``sanitizers`` and ``guard``); ``channels`` the running channels by name (the
        app's live mapping: runs download the files of messages through them); ``sink``
        where runs report unless their request names another; ``gates`` the chain whose
        run stages each run passes (by default the run gates alone); ``estimators`` the
        token estimators, one per provider (shared with the budgets); ``approvals`` asks
        before the calls that need it (none: no call waits)."""
        self.settings = settings
        self.host = host
        self.store = store
        self.provider = provider
        self.current = plugins or CurrentPlugins(PluginSnapshot.of(
            guard or InputGuard([], settings.guard_mode, settings.guard_modes), tools,
            sanitizers=list(sanitizers)))
        """What the enabled plugins offer; replaced whole when plugins change."""
        self.estimators = estimators or Estimators()
        self.estimator = self.estimators.for_provider(provider.name)
        self.gates = gates or GateChain(run_gates(host))
        """Who is answered and how (bot.engine.gates); runs pass its run stages."""
        self.compactor = Compactor(settings, store, lambda: self.provider, self.estimator_for,
                                   self._memory_flush)
        self.prune = PruneSettings(soft_ratio=settings.prune_soft_ratio,
                                   hard_ratio=settings.prune_hard_ratio)
        self.breakers = Breakers()
        self.tool_metrics = ToolMetricsRegistry()
        self.sink = sink or RunSink()
        """Where runs report (error channel, large results, sends, spans) unless their
        request names another sink."""
        self.active_runs = 0
        self.channels: Mapping[str, Channel] = {} if channels is None else channels
        """The running channels by name: runs download the files of messages with them."""
        self.workspaces_root = settings.workspaces_dir
        """The default agent's workspaces (others: :func:`bot.agents.router.workspaces_root`)."""
        self.agents = agents
        """Resolves each run's agent; judge statistics."""
        self._holds: set[asyncio.Future[Any]] = set()
        self.approvals = approvals
        """Asks a person before tool calls that need approval (bot.engine.approvals)."""

    @property
    def plugins(self) -> PluginSnapshot:
        """The current plugin state (what a run starting now takes)."""
        return self.current.now

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
        return self.estimators.for_provider(provider)

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

    async def execute(self, req: RunRequest) -> RunResult:
        """Execute ``req`` and return its outcome; its commit is the caller's to write.

        Raises ``CancelledError`` if cancelled. Waits first for the work passed to
        :meth:`hold_runs` that is not done yet. Once the commit is written, call
        :meth:`finished`.
        """
        await self.held()
        run = Run(self, req)
        self.active_runs += 1
        req.session.pins += 1
        try:
            return await run.execute()
        finally:
            req.session.pins -= 1
            self.active_runs -= 1

    async def finished(self, req: RunRequest, result: RunResult) -> None:
        """After the commit: announce the run's last event and compact its session if due."""
        if result.ending is not None:
            listener = (req.sink or self.sink).events
            if listener is not None:
                await listener(result.ending)
            if self.host.hooks.implemented(hookspecs.roost_run_event):
                await self.host.hooks.roost_run_event(event=result.ending)
        if req.persist and result.status == "completed":
            try:
                agent = await self.agents.get(req.agent)  # cached: the run just used it
            except Exception:
                log.exception("no compaction after run %s: agent %s", req.run_id, req.agent)
                return
            # The compactor is asked only once the history is due.
            if agent.settings.compaction and compaction_due(
                    req.session.messages, agent.settings,
                    self.estimator_for((agent.provider or self.provider).name)):
                self.compactor.schedule(req.session, req.message, agent)

    async def run(self, req: RunRequest) -> RunResult:
        """Execute ``req``, write its commit on its own, announce it; the whole run.

        For runs no inbox entry waits on (tools' sub-runs, the memory flush, tests).
        """
        result = await self.execute(req)
        if result.commit is not None:
            try:
                await result.commit.write(self.store)
            except Exception as exc:
                if result.status == "failed":
                    log.exception("could not persist failed run %s", req.run_id)
                else:
                    log.exception("could not persist run %s", req.run_id)
                    result = result.as_failed(describe_error(exc))
                    await self._write_failed(result)
        await self.finished(req, result)
        return result

    async def _write_failed(self, result: RunResult) -> None:
        if result.commit is None:
            return
        try:
            await result.commit.write(self.store)
        except Exception:
            log.exception("could not persist failed run %s", result.run_id)
