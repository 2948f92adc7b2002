"""Replies into rooms: posts, streamed drafts edited in place, files, reactions, typing.

Every post carries a transaction id the homeserver dedupes on for the bot's device: a
reply's is its ``delivery_id`` and the piece's number (``roost-7#0``), the same in every
attempt and across restarts, so a post repeated after a lost answer or a kill -9 is
shown once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any
from urllib.parse import quote

import aiohttp
import nio

from plugins.matrix.api import MatrixApi, MatrixError, refused
from plugins.matrix.inbound import Recent
from plugins.matrix.render import (
    media_content,
    media_kind,
    pieces,
    related,
    replacement,
    text_content,
)
from roost import MediaError, MediaTooLarge, OpenFile, OutboundFile, OutboundMessage, marked_send
from roost.channels import (
    DeliveryPolicy,
    EditStream,
    InFlight,
    RateLimited,
    Transient,
    short,
)

DRAFT_LIMIT = 16_000
"""Characters a streamed draft shows (the final reply is split to fit events)."""
TYPING_EVERY = 20.0
"""Seconds between two typing notices (each holds for 30 s)."""
GONE = frozenset({"M_NOT_FOUND", "M_FORBIDDEN", "M_BAD_JSON", "M_INVALID_PARAM"})
"""Answers that say a message cannot be edited or redacted (any more)."""
DRAFT_POLICY = DeliveryPolicy(attempts=1)
"""A streaming edit is cosmetic: one try; the next edit or the final reply catches up."""


class Replies:
    """Posts and edits of the bot's messages in rooms (see the module docstring)."""

    def __init__(self, api: MatrixApi, inflight: InFlight, bot_posted: Recent,
                 bot_threads: Recent, *, edit_interval: float) -> None:
        """``bot_posted``/``bot_threads``: where the bot's posts and the threads it speaks
        in are remembered (the translator reads them to tell replies to the bot)."""
        self.api = api
        self.inflight = inflight
        self.bot_posted = bot_posted
        self.bot_threads = bot_threads
        self.edit_interval = edit_interval
        self.my_reactions = Recent()

    # -- posting ------------------------------------------------------------------

    async def post(self, room_id: str, content: dict[str, Any], txn: str | None, *,
                   kind: str = "m.room.message", policy: DeliveryPolicy | None = None,
                   mark: bool = True) -> str:
        """Send one event; its id. ``txn`` (else a fresh one) makes repeats harmless."""
        txn = txn or uuid.uuid4().hex
        client = self.api.client

        async def call() -> Any:
            return await client.room_send(room_id, kind, content, tx_id=txn,
                                          ignore_unverified_devices=True)

        async def attempt() -> Any:
            once = self.api.once
            if not mark:
                return await once("send", call)
            return await marked_send(lambda: once("send", call), refused=refused)

        answer = await self.inflight.tracked(self.api.call(
            "send", attempt, scope=room_id, policy=policy, raw=True))
        event_id = str(answer.event_id)
        self.bot_posted.put(event_id)
        return event_id

    async def send(self, message: OutboundMessage, opened: Sequence[OpenFile]) -> str | None:
        """Deliver one reply: its text in pieces (the first edited into ``replace`` if
        named), then its files; the id of its last text event."""
        room, thread = message.chat_id, message.thread_id
        reply_to = message.reply_to if message.chat_type == "group" or thread else None
        key = message.delivery_id
        last: str | None = None
        kept_draft = False
        texts = pieces(message.text) if message.text.strip() else []
        for number, piece in enumerate(texts):
            content = text_content(piece)
            txn = f"{key}#{number}" if key else None
            if number == 0 and message.replace:
                edited = await self.replace(room, message.replace, content,
                                            f"{txn}e" if txn else None)
                if edited:
                    last, kept_draft = message.replace, True
                    continue
            last = await self.post(room, related(content, reply_to=reply_to,
                                                 thread_id=thread), txn)
        if message.replace and not kept_draft:
            await self.withdraw(room, message.replace)  # not reused: no draft left frozen
        for number, (file, handle) in enumerate(zip(message.files, opened, strict=True)):
            url = await self.upload(file, handle)
            content = media_content(media_kind(file.mime_type), file.name, url,
                                    file.mime_type, handle.size, file.caption)
            await self.post(room, related(content, reply_to=reply_to, thread_id=thread),
                            f"{key}#f{number}" if key else None)
        if thread:
            self.bot_threads.put(thread)
        return last

    async def replace(self, room_id: str, event_id: str, content: dict[str, Any],
                      txn: str | None, *, policy: DeliveryPolicy | None = None) -> bool:
        """Edit the bot's ``event_id`` to ``content``; ``False`` if it cannot be edited."""
        try:
            await self.post(room_id, replacement(event_id, content), txn, policy=policy)
        except MatrixError as exc:
            if exc.errcode not in GONE:
                raise
            return False
        return True

    async def withdraw(self, room_id: str, event_id: str) -> None:
        """Redact one of the bot's messages; one already gone counts as redacted."""
        client = self.api.client
        try:
            await self.inflight.tracked(self.api.call(
                "redact", lambda: client.room_redact(room_id, event_id), scope=room_id))
        except MatrixError as exc:
            if exc.errcode not in GONE:
                raise

    # -- files ----------------------------------------------------------------------

    def check_file(self, file: OutboundFile, size: int) -> None:
        """Refuse a file over the homeserver's upload limit before anything is posted."""
        if size > self.api.upload_limit:
            raise MediaTooLarge(size, self.api.upload_limit)

    async def upload(self, file: OutboundFile, handle: OpenFile) -> str:
        """Upload the open file to the media repository; its ``mxc://`` URI."""
        data = await asyncio.to_thread(handle.read_at, 0, handle.size)
        session = self.api.session
        assert session is not None
        url = (f"{self.api.homeserver}/_matrix/media/v3/upload?filename="
               f"{quote(file.name, safe='')}")
        headers = {"Authorization": f"Bearer {self.api.client.access_token}",
                   "Content-Type": file.mime_type or "application/octet-stream"}

        async def attempt() -> str:
            try:
                async with session.post(url, data=data, headers=headers) as response:
                    body = await response.text()
                    status = response.status
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                raise Transient(f"{type(exc).__name__}: {short(exc, 120)}") from exc
            answer = _json(body)
            if status == 429 or answer.get("errcode") == "M_LIMIT_EXCEEDED":
                wait = answer.get("retry_after_ms")
                raise RateLimited(wait / 1000 if isinstance(wait, int) and wait > 0 else 1.0)
            if status >= 500:
                raise Transient(f"HTTP {status}")
            if status == 413:
                raise MediaTooLarge(handle.size, self.api.upload_limit)
            uri = answer.get("content_uri")
            if status != 200 or not isinstance(uri, str):
                raise MediaError(f"uploading {file.name} to Matrix failed (HTTP {status} "
                                 f"{short(str(answer.get('errcode') or ''), 40)})")
            return uri

        return await self.inflight.tracked(self.api.call(f"upload {file.name}", attempt,
                                                         raw=False))

    # -- streaming ----------------------------------------------------------------------

    def open_stream(self, room_id: str, reply_to: str | None,
                    thread_id: str | None) -> EditStream:
        """A draft posted on the first push and edited (``m.replace``) as the reply grows."""
        async def send(text: str) -> str:
            return await self.post(room_id, related(text_content(text), reply_to=reply_to,
                                                    thread_id=thread_id), None,
                                   policy=DRAFT_POLICY, mark=False)

        async def edit(event_id: str, text: str) -> None:
            await self.post(room_id, replacement(event_id, text_content(text)), None,
                            policy=DRAFT_POLICY, mark=False)

        async def finalize(draft: str | None, text: str | None) -> str | None:
            if text is None or not text.strip():
                if draft is not None:
                    await self.withdraw(room_id, draft)
                return None
            return await self.send(OutboundMessage(
                channel="matrix", chat_id=room_id, text=text,
                chat_type="group" if reply_to else "direct", reply_to=reply_to,
                thread_id=thread_id, replace=draft), ())

        return EditStream(send=send, edit=edit, finalize=finalize, limit=DRAFT_LIMIT,
                          interval=self.edit_interval)

    # -- reactions and typing -------------------------------------------------------------

    async def react(self, room_id: str, event_id: str, emoji: str | None,
                    replacing: str | None = None) -> bool:
        """Put the bot's reaction ``emoji`` on ``event_id`` instead of its earlier one
        (``None``: remove it; ``replacing``: the earlier one's key, looked up among the
        message's reactions when this process did not set it). Dropped while the account
        is rate limited."""
        if self.api.limiter.blocked_for("bot") > 0:
            return False
        try:
            earlier = self.my_reactions.pop(f"{room_id}|{event_id}")
            if earlier is None and replacing:
                earlier = await self.my_reaction(room_id, event_id, replacing)
            if earlier is not None:
                await self.withdraw(room_id, earlier)
            if emoji is not None:
                content = {"m.relates_to": {"rel_type": "m.annotation", "event_id": event_id,
                                            "key": emoji}}
                mine = await self.post(room_id, content, None, kind="m.reaction",
                                       policy=DRAFT_POLICY, mark=False)
                self.my_reactions.put(f"{room_id}|{event_id}", mine)
        except (MatrixError, RateLimited, Transient):
            return False
        return True

    async def my_reaction(self, room_id: str, event_id: str, key: str) -> str | None:
        """The id of the bot's ``key`` reaction on ``event_id`` (read from the server's
        relations of the message, the newest 100), or ``None``."""
        client = self.api.client
        try:
            async for event in client.room_get_event_relations(
                    room_id, event_id, event_type="m.reaction", limit=100):
                source = getattr(event, "source", None)
                if not isinstance(source, dict) or source.get("sender") != self.api.user_id:
                    continue
                relation = (source.get("content") or {}).get("m.relates_to") or {}
                if isinstance(relation, dict) and relation.get("key") == key:
                    return str(source.get("event_id") or "") or None
        except (aiohttp.ClientError, TimeoutError, OSError, nio.LocalProtocolError) as exc:
            raise Transient(f"reading reactions: {short(exc, 120)}") from exc
        return None

    @contextlib.asynccontextmanager
    async def typing(self, room_id: str) -> AsyncIterator[None]:
        """Typing notices in ``room_id`` while the block runs (best effort, never raises)."""
        client = self.api.client

        async def notice(on: bool) -> None:
            with contextlib.suppress(MatrixError, RateLimited, Transient):
                await self.api.once("typing", lambda: client.room_typing(
                    room_id, on, timeout=30_000))

        async def keep() -> None:
            while True:
                await notice(True)
                await asyncio.sleep(TYPING_EVERY)

        task = self.inflight.spawn(keep())
        try:
            yield
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await notice(False)


def _json(body: str) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}
