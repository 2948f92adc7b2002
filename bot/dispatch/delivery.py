"""The end of a run: its one commit, then the reply handed to the platform.

A reply is written to the outbox in the run's own commit (with the inbox entries
it answers), so a process that dies after the commit sends it after a restart;
one the platform did not take stays in the outbox for :mod:`.redelivery`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from bot.config.masking import mask_text
from bot.contracts.channel import Channel, ReplyStream, SendingMark, sending_mark
from bot.contracts.messages import InboundMessage, OutboundMessage
from bot.dispatch.redelivery import Redeliveries, send_marked
from bot.dispatch.replicas import ReplicaWork
from bot.dispatch.stream import draft_id
from bot.engine.requests import RunCommit, RunResult
from bot.storage.db import Statements
from bot.storage.inbox import Inbox
from bot.storage.sessions import SessionStore
from bot.tools.outcomes import describe_error

log = logging.getLogger("roost.dispatch.delivery")

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


def _noting(inbox: Inbox, outbox_id: int) -> SendingMark:
    """A streamed reply's mark: only the adapter's note is kept (a replica taking over
    sends a streamed reply again, as before)."""
    noted = False

    async def mark(on: bool, note: str | None = None) -> None:
        nonlocal noted
        if on and note is not None:
            await inbox.note_attempt(outbox_id, note)
            noted = True
        elif not on and noted:
            await inbox.note_attempt(outbox_id, None)
            noted = False
    return mark


async def deliver_result(channel: Channel | None, message: InboundMessage, result: RunResult,
                         stream: ReplyStream | None, *, inbox: Inbox,
                         redeliveries: Redeliveries,
                         count: Callable[[str, str], None]) -> None:
    """Show a committed run's reply: finish its draft or send it, and record the outcome.

    ``count(channel, outcome)`` sees ``ok``, ``failed`` (kept for redelivery) or
    ``given_up``.
    """
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
                with sending_mark(_noting(inbox, result.outbox_id)):
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
            count(message.channel, "failed" if result.outbox_id is not None else "given_up")
        if result.outbox_id is None or reply is None:
            log.warning("delivering run %s to %s:%s failed: %s", result.run_id,
                        message.channel, message.chat_id, exc)
            return
        log.warning("delivering run %s to %s:%s failed (%s); it stays in the outbox",
                    result.run_id, message.channel, message.chat_id, exc)
        inbox.not_delivered(result.outbox_id, final=False, error=mask_text(str(exc)))
        redeliveries.schedule(result.outbox_id, reply, draft, 1)
        return
    if reply is not None:  # not a silent or withdrawn reply
        count(message.channel, "ok")
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
