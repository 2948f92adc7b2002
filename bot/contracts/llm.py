"""Provider-neutral conversation types and the provider protocol.

Every LLM provider (Anthropic, OpenAI-compatible, scripted, or a plugin's)
translates these types to its own wire format and back.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

Role = Literal["user", "assistant", "tool"]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool invocation requested by the model."""

    id: str
    name: str
    arguments: Mapping[str, Any]


PartKind = Literal["image", "document", "audio"]


@dataclass(frozen=True, slots=True)
class ContentPart:
    """A file that is part of a message to the model: an image, a document, an audio clip.

    Stored by reference, never as bytes: ``path`` is relative to the workspace
    ``root`` (``inbox/2026-11-23/photo-1.jpg``); providers read
    ``Path(root) / path`` when they build a request, and a part whose file is gone
    becomes a text note. ``mime_type`` was sniffed from the bytes.
    """

    kind: PartKind
    path: str
    mime_type: str
    width: int = 0
    height: int = 0
    size: int = 0
    root: str = ""
    pages: int = 0
    """Pages of a document (PDF); 0 when unknown or not a document."""

    @property
    def file(self) -> Path:
        """The file on disk: ``root / path``."""
        return Path(self.root) / self.path


@dataclass(slots=True)
class ChatMessage:
    """One entry of a session's history.

    ``user`` messages carry the sender (groups share one history, so each
    message is attributed); ``assistant`` messages may carry tool calls;
    ``tool`` messages answer exactly one tool call by ``tool_call_id``.
    """

    role: Role
    content: str
    sender_id: str | None = None
    sender_name: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    tool_name: str | None = None
    is_error: bool = False
    created_at: float = field(default_factory=time.time)
    parts: tuple[ContentPart, ...] = ()
    """Files that belong to this (user) message, besides ``content`` (the text)."""
    weight: float = field(default=-1.0, init=False, repr=False, compare=False)
    """Cached size in English-equivalent characters (see bot.engine.context). ``init=False``
    so ``dataclasses.replace`` starts a changed copy without a stale value."""


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """What the model is told about a tool."""

    name: str
    description: str
    input_schema: Mapping[str, Any]


@dataclass(slots=True)
class Usage:
    """Token counts for one or more LLM calls.

    ``input_tokens`` is every prompt token the model read, cached or not;
    ``cache_read_tokens`` and ``cache_write_tokens`` are the parts of it read from
    and written to the provider's prompt cache (Anthropic bills them at 0.1x and
    1.25x the input price; OpenAI-compatible servers report reads only).
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    @property
    def uncached_tokens(self) -> int:
        """Input tokens neither read from nor written to the cache."""
        return max(0, self.input_tokens - self.cache_read_tokens - self.cache_write_tokens)

    def add(self, other: Usage) -> None:
        """Accumulate ``other`` into this counter."""
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.cache_read_tokens += other.cache_read_tokens
        self.cache_write_tokens += other.cache_write_tokens


@dataclass(frozen=True, slots=True)
class LLMRequest:
    """Everything a provider needs for one model call."""

    model: str
    system: str
    messages: tuple[ChatMessage, ...]
    tools: tuple[ToolSpec, ...] = ()
    max_tokens: int = 4096
    temperature: float | None = None
    """``None`` leaves the provider's default; providers whose API has no such
    parameter (Anthropic's current Messages API) ignore it."""
    vision: bool = True
    """Whether the model takes images (and documents): when ``False`` the provider
    sends a text note in place of every part, never the bytes."""
    note: str = ""
    """Context for this request only, read after the conversation: the current time,
    the tool execution summary, a loop warning (volatile prompt sections). Never
    stored. Providers send it after their last prompt-cache breakpoint (Anthropic: a
    text block after the final message's cached blocks; OpenAI-compatible: appended
    to the final message), so that ``system``, ``tools`` and ``messages`` stay a
    byte-identical prefix of the next request of the same chat and are read from
    the cache."""
    cache: bool = True
    """``False`` for a one-off request no later request shares a prefix with (the
    compaction summarizer): the provider marks nothing for its prompt cache, as
    writing an entry costs more than plain input (Anthropic: 1.25x)."""


@dataclass(slots=True)
class LLMResponse:
    """A complete model answer: text, tool calls, usage."""

    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage = field(default_factory=Usage)
    stop_reason: str = ""


OnText = Callable[[str], None]
"""Receives each streamed text fragment as it arrives."""

OnRetry = Callable[[int, int, str], Awaitable[None]]
"""Called as ``on_retry(attempt, max_attempts, error)`` before a provider retries.

A numbered call (``attempt`` ≥ 2) voids any text streamed so far: the answer
streams again from its start. ``on_retry(0, 0, reason)`` means the call is held
by the provider's circuit breaker (the model service is failing) and will go
on once it answers again; the core tells the chat once."""


class ProviderError(Exception):
    """A provider call failed; ``retryable`` says whether trying again may help."""

    def __init__(self, message: str, *, retryable: bool = False, status: int | None = None):
        super().__init__(message)
        self.retryable = retryable
        self.status = status


class LLMProvider(Protocol):
    """The interface every provider implements.

    ``complete`` streams text fragments to ``on_text`` when given, and returns
    the whole answer. It must be cancellation-safe: cancelling the awaiting task
    aborts the HTTP stream.
    """

    name: str

    async def complete(
        self,
        request: LLMRequest,
        *,
        on_text: OnText | None = None,
        on_retry: OnRetry | None = None,
    ) -> LLMResponse: ...

    async def aclose(self) -> None: ...
