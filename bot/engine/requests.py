"""What a run is asked to do and how it ended: :class:`RunRequest`, :class:`RunResult`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from bot.contracts.events import RunEvent
from bot.contracts.llm import ChatMessage, ToolCall, Usage
from bot.contracts.messages import InboundMessage
from bot.contracts.prompt import PromptMode
from bot.contracts.runtime import NO_REPLY as NO_REPLY
from bot.engine.snapshot import PluginSnapshot
from bot.observability.ids import hex_id
from bot.storage.db import Statements
from bot.storage.inbox import RunJournal
from bot.storage.sessions import Session
from bot.tools.outcomes import RawError

Listener = Callable[[RunEvent], Awaitable[None]]
FailureHandler = Callable[[ToolCall, RawError, str], Awaitable[str]]
"""``(call, raw_error, session_key) -> text for the model``."""
LargeResultHandler = Callable[[str, str, str], Awaitable[str]]
"""``(session_key, tool_name, content) -> preview with a reference``."""
RunStatus = Literal["completed", "failed", "cancelled", "refused"]


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
    on_commit: Callable[[str | None, bool], Statements] | None = None
    """``(reply or None, failed) -> statements`` written in the run's own commit
    (the dispatcher closes the inbox entries and queues the reply there)."""


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
    """The reply's outbox entry, when the run queued one in its commit."""

    @property
    def silent(self) -> bool:
        """True when nothing is to be delivered."""
        return self.reply is None
