"""Conversations as plugins see them: a session, its key and when it was last used."""

from __future__ import annotations

from dataclasses import dataclass, field

from bot.contracts.llm import ChatMessage
from bot.contracts.messages import InboundMessage

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

    Direct chats are per user per channel; a group shares one history, and a
    thread or forum topic inside a group is a conversation of its own.
    """
    if message.chat_type == "group":
        thread = f":{message.thread_id}" if message.thread_id else ""
        return f"{agent}:{message.channel}:group:{message.chat_id}{thread}"
    return f"{agent}:{message.channel}:direct:{message.sender_id}"


def agent_of(key: str) -> str:
    """The agent a session key belongs to (its first part)."""
    return key.split(":", 1)[0]
