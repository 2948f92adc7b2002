"""Compaction: summarizing old history, mid-run and after a run, with a memory flush first.

Post-run, when a session's active history passes ``compact_min_messages`` or
``compact_ratio`` of the window, one background task per session (others skip
while it holds the session's lock) first runs the memory flush (an embedded,
minimal-prompt run that may write ``memory/YYYY-MM-DD.md``, once per
compaction cycle), then asks the model for a summary of all but the last
``compact_keep_messages`` messages and swaps them for it. A failed summary
changes nothing.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from bot.config.settings import Settings
from bot.contracts.llm import BudgetRefused, ChatMessage, LLMProvider, LLMRequest, metered_complete
from bot.contracts.messages import InboundMessage
from bot.engine.context import (
    TokenEstimator,
    compaction_due,
    repair_pairing,
    summary_messages,
)
from bot.engine.media import text_only
from bot.observability.tracing import RunTrace
from bot.storage.sessions import Session, SessionStore, agent_of
from bot.tools.outcomes import describe_error

if TYPE_CHECKING:
    from bot.agents.router import Agent

log = logging.getLogger("roost.engine.compaction")

SUMMARY_SYSTEM = (
    "You compress chat history. Write a concise summary of the conversation below for the "
    "assistant's own later use: who said what, decisions, facts learned about the users, "
    "open tasks and promises, names of files touched. Plain prose or short bullets, no "
    "preamble."
)
SUMMARY_MAX_TOKENS = 1_024
SUMMARY_TEMPERATURE = 0.3
SUMMARY_TIMEOUT = 120.0
FLUSH_TIMEOUT = 90.0
FLUSH_ITERATIONS = 5
FLUSH_WINDOW = 10
FLUSH_TOOLS = ("read_file", "write_file")
TRANSCRIPT_TOOL_CHARS = 2_000
RETRY_AFTER_MESSAGES = 10


def flush_prompt(today: dt.date) -> str:
    """The instruction of the pre-compaction memory flush."""
    return (f"Pre-compaction memory flush: older messages of this conversation are about to "
            f"be summarized. Store durable memories now (facts, preferences, decisions, open "
            f"tasks) by appending them to memory/{today.isoformat()}.md with write_file "
            f"(read it first if it exists; create memory/ if needed). If nothing is worth "
            f"storing, reply with NO_REPLY.")


def transcript(messages: Sequence[ChatMessage], previous_summary: str = "") -> str:
    """Render messages as plain text for the summarizer (no tool pairing to break)."""
    lines = []
    if previous_summary:
        lines.append(f"[Earlier summary]\n{previous_summary}\n")
    for m in messages:
        if m.role == "user":
            who = m.sender_name or m.sender_id or "user"
            # The summarizer gets text only; it is told which files were shown.
            files = "".join(f"\n[{p.kind}: {p.path}]" for p in m.parts
                            if f"{p.path}" not in m.content)
            lines.append(f"{who}: {m.content}{files}")
        elif m.role == "assistant":
            calls = ", ".join(f"{c.name}({dict(c.arguments)})" for c in m.tool_calls)
            text = m.content + (f" [called {calls}]" if calls else "")
            lines.append(f"assistant: {text}")
        else:
            lines.append(f"[{m.tool_name} result] {m.content[:TRANSCRIPT_TOOL_CHARS]}")
    return "\n".join(lines)


async def summarize(provider: LLMProvider, model: str, messages: Sequence[ChatMessage],
                    previous_summary: str = "") -> str:
    """Ask ``provider``'s ``model`` for a summary of ``messages``; raises on failure or
    empty output."""
    request = LLMRequest(
        model=model,
        system=SUMMARY_SYSTEM,
        messages=(ChatMessage("user", transcript(messages, previous_summary)),),
        max_tokens=SUMMARY_MAX_TOKENS,
        temperature=SUMMARY_TEMPERATURE,
        cache=False,  # a transcript no later request starts with: caching it only costs
    )
    async with asyncio.timeout(SUMMARY_TIMEOUT):
        response = await metered_complete(provider, request)
    summary = response.text.strip()
    if not summary:
        raise ValueError("the model returned an empty summary")
    return summary


def split_point(messages: Sequence[ChatMessage], keep: int) -> int:
    """Index where the kept tail starts: about ``keep`` messages, never at a tool result."""
    cut = max(0, len(messages) - keep)
    while 0 < cut < len(messages) and messages[cut].role == "tool":
        cut -= 1
    return cut


def midloop_due(settings: Settings, convo: Sequence[ChatMessage], prompt_tokens: int) -> bool:
    """Whether a run's conversation of ``prompt_tokens`` fills enough of the window to be
    compacted mid-run (each run does it at most once)."""
    return (settings.compaction and len(convo) >= 4
            and prompt_tokens >= settings.compact_ratio * settings.context_window)


async def compact_midloop(convo: list[ChatMessage], current: ChatMessage | None,
                          provider: LLMProvider, model: str, trace: RunTrace,
                          session_key: str) -> list[ChatMessage]:
    """A run's conversation with its oldest ~70% summarized (``convo`` itself when the
    summary fails). ``current``, the message being answered, stays verbatim."""
    cut = split_point(convo, max(2, round(len(convo) * 0.3)))
    if cut <= 0:
        return convo
    span = trace.start("llm", "compaction", model=model, messages=cut)
    try:
        summary = await summarize(provider, model, convo[:cut])
    except Exception as exc:
        span.end(error=True, error_message=describe_error(exc))
        log.warning("mid-run compaction of %s failed; continuing uncompacted", session_key,
                    exc_info=exc)
        return convo
    span.end()
    log.info("mid-run compaction of %s: %d messages summarized", session_key, cut)
    created = current.created_at if current is not None else None
    task = next((m for m in convo if m.role == "user" and m.created_at == created), None)
    return [*summary_messages(summary), *([task] if task in convo[:cut] else []),
            *convo[cut:]]


FlushRun = Callable[[InboundMessage, Session, str, Sequence[ChatMessage]], Awaitable[str]]
"""``flush(message, session, agent, history)``: run the memory-flush turn and say how it went."""


class Compactor:
    """Runs post-run compaction for sessions, at most one at a time per session.

    Given what it needs rather than the engine: the session ``store``, the
    default ``provider()``, ``estimator_for(provider name)`` and ``flush``, which
    runs the pre-compaction memory-flush turn.
    """

    def __init__(self, settings: Settings, store: SessionStore,
                 provider: Callable[[], LLMProvider],
                 estimator_for: Callable[[str], TokenEstimator], flush: FlushRun) -> None:
        self.settings = settings
        self.store = store
        self.provider = provider
        self.estimator_for = estimator_for
        self.flush = flush
        self.busy: set[str] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        # After a failure, wait for this much more history before trying again, so
        # a broken summarizer does not cost an extra model call on every run.
        self.failed_at: dict[str, int] = {}

    def needed(self, session: Session, agent: Agent | None = None) -> bool:
        """Whether the session's active history calls for compaction (under ``agent``'s
        context window; the default agent's when ``None``)."""
        settings = agent.settings if agent is not None else self.settings
        if not settings.compaction:
            return False
        failed = self.failed_at.get(session.key)
        if failed is not None and len(session.messages) < failed + RETRY_AFTER_MESSAGES:
            return False
        provider, _ = self._provider(agent)
        return compaction_due(session.messages, settings, self.estimator_for(provider.name))

    def _provider(self, agent: Agent | None) -> tuple[LLMProvider, str]:
        """The provider and model that summarize for ``agent``."""
        if agent is None:
            return self.provider(), self.settings.model
        return agent.provider or self.provider(), agent.settings.model

    def schedule(self, session: Session, message: InboundMessage,
                 agent: Agent | None = None) -> bool:
        """Start a background compaction unless one is running for this session."""
        if session.key in self.busy or not self.needed(session, agent):
            return False
        self.busy.add(session.key)
        task = asyncio.create_task(self._run(session, message, agent))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return True

    async def wait(self) -> None:
        """Wait for every compaction in progress (tests, shutdown)."""
        while self.tasks:
            await asyncio.gather(*list(self.tasks), return_exceptions=True)

    async def _run(self, session: Session, message: InboundMessage,
                   agent: Agent | None) -> None:
        session.pins += 1
        try:
            if self.settings.memory_flush and session.flushed_compaction < session.compactions:
                await self.memory_flush(session, message, agent)
            await self.compact(session, agent)
            self.failed_at.pop(session.key, None)
        except BudgetRefused as exc:
            self.failed_at[session.key] = len(session.messages)
            log.info("compaction of %s skipped: %s", session.key, exc.reply)
        except Exception:
            self.failed_at[session.key] = len(session.messages)
            log.exception("compaction of %s failed; history left as it was (next try after "
                          "%d more messages)", session.key, RETRY_AFTER_MESSAGES)
        finally:
            session.pins -= 1
            self.busy.discard(session.key)

    async def memory_flush(self, session: Session, message: InboundMessage,
                           agent: Agent | None = None) -> None:
        """Give the agent one minimal, tool-limited run to save durable memories."""
        history = session.messages[-FLUSH_WINDOW:]
        while history and history[0].role != "user":
            history = history[1:]
        flush = InboundMessage(
            channel=message.channel, chat_id=message.chat_id, chat_type=message.chat_type,
            sender_id=message.sender_id, sender_name=message.sender_name,
            text=flush_prompt(dt.datetime.now(dt.UTC).date()),
        )
        outcome = await self.flush(
            flush, session, agent.name if agent is not None else agent_of(session.key),
            repair_pairing(text_only(history)))
        await self.store.mark_flushed(session)
        log.info("memory flush for %s: %s", session.key, outcome)

    async def compact(self, session: Session, agent: Agent | None = None) -> bool:
        """Summarize all but the last few messages; returns whether it did."""
        cut = split_point(session.messages, self.settings.compact_keep_messages)
        if cut <= 0:
            return False
        old = list(session.messages[:cut])
        provider, model = self._provider(agent)
        summary = await summarize(provider, model, old, session.summary)
        if not await self.store.compact(session, cut, summary):
            # Another replica compacted it meanwhile (or its oldest messages are not the
            # ones summarized): the next run starts from the stored session.
            log.info("compaction of %s dropped: the stored session changed meanwhile",
                     session.key)
            return False
        log.info("compacted %s: %d messages into a %d-char summary (compaction #%d)",
                 session.key, cut, len(summary), session.compactions)
        return True
