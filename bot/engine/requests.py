"""What a run is asked to do, what it reports to, and how it ended.

:class:`RunRequest` (with :class:`RunOptions` and a :class:`RunSink`) goes in;
:class:`RunResult` comes out, carrying the :class:`RunCommit` its caller writes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from bot.contracts.events import RunEvent
from bot.contracts.llm import ChatMessage, ToolCall, Usage
from bot.contracts.messages import InboundMessage
from bot.contracts.prompt import PromptMode
from bot.contracts.runtime import NO_REPLY as NO_REPLY
from bot.contracts.tools import SendFunc
from bot.engine.snapshot import PluginSnapshot
from bot.observability.ids import hex_id
from bot.observability.tracing import Span, SpanExporter
from bot.storage.db import Statements
from bot.storage.inbox import RunJournal
from bot.storage.sessions import RunRecord, Session, SessionStore
from bot.tools.outcomes import RawError

Listener = Callable[[RunEvent], Awaitable[None]]
FailureHandler = Callable[[ToolCall, RawError, str], Awaitable[str]]
"""``(call, raw_error, session_key) -> text for the model``."""
LargeResultHandler = Callable[[str, str, str], Awaitable[str]]
"""``(session_key, tool_name, content) -> preview with a reference``."""
RunStatus = Literal["completed", "failed", "cancelled", "refused"]


@dataclass(frozen=True, slots=True)
class RunSink:
    """Where a run reports beyond its result; every part is optional.

    ``on_tool_failure`` turns a tool failure into what the model reads (the error
    channel), ``on_large_result`` stores a large result and returns the preview
    the model reads, ``deliver`` sends a message through its channel at once
    (``ToolContext.send``), ``export`` receives each run's finished spans.
    """

    on_tool_failure: FailureHandler | None = None
    on_large_result: LargeResultHandler | None = None
    deliver: SendFunc | None = None
    export: SpanExporter | None = None


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

    @classmethod
    def with_options(cls, message: InboundMessage, session: Session, options: RunOptions, *,
                     run_id: str, agent: str, plugins: PluginSnapshot | None,
                     journal: RunJournal | None) -> RunRequest:
        """A request running with ``options`` (what the dispatcher starts)."""
        return cls(message, session, run_id=run_id, agent=agent, plugins=plugins,
                   journal=journal, mode=options.mode, kind=options.kind,
                   extra_context=options.extra_context, max_iterations=options.max_iterations,
                   tools=options.tools, persist=options.persist, timeout=options.timeout)


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
