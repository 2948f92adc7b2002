"""System-prompt sections: the plugin contract (the engine assembles them:
:func:`bot.engine.context.assemble`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import Literal

from bot.contracts.messages import InboundMessage

PromptMode = Literal["full", "minimal"]


class Order(IntEnum):
    """Where the built-in sections sit in the system prompt (ascending).

    The gaps are for plugins: a section with ``order=375`` lands between safety
    and workspace. A section without an order gets :attr:`PLUGIN_DEFAULT`,
    after what the model must know about itself, its tools and its user, and
    before the per-run details. Text that changes between turns (the time) is
    marked ``volatile`` and read after the conversation instead (see
    :class:`PromptSection`), wherever its order puts it.
    """

    IDENTITY = 100
    """Platform, direct or group chat, group attribution, NO_REPLY."""
    BOOTSTRAP = 150
    """The mandatory first-run notice with BOOTSTRAP.md, while that file has content."""
    PERSONA = 200
    """SOUL.md and IDENTITY.md, early where they shape everything after."""
    TOOLING = 300
    """The tools of this run, one line each."""
    SAFETY = 350
    """External content is data; secrets stay secret."""
    ERROR_HANDLING = 360
    """How to read a failed tool call and when to retry it (only with tools)."""
    WORKSPACE = 400
    """Whose workspace the file tools reach."""
    USER = 450
    """Who sent the message."""
    PLUGIN_DEFAULT = 500
    """Sections that do not choose an order."""
    TIME = 600
    """Current UTC time (volatile: read after the conversation)."""
    FORMATTING = 650
    """How to format for the message's channel."""
    EXTRA_CONTEXT = 700
    """``PromptContext.extra_context`` in ``<extra_context>`` tags."""
    PATTERNS = 750
    """The agent's patterns that match this message (added by the engine, not a plugin;
    volatile)."""
    PROJECT_CONTEXT = 800
    """AGENTS.md and TOOLS.md behind a defensive preamble."""
    KERNEL = 850
    """The Kernel segment (USER.md, pinned facts), added by the engine, not a plugin."""
    RUNTIME = 900
    """Agent, session, channel, model, provider."""
    PERSONA_REMINDER = 950
    """A recency reminder to stay in character."""
    MEMORY_REMINDER = 960
    """Check notes before answering about the past."""


@dataclass(frozen=True, slots=True)
class PromptContext:
    """What section builders may look at."""

    message: InboundMessage
    session_key: str
    workspace: Path
    tool_names: Sequence[str]
    model: str
    provider: str
    agent: str
    mode: PromptMode = "full"
    extra_context: str = ""
    """Run-specific context from the caller (a parent run, a cron job, the heartbeat)."""
    agent_dir: Path | None = None
    """A ``predefined`` agent's persona directory (SOUL.md, AGENTS.md... are read from
    here, USER.md still from ``workspace``); ``None`` for an ``open`` agent."""


@dataclass(frozen=True, slots=True)
class PromptSection:
    """A block of the system prompt. Lower ``order`` comes first (see :class:`Order`).

    ``volatile``: the text changes between turns of one conversation (the time,
    the latest sender in a group, what matched this message). Such sections
    leave the system prompt for the request's ``note``, read after the
    conversation, so the system prompt and history stay a cacheable prefix
    (prompt caching reads a prefix only while it is byte-identical).
    """

    name: str
    text: str
    order: int = Order.PLUGIN_DEFAULT
    volatile: bool = False
