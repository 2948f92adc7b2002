"""Buttons, presses, people's edits and reactions in the fake, as the Bot API has them.

Inline keyboards on the bot's messages are checked as Telegram checks them
(``callback_data`` 1–64 bytes, else ``BUTTON_DATA_INVALID``); a press is a
``callback_query`` update that must be answered once with
``answerCallbackQuery`` within :attr:`Interactions.answer_within` seconds, else
"query is too old"; ``setMessageReaction`` takes one emoji of Telegram's fixed
list (``REACTION_INVALID`` otherwise); ``message_reaction`` updates are served
only to a bot that named them in ``allowed_updates``.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bot.testing.telegram.state import State
from bot.testing.telegram.updates import Updates
from bot.testing.telegram.wire import ALICE, ApiError, public, require, unix_now

QUERY_TOO_OLD = ("Bad Request: query is too old and response timeout expired or query ID "
                 "is invalid")
"""Telegram's answer to a late, repeated or unknown ``answerCallbackQuery``."""
MAX_CALLBACK_DATA = 64
REACTION_EMOJI = frozenset((
    "👍", "👎", "❤", "🔥", "🥰", "👏", "😁", "🤔", "🤯", "😱", "🤬", "😢", "🎉", "🤩", "🤮",
    "💩", "🙏", "👌", "🕊", "🤡", "🥱", "🥴", "😍", "🐳", "❤\u200d🔥", "🌚", "🌭", "💯", "🤣",
    "⚡", "🍌", "🏆", "💔", "🤨", "😐", "🍓", "🍾", "💋", "🖕", "😈", "😴", "😭", "🤓", "👻",
    "👨\u200d💻", "👀", "🎃", "🙈", "😇", "😨", "🤝", "✍", "🤗", "🫡", "🎅", "🎄", "☃", "💅",
    "🤪", "🗿", "🆒", "💘", "🙉", "🦄", "😘", "💊", "🙊", "😎", "👾", "🤷\u200d♂", "🤷",
    "🤷\u200d♀", "😡",
))
"""The emoji ``ReactionTypeEmoji`` may carry (the Bot API's fixed list)."""


def check_markup(markup: Any) -> None:
    """Refuse ``reply_markup`` as Telegram does: an inline keyboard of rows of buttons,
    each with a text and ``callback_data`` of 1–64 bytes (or a url)."""
    if markup is None:
        return
    rows = markup.get("inline_keyboard") if isinstance(markup, dict) else None
    if not isinstance(rows, list) or not all(isinstance(r, list) for r in rows):
        raise ApiError(400, "Bad Request: can't parse reply keyboard markup JSON object")
    for row in rows:
        for button in row:
            if not isinstance(button, dict) or not str(button.get("text") or "").strip():
                raise ApiError(400, "Bad Request: can't parse inline keyboard button: Text "
                                    "buttons are unallowed in the inline keyboard")
            if "url" in button:
                continue
            data = button.get("callback_data")
            if not isinstance(data, str) or \
                    not 1 <= len(data.encode("utf-8")) <= MAX_CALLBACK_DATA:
                raise ApiError(400, "Bad Request: BUTTON_DATA_INVALID")


def keyboard(markup: Any) -> Any:
    """What a message keeps of ``reply_markup``: an inline keyboard with buttons, else
    nothing (an empty keyboard removes it)."""
    if isinstance(markup, dict) and markup.get("inline_keyboard"):
        return markup
    return None


@dataclass(slots=True)
class Query:
    """A callback query the fake sent: when, and whether it was answered."""

    query_id: str
    sent: float
    answered: bool = False
    text: str | None = None
    show_alert: bool = False


class Interactions:
    """Pressing buttons, people editing messages and reacting; the bot answering presses
    and setting its own reactions."""

    def __init__(self, state: State, updates: Updates) -> None:
        self.state = state
        self.updates = updates
        self.queries: dict[str, Query] = {}
        """Every callback query sent, by id (answered or not)."""
        self.reactions: dict[tuple[int | str, int], list[str]] = {}
        """The bot's own reaction on each message, as set by ``setMessageReaction``."""
        self.answer_within = 15.0
        """Seconds a callback query can be answered in (lower it to test a late answer)."""
        self._query_ids = itertools.count(4_000_000_000_000_000_001)

    # -- pushed by tests ---------------------------------------------------------

    def press(self, message_id: int, data: str, *, chat_id: int | str | None = None,
              sender: Mapping[str, Any] = ALICE) -> dict[str, Any]:
        """Push a ``callback_query``: ``sender`` pressed the button with ``data`` under
        the bot's message ``message_id`` (in ``chat_id``, else the sender's private chat)."""
        chat = sender["id"] if chat_id is None else chat_id
        kept = self.state.messages.get((chat, message_id))
        if kept is None:
            raise AssertionError(f"the bot has no message {message_id} in {chat}")
        query_id = str(next(self._query_ids))
        self.queries[query_id] = Query(query_id, time.monotonic())
        return self.updates.push_update({"callback_query": {
            "id": query_id, "from": dict(sender), "message": public(kept),
            "chat_instance": f"-{abs(hash(chat)) % 10**18}", "data": data}})

    def edit_by_user(self, update: Mapping[str, Any], text: str, *,
                     entities: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """Push an ``edited_message``: the message of a pushed ``update`` with new text
        (and its ``entities``: none unless given, as Telegram parses the new text)."""
        original = {k: v for k, v in update["message"].items() if k != "entities"}
        edited = {**original, "text": text, "edit_date": unix_now()}
        if entities:
            edited["entities"] = entities
        return self.updates.push_update({"edited_message": edited})

    def user_reaction(self, chat_id: int | str, message_id: int, emoji: str | None, *,
                      old: str | None = None,
                      sender: Mapping[str, Any] = ALICE) -> dict[str, Any]:
        """Push a ``message_reaction``: ``sender`` changed their reaction on a message
        from ``old`` to ``emoji`` (``None``: none)."""
        def listed(value: str | None) -> list[dict[str, str]]:
            return [] if value is None else [{"type": "emoji", "emoji": value}]

        return self.updates.push_update({"message_reaction": {
            "chat": self.state.chat(chat_id), "message_id": message_id,
            "user": dict(sender), "date": unix_now(),
            "old_reaction": listed(old), "new_reaction": listed(emoji)}})

    # -- called by the bot -------------------------------------------------------------

    def answer_callback_query(self, p: dict[str, Any]) -> bool:
        require(p, "callback_query_id")
        query = self.queries.get(str(p["callback_query_id"]))
        if query is None or query.answered or \
                time.monotonic() - query.sent > self.answer_within:
            raise ApiError(400, QUERY_TOO_OLD)
        text = p.get("text")
        if text is not None and len(str(text)) > 200:
            raise ApiError(400, "Bad Request: MESSAGE_TOO_LONG")
        query.answered = True
        query.text = None if text is None else str(text)
        query.show_alert = bool(p.get("show_alert"))
        return True

    def set_message_reaction(self, p: dict[str, Any]) -> bool:
        require(p, "chat_id", "message_id")
        key = (p["chat_id"], int(p["message_id"]))
        if key not in self.state.messages and key not in self.state.foreign:
            raise ApiError(400, "Bad Request: message to react not found")
        reaction = p.get("reaction") or []
        if not isinstance(reaction, list):
            raise ApiError(400, "Bad Request: can't parse reaction types JSON object")
        if len(reaction) > 1:
            raise ApiError(400, "Bad Request: REACTIONS_TOO_MANY")
        emoji = []
        for item in reaction:
            if not isinstance(item, dict) or item.get("type") != "emoji" \
                    or item.get("emoji") not in REACTION_EMOJI:
                raise ApiError(400, "Bad Request: REACTION_INVALID")
            emoji.append(str(item["emoji"]))
        if emoji:
            self.reactions[key] = emoji
        else:
            self.reactions.pop(key, None)
        return True
