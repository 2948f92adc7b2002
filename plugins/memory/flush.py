"""The scheduled memory flush: quiet conversations get one run to store durable memories.

Every ``flush_every_hours`` each conversation that has been idle for
``flush_idle_minutes`` and has at least ``flush_min_messages``
messages it has not flushed yet gets one minimal, tool-limited run. Which
sessions are quiet and how long they are comes from the session store; what
was flushed is this plugin's own table (:mod:`plugins.memory.state`).
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from plugins.memory.config import memory_config
from plugins.memory.notes import today_utc
from plugins.memory.state import NEVER, FlushStates

# The flush is a background turn with compaction's limits and its history repair (and
# its photos as text: a flush needs the words only).
from roost import (
    FLUSH_ITERATIONS,
    FLUSH_TIMEOUT,
    FLUSH_TOOLS,
    ChatMessage,
    InboundMessage,
    JobSpec,
    RunRequest,
    Settings,
    agent_of,
    repair_pairing,
    text_only,
)

if TYPE_CHECKING:
    from roost import Runtime

log = logging.getLogger("roost.plugins.memory.flush")

SCHEDULED_FLUSH_MESSAGES = 40
"""The scheduled flush shows the model at most this many of the unflushed messages."""


def scheduled_flush_prompt(today: dt.date) -> str:
    """The instruction of the scheduled memory flush."""
    return (f"Scheduled memory flush: this conversation has been quiet for a while. Store "
            f"durable memories from it now (facts, preferences, decisions, open tasks) by "
            f"appending them to memory/{today.isoformat()}.md with write_file (read it first "
            f"if it exists; create memory/ if needed). Skip what your notes already say. If "
            f"nothing is worth storing, reply with NO_REPLY.")


@dataclass(frozen=True, slots=True)
class FlushCandidate:
    """A session the scheduled flush selected, as the database saw it."""

    session_id: int
    key: str
    updated_at: float
    total: int
    """Messages of the session so far, compacted ones included (only ever grows)."""
    flushed: int
    """``total`` when the last scheduled flush of it succeeded."""


class MemoryFlushJob:
    """The scheduled memory flush: which sessions qualify, the flush run, the record.

    A session qualifies when it has been idle for ``flush_idle_minutes``,
    has at least ``flush_min_messages`` messages since its last
    successful scheduled flush, and was not tried yet in the current window
    (``flush_every_hours``, counted from the Unix epoch, so a restart
    or a late fire inside the same window does not flush it twice). It is
    skipped, and not recorded, while it has a run in flight or queued, or while
    it is being compacted. ``clock`` returns Unix time (tests move it).
    """

    def __init__(self, settings: Settings, clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.config = memory_config(settings)
        self.clock = clock
        self.window = self.config.flush_every_hours * 3600

    def spec(self) -> JobSpec:
        """The job, for ``roost_scheduled_jobs``."""
        return JobSpec("memory_flush", every(self.window), self.run)

    async def run(self, app: Runtime) -> None:
        """One tick of the job (what the scheduler calls)."""
        await self.flush_due(app)

    async def flush_due(self, app: Runtime) -> list[str]:
        """Flush every qualifying session, one at a time; returns the keys flushed."""
        now = self.clock()
        window = math.floor(now / self.window)
        flushed = []
        for candidate in await self.candidates(app, now, window):
            key = candidate.key
            if app.compacting(key) or app.running_count(key) or app.queue_length(key):
                log.info("memory flush of %s skipped: the session is busy", key)
                continue
            # Post-run compaction of this session waits meanwhile, and we never
            # start while a compaction runs.
            with app.hold_compaction(key):
                if await self.flush(app, candidate, window):
                    flushed.append(key)
        return flushed

    async def candidates(self, app: Runtime, now: float, window: int) -> list[FlushCandidate]:
        """Sessions idle long enough, with enough unflushed messages, not tried this window."""
        c = self.config
        idle = await app.store.idle_sessions(before=now - c.flush_idle_minutes * 60)
        states = await self._states(app).get([a.id for a in idle])
        # Activity since the last flush comes first: it skips counting the messages
        # of every session that has been quiet since, which is most of them.
        fresh = [(a, state) for a in idle
                 if (state := states.get(a.id, NEVER)).window < window
                 and a.updated_at > state.flushed_upto]
        counts = await app.store.message_counts([a.id for a, _ in fresh])
        return [FlushCandidate(a.id, a.key, a.updated_at, total, state.flushed_count)
                for a, state in fresh
                if (total := counts.get(a.id, 0)) - state.flushed_count
                >= c.flush_min_messages]

    async def flush(self, app: Runtime, candidate: FlushCandidate, window: int) -> bool:
        """Run the flush for one session and record it; returns whether it succeeded.

        Its own run rather than ``Compactor.memory_flush``: that one marks the
        compaction cycle as flushed (so the flush before the next compaction
        would be skipped), shows only the last 10 messages, and tells the model
        the history is about to be summarized, which is not the case here.
        """
        session = await app.store.get(candidate.key)
        if session.id != candidate.session_id:
            return False  # reset since the query: a new conversation, nothing to flush
        unflushed = candidate.total - candidate.flushed
        history = text_only(session.messages[-min(unflushed, SCHEDULED_FLUSH_MESSAGES):])
        while history and history[0].role != "user":
            history = history[1:]
        message = flush_message(session.key, session.messages,
                                scheduled_flush_prompt(today_utc()))
        ok = False
        if message is not None and history:
            try:
                result = await app.run_turn(RunRequest(
                    message, session, mode="minimal", agent=agent_of(session.key),
                    max_iterations=FLUSH_ITERATIONS, tools=FLUSH_TOOLS,
                    history=repair_pairing(history), persist=False, timeout=FLUSH_TIMEOUT,
                    kind="memory_flush",
                ))
                ok = result.status == "completed"
                log.info("scheduled memory flush for %s: %s", session.key,
                         "nothing stored" if result.silent else result.status)
            except Exception:
                log.exception("scheduled memory flush for %s failed", session.key)
        await self._record(app, candidate, window, ok)
        return ok

    async def _record(self, app: Runtime, candidate: FlushCandidate, window: int,
                      ok: bool) -> None:
        # A failure only uses up the window: the same messages are tried again in
        # the next one, instead of on every tick while the provider is down.
        states = self._states(app)
        if ok:
            await states.flushed(candidate.session_id, candidate.total, candidate.updated_at,
                                 window)
        else:
            await states.tried(candidate.session_id, window)

    @staticmethod
    def _states(app: Runtime) -> FlushStates:
        return FlushStates(app.store.db, app.store.lock)


def flush_message(key: str, messages: Sequence[ChatMessage],
                  text: str) -> InboundMessage | None:
    """The message a background run of session ``key`` is attributed to.

    Keys look like ``agent:channel:direct:user`` or
    ``agent:channel:group:chat[:thread]``. The sender (whose workspace the run
    writes to) is the direct chat's user, or in a group the author of the
    latest user message, like the pre-compaction flush. A direct chat's
    ``chat_id`` is taken to be the user id: nothing is delivered, so it only
    labels the run. ``None`` when there is no sender to attribute it to.
    """
    parts = key.split(":")
    if len(parts) < 4:
        return None
    _, channel, kind, *rest = parts
    last = next((m for m in reversed(messages) if m.role == "user" and m.sender_id), None)
    if kind == "direct":
        user = ":".join(rest)
        name = (last.sender_name or "") if last is not None and last.sender_id == user else ""
        return InboundMessage(channel, user, "direct", user, text, sender_name=name)
    if kind == "group" and last is not None and last.sender_id:
        thread = ":".join(rest[1:]) or None
        return InboundMessage(channel, rest[0], "group", last.sender_id, text,
                              sender_name=last.sender_name or "", thread_id=thread)
    return None


def every(seconds: float) -> str:
    """A job schedule (``every <N>s|m|h``) for an interval, in the largest exact unit."""
    whole = max(1, round(seconds))
    for unit, size in (("h", 3600), ("m", 60)):
        if whole % size == 0:
            return f"every {whole // size}{unit}"
    return f"every {whole}s"
