"""A run's reply on its way to the chat: streamed, committed, handed to the platform.

While the run works, :class:`RunWatch` turns its events into what the chat sees:
streamed text goes into the reply's draft (:class:`StreamBridge`, holding back a
possible NO_REPLY), a provider held by its circuit breaker is announced once, the
run's own notices are sent; the dispatcher learns when the run showed output (a
follow-up no longer merges into it).

When it ends, the reply is written to the outbox in the run's own commit
(:func:`commit_run`, with the inbox entries it answers), so a process that dies
after the commit sends it after a restart; :func:`deliver_result` hands it to the
platform, and one the platform did not take is sent again later
(:class:`Redeliveries`), replacing its draft, then given up.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

from bot.config.masking import mask_text
from bot.contracts.channel import Channel, ReplyStream, Undeliverable, sending_mark
from bot.contracts.events import RunEvent
from bot.contracts.llm import Sanitizer, run_pipeline
from bot.contracts.messages import InboundMessage, OutboundMessage
from bot.dispatch.lanes import Running
from bot.dispatch.replicas import ReplicaWork
from bot.engine.requests import NO_REPLY, RunCommit, RunResult
from bot.resilience.retry import RetryPolicy
from bot.storage.db import Statements
from bot.storage.inbox import Inbox
from bot.storage.sessions import SessionStore
from bot.tools.outcomes import describe_error

log = logging.getLogger("roost.dispatch.delivery")


# -- while the run works: its draft and notices ---------------------------------------

def draft_id(stream: ReplyStream | None) -> str | None:
    """The platform id of a stream's draft (streams of older channel plugins have none)."""
    value = getattr(stream, "message_id", None)
    return str(value) if value else None


class DeliveryCount(Protocol):
    """Counts each attempt to hand a reply to its channel (the app's metrics)."""

    def delivery(self, channel: str, outcome: str) -> None:
        """One attempt on ``channel``: ``ok``, ``failed`` (kept and retried) or ``given_up``."""
        ...


class Uncounted:
    """A :class:`DeliveryCount` that counts nothing."""

    def delivery(self, channel: str, outcome: str) -> None:
        """Count nothing."""



class DraftWatch:
    """Journals the id of a run's draft once the channel showed one."""

    def __init__(self, inbox: Inbox, entries: tuple[int, ...]) -> None:
        self.inbox = inbox
        self.entries = entries
        self.seen: str | None = None

    def check(self, stream: ReplyStream | None) -> None:
        draft = draft_id(stream)
        if draft and draft != self.seen and self.entries:
            self.seen = draft
            self.inbox.set_draft(self.entries, draft)


class StreamBridge:
    """Forwards streamed text to a channel, holding back a possible NO_REPLY.

    Text the model writes before calling tools becomes its own message, so the
    final answer starts a fresh one instead of being glued onto it.
    """

    def __init__(self, channel: Channel | None, message: InboundMessage,
                 sanitizers: Sequence[Sanitizer]) -> None:
        self.channel = channel
        self.message = message
        self.sanitizers = sanitizers
        self.stream = channel.open_stream(message) if channel is not None else None
        self.text = ""
        self.visible = ""
        self.shown = False

    @property
    def draft_id(self) -> str | None:
        """The platform id of the current draft, if the channel showed one."""
        return draft_id(self.stream)

    async def end_block(self) -> None:
        if self.stream is None or self.channel is None:
            return
        if self.shown:
            block = run_pipeline(self.text, self.sanitizers)
            await self.stream.finish(block if block and block != NO_REPLY else None)
            self.stream = self.channel.open_stream(self.message)
        self.text = ""
        self.visible = ""
        self.shown = False

    async def restart(self) -> None:
        """The model's answer is being generated again: the draft starts over."""
        self.text = ""

    async def add(self, fragment: str) -> None:
        if self.stream is None:
            return
        self.text += fragment
        # Show only what the final reply will show: sanitized, and nothing from
        # a thinking or tool block whose closing tag has not arrived yet.
        visible = run_pipeline(_complete_part(self.text), self.sanitizers)
        if not visible or NO_REPLY.startswith(visible) or visible == self.visible:
            return
        self.shown = True
        self.visible = visible
        await self.stream.push(visible)


_HIDDEN_BLOCK = re.compile(
    r"<(think|thinking|thought|antthinking|tool_call|function_calls?|tool_use|invoke)\b",
    re.IGNORECASE)


def _complete_part(text: str) -> str:
    """``text`` up to any hidden block still open, or a tag still being written."""
    for match in _HIDDEN_BLOCK.finditer(text):
        close = re.compile(rf"</{match.group(1)}\s*>", re.IGNORECASE)
        if not close.search(text, match.end()):
            text = text[:match.start()]
            break
    lt = text.rfind("<")
    if lt != -1 and ">" not in text[lt:]:
        text = text[:lt]
    return text


HELD_NOTICE = ("The AI service is not answering right now. Your message is safe: I will "
               "answer as soon as it is back.")


class RunWatch:
    """The listener of one lane entry's run; ``notify(text)`` sends a notice to its chat.
    The draft's id is journaled on the entry's inbox entries in ``inbox``."""

    def __init__(self, entry: Running, bridge: StreamBridge, inbox: Inbox,
                 notify: Callable[[str], None]) -> None:
        self.entry = entry
        self.bridge = bridge
        self.draft = DraftWatch(inbox, entry.pending.entries)
        self.notify = notify
        self.held = False

    async def __call__(self, event: RunEvent) -> None:
        if event.type == "chunk":
            self.entry.shown()
            await self.bridge.add(event.payload["content"])
            self.draft.check(self.bridge.stream)
        elif event.type == "tool.call":
            self.entry.shown()
            if not event.payload.get("read_only"):
                self.entry.acted()
            await self.bridge.end_block()
        elif event.type == "run.retrying":
            if event.payload.get("attempt") == 0:
                # Held by the provider's circuit breaker: say so once.
                if not self.held:
                    self.held = True
                    self.notify(HELD_NOTICE)
            else:
                await self.bridge.restart()
        elif event.type == "activity":
            if event.payload.get("phase") == "committing":
                self.entry.committing()
            elif event.payload.get("phase") == "approval":
                # Asking a person: a follow-up starts a run of its own.
                self.entry.shown()
            elif event.payload.get("notice"):
                self.notify(event.payload["notice"])


# -- when it ends: the commit, the reply handed over, and again ---------------------

LeaseCheck = Callable[[Any], Awaitable[None]]
"""A check in the commit that this replica still holds the session's lease."""


def inbox_statements(inbox: Inbox, message: InboundMessage, entries: tuple[int, ...],
                     commit: RunCommit, *, draft: str | None,
                     lease_check: LeaseCheck | None) -> Statements:
    """What a run's commit writes besides its history: its entries done, the reply queued.

    ``draft`` is the id of the draft shown while streaming; ``lease_check`` (with
    replicas) runs last, after the inbox rows (see ``Claims.lease_check``). The
    statements return the reply's outbox id.
    """
    out = None if commit.reply is None else OutboundMessage.reply_to_message(
        message, commit.reply, "error" if commit.failed else "reply")
    finish = inbox.finish(entries, out, draft, commit.run_id)
    if lease_check is None:
        return finish

    async def lease_checked(db: Any) -> Any:
        outbox_id = await finish(db)
        await lease_check(db)
        return outbox_id
    return lease_checked


class StreamNote:
    """A streamed reply's :class:`SendingMark`: only the adapter's note is kept (a replica
    taking over sends a streamed reply again, as before)."""

    def __init__(self, inbox: Inbox, outbox_id: int) -> None:
        self.inbox = inbox
        self.outbox_id = outbox_id
        self.noted = False

    async def record(self, on: bool, note: str | None = None) -> None:
        """Keep ``note`` with the reply; take it back when nothing was shown after all."""
        if on and note is not None:
            await self.inbox.note_attempt(self.outbox_id, note)
            self.noted = True
        elif not on and self.noted:
            await self.inbox.note_attempt(self.outbox_id, None)
            self.noted = False


class OutboxMark:
    """A sent reply's :class:`SendingMark`: the outbox records that it may have been
    shown (and the adapter's note), or takes that back."""

    def __init__(self, inbox: Inbox, outbox_id: int) -> None:
        self.inbox = inbox
        self.outbox_id = outbox_id
        self.noted = False

    async def record(self, on: bool, note: str | None = None) -> None:
        """Mark the reply as possibly shown (``on``) or certainly not, with ``note``."""
        await self.inbox.sending(self.outbox_id, on, note, forget=not on and self.noted)
        self.noted = on and (self.noted or note is not None)


async def deliver_result(channel: Channel | None, message: InboundMessage, result: RunResult,
                         stream: ReplyStream | None, *, inbox: Inbox,
                         redeliveries: Redeliveries, counts: DeliveryCount) -> None:
    """Show a committed run's reply: finish its draft or send it, and record the outcome
    (``counts`` sees ``ok``, ``failed`` (kept for redelivery) or ``given_up``)."""
    if channel is None:
        log.error("no channel %r to deliver run %s", message.channel, result.run_id)
        return
    reply = None if result.reply is None else OutboundMessage.reply_to_message(
        message, result.reply, "error" if result.status == "failed" else "reply")
    draft = draft_id(stream)
    try:
        if stream is not None:
            if result.outbox_id is None:
                await stream.finish(result.reply)
            else:
                with sending_mark(StreamNote(inbox, result.outbox_id)):
                    await stream.finish(result.reply)
            platform_id = draft_id(stream)
        elif reply is not None:
            if result.outbox_id is None:
                platform_id = await channel.send(reply)
            else:
                reply = dataclasses.replace(reply, delivery_id=f"roost-{result.outbox_id}")
                platform_id = await send_marked(channel, reply, inbox, result.outbox_id)
        else:
            return
    except Exception as exc:
        if reply is not None:
            counts.delivery(message.channel, "failed" if result.outbox_id is not None
                            and not isinstance(exc, Undeliverable) else "given_up")
        if result.outbox_id is None or reply is None:
            log.warning("delivering run %s to %s:%s failed: %s", result.run_id,
                        message.channel, message.chat_id, exc)
            return
        if isinstance(exc, Undeliverable):
            log.warning("reply of run %s to %s:%s is undeliverable (%s); given up, it "
                        "stays in the outbox as failed", result.run_id, message.channel,
                        message.chat_id, exc)
            inbox.not_delivered(result.outbox_id, final=True, error=mask_text(str(exc)))
            return
        log.warning("delivering run %s to %s:%s failed (%s); it stays in the outbox",
                    result.run_id, message.channel, message.chat_id, exc)
        inbox.not_delivered(result.outbox_id, final=False, error=mask_text(str(exc)))
        redeliveries.schedule(result.outbox_id, reply, draft, 1)
        return
    if reply is not None:  # not a silent or withdrawn reply
        counts.delivery(message.channel, "ok")
    if result.outbox_id is not None:
        inbox.delivered(result.outbox_id, platform_id)


async def commit_run(store: SessionStore, inbox: Inbox, replicas: ReplicaWork | None,
                     message: InboundMessage, entries: tuple[int, ...], result: RunResult,
                     draft: str | None) -> RunResult:
    """Write a run's history, its inbox entries done and its reply queued, in one
    transaction; returns the result with the reply's outbox id.

    A commit that fails makes the run a failed one (its apology is written
    instead); one refused for a lost lease (``replicas``) is not written at all.
    """
    try:
        outbox_id = await _write(store, inbox, replicas, message, entries, result, draft)
        return dataclasses.replace(result, outbox_id=outbox_id)
    except Exception as exc:
        if replicas is not None and result.run_id in replicas.lost_runs:
            return result.as_failed("the session's lease was lost")
        if result.status == "failed":
            log.exception("could not persist failed run %s", result.run_id)
            return result
        log.exception("could not persist run %s", result.run_id)
        failed = result.as_failed(describe_error(exc))
    try:
        outbox_id = await _write(store, inbox, replicas, message, entries, failed, draft)
    except Exception:
        log.exception("could not persist failed run %s", result.run_id)
        return failed
    return dataclasses.replace(failed, outbox_id=outbox_id)


async def _write(store: SessionStore, inbox: Inbox, replicas: ReplicaWork | None,
                 message: InboundMessage, entries: tuple[int, ...], result: RunResult,
                 draft: str | None) -> int | None:
    commit = result.commit
    if commit is None:
        return None
    inbox_writes = None if not entries else inbox_statements(
        inbox, message, entries, commit, draft=draft,
        lease_check=None if replicas is None
        else replicas.lease_check(commit.session.key, result.run_id))
    outbox_id: int | None = await commit.write(store, inbox_writes)
    return outbox_id


REDELIVERY = RetryPolicy.fixed(5.0, 30.0, 120.0, 600.0)
"""A reply the platform did not take is sent again after 5 s, 30 s, 2 min and 10 min
(and after a restart), then given up."""


async def send_marked(channel: Channel, reply: OutboundMessage, inbox: Inbox,
                      outbox_id: int) -> str | None:
    """``channel.send(reply)`` with the outbox's ``sending`` mark set as late as the
    adapter allows: by the adapter right before its platform call (after its rate-limit
    waits) where it can, else here just before the send."""
    if not channel.marks_sending:
        await inbox.sending(outbox_id)
        return await channel.send(reply)

    with sending_mark(OutboxMark(inbox, outbox_id)):
        return await channel.send(reply)


class Redeliveries:
    """Committed replies waiting for another attempt.

    Each attempt carries the reply's stable ``delivery_id`` (``roost-<outbox id>``)
    and ``redelivery=True``, so adapters that can check whether an earlier attempt
    landed do. ``counts`` sees every attempt's outcome.
    """

    def __init__(self, inbox: Inbox, channels: Mapping[str, Channel],
                 counts: DeliveryCount) -> None:
        self.inbox = inbox
        self.channels = channels
        self.counts = counts
        self.tasks: set[asyncio.Task[None]] = set()
        self._waiting: dict[int, asyncio.Task[None]] = {}
        self._sending: set[asyncio.Task[None]] = set()
        self._stopped = False

    def schedule(self, outbox_id: int, reply: OutboundMessage, draft: str | None,
                 attempts: int, delay: float | None = None) -> None:
        """Send the reply again after ``delay`` (the policy's, by default), backing off.

        An attempt of the same reply still waiting is replaced (a retry asked now). Once
        :meth:`stop` was called nothing is scheduled: the reply stays in the outbox."""
        if self._stopped:
            return
        if delay is None:
            delay = REDELIVERY.delay(attempts)
        waiting = self._waiting.pop(outbox_id, None)
        if waiting is not None:
            waiting.cancel()
        task = asyncio.ensure_future(self._again(outbox_id, reply, draft, attempts, delay))
        self._waiting[outbox_id] = task
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        task.add_done_callback(lambda done: self._forget(outbox_id, done))

    def _forget(self, outbox_id: int, task: asyncio.Task[None]) -> None:
        """Drop a finished attempt from the waiting ones (unless a newer one replaced it)."""
        if self._waiting.get(outbox_id) is task:
            del self._waiting[outbox_id]

    def stop(self) -> None:
        """Start no more attempts (a shutdown): those waiting are cancelled, those already
        talking to their platform go on (:meth:`sent`); what is not delivered stays in the
        outbox for the next start."""
        self._stopped = True
        for task in list(self.tasks):
            if task not in self._sending:
                task.cancel()

    async def sent(self) -> None:
        """Return once no attempt is talking to its platform."""
        while self._sending:
            await asyncio.wait(set(self._sending))

    def cancel(self) -> None:
        """Cancel every attempt, even one mid-call: what is not delivered stays in the
        outbox for the next start."""
        for task in list(self.tasks):
            task.cancel()

    async def _again(self, outbox_id: int, reply: OutboundMessage, draft: str | None,
                     attempts: int, delay: float) -> None:
        await asyncio.sleep(delay)
        if not await self.inbox.still_to_send(outbox_id):
            # Delivered, dropped or retried elsewhere (the Control UI) meanwhile.
            log.info("reply %d is no longer this process's to send", outbox_id)
            return
        channel = self.channels.get(reply.channel)
        if channel is None:
            log.error("reply %d: no channel %r; kept in the outbox", outbox_id, reply.channel)
            return
        current = asyncio.current_task()
        assert current is not None
        self._sending.add(current)
        try:
            platform_id = await send_marked(channel, dataclasses.replace(
                reply, replace=draft, delivery_id=f"roost-{outbox_id}", redelivery=True),
                self.inbox, outbox_id)
        except Exception as exc:
            final = attempts >= REDELIVERY.retries or isinstance(exc, Undeliverable)
            self.counts.delivery(reply.channel, "given_up" if final else "failed")
            self.inbox.not_delivered(outbox_id, final=final, error=mask_text(str(exc)))
            if final:
                log.error("reply %d to %s:%s could not be delivered; given up (%s)",
                          outbox_id, reply.channel, reply.chat_id, exc)
            else:
                log.warning("reply %d to %s:%s not delivered (%s); trying again",
                            outbox_id, reply.channel, reply.chat_id, exc)
                self.schedule(outbox_id, reply, draft, attempts + 1)
            return
        finally:
            self._sending.discard(current)
        self.counts.delivery(reply.channel, "ok")
        self.inbox.delivered(outbox_id, platform_id)
