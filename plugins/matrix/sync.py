"""The update source: ``/sync`` long polls, the position kept in the channel's notes.

**Acknowledged means recorded.** The ``next_batch`` token of an answer is put in the
channel's notes (Roost's database) only after every event of the answer was handed to
the core's handler and it returned, so a restart syncs from the last answer fully
recorded: nothing is lost, and what is repeated the inbox drops (the event id is its
key). If the handler raises, the same answer is asked for again after a pause.

A room with more new events than one answer carries (``timeline_limit``) is read back
through ``/messages`` to the last recorded position first, so a long downtime loses
nothing either (up to 2,000 events per room).

**The first start** records the position and handles invites but answers no history.
**A restart** asks for the rooms' full state once (``full_state``), so who is in each
room (a DM is a room of two) is known again.

**Replicas.** With several replicas on one database only the leader syncs; the others
send.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import nio

from plugins.matrix.api import MatrixApi, MatrixError
from plugins.matrix.inbound import Room, Translator
from roost import ChannelHealth, InboundHandler, Settings
from roost.channels import (
    READY,
    ChannelState,
    DeliveryPolicy,
    Leadership,
    RateLimited,
    Transient,
    short,
)

log = logging.getLogger("roost.channels.matrix")

STANDBY = ChannelHealth(True, "standby: another replica syncs")
"""A follower's health: it sends; the leader receives."""
MISSED_PAGES = 20
"""Pages of 100 events read back into a room whose sync answer was cut short."""
NEXT_BATCH = "next_batch"
"""The channel note holding the position of the last answer fully recorded."""
TOLD_ENCRYPTED = "told_encrypted:"
"""Prefix of the notes saying a room was told the bot cannot read its encrypted messages."""
ENCRYPTED_NOTICE = ("I can't read end-to-end encrypted messages in this room (this Roost "
                    "runs without Matrix encryption support). Please write to me in an "
                    "unencrypted room.")
UNDECRYPTABLE_NOTICE = ("I couldn't decrypt a message in this room: its keys were not shared "
                        "with my device. Please send it again.")


class SyncSource:
    """Long-polls ``/sync`` and hands each room's events to the handler, in order."""

    def __init__(self, api: MatrixApi, translator: Translator, settings: Settings, *,
                 timeout: float, timeline_limit: int, auto_join: bool,
                 policy: DeliveryPolicy,
                 tell: Callable[[str, str], Awaitable[object]]) -> None:
        self.api = api
        self.translator = translator
        self.settings = settings
        self.timeout = timeout
        self.timeline_limit = timeline_limit
        self.auto_join = auto_join
        self.policy = policy
        self.tell = tell
        """``tell(room_id, text)`` posts a notice (the encrypted-room one)."""
        self.handler: InboundHandler | None = None
        self.notes: ChannelState | None = None
        self.leadership: Leadership | None = None
        self.task: asyncio.Task[None] | None = None
        self.open = False
        self.synced = False
        self.problem = ""
        self.batches = 0
        """Answers fully handled (for tests and logs)."""
        self.progress = asyncio.Condition()

    def start(self, handler: InboundHandler, notes: ChannelState,
              leadership: Leadership | None) -> None:
        """Begin syncing in a task of its own."""
        self.handler, self.notes, self.leadership = handler, notes, leadership
        self.open = True
        self.task = asyncio.create_task(self.run(), name="matrix-sync")

    def health(self) -> ChannelHealth:
        """Ready once a sync answered; not from a failed one until the next success."""
        if not self.open:
            return ChannelHealth(False, "stopped")
        if self.leadership is not None and not self.leadership.is_leader:
            return STANDBY
        if self.problem:
            return ChannelHealth(False, self.problem)
        return READY if self.synced else ChannelHealth(False, "connecting")

    async def close(self) -> None:
        """Stop syncing; an answer being handled is not acknowledged."""
        self.open = False
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)

    async def run(self) -> None:
        while self.open:
            if self.leadership is not None and not self.leadership.is_leader:
                log.info("Matrix: another replica syncs")
                await self.leadership.wait_leading()
                continue
            lost = asyncio.ensure_future(self.leadership.wait_lost()) \
                if self.leadership is not None else None
            syncing = asyncio.ensure_future(self.sync_forever())
            waiting = {syncing} if lost is None else {syncing, lost}
            try:
                await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in waiting:
                    task.cancel()
                await asyncio.gather(*waiting, return_exceptions=True)
            if syncing.done() and not syncing.cancelled():
                failed = syncing.exception()
                if failed is not None:
                    raise failed

    async def sync_forever(self) -> None:
        """Sync until cancelled: each answer handled, then its position recorded."""
        assert self.notes is not None
        if self.leadership is not None:
            log.info("Matrix: this replica leads: syncing")
        token = await self.notes.get(NEXT_BATCH)
        first = token is None
        full_state = True
        while self.open:
            try:
                # A long poll, outside the limiter: sends must not queue behind it.
                answer = await self.api.once("sync", functools.partial(
                    self.api.client.sync, timeout=int(self.timeout * 1000), since=token,
                    full_state=full_state, sync_filter=self.filter()))
            except (Transient, RateLimited, MatrixError) as exc:
                self.problem = f"sync failing ({short(exc, 80)})"
                log.warning("Matrix: %s", self.problem)
                await asyncio.sleep(self.policy.delay(1) if not isinstance(exc, RateLimited)
                                    else self.policy.honour(exc.retry_after))
                continue
            self.problem, self.synced = "", True
            try:
                await self.handle(answer, history=not first, since=token)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("Matrix: events not recorded (%s); syncing them again",
                            short(exc, 120))
                await asyncio.sleep(self.policy.delay(1))
                continue
            token, first, full_state = str(answer.next_batch), False, False
            await self.notes.put(NEXT_BATCH, token)
            await self.api.upkeep()
            async with self.progress:
                self.batches += 1
                self.progress.notify_all()

    def filter(self) -> dict[str, Any]:
        return {"room": {"timeline": {"limit": self.timeline_limit},
                         "state": {"lazy_load_members": False}},
                "presence": {"types": []}, "account_data": {"types": []}}

    async def handle(self, answer: Any, *, history: bool, since: str | None) -> None:
        """Hand every room's timeline to the handler (``history``: else only note the
        position), then answer the invites. A timeline cut short (more new events than
        one answer carries) is completed from ``/messages`` back to ``since`` first."""
        assert self.handler is not None
        for room_id, info in answer.rooms.join.items():
            if not history:
                continue
            room = self.room(room_id)
            events = [getattr(event, "source", None) for event in info.timeline.events]
            if info.timeline.limited and since and info.timeline.prev_batch \
                    and not self.joined_now(events):
                events = await self.missed(room_id, info.timeline.prev_batch, since) + events
            for source in events:
                if not isinstance(source, dict):
                    continue
                if source.get("type") == "m.room.encrypted" \
                        and source.get("sender") != self.api.user_id:
                    await self.encrypted(room_id)
                    continue
                inbound = await self.translator.translate(source, room)
                if inbound is not None:
                    await self.handler(inbound)
        for room_id, invite in answer.rooms.invite.items():
            await self.invited(room_id, invite)

    def joined_now(self, events: list[Any]) -> bool:
        """Whether the bot's own join is among ``events`` (a room new to it: what came
        before is history, not missed)."""
        return any(isinstance(e, dict) and e.get("type") == "m.room.member"
                   and e.get("state_key") == self.api.user_id
                   and isinstance(e.get("content"), dict)
                   and e["content"].get("membership") == "join" for e in events)

    async def missed(self, room_id: str, start: str, since: str) -> list[Any]:
        """The events of ``room_id`` between ``since`` and ``start`` (a sync's
        ``prev_batch``), oldest first; at most :data:`MISSED_PAGES` pages of them."""
        client, found = self.api.client, []
        for _ in range(MISSED_PAGES):
            page = await self.api.call("messages", functools.partial(
                client.room_messages, room_id, start=start, end=since,
                direction=nio.MessageDirection.back, limit=100), scope=room_id)
            found += [getattr(event, "source", None) for event in page.chunk]
            if not page.chunk or not page.end or page.end == start:
                return found[::-1]
            start = page.end
        log.warning("Matrix: more than %d events missed in %s; the older ones are skipped",
                    MISSED_PAGES * 100, room_id)
        return found[::-1]

    def room(self, room_id: str) -> Room:
        known = self.api.client.rooms.get(room_id)

        def name_of(user_id: str) -> str:
            if known is None:
                return ""
            return str(known.user_name(user_id) or "")

        direct = known is not None and known.member_count <= 2
        return Room(room_id, direct, name_of)

    async def encrypted(self, room_id: str) -> None:
        """Say once per room (durably) that an encrypted message could not be read (no
        encryption support, or no keys for it)."""
        assert self.notes is not None
        key = TOLD_ENCRYPTED + room_id
        if await self.notes.get(key):
            return
        await self.tell(room_id, UNDECRYPTABLE_NOTICE if self.api.encrypting
                        else ENCRYPTED_NOTICE)
        await self.notes.put(key, "1")

    async def invited(self, room_id: str, invite: Any) -> None:
        """Join when the policy for that kind of room lets the inviter in, else decline."""
        inviter, direct = "", False
        for event in invite.invite_state:
            # matrix-nio keeps a stripped member event's fields as attributes only.
            content = getattr(event, "content", None)
            if getattr(event, "state_key", None) == self.api.user_id \
                    and getattr(event, "membership", None) == "invite" \
                    and isinstance(content, dict):
                inviter = str(getattr(event, "sender", "") or "")
                direct = content.get("is_direct") is True
        if not self.auto_join or not inviter:
            return
        if self.welcome(inviter, room_id, direct):
            log.info("Matrix: joining %s (invited by %s)", room_id, inviter)
            await self.api.call("join", lambda: self.api.client.join(room_id))
        else:
            log.info("Matrix: declining %s from %s (policy)", room_id, inviter)
            await self.api.call("leave", lambda: self.api.client.room_leave(room_id))

    def welcome(self, inviter: str, room_id: str, direct: bool) -> bool:
        """Whether the DM or group policy lets ``inviter`` bring the bot into ``room_id``."""
        s = self.settings
        if s.is_admin("matrix", inviter):
            return True
        if direct:
            policy = s.dm_policy_for("matrix")
            if policy == "disabled":
                return False
            return policy != "allowlist" or f"matrix:{inviter}" in s.dm_allowlist
        return s.group_policy_for("matrix", room_id) != "off"

    async def wait_batches(self, count: int) -> None:
        """Return once ``count`` answers were handled in all (tests wait on it)."""
        async with self.progress:
            await self.progress.wait_for(lambda: self.batches >= count)
