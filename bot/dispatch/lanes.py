"""A session's lane: its runs in flight and its queue of waiting messages."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from bot.contracts.messages import InboundMessage
from bot.dispatch.registry import ActiveRun
from bot.engine.guard import join_messages
from bot.engine.requests import RunResult
from bot.storage.inbox import RunJournal


@dataclass(slots=True)
class Pending:
    """A message (or merged messages, or a scheduled turn) waiting for or in its run."""

    message: InboundMessage
    received: float
    options: dict[str, Any] | None = None
    """RunRequest options of a scheduled run (mode, kind, extra_context...)."""
    done: asyncio.Future[RunResult] | None = None
    deliver_failed: bool = True
    entries: tuple[int, ...] = ()
    """The inbox entries this run answers (several when messages were merged)."""
    journal: RunJournal | None = None
    """What an interrupted earlier run of these entries recorded (recovery)."""
    stale_draft: str | None = None
    """A draft an interrupted earlier run left in the chat."""
    counted: bool = False
    """The inbox recorded the run as started when it recorded the message."""
    texts: tuple[str, ...] = ()
    """The texts of merged messages, each kept whole where the limit allows."""


@dataclass(slots=True)
class Running:
    """A lane's run in flight: what it answers and its registry entry."""

    pending: Pending
    run: ActiveRun | None = None
    output: bool = False


@dataclass(slots=True)
class Lane:
    """The runs and queue of one session."""

    key: str
    limit: int
    running: list[Running] = field(default_factory=list)
    queue: deque[Pending] = field(default_factory=deque)


def joined(first: Pending, second: InboundMessage, entry: int, now: float,
           limit: int) -> Pending:
    """``second`` merged into ``first``: one run answers both."""
    # Reply to the newest message: that is the one the sender is looking at.
    texts = (*(first.texts or (first.message.text,)), second.text)
    attachments = first.message.attachments + second.attachments
    message = dataclasses.replace(second, text=join_messages(texts, limit),
                                  attachments=attachments)
    return Pending(message, now, entries=(*first.entries, entry),
                    stale_draft=first.stale_draft, texts=texts)
