"""The tool contract: what a plugin provides and what a tool receives when run."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bot.contracts.llm import ContentPart, ToolSpec
from bot.contracts.messages import OutboundMessage
from bot.contracts.prompt import PromptContext, PromptSection

SendFunc = Callable[[OutboundMessage], Awaitable["str | None"]]
"""Delivers a message through its channel now; returns the platform's message id if known."""


class ToolError(Exception):
    """Raised by a tool to report a failure the model should see.

    ``code`` is a short machine-readable tag (``NOT_FOUND``, ``PATH_ESCAPE``...);
    ``retryable`` marks failures that may succeed when tried again.
    """

    def __init__(self, message: str, *, code: str = "TOOL_ERROR", retryable: bool = False,
                 details: Mapping[str, Any] | None = None):
        super().__init__(message)
        self.code = code
        self.retryable = retryable
        self.details: Mapping[str, Any] = details or {}
        """Structured facts the tool knows better than any pattern (``error_type``,
        ``affected_resources``, ``dependencies``, ``suggested_actions``)."""


@dataclass(frozen=True, slots=True)
class ToolContext:
    """Who is running the tool, where, and until when.

    ``deadline`` is a ``time.monotonic()`` value; the executor enforces it with
    asyncio cancellation, and a tool may read it to size its own work.
    """

    user_id: str
    channel: str
    chat_id: str
    session_key: str
    run_id: str
    workspace: Path
    deadline: float
    chat_type: str = "direct"
    thread_id: str | None = None
    send: SendFunc | None = None
    """Delivers a message at once (not after the run, like the reply), e.g. a file
    for ``send_file``; address it to this context's ``channel``/``chat_id``/``thread_id``.
    Raises what the channel's ``send`` raises (:class:`bot.contracts.media.MediaTooLarge`
    for a file over the platform's limit). ``None`` where no channel can be reached."""

    def remaining(self) -> float:
        """Seconds left before the executor cancels this tool."""
        return max(0.0, self.deadline - time.monotonic())


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What a tool returns: text for the model, and whether it is an error.

    ``parts`` are files the model should see with the text (an image a tool
    produced, saved in the workspace): providers that take images in tool
    results send them, others get a note naming the file.
    """

    content: str
    is_error: bool = False
    parts: tuple[ContentPart, ...] = ()
    only_tools: frozenset[str] | None = None
    """When set, the rest of this run may call only these tools (a loaded skill's
    ``allowed-tools``): the run's tools are narrowed to them, never widened; ``None``
    changes nothing."""


ToolFunc = Callable[[ToolContext, Mapping[str, Any]], Awaitable["ToolResult | str"]]

ToolPrompt = Callable[[PromptContext], Awaitable[Sequence[PromptSection]]]
"""A tool's guidance for the system prompt: the sections it adds to one run's prompt."""


@dataclass(frozen=True, slots=True)
class ToolRetry:
    """How a tool's transient failures are retried (exponential backoff with jitter).

    Attempt ``n`` (from 1) waits ``min(initial_delay * multiplier**(n-1), max_delay)``
    seconds ±``jitter``; no more than ``max_attempts`` attempts or ``max_total``
    seconds in all.
    """

    max_attempts: int = 5
    initial_delay: float = 0.1
    multiplier: float = 2.0
    max_delay: float = 0.8
    max_total: float = 2.0
    jitter: float = 0.1


@dataclass(frozen=True, slots=True)
class Tool:
    """A named capability the model can call.

    ``execute(context, args)`` returns a :class:`ToolResult` or plain text, or
    raises :class:`ToolError` for failures the model should read.
    """

    name: str
    description: str
    input_schema: Mapping[str, Any]
    execute: ToolFunc
    timeout: float | None = None
    """Seconds before the call is cancelled (``None``: the ``tool_timeout`` setting)."""
    retry: ToolRetry | None = None
    """Retry policy for transient failures (``None``: the default policy)."""
    transient_codes: frozenset[str] = frozenset()
    permanent_codes: frozenset[str] = frozenset()
    """Error codes this tool classifies differently from the defaults."""
    requires: tuple[str, ...] = ()
    """Tools whose output this one needs: if one fails permanently in the same
    batch, this call is skipped (or answered with ``default``)."""
    optional: bool = False
    """A skipped optional call is not an error for the model, just a note."""
    default: str | None = None
    """The result to use when this call is skipped because a requirement failed."""
    meta: Mapping[str, Any] = field(default_factory=dict)
    breaker_key: Callable[[ToolContext, Mapping[str, Any]], str] | None = None
    """Divides the tool's circuit breaker: calls with different keys (a user and a
    host, say) open and pause apart. ``None``: one breaker for every call."""
    read_only: bool = False
    """The tool only reads (a file, the web, memory): calling it changes nothing, so a
    run that called only such tools may be started again when its message is edited.
    Unmarked tools are taken to have side effects."""
    prompt: ToolPrompt | None = None
    """Called once per run this tool is offered to (once, too, when several offered tools
    share it); its sections join the plugins' prompt sections under the same rules (``order``,
    ``volatile``). One that raises or outlasts ``timeout`` is logged and left out of the run."""

    def spec(self) -> ToolSpec:
        """The part of the tool the model is shown."""
        return ToolSpec(self.name, self.description, self.input_schema)
