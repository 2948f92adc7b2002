"""Sessions' lanes: their runs in flight, their queues of waiting messages, merging.

Each session has a lane: up to one run at a time in a direct chat and
``group_max_concurrent`` in a group; further messages wait in a FIFO capped at
``queue_cap`` (the oldest is dropped). A message from the same sender that
arrives within ``merge_window_ms`` of the previous one, while that message's run
has shown nothing yet, cancels the run and restarts it with both texts, so a
lone message is never delayed to wait for a possible follow-up. The runs in flight are
:class:`RunRegistry`'s (``/stop`` aborts them).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from bot.config.settings import Settings
from bot.contracts.messages import InboundMessage
from bot.engine.requests import RunOptions, RunResult
from bot.storage.inbox import RunJournal


@dataclass(slots=True)
class ActiveRun:
    """A run in flight. ``cancel_reason`` says why it was cancelled, if it was."""

    run_id: str
    session_key: str
    task: asyncio.Task[None]
    started_at: float
    cancel_reason: str = ""

    def cancel(self, reason: str) -> None:
        """Cancel its task, remembering ``reason`` ("stop", "merged", "shutdown")."""
        self.cancel_reason = reason
        self.task.cancel(reason)


@dataclass
class RunRegistry:
    """Every in-flight run by id, in start order per session."""

    runs: dict[str, ActiveRun] = field(default_factory=dict)

    def register(self, run: ActiveRun) -> None:
        """Track ``run`` until :meth:`unregister`."""
        self.runs[run.run_id] = run

    def unregister(self, run_id: str) -> None:
        """Forget a finished run."""
        self.runs.pop(run_id, None)

    def for_session(self, session_key: str) -> list[ActiveRun]:
        """In-flight runs of one session, oldest first, leaving out cancelled ones."""
        return sorted((r for r in self.runs.values()
                       if r.session_key == session_key and not r.cancel_reason),
                      key=lambda r: r.started_at)

    def abort(self, run_id: str, session_key: str, reason: str = "stop") -> bool:
        """Cancel one run, only if it belongs to ``session_key``."""
        run = self.runs.get(run_id)
        if (run is None or run.session_key != session_key or run.task.done()
                or run.cancel_reason):
            return False
        run.cancel(reason)
        return True

    def abort_session(self, session_key: str, reason: str = "stop") -> int:
        """Cancel every run of a session; returns how many were cancelled."""
        return sum(self.abort(r.run_id, session_key, reason)
                   for r in self.for_session(session_key))

    def abort_all(self, reason: str = "shutdown") -> int:
        """Cancel every run (shutdown)."""
        return sum(self.abort(r.run_id, r.session_key, reason) for r in list(self.runs.values()))


@dataclass(slots=True)
class Pending:
    """A message (or merged messages, or a scheduled turn) waiting for or in its run."""

    message: InboundMessage
    received: float
    options: RunOptions = field(default_factory=RunOptions)
    """How the run runs (a scheduled run's mode, kind, extra context...)."""
    from_person: bool = True
    """Sent by a person (``False``: a scheduled turn, never merged, no request window)."""
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
    fresh: bool = False
    """Started again on an edited text: what an earlier start journaled is forgotten."""


@dataclass(slots=True)
class Running:
    """A lane's run in flight: what it answers and its registry entry."""

    pending: Pending
    run: ActiveRun | None = None
    output: bool = False
    """The run showed something or is being committed: a follow-up is not merged into it."""
    side_effects: bool = False
    """A tool not marked read-only was called: an edit of its message can no longer
    restart it (bot.dispatch.corrections)."""
    answering: bool = False
    """The run's answer is being committed: an edit of its message is a correction."""

    def attach(self, run: ActiveRun) -> None:
        """The registry entry of the run started for this entry."""
        self.run = run

    def shown(self) -> None:
        """The run showed output (or its commit began): it is no longer merged into."""
        self.output = True

    def acted(self) -> None:
        """The run called a tool that may have changed something."""
        self.side_effects = True

    def committing(self) -> None:
        """The run's answer is being committed."""
        self.answering = True
        self.output = True


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


@dataclass(slots=True)
class Moves:
    """What a change to a lane asks of its owner: ``start`` the runs of these entries
    (each announced with :meth:`Lanes.started` once its task exists), and tell the
    senders of ``dropped`` messages (the full queue dropped them)."""

    start: list[Running] = field(default_factory=list)
    dropped: list[Pending] = field(default_factory=list)


class Lanes:
    """Every session's lane: who runs now, who waits, and merging follow-ups.

    Each change returns its :class:`Moves`; the owner starts the runs it names and
    calls :meth:`finished` when one is done.
    """

    def __init__(self, settings: Settings, registry: RunRegistry) -> None:
        self.settings = settings
        self.registry = registry
        self.by_key: dict[str, Lane] = {}
        self.closed = False
        """Set on shutdown: queued messages no longer start."""

    def lane(self, key: str, message: InboundMessage) -> Lane:
        """Session ``key``'s lane (made for ``message``'s kind of chat when new)."""
        lane = self.by_key.get(key)
        if lane is None:
            limit = self.settings.group_max_concurrent if message.chat_type == "group" else 1
            lane = self.by_key[key] = Lane(key, limit)
        return lane

    def waiting(self) -> int:
        """Messages waiting in all the queues."""
        return sum(len(lane.queue) for lane in self.by_key.values())

    def queue_length(self, key: str) -> int:
        """Messages waiting in a session's queue."""
        lane = self.by_key.get(key)
        return len(lane.queue) if lane else 0

    def clear_queue(self, key: str) -> int:
        """Drop a session's queue; returns how many messages it held."""
        lane = self.by_key.get(key)
        if not lane:
            return 0
        dropped = len(lane.queue)
        lane.queue.clear()
        return dropped

    def add(self, lane: Lane, pending: Pending) -> Moves:
        """Start ``pending`` if the lane has room, else queue it (never merged)."""
        if len(lane.running) < lane.limit:
            return Moves([self.start(lane, pending)])
        lane.queue.append(pending)
        return Moves()

    def enqueue(self, lane: Lane, message: InboundMessage, entry: int, *,
                counted: bool = False) -> Moves:
        """A person's message: merged into their previous one, started, or queued."""
        now = time.monotonic()
        window = self.settings.merge_window_ms / 1000
        merged = self._merge(lane, message, entry, now, window) if window else None
        if merged is not None:
            return merged
        if len(lane.running) < lane.limit:
            return Moves([self.start(lane, Pending(message, now, entries=(entry,),
                                                   counted=counted))])
        moves = Moves()
        if len(lane.queue) >= self.settings.queue_cap:
            dropped = lane.queue.popleft()
            if dropped.done is not None and not dropped.done.done():
                dropped.done.set_exception(RuntimeError("dropped: the chat's queue was full"))
            moves.dropped.append(dropped)
        lane.queue.append(Pending(message, now, entries=(entry,), counted=counted))
        return moves

    def _merge(self, lane: Lane, message: InboundMessage, entry_id: int, now: float,
               window: float) -> Moves | None:
        # Into the running run only when nothing waits behind it: a message
        # queued in between must not be answered after the one merged past it.
        for running in reversed(lane.running if not lane.queue else ()):
            prev = running.pending
            if (prev.message.sender_id == message.sender_id and not running.output
                    and prev.from_person and prev.journal is None
                    and now - prev.received <= window and running.run is not None):
                lane.running.remove(running)
                self.registry.abort(running.run.run_id, lane.key, "merged")
                limit = self.settings.max_message_chars
                return Moves([self.start(lane, joined(prev, message, entry_id, now, limit))])
        if lane.queue and len(lane.running) >= lane.limit:
            last = lane.queue[-1]
            if (last.message.sender_id == message.sender_id and last.from_person
                    and now - last.received <= window):
                limit = self.settings.max_message_chars
                lane.queue[-1] = joined(last, message, entry_id, now, limit)
                return Moves()
        return None

    def find(self, key: str, entry: int) -> tuple[Lane, Pending | Running] | None:
        """Where inbox entry ``entry`` of session ``key`` is: queued (its :class:`Pending`)
        or in a run (its :class:`Running`); ``None`` when neither here."""
        lane = self.by_key.get(key)
        if lane is None:
            return None
        for running in lane.running:
            if entry in running.pending.entries:
                return lane, running
        for pending in lane.queue:
            if entry in pending.entries:
                return lane, pending
        return None

    def replace_queued(self, lane: Lane, pending: Pending, new: Pending | None) -> None:
        """Put ``new`` in queued ``pending``'s place (``None``: take it out, withdrawn
        before it started)."""
        if pending not in lane.queue:
            return
        if new is None:
            lane.queue.remove(pending)
        else:
            lane.queue[lane.queue.index(pending)] = new
        if not lane.running and not lane.queue and self.by_key.get(lane.key) is lane:
            del self.by_key[lane.key]

    def withdraw(self, lane: Lane, running: Running) -> Moves:
        """Cancel ``running``'s run (reason ``withdrawn``): it leaves the lane now (a run
        cancelled before its first step never reaches its own cleanup)."""
        if running.run is not None:
            self.registry.abort(running.run.run_id, lane.key, "withdrawn")
        return self.finished(lane, running)

    def restart(self, lane: Lane, running: Running, pending: Pending) -> Moves:
        """Cancel ``running``'s run (reason ``edited``) and run ``pending`` in its place."""
        if running in lane.running:
            lane.running.remove(running)
        if running.run is not None:
            self.registry.abort(running.run.run_id, lane.key, "edited")
            # A run cancelled before its first step never reaches its own cleanup.
            self.registry.unregister(running.run.run_id)
        return Moves([self.start(lane, pending)])

    def behind(self, lane: Lane, pending: Pending) -> Moves:
        """``pending`` starts after a run now in flight ends (even with room for it), or
        now when none is."""
        if lane.running:
            lane.queue.append(pending)
            return Moves()
        return self.add(lane, pending)

    def start(self, lane: Lane, pending: Pending) -> Running:
        """``pending`` runs now: its entry among the lane's running ones."""
        entry = Running(pending)
        lane.running.append(entry)
        return entry

    def started(self, lane: Lane, entry: Running, run_id: str,
                task: asyncio.Task[None]) -> None:
        """``entry``'s run ``run_id`` is in flight as ``task``, registered for ``/stop``."""
        run = ActiveRun(run_id, lane.key, task, time.monotonic())
        entry.attach(run)
        self.registry.register(run)

    def finished(self, lane: Lane, entry: Running) -> Moves:
        """``entry``'s run ended: the next queued messages start; an idle lane goes."""
        if entry.run is not None:
            self.registry.unregister(entry.run.run_id)
        if entry in lane.running:
            lane.running.remove(entry)
        moves = Moves()
        while lane.queue and len(lane.running) < lane.limit and not self.closed:
            moves.start.append(self.start(lane, lane.queue.popleft()))
        if not lane.running and not lane.queue and self.by_key.get(lane.key) is lane:
            del self.by_key[lane.key]
        return moves

    def close(self) -> None:
        """Shutdown: queued messages do not start (their scheduled callers are cancelled)."""
        self.closed = True
        for lane in self.by_key.values():
            for pending in lane.queue:
                if pending.done is not None and not pending.done.done():
                    pending.done.cancel()
            lane.queue.clear()


def join_messages(texts: Sequence[str], limit: int) -> str:
    """Several messages merged into one run's text, every one of them kept.

    When together they exceed ``limit`` characters, the longest are shortened
    (each marked, so the model can say so) and the short ones stay whole:
    a quick follow-up behind a huge paste is never cut away.
    """
    joined = "\n".join(texts)
    if len(joined) <= limit:
        return joined
    marker = "\n[... shortened: this message was {n:,} characters long]"
    budget = limit - (len(texts) - 1) - len(marker) * len(texts) - 8 * len(texts)
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    share: dict[int, int] = {}
    left, remaining = budget, len(texts)
    for i in order:
        fair = max(0, left // remaining)
        share[i] = min(len(texts[i]), fair)
        left -= share[i]
        remaining -= 1
    parts = []
    for i, text in enumerate(texts):
        if share[i] >= len(text):
            parts.append(text)
        else:
            parts.append(text[:share[i]] + marker.format(n=len(text)))
    return "\n".join(parts)
