"""Sends whose outcome is unknown, found out before anything is sent again.

The Bot API has no idempotency key: a ``sendMessage`` (``sendPhoto``,
``sendDocument``) cut off by a reset after Telegram took it, a timeout or a 5xx
may or may not have posted the message. Resending blindly posts it twice.

Message ids are sequential in each chat (every member's messages take the
next), so a message the call posted has an id above the highest one known in
the chat before the call (its *floor*). Such a candidate id is probed with an
edit to the very text (or caption) and parse mode the call sent: "message is not
modified" proves the message is ours and shows exactly that; "can't be edited"
is someone else's message; "not found" an id not used yet (or deleted). Probing
goes up from the floor, skips ids known to be another message, gives up after
two unused ids in a row or :data:`PROBE_WINDOW` ids, and only then is the
message sent again.

The probe must not change a message: the only messages of ours above a floor are
the ones whose outcome is being found out, because message-creating calls to one
chat go one at a time (a lock per chat) and each is resolved before the next
starts. A chat where a probe itself could not finish is left unresolved: later
unknown outcomes there are resent without probing (a duplicate is possible,
never a changed message). Across a restart the floor comes from the core: the
adapter notes it with its first platform call of a reply (:func:`marked_send`'s
``note``), the outbox keeps it, and a redelivery carries it back as
``OutboundMessage.attempt_note``; each piece of the reply is then looked for
from there before it is sent. A reply found not to have arrived at all takes its
note back. What a killed process posted above a note without learning its id, or
after the reply's first piece, the next process does not know: a probe can then
edit such a message of Roost's into the reply (logged as a warning).
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from aiogram.exceptions import TelegramBadRequest
from aiogram.methods import (
    EditMessageCaption,
    EditMessageText,
    SendDocument,
    SendMessage,
    SendPhoto,
)
from aiogram.types import Chat, Message

from bot.contracts.channel import found_nothing_shown, found_shown
from channels.delivery import DeliveryPolicy, RateLimited, Transient, deliver
from channels.telegram.client import BotApi, ChatIds, Chats, certainly_refused

log = logging.getLogger("roost.channels.telegram")

PROBE_WINDOW = 20
"""Candidate ids probed after one unknown outcome, at most."""
UNUSED_IN_A_ROW = 2
"""Unused ids in a row after which the message is taken as not posted."""

Creating = SendMessage | SendPhoto | SendDocument
"""The calls that post a new message."""


@dataclass(slots=True)
class _Reply:
    """A reply being sent: a redelivery's floor (each piece is looked for above it before
    it is posted), and whether some call's outcome could not be found out."""

    floor: int | None
    unsure: bool = False
    held: ChatIds | None = None
    """The chat whose message-creating lock the reply holds until it is sent."""


_REPLY: contextvars.ContextVar[_Reply | None] = contextvars.ContextVar(
    "roost_telegram_reply", default=None)


class _Unresolved(Exception):
    """A probe could not finish (its own calls kept failing)."""


class Outcomes:
    """Message-creating calls made one at a time per chat, unknown outcomes probed."""

    def __init__(self, api: BotApi, chats: Chats, *, policy: DeliveryPolicy) -> None:
        self.api = api
        self.chats = chats
        self.policy = policy

    async def post(self, method: Creating, what: str, *,
                   request_timeout: int | None = None) -> Message:
        """Post a message urgently (retried per the channel's policy)."""
        sent = await self.create(method, what, policy=self.policy,
                                 request_timeout=request_timeout)
        assert sent is not None  # urgent calls never give way
        return sent

    async def create(self, method: Creating, what: str, *, policy: DeliveryPolicy,
                      request_timeout: int | None = None, urgent: bool = True
                      ) -> Message | None:
        """Post a message (``urgent``: retried per ``policy``), finding out after each
        unknown outcome whether it was posted before trying again.

        A redelivered reply (:func:`as_reply`) first looks for the piece above its
        floor. Not ``urgent``: tried once, ``None`` when it gave way or failed (a
        failure with an unknown outcome is probed first).
        """
        ids = self.chats.ids(method.chat_id)
        reply = _REPLY.get()
        if reply is not None and reply.held is ids:
            return await self._create_held(ids, method, what, policy=policy,
                                           request_timeout=request_timeout, urgent=urgent)
        if not urgent and ids.lock.locked():
            return None  # a draft gives way to a message being posted
        await ids.lock.acquire()
        if reply is not None and urgent and reply.held is None:
            # Held until the reply is sent: no other message lands between its pieces.
            reply.held = ids
            return await self._create_held(ids, method, what, policy=policy,
                                           request_timeout=request_timeout, urgent=urgent)
        try:
            return await self._create_held(ids, method, what, policy=policy,
                                           request_timeout=request_timeout, urgent=urgent)
        finally:
            ids.lock.release()

    async def _create_held(self, ids: ChatIds, method: Creating, what: str, *,
                           policy: DeliveryPolicy, request_timeout: int | None,
                           urgent: bool) -> Message | None:
        """:meth:`create` holding the chat's lock."""
        floor = ids.top
        resume = _REPLY.get()
        if resume is not None and resume.floor is not None:
            found = await self._look_for(method, resume.floor)
            if found is not None:
                resume.floor = found
                return self._found(method, found)
            resume.floor = None  # this piece and the rest were never posted
        unknown = False

        async def attempt() -> Message | None:
            nonlocal unknown
            if unknown:
                unknown = False
                found = await self._look_for(method, floor)
                if found is not None:
                    return self._found(method, found)
            try:
                sent = await self.api.call(method, urgent=urgent,
                                       request_timeout=request_timeout)
            except Exception as exc:
                unknown = not certainly_refused(exc)
                raise
            if sent is not None:
                self.chats.saw(sent.chat.id, sent.message_id)
            return sent

        if urgent:
            try:
                return await deliver(attempt, what=f"telegram {what}", policy=policy)
            except (Transient, RateLimited):
                if unknown:
                    # The last attempt's outcome too is found out before giving up.
                    found = await self._look_for(method, floor)
                    if found is not None:
                        return self._found(method, found)
                raise
        try:
            return await attempt()
        except Exception as exc:
            if not unknown:
                raise
            found = await self._look_for(method, floor)
            if found is None:
                raise exc from None
            return self._found(method, found)

    async def _look_for(self, method: Creating, floor: int | None) -> int | None:
        """The id of the message ``method`` posted above ``floor``, ``None`` if it was
        not posted (or cannot be looked for: no floor, or the chat is unresolved)."""
        ids = self.chats.ids(method.chat_id)
        if floor is None or ids.unresolved:
            _unsure()
            log.info("telegram: whether a %s to %s was posted cannot be found out (%s); "
                     "sending it again", method.__api_method__, method.chat_id,
                     "nothing known of the chat" if floor is None else "chat unresolved")
            return None
        unused = 0
        for candidate in range(floor + 1, floor + 1 + PROBE_WINDOW):
            if candidate in ids.known:
                unused = 0
                continue
            try:
                verdict = await self._probe(method, candidate)
            except _Unresolved:
                ids.unresolved = True
                _unsure()
                log.warning("telegram: could not find out whether a %s to %s was posted; "
                            "sending it again", method.__api_method__, method.chat_id)
                return None
            if verdict == "ours":
                log.info("telegram: a %s to %s whose answer was lost had been posted (%d); "
                         "not sent again", method.__api_method__, method.chat_id, candidate)
                return candidate
            if verdict == "unused":
                unused += 1
                if unused >= UNUSED_IN_A_ROW:
                    break
            else:
                unused = 0
        log.info("telegram: a %s to %s whose answer was lost had not been posted; sending "
                 "it again", method.__api_method__, method.chat_id)
        return None

    async def _probe(self, method: Creating, message_id: int) -> str:
        """``"ours"``, ``"other"`` or ``"unused"``: what id ``message_id`` holds, by an edit
        to what ``method`` posted (a no-op on a message showing exactly that)."""
        edit: EditMessageText | EditMessageCaption
        if isinstance(method, SendMessage):
            edit = EditMessageText(chat_id=method.chat_id, message_id=message_id,
                                   text=method.text, parse_mode=method.parse_mode)
        else:
            edit = EditMessageCaption(chat_id=method.chat_id, message_id=message_id,
                                      caption=method.caption, parse_mode=method.parse_mode)

        async def call() -> object:
            return await self.api.call(edit, marked=False)

        try:
            await deliver(call, what=f"telegram {edit.__api_method__} (probe)",
                          policy=self.policy)
        except TelegramBadRequest as exc:
            text = exc.message.lower()
            if "message is not modified" in text:
                return "ours"
            if "not found" in text or "message_id_invalid" in text:
                return "unused"
            return "other"  # can't be edited (someone else's), no text / caption, ...
        except Exception as exc:
            raise _Unresolved(type(exc).__name__) from exc
        # The edit took effect: a message of ours the chat's known ids did not hold
        # (left by a process that died mid-call) now shows this text.
        log.warning("telegram: probing %d in %s changed a message of Roost's not known to "
                    "this process", message_id, method.chat_id)
        return "ours"

    def _found(self, method: Creating, message_id: int) -> Message:
        """The message a probe found, as the send would have returned it (id and chat)."""
        chat = self.chats.current(method.chat_id)
        self.chats.saw(chat, message_id)
        found_shown()
        return Message(message_id=message_id, date=datetime.datetime.now(datetime.UTC),
                       chat=Chat(id=chat if isinstance(chat, int) else 0,
                                 type="private" if isinstance(chat, int) and chat > 0
                                 else "supergroup"))


def _unsure() -> None:
    reply = _REPLY.get()
    if reply is not None:
        reply.unsure = True


@contextlib.asynccontextmanager
async def as_reply(floor: int | None) -> AsyncIterator[None]:
    """The block is one reply: with a redelivery's ``floor``, each message it posts is
    looked for above it first. If the block fails and every call of it was refused or
    found not to have arrived, the core's mark and note are taken back."""
    reply = _Reply(floor)
    token = _REPLY.set(reply)
    try:
        yield
    except Exception:
        if not reply.unsure:
            await found_nothing_shown()
        raise
    finally:
        _REPLY.reset(token)
        if reply.held is not None:
            reply.held.lock.release()
