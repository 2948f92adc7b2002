"""What a run is asked to do, with which plugin state, what it reports to, and how it ended.

:class:`RunRequest` (with :class:`RunOptions`, a :class:`RunSink` and the
:class:`PluginSnapshot` it runs with) goes in; :class:`RunResult` comes out, carrying
the :class:`RunCommit` its caller writes.

When a plugin is enabled or disabled, :meth:`bot.app.roost.Roost.refresh_plugins`
builds a new :class:`PluginSnapshot` and swaps it into :class:`CurrentPlugins` in one
step. A run captures the snapshot when it starts and uses it to the end (tools,
sanitizers while streaming and at the finish, the guard, judges), so it never mixes
two plugin states.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, Protocol

from bot.contracts.events import EventType, RunEvent
from bot.contracts.judge import Judge
from bot.contracts.llm import ChatMessage, Sanitizer, ToolCall, Usage
from bot.contracts.messages import InboundMessage
from bot.contracts.prompt import PromptMode
from bot.contracts.runtime import NO_REPLY as NO_REPLY
from bot.contracts.tools import SendFunc, Tool
from bot.engine.gates import InputGuard
from bot.observability.tracing import Span, SpanExporter, hex_id
from bot.storage.db import Statements
from bot.storage.inbox import RunJournal
from bot.storage.sessions import RunRecord, Session, SessionStore
from bot.tools.outcomes import RawError

Listener = Callable[[RunEvent], Awaitable[None]]


class Emit(Protocol):
    """A run's event emitter: ``await emit("chunk", content=...)``."""

    def __call__(self, type_: EventType, **payload: Any) -> Awaitable[None]: ...


FailureHandler = Callable[[ToolCall, RawError, str], Awaitable[str]]
"""``(call, raw_error, session_key) -> text for the model``."""
LargeResultHandler = Callable[[str, str, str], Awaitable[str]]
"""``(session_key, tool_name, content) -> preview with a reference``."""
RunStatus = Literal["completed", "failed", "cancelled", "refused"]


@dataclass(frozen=True, slots=True)
class PluginSnapshot:
    """The tools, sanitizers, guard and judges of one plugin state."""

    guard: InputGuard
    tools: Mapping[str, Tool] = field(default_factory=lambda: MappingProxyType({}))
    tool_groups: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Tool name -> the plugin that offers it (``group:<plugin>`` in tool policies)."""
    sanitizers: tuple[Sanitizer, ...] = ()
    """In the order they run."""
    judges: Mapping[str, Judge] = field(default_factory=lambda: MappingProxyType({}))
    """Judges plugins offer (``roost_judges``), by name."""

    def guard_scan(self, text: str) -> list[str]:
        """Names of the guard's patterns that match ``text``, whatever its mode."""
        return self.guard.scan(text)

    @classmethod
    def of(cls, guard: InputGuard, tools: Mapping[str, Tool] | None = None,
           tool_groups: Mapping[str, str] | None = None,
           sanitizers: tuple[Sanitizer, ...] | list[Sanitizer] = (),
           judges: Mapping[str, Judge] | None = None) -> PluginSnapshot:
        """A snapshot of copies: later changes to the arguments do not leak in."""
        return cls(guard, MappingProxyType(dict(tools or {})),
                   MappingProxyType(dict(tool_groups or {})),
                   tuple(sorted(sanitizers, key=lambda s: s.order)),
                   MappingProxyType(dict(judges or {})))


class CurrentPlugins:
    """The current :class:`PluginSnapshot`, replaced whole when plugins change.

    Built before the engine and shared with whoever reads the plugin state
    (the engine, the agents' judges, the metrics' tool names).
    """

    def __init__(self, snapshot: PluginSnapshot) -> None:
        self._snapshot = snapshot

    @property
    def now(self) -> PluginSnapshot:
        """The snapshot a run starting now takes."""
        return self._snapshot

    def replace(self, snapshot: PluginSnapshot) -> None:
        """Swap in ``snapshot``: a run sees the old state or the new one, never a mix."""
        self._snapshot = snapshot

    def judges(self) -> Mapping[str, Judge]:
        """The judges plugins offer now, by name."""
        return self._snapshot.judges

    def tool_names(self) -> list[str]:
        """The names of the tools offered now."""
        return list(self._snapshot.tools)


@dataclass(frozen=True, slots=True)
class RunSink:
    """Where a run reports beyond its result; every part is optional.

    ``on_tool_failure`` turns a tool failure into what the model reads (the error
    channel), ``on_large_result`` stores a large result and returns the preview
    the model reads, ``deliver`` sends a message through its channel at once
    (``ToolContext.send``), ``export`` receives each run's finished spans, ``events``
    hears the run's events as they happen (streamed text, tool calls, its ending).
    """

    on_tool_failure: FailureHandler | None = None
    on_large_result: LargeResultHandler | None = None
    deliver: SendFunc | None = None
    export: SpanExporter | None = None
    events: Listener | None = None


@dataclass(frozen=True, slots=True)
class RunOptions:
    """How a run no person asked for (cron, heartbeat) runs; the defaults are a chat turn's."""

    mode: PromptMode = "full"
    kind: str = "chat"
    extra_context: str = ""
    max_iterations: int | None = None
    tools: Sequence[str] | None = None
    persist: bool = True
    timeout: float | None = None
    approved: tuple[str, ...] = ()
    """Tools an admin pre-approved for the job: with nobody to ask, only these run
    of the tools needing approval."""
    job: str = ""
    """The scheduled job this run is a fire of (``cron:<job id>``); '' names it by ``kind``."""

    @property
    def usage_job(self) -> str:
        """Whose ``job`` usage counter the run adds to: the job, else a kind other than
        ``chat`` (``heartbeat``), else none."""
        return self.job or ("" if self.kind == "chat" else self.kind)


@dataclass(slots=True)
class RunRequest:
    """One run to execute. ``message.text`` is the (possibly merged) user text.

    Background runs (memory flush, cron) narrow what the run may do: ``tools``
    limits the tools offered and executable, ``history`` replaces the session
    history, ``persist=False`` writes nothing to the session (the trace is
    still stored), and ``timeout`` replaces ``run_timeout``.
    """

    message: InboundMessage
    session: Session
    run_id: str = field(default_factory=hex_id)
    max_iterations: int | None = None
    mode: PromptMode = "full"
    agent: str = "default"
    tools: Sequence[str] | None = None
    history: Sequence[ChatMessage] | None = None
    persist: bool = True
    timeout: float | None = None
    kind: str = "chat"
    extra_context: str = ""
    """Extra text for the prompt's ``<extra_context>`` section (cron jobs, sub-tasks)."""
    journal: RunJournal | None = None
    """Where the run records its tool exchange as it happens; one left by an
    interrupted earlier run of the same message is replayed first."""
    plugins: PluginSnapshot | None = None
    """The plugin state to run with (captured when the message was taken up);
    ``None``: the engine's current one."""
    sink: RunSink | None = None
    """Where the run reports (error channel, large results, sends, spans);
    ``None``: the engine's own sink."""
    approved: tuple[str, ...] = ()
    """Tools pre-approved for a run nobody can be asked in (:attr:`RunOptions.approved`)."""

    @classmethod
    def with_options(cls, message: InboundMessage, session: Session, options: RunOptions, *,
                     run_id: str, agent: str, plugins: PluginSnapshot | None,
                     journal: RunJournal | None, sink: RunSink | None = None) -> RunRequest:
        """A request running with ``options`` (what the dispatcher starts)."""
        return cls(message, session, run_id=run_id, agent=agent, plugins=plugins,
                   journal=journal, sink=sink, mode=options.mode, kind=options.kind,
                   extra_context=options.extra_context, max_iterations=options.max_iterations,
                   tools=options.tools, persist=options.persist, timeout=options.timeout,
                   approved=options.approved)


@dataclass(frozen=True, slots=True)
class RunCommit:
    """What a persisted run writes: its history, usage and trace, in one transaction.

    ``reply`` is the text to queue for delivery (``None``: silent) and ``failed``
    whether it is an apology; the caller adds its own statements (inbox, outbox).
    """

    session: Session
    run_id: str
    messages: Sequence[ChatMessage]
    usage: Usage | None
    model: str
    provider: str
    record: RunRecord
    spans: Sequence[Span]
    reply: str | None
    failed: bool = False

    async def write(self, store: SessionStore,
                    same_transaction: Statements | None = None) -> Any:
        """Write it, and ``same_transaction`` with it; returns what those statements return."""
        return await store.append_run(self.session, self.run_id, list(self.messages),
                                      self.usage, self.model, self.provider, self.record,
                                      list(self.spans),
                                      same_transaction=same_transaction)


@dataclass(slots=True)
class RunResult:
    """How a run ended. ``reply`` is what to deliver (``None`` when silent)."""

    run_id: str
    status: RunStatus
    reply: str | None
    usage: Usage
    iterations: int = 0
    error: str = ""
    outbox_id: int | None = None
    """The reply's outbox entry, once its commit queued one."""
    commit: RunCommit | None = None
    """What the caller writes for a persisted run (nothing of it is written yet)."""
    ending: RunEvent | None = None
    """The run's last event, announced once its commit is written."""

    @property
    def silent(self) -> bool:
        """True when nothing is to be delivered."""
        return self.reply is None

    def as_failed(self, error: str) -> RunResult:
        """This run failed with ``error`` after all (its commit could not be written):
        the user gets an apology and the history keeps only what the user said."""
        apology = f"Sorry, I couldn't answer that: {error}"
        commit = self.commit
        if commit is not None:
            commit = dataclasses.replace(
                commit, messages=tuple(m for m in commit.messages if m.role == "user"),
                model="", provider="", reply=apology, failed=True,
                record=dataclasses.replace(commit.record, status="failed", error=error))
        ending = None if self.ending is None else dataclasses.replace(
            self.ending, type="run.failed", payload={"error": error})
        return RunResult(self.run_id, "failed", apology, self.usage, self.iterations, error,
                         commit=commit, ending=ending)
