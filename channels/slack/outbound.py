"""Replies out: posting exactly once, streaming drafts, deleting.

:class:`Replies` posts, edits and deletes messages through :class:`SlackApi`;
each post carries a nonce in its metadata so a retry never posts it twice.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from slack_sdk.errors import SlackApiError

from bot.contracts.channel import ReplyStream
from bot.contracts.messages import ButtonRows, InboundMessage, OutboundMessage
from channels.delivery import DeliveryPolicy, EditStream, RateLimited, Transient, deliver
from channels.inflight import InFlight
from channels.slack.api import SlackApi
from channels.slack.changes import blocks_of
from channels.slack.common import (
    EDIT_POLICY,
    LOOKUP_LIMIT,
    LOOKUP_MARGIN,
    MESSAGE_LIMIT,
    METADATA_EVENT,
    REDELIVERY_LOOKBACK,
    REMEMBERED,
    SWEEP_MARGIN,
    RecentKeys,
    error_code,
    log,
    logged,
    problem_text,
    ts_order,
)
from channels.slack.errors import delivery_error
from channels.slack_format import split_for_slack, to_mrkdwn


class Replies:
    """Posts each message of a reply exactly once, streams drafts, edits and deletes."""

    def __init__(self, api: SlackApi, inflight: InFlight,
                 bot_threads: RecentKeys[tuple[str, str]], *, policy: DeliveryPolicy,
                 edit_interval: float) -> None:
        """``bot_threads`` gets each thread a post goes into (a reply there addresses
        the bot); ``edit_interval`` spaces streaming edits."""
        self.api = api
        self.inflight = inflight
        self.bot_threads = bot_threads
        self.policy = policy
        self.edit_interval = edit_interval
        self._dropped: RecentKeys[tuple[str, str]] = RecentKeys(REMEMBERED)
        """Drafts the reply was posted in place of (and deleted)."""

    def open_stream(self, message: InboundMessage) -> ReplyStream:
        """An edited draft in the place of the reply to ``message``."""
        target = OutboundMessage.reply_to_message(message, "")
        channel, thread_ts = target.chat_id, target.thread_id or target.reply_to

        shown = [""]  # the draft's text as Slack has it, to skip a no-op final edit
        editing: list[asyncio.Task[None]] = []
        doubtful = [False]  # a draft edit failed: it may still land after the final one

        async def send(draft: str) -> str:
            text = to_mrkdwn(draft)
            try:
                ts = await self._post(channel, text, thread_ts)
            except Exception:
                # No draft then ("" is no message): the final reply is posted fresh.
                log.warning("Slack: could not post a streaming draft", exc_info=True)
                return ""
            shown[0] = text
            return ts

        async def update(ts: str, text: str) -> None:
            try:
                await self.api.call("chat.update", self.api.web.chat_update, EDIT_POLICY,
                                 channel=channel, ts=ts, text=text)
            except Exception:
                doubtful[0] = True
                raise
            shown[0] = text

        async def edit(ts: str, draft: str) -> None:
            if ts:
                # Shielded: the stream cancels a pending edit when the reply is
                # final, but a request already sent would still be applied,
                # possibly after the final edit. finalize() waits for it.
                editing[:] = [asyncio.ensure_future(update(ts, to_mrkdwn(draft)))]
                await asyncio.shield(editing[0])

        async def finalize(ts: str | None, final: str | None) -> str | None:
            await asyncio.gather(*editing, return_exceptions=True)
            pieces = split_for_slack(final, MESSAGE_LIMIT) if final and final.strip() else []
            last = await self.deliver_reply(channel, thread_ts, pieces, draft=ts or None,
                                             shown=shown[0])
            if doubtful[0] and ts and pieces and self._kept(channel, ts):
                # A draft edit that timed out may still be applied by Slack
                # after the final text: put the final text back once it would have.
                self.inflight.spawn(self._reassert(channel, ts, pieces[0]))
            # The draft may have been replaced by a new message: the stream
            # names the message that now carries the reply.
            return last

        return EditStream(send=send, edit=edit, finalize=finalize, limit=MESSAGE_LIMIT,
                          interval=self.edit_interval)

    async def deliver_reply(self, channel: str, thread_ts: str | None, pieces: list[str],
                             *, draft: str | None, shown: str | None = None,
                             delivery_id: str | None = None,
                             look_first: bool = True,
                             buttons: ButtonRows = ()) -> str | None:
        """Put ``pieces`` in place of ``draft`` (or post them); the last message's ts.

        No pieces means a silent reply: the draft is deleted. The draft is
        edited into the first piece (skipped when it already shows it); if that
        edit fails for good (the draft is gone, too old, or Slack keeps failing
        the edit), the piece is posted anew and the draft deleted, so no draft
        is left frozen. Raises when the reply could not be delivered.

        With a ``delivery_id`` (the core's key of the reply, the same across
        attempts and restarts) each piece's nonce derives from it, and the
        conversation is read once for pieces already posted, which are not
        posted again: the core sends a key again only when an earlier attempt
        failed, here or in a process that stopped before recording it, and
        that attempt may have posted some or all of the pieces. ``look_first``
        False (a first delivery: nothing can have been posted yet) skips that read.
        ``buttons`` go under the last piece (Block Kit ``actions`` blocks).
        """
        nonces: list[str | None] = [None] * len(pieces)
        posted: dict[str, str] = {}
        if delivery_id and pieces:
            nonces = [delivery_id if i == 0 else f"{delivery_id}#{i}"
                      for i in range(len(pieces))]
            if look_first:
                posted = await self._posted_before(channel, thread_ts, delivery_id)
        if not pieces:
            if draft:
                await self.delete(channel, draft)
            return None
        first: str | None = None
        last_blocks = blocks_of(pieces[-1], buttons) if buttons else None
        lone = last_blocks if len(pieces) == 1 else None
        if draft:
            if pieces[0] == shown and lone is None:
                first = draft
            else:
                try:
                    await self.api.call("chat.update", self.api.web.chat_update, self.policy,
                                     channel=channel, ts=draft, text=pieces[0],
                                     **({} if lone is None else {"blocks": lone}))
                    first = draft
                except Exception as exc:
                    log.warning("Slack: could not edit draft %s into the reply (%s); "
                                "posting it anew", draft, exc)
        if first is None:
            first = posted.get(nonces[0] or "") or await self._post(
                channel, pieces[0], thread_ts, nonces[0], lone)
            if draft:
                await self._drop_draft(channel, draft)
        last = first
        for index, (piece, nonce) in enumerate(zip(pieces[1:], nonces[1:], strict=True)):
            under = last_blocks if index == len(pieces) - 2 else None
            last = posted.get(nonce or "") or await self._post(channel, piece, thread_ts, nonce,
                                                               under)
        return last

    def _kept(self, channel: str, ts: str) -> bool:
        return (channel, ts) not in self._dropped

    async def _reassert(self, channel: str, ts: str, text: str) -> None:
        await asyncio.sleep(self.api.timeout + SWEEP_MARGIN)
        with logged("restoring a reply after a late draft edit"):
            await self.api.call("chat.update", self.api.web.chat_update, self.policy,
                             channel=channel, ts=ts, text=text)

    async def _drop_draft(self, channel: str, ts: str) -> None:
        """Delete a draft the reply was posted in place of.

        The reply is out, so a failure here must not fail the send (the core
        would post the reply again); it is logged instead.
        """
        self._dropped.add((channel, ts))
        try:
            await self.delete(channel, ts)
        except Exception:
            log.exception("Slack: could not delete the replaced draft %s in %s", ts, channel)

    async def delete(self, channel: str, ts: str) -> None:
        """Delete one of the bot's messages; one already gone counts as deleted."""
        try:
            await self.api.call("chat.delete", self.api.web.chat_delete, self.policy,
                             channel=channel, ts=ts)
        except SlackApiError as exc:
            if error_code(exc) != "message_not_found":
                raise

    async def _post(self, channel: str, text: str, thread_ts: str | None,
                    nonce: str | None = None, blocks: list[dict[str, Any]] | None = None) -> str:
        """Post one message exactly once; its ts.

        ``chat.postMessage`` has no idempotency key, and a call that failed
        with a reset, a timeout or a 5xx may still have posted. So each post
        carries a nonce in its message metadata (``nonce``, else a random
        one), and before posting again after such a failure the conversation
        is searched for it. A call that timed out may also land *after* the
        retry posted: once the call timeout has passed, a sweep deletes any
        other message with the nonce.
        """
        nonce = nonce or uuid.uuid4().hex
        metadata = {"event_type": METADATA_EVENT, "event_payload": {"nonce": nonce}}
        # Slack's clock, not ours, stamps the message: leave a generous margin.
        since = f"{time.time() - LOOKUP_MARGIN:.6f}"
        unsure = False
        found_again = False

        async def attempt() -> str:
            nonlocal unsure, found_again
            if unsure:
                found = await self._find_posts(channel, thread_ts, nonce, since)
                if found:
                    log.info("Slack: a post that failed had gone out (ts %s); not posting "
                             "again", found[0])
                    found_again = True
                    return found[0]
            try:
                response = await self.api.web.chat_postMessage(
                    channel=channel, text=text, thread_ts=thread_ts, metadata=metadata,
                    blocks=blocks)
            except Exception as exc:
                mapped = delivery_error(exc)
                unsure = unsure or isinstance(mapped, Transient)
                if mapped is exc:
                    raise
                raise mapped from exc
            return str(response.get("ts") or "")

        ts = await self.inflight.tracked(deliver(attempt, what="Slack chat.postMessage",
                                         policy=self.policy))
        if thread_ts:
            self.bot_threads.add((channel, thread_ts))
        if unsure and not found_again:
            self.inflight.spawn(self._sweep(channel, thread_ts, nonce, since, keep=ts))
        return ts

    async def _posted_before(self, channel: str, thread_ts: str | None,
                             delivery_id: str) -> dict[str, str]:
        """The pieces of reply ``delivery_id`` already posted: ts by nonce.

        One read of the last day, no retries: when it fails (Slack limits
        history reads hard for some apps, or a scope is missing) the reply
        is posted, risking a duplicate rather than holding up the reply.
        """
        since = f"{time.time() - REDELIVERY_LOOKBACK:.6f}"
        try:
            found = await self.inflight.tracked(self._read_nonces(channel, thread_ts, since))
        except Exception as exc:
            log.info("Slack: could not check whether reply %s was posted already (%s); "
                     "posting it", delivery_id, problem_text(exc))
            return {}
        mine = {nonce: stamps[0] for nonce, stamps in found.items()
                if nonce == delivery_id or nonce.startswith(delivery_id + "#")}
        if mine:
            log.info("Slack: %d piece(s) of reply %s were posted already; not posting "
                     "them again", len(mine), delivery_id)
            if thread_ts:
                self.bot_threads.add((channel, thread_ts))
        return mine

    async def _sweep(self, channel: str, thread_ts: str | None, nonce: str, since: str,
                     keep: str) -> None:
        """Delete copies of a post that landed late (a timed-out try Slack still ran)."""
        await asyncio.sleep(self.api.timeout + SWEEP_MARGIN)
        with logged("removing a duplicate post"):
            for ts in await self._find_posts(channel, thread_ts, nonce, since):
                if ts != keep:
                    log.warning("Slack: a timed-out post landed late (ts %s); deleted", ts)
                    await self.delete(channel, ts)

    async def _find_posts(self, channel: str, thread_ts: str | None, nonce: str,
                          since: str) -> list[str]:
        """The ts of the bot's messages carrying ``nonce``, oldest first.

        Without history access (a missing scope) nothing can be checked, and
        none is reported: posting again risks a duplicate, not posting a loss.
        """
        try:
            found = await self._read_nonces(channel, thread_ts, since)
        except (Transient, RateLimited):
            raise
        except Exception as exc:
            log.warning("Slack: could not check whether a failed post went out (%s); "
                        "posting again", exc)
            return []
        return found.get(nonce, [])

    async def _read_nonces(self, channel: str, thread_ts: str | None,
                           since: str) -> dict[str, list[str]]:
        """The ts of the bot's recent messages by their nonce, oldest first.

        Raises Slack's errors mapped by :func:`delivery_error`.
        """
        api = self.api.web
        try:
            if thread_ts:
                response = await api.conversations_replies(
                    channel=channel, ts=thread_ts, oldest=since, include_all_metadata=True,
                    limit=LOOKUP_LIMIT)
            else:
                response = await api.conversations_history(
                    channel=channel, oldest=since, include_all_metadata=True,
                    limit=LOOKUP_LIMIT)
        except Exception as exc:
            mapped = delivery_error(exc)
            if mapped is exc:
                raise
            raise mapped from exc
        found: dict[str, list[str]] = {}
        for item in response.get("messages") or []:
            meta = item.get("metadata") if isinstance(item, dict) else None
            payload = meta.get("event_payload") if isinstance(meta, dict) else None
            if (isinstance(meta, dict) and meta.get("event_type") == METADATA_EVENT
                    and isinstance(payload, dict) and isinstance(payload.get("nonce"), str)
                    and item.get("ts")):
                found.setdefault(payload["nonce"], []).append(str(item["ts"]))
        for stamps in found.values():
            stamps.sort(key=ts_order)
        return found
