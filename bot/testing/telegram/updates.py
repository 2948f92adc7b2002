"""Updates in the fake: pushed by tests, served by ``getUpdates`` or POSTed to a webhook."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp

from bot.testing.telegram.state import State
from bot.testing.telegram.wire import (
    ALICE,
    UPDATE_KINDS,
    ApiError,
    Pending,
    RawJson,
    Webhook,
    dump_json,
    public,
    unix_now,
    utf16_len,
)

ONLY_WHEN_LISTED = frozenset({"chat_member", "message_reaction", "message_reaction_count"})
"""Kinds Telegram sends only to a bot that named them in ``allowed_updates``."""


def wanted(kind: str, allowed: Any) -> bool:
    """Whether an update of ``kind`` is served under ``allowed_updates`` = ``allowed``."""
    if isinstance(allowed, list) and allowed:
        return kind in allowed
    return kind not in ONLY_WHEN_LISTED


class Updates:
    """Pushing updates (messages of every shape), long polling and webhook delivery."""

    def __init__(self, state: State) -> None:
        self.state = state
        self._updates: list[Pending] = []
        self._redeliver: list[Pending] = []
        self._confirmed = 0  # every update_id below this was confirmed by an offset
        self._update_ids = itertools.count(1)
        self._wake = asyncio.Event()
        self._poll_generation = 0
        self._client: aiohttp.ClientSession | None = None
        self._webhook_task: asyncio.Task[None] | None = None


    # -- pushing updates -----------------------------------------------------

    def push_update(self, update: Mapping[str, Any]) -> dict[str, Any]:
        """Queue an update (an ``update_id`` is assigned if missing); returns it."""
        data = dict(update)
        if not isinstance(data.get("update_id"), int):
            data["update_id"] = next(self._update_ids)
        else:
            self._skip_ids_to(data["update_id"])
        kind = next((k for k in UPDATE_KINDS if k in data), None)
        self._enqueue(Pending(data["update_id"], data, kind))
        return data

    def push_raw(self, payload: Any) -> int:
        """Queue anything as an update, even garbage; returns the id it is ordered by.

        A dict with an integer ``update_id`` keeps it; anything else is ordered
        by a fresh id the client cannot see, so only a later update's offset
        confirms it (as with the real server).
        """
        if isinstance(payload, dict) and isinstance(payload.get("update_id"), int):
            update_id = int(payload["update_id"])
            self._skip_ids_to(update_id)
        else:
            update_id = next(self._update_ids)
        self._enqueue(Pending(update_id, payload, None))
        return update_id

    def _skip_ids_to(self, update_id: int) -> None:
        """Later assigned ids stay above an explicit one, as the server's ids only grow."""
        self._update_ids = itertools.count(max(update_id + 1, next(self._update_ids)))

    def push_json(self, text: str, update_id: int) -> int:
        """Queue an update given as raw JSON text, served exactly as written.

        For updates Python's own ``json`` could not even encode, such as one
        nested a hundred thousand levels deep. ``update_id`` orders it (it
        should match the one in ``text``, as on the real server).
        """
        self._skip_ids_to(update_id)
        self._enqueue(Pending(update_id, RawJson(text), None))
        return update_id

    def redeliver(self, update: Mapping[str, Any]) -> None:
        """Serve an already delivered update again, whatever offset was confirmed.

        That is what the real server does when the bot restarts before its
        offset reached the server, or when a webhook answer was lost.
        """
        self._redeliver.append(Pending(int(update["update_id"]), dict(update), "message"))
        self._notify_updates()

    def private_message(self, text: str | None, *, sender: Mapping[str, Any] = ALICE,
                        entities: Sequence[Mapping[str, Any]] | None = None,
                        **extra: Any) -> dict[str, Any]:
        """Push a message in the sender's private chat with the bot.

        ``text=None`` leaves the text out, for media messages (see
        :meth:`FakeTelegram.photo` and its kin); ``entities`` are then the caption's.
        """
        chat = {"id": sender["id"], "type": "private", "first_name": sender["first_name"]}
        if "username" in sender:
            chat["username"] = sender["username"]
        return self._push_message(chat, sender, text, entities, **extra)

    def group_message(self, text: str | None, *, chat_id: int = -1001234567890,
                      sender: Mapping[str, Any] = ALICE, title: str = "Test group",
                      entities: Sequence[Mapping[str, Any]] | None = None,
                      reply_to: Mapping[str, Any] | None = None, forum: bool = False,
                      thread_id: int | None = None, **extra: Any) -> dict[str, Any]:
        """Push a message in a group (a supergroup when ``chat_id`` starts with -100).

        ``reply_to`` is the replied-to message object; ``thread_id`` puts the
        message in that forum topic (and makes the chat a forum).
        """
        kind = "supergroup" if str(chat_id).startswith("-100") else "group"
        chat: dict[str, Any] = {"id": chat_id, "type": kind, "title": title}
        if forum or thread_id is not None:
            chat["is_forum"] = True
        if thread_id is not None:
            extra["message_thread_id"] = thread_id
            extra["is_topic_message"] = True
            if reply_to is None:
                # In a topic, a message that replies to nothing replies to the
                # topic's creation service message.
                reply_to = {"message_id": thread_id, "date": unix_now(), "chat": chat,
                            "from": ALICE, "message_thread_id": thread_id,
                            "forum_topic_created": {"name": f"Topic {thread_id}",
                                                    "icon_color": 7322096}}
        if reply_to is not None:
            extra["reply_to_message"] = dict(reply_to)
        return self._push_message(chat, sender, text, entities, **extra)

    def mention(self, text: str, **kwargs: Any) -> dict[str, Any]:
        """Push a group message starting with ``@botusername`` (with its entity)."""
        handle = f"@{self.state.username}"
        entity = {"type": "mention", "offset": 0, "length": utf16_len(handle)}
        return self.group_message(f"{handle} {text}", entities=[entity], **kwargs)

    def reply_to_bot(self, text: str, message_id: int | None = None,
                     **kwargs: Any) -> dict[str, Any]:
        """Push a group message replying to one the bot sent (the latest by default)."""
        chat_id = kwargs.get("chat_id", -1001234567890)
        if message_id is None:
            mine = [mid for (cid, mid) in self.state.messages if cid == chat_id]
            if not mine:
                raise AssertionError(f"the bot sent nothing to {chat_id} to reply to")
            message_id = max(mine)
        kept = self.state.messages.get((chat_id, message_id))
        original = public(kept) if kept is not None else {
            "message_id": message_id, "date": unix_now(), "chat": self.state.chat(chat_id),
            "from": self.state.bot_user, "text": "earlier"}
        return self.group_message(text, reply_to=original, **kwargs)

    def topic_message(self, text: str, thread_id: int, *, mention: bool = True,
                      **kwargs: Any) -> dict[str, Any]:
        """Push a message in forum topic ``thread_id``, mentioning the bot by default."""
        if mention:
            handle = f"@{self.state.username}"
            kwargs["entities"] = [{"type": "mention", "offset": 0, "length": len(handle)}]
            text = f"{handle} {text}"
        return self.group_message(text, thread_id=thread_id, **kwargs)

    def command(self, command: str, args: str = "", *, group: bool = False,
                **kwargs: Any) -> dict[str, Any]:
        """Push ``/command[@bot] args`` with its ``bot_command`` entity."""
        head = command if command.startswith("/") else f"/{command}"
        text = f"{head} {args}".strip()
        entities = [{"type": "bot_command", "offset": 0, "length": utf16_len(head)}]
        if group:
            return self.group_message(text, entities=entities, **kwargs)
        return self.private_message(text, entities=entities, **kwargs)

    def _push_message(self, chat: dict[str, Any], sender: Mapping[str, Any],
                      text: str | None, entities: Sequence[Mapping[str, Any]] | None,
                      **extra: Any) -> dict[str, Any]:
        self.state.chats[chat["id"]] = chat
        message: dict[str, Any] = {"message_id": self.state.next_id(chat["id"]), "date": unix_now(),
                                   "chat": chat, "from": dict(sender)}
        # A media message has no text (its words are the caption).
        if text is not None:
            message["text"] = text
        if entities:
            message["entities" if text is not None else "caption_entities"] = \
                [dict(e) for e in entities]
        message.update(extra)
        self.state.foreign.add((chat["id"], message["message_id"]))
        return self.push_update({"message": message})

    def _enqueue(self, pending: Pending) -> None:
        self._updates.append(pending)
        self._notify_updates()

    def _notify_updates(self) -> None:
        self._wake.set()
        self._wake = asyncio.Event()
        if self.state.webhook is not None:
            self._ensure_webhook_worker()

    # -- updates -------------------------------------------------------------------

    async def get_updates(self, p: dict[str, Any]) -> list[Any]:
        if self.state.webhook is not None:
            raise ApiError(409, "Conflict: can't use getUpdates method while webhook is "
                                 "active; use deleteWebhook to delete the webhook first")
        # As the real server reads it: a 32-bit integer (longer numbers wrap), and
        # a negative offset forgets every queued update but the last -offset.
        offset = (int(p.get("offset") or 0) + 2**31) % 2**32 - 2**31
        if offset < 0:
            self._updates = self._updates[offset:]
            self._redeliver.clear()
        limit = max(1, min(100, int(p.get("limit") or 100)))
        timeout = float(p.get("timeout") or 0)
        allowed = p.get("allowed_updates")
        self._poll_generation += 1
        generation = self._poll_generation
        deadline = time.monotonic() + timeout
        while True:
            if offset > 0:
                self._confirm(offset)
            ready = self._ready_updates(limit, allowed)
            if ready or time.monotonic() >= deadline or self.state.closing:
                return ready
            wake = self._wake
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), deadline - time.monotonic())
            if generation != self._poll_generation:
                raise ApiError(409, "Conflict: terminated by other getUpdates request; make "
                                     "sure that only one bot instance is running")

    def _confirm(self, offset: int) -> None:
        self._confirmed = max(self._confirmed, offset)
        self._updates = [u for u in self._updates if u.update_id >= offset]

    def _ready_updates(self, limit: int, allowed: Any) -> list[Any]:
        out: list[Any] = []
        if self._redeliver:
            batch, self._redeliver = self._redeliver[:limit], self._redeliver[limit:]
            out.extend(u.payload for u in batch)
        for pending in self._updates:
            if len(out) >= limit:
                break
            if pending.kind is not None and not wanted(pending.kind, allowed):
                continue
            out.append(pending.payload)
        return out

    # -- webhook ---------------------------------------------------------------------

    def set_webhook(self, p: dict[str, Any]) -> bool:
        url = str(p.get("url") or "")
        if not url:
            self.state.webhook = None
            return True
        if p.get("drop_pending_updates"):
            self._updates.clear()
        secret = p.get("secret_token")
        if secret is not None and not re.fullmatch(r"[A-Za-z0-9_-]{1,256}", str(secret)):
            raise ApiError(400, "Bad Request: secret token contains unallowed characters")
        allowed = p.get("allowed_updates")
        self.state.webhook = Webhook(url, None if secret is None else str(secret),
                                allowed if isinstance(allowed, list) else None)
        self._ensure_webhook_worker()
        return True

    def _ensure_webhook_worker(self) -> None:
        if self._webhook_task is None or self._webhook_task.done():
            self._webhook_task = asyncio.create_task(self._deliver_webhooks())

    async def _deliver_webhooks(self) -> None:
        """POST pending updates to the webhook one at a time, as the server does."""
        if self._client is None:
            self._client = aiohttp.ClientSession()
        while self.state.webhook is not None:
            hook = self.state.webhook
            pending = self._redeliver + self._updates
            if not pending:
                wake = self._wake
                await wake.wait()
                continue
            item = pending[0]
            headers = {"Content-Type": "application/json"}
            if hook.secret is not None:
                headers["X-Telegram-Bot-Api-Secret-Token"] = hook.secret
            status = 0
            try:
                async with self._client.post(hook.url, data=dump_json(item.payload),
                                             headers=headers) as resp:
                    status = resp.status
            except (aiohttp.ClientError, OSError):
                status = 0
            hook.attempts.append((item.update_id, status))
            async with self.state.call_cond:  # wake wait_until() on delivery attempts too
                self.state.call_cond.notify_all()
            if 200 <= status < 300 or len([a for a in hook.attempts
                                           if a[0] == item.update_id]) \
                    >= self.state.webhook_max_attempts:
                if item in self._redeliver:
                    self._redeliver.remove(item)
                elif item in self._updates:
                    self._updates.remove(item)
            else:
                await asyncio.sleep(0.05)

    @property
    def queued(self) -> int:
        """Updates queued and not yet confirmed (redeliveries not counted)."""
        return len(self._updates)

    def drop_pending(self) -> None:
        """Forget the queued updates (``drop_pending_updates``)."""
        self._updates.clear()

    async def close(self) -> None:
        """Wake a long poll, stop webhook delivery and close its HTTP client."""
        self._wake.set()
        if self._webhook_task is not None:
            self._webhook_task.cancel()
            await asyncio.gather(self._webhook_task, return_exceptions=True)
        if self._client is not None:
            await self._client.close()

    @property
    def pending_updates(self) -> int:
        """Updates queued and not yet confirmed by an offset (or webhook answer)."""
        return len(self._updates) + len(self._redeliver)

    @property
    def webhook_attempts(self) -> list[tuple[int, int]]:
        """``(update_id, HTTP status)`` of each webhook delivery (0: no connection)."""
        return list(self.state.webhook.attempts) if self.state.webhook else []
