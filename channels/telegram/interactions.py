"""Presses, edits and reactions on Telegram: updates in as the core's events; presses
answered, the bot's messages edited and its reactions set.

A press is a ``callback_query`` (answered with ``answerCallbackQuery``, which
Telegram takes for about 15 s and once); a person's edit an ``edited_message``
(the same message id); a reaction change a ``message_reaction`` (sent only when
named in ``allowed_updates``, in groups only to admins). The bot's reactions come
from Telegram's fixed emoji list (:data:`REACTION_EMOJI`) and are set with
``setMessageReaction`` at the lowest priority: one that would wait is dropped.
"""

from __future__ import annotations

import logging
from datetime import datetime

from aiogram.exceptions import TelegramBadRequest
from aiogram.methods import AnswerCallbackQuery, SetMessageReaction
from aiogram.types import (
    CallbackQuery,
    InlineKeyboardButton,
    InlineKeyboardMarkup,
    Message,
    MessageReactionUpdated,
    ReactionTypeEmoji,
    ReactionTypeUnion,
)

from bot.contracts.messages import (
    ButtonPress,
    ButtonRows,
    MessageEdit,
    ReactionEvent,
)
from channels.telegram.client import BotApi, describe_error
from channels.telegram.inbound import CHANNEL_NAME, Translator, short

log = logging.getLogger("roost.channels.telegram")

REACTION_EMOJI = frozenset((
    "👍", "👎", "❤", "🔥", "🥰", "👏", "😁", "🤔", "🤯", "😱", "🤬", "😢", "🎉", "🤩", "🤮",
    "💩", "🙏", "👌", "🕊", "🤡", "🥱", "🥴", "😍", "🐳", "❤\u200d🔥", "🌚", "🌭", "💯", "🤣",
    "⚡", "🍌", "🏆", "💔", "🤨", "😐", "🍓", "🍾", "💋", "🖕", "😈", "😴", "😭", "🤓", "👻",
    "👨\u200d💻", "👀", "🎃", "🙈", "😇", "😨", "🤝", "✍", "🤗", "🫡", "🎅", "🎄", "☃", "💅",
    "🤪", "🗿", "🆒", "💘", "🙉", "🦄", "😘", "💊", "🙊", "😎", "👾", "🤷\u200d♂", "🤷",
    "🤷\u200d♀", "😡",
))
"""The emoji a bot may react with (``ReactionTypeEmoji``'s fixed list)."""
ALLOWED_EVENTS = ["message", "edited_message", "callback_query", "message_reaction"]
"""The update kinds Roost asks for (``allowed_updates``); Telegram sends no others."""
QUERY_GONE = "query is too old"
"""Telegram's words for a callback query that can no longer be answered."""


def reaction_emoji(emoji: str) -> str | None:
    """``emoji`` as Telegram's list spells it (without the variation selector U+FE0F
    that keyboards add, "❤️" is "❤"), or ``None`` if it is not on the list."""
    if emoji in REACTION_EMOJI:
        return emoji
    bare = emoji.replace("\ufe0f", "")
    return bare if bare in REACTION_EMOJI else None


def markup_of(rows: ButtonRows) -> InlineKeyboardMarkup:
    """``rows`` as an inline keyboard (none: an empty one, which removes the keyboard)."""
    return InlineKeyboardMarkup(inline_keyboard=[
        [InlineKeyboardButton(text=b.label, callback_data=b.data) for b in row]
        for row in rows if row])


def press_of(query: CallbackQuery) -> ButtonPress | None:
    """The press a ``callback_query`` reports; ``None`` for one without data or message
    (a game button, a press on an inline-mode message)."""
    message = query.message
    if query.data is None or message is None:
        return None
    chat = message.chat
    thread = getattr(message, "message_thread_id", None) \
        if getattr(message, "is_topic_message", None) else None
    return ButtonPress(
        channel=CHANNEL_NAME, chat_id=str(chat.id), message_id=str(message.message_id),
        data=query.data, user_id=str(query.from_user.id),
        user_name=short(query.from_user.full_name), press_id=query.id,
        chat_type="direct" if chat.type == "private" else "group",
        thread_id=None if thread is None else str(thread), raw=query)


def edit_of(translator: Translator, message: Message, event_id: str) -> MessageEdit | None:
    """The edit an ``edited_message`` reports, its message translated as a new one would
    be (same id); ``None`` when such a message would not be for Roost."""
    inbound = translator.translate(message, event_id=event_id)
    if inbound is None:
        return None
    edited = message.edit_date
    when = edited.timestamp() if isinstance(edited, datetime) else \
        float(edited) if edited is not None else message.date.timestamp()
    return MessageEdit(inbound, edited_at=when)


def reactions_of(update: MessageReactionUpdated, event_id: str) -> list[ReactionEvent]:
    """One event per emoji added or removed in a ``message_reaction`` (custom and paid
    reactions are left out); an anonymous (chat) reactor has no user and is left out."""
    person = update.user
    if person is None:
        return []

    def emoji(reactions: list[object]) -> list[str]:
        return [r.emoji for r in reactions if isinstance(r, ReactionTypeEmoji)]

    old, new = emoji(list(update.old_reaction)), emoji(list(update.new_reaction))
    changes = [(e, False) for e in old if e not in new] + [(e, True) for e in new
                                                           if e not in old]
    return [ReactionEvent(channel=CHANNEL_NAME, chat_id=str(update.chat.id),
                          message_id=str(update.message_id), user_id=str(person.id),
                          user_name=short(person.full_name), emoji=e, added=added,
                          event_id=f"{event_id}:{i}")
            for i, (e, added) in enumerate(changes)]


class Interactions:
    """Answers presses and sets the bot's reactions through :class:`BotApi`."""

    def __init__(self, api: BotApi) -> None:
        self.api = api

    async def answer(self, press: ButtonPress, note: str | None, alert: bool) -> None:
        """``answerCallbackQuery`` (once, urgently); one Telegram no longer takes is logged."""
        method = AnswerCallbackQuery(callback_query_id=press.press_id,
                                     text=None if note is None else note[:200],
                                     show_alert=alert or None)
        try:
            await self.api.call(method, marked=False)
        except TelegramBadRequest as exc:
            if QUERY_GONE not in exc.message:
                raise
            log.info("telegram: the press %s was not answered in time (%s)", press.press_id,
                     exc.message)

    async def react(self, chat_id: int | str, message_id: int, emoji: str | None) -> bool:
        """Set (or with ``None`` clear) the bot's reaction, giving way to everything else."""
        reaction: list[ReactionTypeUnion] = []
        if emoji is not None:
            listed = reaction_emoji(emoji)
            if listed is None:
                log.info("telegram: %r is not a reaction Telegram allows; not set", emoji)
                return False
            reaction = [ReactionTypeEmoji(emoji=listed)]
        method = SetMessageReaction(chat_id=chat_id, message_id=message_id, reaction=reaction)
        try:
            done = await self.api.call(method, urgent=False, marked=False)
        except Exception as exc:
            log.info("telegram: reaction on %s in %s not set (%s)", message_id, chat_id,
                     describe_error(exc))
            return False
        if done is None:
            log.debug("telegram: reaction on %s in %s dropped (rate limited)", message_id,
                      chat_id)
            return False
        return True
