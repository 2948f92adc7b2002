"""Provider-neutral conversation types (a message, a session), the provider protocol,
who pays for a call, and how the model's final text is cleaned (:class:`Sanitizer`).

Every LLM provider (Anthropic, OpenAI-compatible, scripted, or a plugin's)
translates these types to its own wire format and back. Every model call made
while a run is served goes through :func:`metered_complete`, which reserves the
call's worst case on the run's :data:`METER` before it and settles it after.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from bot.contracts.messages import InboundMessage

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


_PART_FIELDS = frozenset(f.name for f in dataclasses.fields(ContentPart))


def encode_parts(parts: Sequence[ContentPart]) -> str | None:
    """A message's parts as JSON references (path, type, size...), ``None`` for none."""
    if not parts:
        return None
    return json.dumps([dataclasses.asdict(p) for p in parts], ensure_ascii=False)


def decode_parts(text: str | None) -> tuple[ContentPart, ...]:
    """The inverse of :func:`encode_parts`; fields a newer Roost added are ignored."""
    if not text:
        return ()
    return tuple(ContentPart(**{k: v for k, v in item.items() if k in _PART_FIELDS})
                 for item in json.loads(text))


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


# -- conversations: a session, its key and when it was last used -------------------------

STALE = -1
"""The version of a cached session copy known to have missed a write."""


@dataclass(frozen=True, slots=True)
class SessionActivity:
    """When an active session was last used (:meth:`SessionStore.idle_sessions`)."""

    id: int
    key: str
    updated_at: float


@dataclass(slots=True, eq=False)
class Session:
    """One conversation: a key, its history and its running totals."""

    id: int
    key: str
    messages: list[ChatMessage]
    created_at: float
    updated_at: float
    model: str = ""
    provider: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    """Of ``input_tokens``, those read from the provider's prompt cache."""
    cache_write_tokens: int = 0
    """Of ``input_tokens``, those written to the prompt cache."""
    summary: str = ""
    """The latest compaction summary of the history before ``messages``."""
    compactions: int = 0
    flushed_compaction: int = -1
    """The compaction cycle whose memory flush already ran."""
    facts: list[str] = field(default_factory=list)
    """Facts pinned to this conversation (``/pin``); part of the Kernel segment."""
    context_tokens: dict[str, int] = field(default_factory=dict, repr=False)
    """Token counts of each context segment in the latest run (for ``/status``)."""
    pins: int = field(default=0, repr=False)
    """Runs currently using this session; a pinned session is never evicted."""
    version: int = 0
    """The database's ``sessions.version`` this copy is; :data:`STALE` once it missed a
    write (the store then reloads it)."""

    def advance(self, committed: int | None) -> None:
        """Record that a write of this copy's own committed as version ``committed``:
        current again only if no other write came in between."""
        self.version = committed if committed is not None \
            and committed == self.version + 1 else STALE


def session_key(message: InboundMessage, agent: str = "default") -> str:
    """The conversation a message belongs to.

    Direct chats are per user per channel (each ``conversation`` in one, such as an
    email thread, apart); a group shares one history, and a thread or forum topic
    inside a group is a conversation of its own.
    """
    if message.chat_type == "group":
        thread = f":{message.thread_id}" if message.thread_id else ""
        return f"{agent}:{message.channel}:group:{message.chat_id}{thread}"
    apart = f":{message.conversation}" if message.conversation else ""
    return f"{agent}:{message.channel}:direct:{message.sender_id}{apart}"


def agent_of(key: str) -> str:
    """The agent a session key belongs to (its first part)."""
    return key.split(":", 1)[0]


# -- who pays for a model call ---------------------------------------------------------
#
# The dispatcher sets METER for a run (a person's message, a cron job, the heartbeat, a
# background memory flush) to the budgets of whoever the run serves; every model call made
# in that context goes through metered_complete, which reserves the call's worst case
# before it and settles to the reported usage after. Tasks started from a run inherit its
# meter (asyncio copies the context).


class BudgetRefused(Exception):
    """A model call does not fit a budget; ``reply`` is the one line for the user."""

    def __init__(self, reply: str) -> None:
        super().__init__(reply)
        self.reply = reply


class Hold(Protocol):
    """One call's reservation, settled exactly once."""

    async def settle(self, usage: Usage | None, model: str) -> None:
        """Replace the reservation by ``usage`` (``None``: the call failed, nothing counted)."""
        ...


class Meter(Protocol):
    """The budgets a run's model calls count against."""

    async def reserve(self, request: LLMRequest, provider: str) -> Hold:
        """Reserve ``request``'s worst case; raises :class:`BudgetRefused` when it does not fit."""
        ...

    async def charge(self, usage: Usage, model: str) -> None:
        """Count usage spent outside a model call (a transcription) without a reservation."""
        ...


METER: ContextVar[Meter | None] = ContextVar("roost_meter", default=None)
"""The meter of the run being served; ``None`` outside one (a call nobody pays for)."""


async def metered_complete(provider: LLMProvider, request: LLMRequest, *,
                           on_text: OnText | None = None,
                           on_retry: OnRetry | None = None) -> LLMResponse:
    """``provider.complete(request)``, reserved before and settled after on the current meter."""
    meter = METER.get()
    if meter is None:
        return await provider.complete(request, on_text=on_text, on_retry=on_retry)
    hold = await meter.reserve(request, provider.name)
    try:
        response = await provider.complete(request, on_text=on_text, on_retry=on_retry)
    except BaseException:
        # Released even when cancelled: the settle is shielded and finishes on its own.
        await asyncio.shield(hold.settle(None, request.model))
        raise
    await asyncio.shield(hold.settle(response.usage, request.model))
    return response


TRANSCRIPT_CHARS_PER_TOKEN = 4
"""A transcription counts as its transcript's tokens, at about this many characters each."""


async def charge_transcription(transcriber: object, transcript: str) -> None:
    """Count a transcription against the current meter: the transcript's tokens as output
    of the transcriber's model (``model``, else its ``name``), priced by ``[budgets.prices]``."""
    meter = METER.get()
    if meter is None:
        return
    model = str(getattr(transcriber, "model", "") or getattr(transcriber, "name", ""))
    await meter.charge(Usage(0, len(transcript) // TRANSCRIPT_CHARS_PER_TOKEN + 1), model)


# -- cleaning the model's final text ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class Sanitizer:
    """A text transform applied to every final reply, lowest ``order`` first.

    ``needs``: characters without which ``func`` has nothing to remove; the pipeline
    passes it only text that contains one of them (empty: every text).
    """

    name: str
    func: Callable[[str], str]
    order: int = 500
    needs: str = ""


def run_pipeline(text: str, sanitizers: Iterable[Sanitizer]) -> str:
    """Apply ``sanitizers`` in order (each to text holding one of its ``needs``) and trim
    the result."""
    for s in sorted(sanitizers, key=lambda s: s.order):
        if not s.needs or any(c in text for c in s.needs):
            text = s.func(text)
    return text.strip()
