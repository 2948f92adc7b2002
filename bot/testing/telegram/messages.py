"""Messages the bot sends, edits and deletes in the fake, checked as Telegram checks them."""

from __future__ import annotations

import json
from typing import Any

from bot.testing.telegram.html import HtmlError, parse_html
from bot.testing.telegram.interactions import check_markup, keyboard
from bot.testing.telegram.state import State
from bot.testing.telegram.wire import (
    COMMAND_NAME,
    MAX_TEXT,
    ApiError,
    public,
    require,
    scope_key,
    unix_now,
    utf16_len,
)

NOT_MODIFIED = ("Bad Request: message is not modified: specified new message content and "
                "reply markup are exactly the same as a current content and reply markup of "
                "the message")
"""Telegram's answer to an edit that would change nothing."""
MAX_CAPTION = 1024
"""Telegram's limit on a caption, in UTF-16 code units after entity parsing."""


class Messages:
    """``sendMessage``, ``editMessageText``, ``editMessageCaption``, ``deleteMessage`` and
    ``setMyCommands``."""

    def __init__(self, state: State) -> None:
        self.state = state

    def _text(self, p: dict[str, Any]) -> str:
        text = self.visible_text(p.get("text"), p.get("parse_mode"))
        if not text.strip():
            raise ApiError(400, "Bad Request: message text is empty")
        if utf16_len(text) > MAX_TEXT:
            raise ApiError(400, "Bad Request: message is too long")
        return text

    @staticmethod
    def visible_text(value: Any, parse_mode: Any) -> str:
        """What a text or caption shows, parsed in its ``parse_mode`` as Telegram does."""
        text = value if isinstance(value, str) else "" if value is None else json.dumps(value)
        mode = str(parse_mode or "")
        if mode.lower() == "html":
            try:
                text = parse_html(text)
            except HtmlError as exc:
                raise ApiError(400, f"Bad Request: can't parse entities: {exc}") from None
        # MarkdownV2 is not modelled: such text is taken as written.
        return text

    def send_message(self, p: dict[str, Any]) -> dict[str, Any]:
        require(p, "chat_id", "text")
        text = self._text(p)
        check_markup(p.get("reply_markup"))
        content: dict[str, Any] = {"text": text}
        if keyboard(p.get("reply_markup")) is not None:
            content["reply_markup"] = keyboard(p.get("reply_markup"))
        return self.post(p, content, source=p.get("text"))

    def post(self, p: dict[str, Any], content: dict[str, Any], *,
              source: Any = None) -> dict[str, Any]:
        """A new message from the bot in ``p["chat_id"]`` with ``content`` (text, or
        media and caption), in the topic and replying as ``p`` asks; kept as shown."""
        chat_id = p["chat_id"]
        chat = self.state.chat(chat_id)
        thread = p.get("message_thread_id")
        if thread is not None and not chat.get("is_forum") and chat.get("type") == "private":
            raise ApiError(400, "Bad Request: message thread not found")
        message: dict[str, Any] = {"message_id": self.state.next_id(chat_id), "date": unix_now(),
                                   "chat": chat, "from": self.state.bot_user, **content}
        if thread is not None:
            message["message_thread_id"] = thread
            message["is_topic_message"] = True
        reply = p.get("reply_parameters")
        reply_id = reply.get("message_id") if isinstance(reply, dict) else \
            p.get("reply_to_message_id")
        if reply_id is not None:
            message["reply_to_message"] = {"message_id": reply_id, "date": unix_now(),
                                           "chat": chat}
        self.state.messages[(chat_id, message["message_id"])] = {
            **message, "_source": source, "_parse_mode": p.get("parse_mode")}
        return message

    def _editable(self, p: dict[str, Any]) -> tuple[tuple[int | str, int], dict[str, Any]]:
        """The bot's message ``p`` names, with Telegram's answers when there is none: a
        message someone else posted "can't be edited"; an id that holds nothing (never
        used yet, or deleted) is "not found"."""
        key = (p["chat_id"], int(p["message_id"]))
        if key in self.state.foreign:
            raise ApiError(400, "Bad Request: message can't be edited")
        message = self.state.messages.get(key)
        if message is None:
            raise ApiError(400, "Bad Request: message to edit not found")
        return key, message

    def edit_message(self, p: dict[str, Any]) -> dict[str, Any]:
        require(p, "chat_id", "message_id", "text")
        key, message = self._editable(p)
        if "text" not in message:
            raise ApiError(400, "Bad Request: there is no text in the message to edit")
        text = self._text(p)
        check_markup(p.get("reply_markup"))
        markup = keyboard(p.get("reply_markup"))
        # Telegram compares the resulting text and entities, and the keyboard; the
        # source text and parse mode stand in for the entities here.
        if p.get("text") == message.get("_source") \
                and p.get("parse_mode") == message.get("_parse_mode") \
                and markup == message.get("reply_markup"):
            raise ApiError(400, NOT_MODIFIED)
        message = {k: v for k, v in message.items() if k != "reply_markup"}
        if markup is not None:
            message["reply_markup"] = markup
        message = {**message, "text": text, "edit_date": unix_now(), "_source": p.get("text"),
                   "_parse_mode": p.get("parse_mode")}
        self.state.messages[key] = message
        return public(message)

    def edit_caption(self, p: dict[str, Any]) -> dict[str, Any]:
        """``editMessageCaption``: a photo's or document's caption (none: removed)."""
        require(p, "chat_id", "message_id")
        key, message = self._editable(p)
        if "text" in message:
            raise ApiError(400, "Bad Request: there is no caption in the message to edit")
        source = p.get("caption") or None
        caption = None if source is None else self.visible_text(source, p.get("parse_mode"))
        if utf16_len(caption or "") > MAX_CAPTION:
            raise ApiError(400, "Bad Request: message caption is too long")
        if source == (message.get("_source") or None) and (
                source is None or p.get("parse_mode") == message.get("_parse_mode")):
            raise ApiError(400, NOT_MODIFIED)
        message = {k: v for k, v in message.items() if k != "caption"}
        if caption is not None:
            message["caption"] = caption
        message = {**message, "edit_date": unix_now(), "_source": source,
                   "_parse_mode": p.get("parse_mode")}
        self.state.messages[key] = message
        return public(message)

    def delete_message(self, p: dict[str, Any]) -> bool:
        require(p, "chat_id", "message_id")
        key = (p["chat_id"], int(p["message_id"]))
        if self.state.messages.pop(key, None) is None:
            raise ApiError(400, "Bad Request: message to delete not found")
        self.state.deleted.append(key)
        return True

    def set_commands(self, p: dict[str, Any]) -> bool:
        commands = p.get("commands")
        if not isinstance(commands, list) or len(commands) > 100:
            raise ApiError(400, "Bad Request: commands must be a list of at most 100")
        for command in commands:
            name = command.get("command", "") if isinstance(command, dict) else ""
            desc = command.get("description", "") if isinstance(command, dict) else ""
            if not COMMAND_NAME.match(str(name)):
                raise ApiError(400, "Bad Request: BOT_COMMAND_INVALID")
            if not 1 <= len(str(desc)) <= 256:
                raise ApiError(400, "Bad Request: BOT_COMMAND_DESCRIPTION_INVALID")
        self.state.commands[scope_key(p.get("scope"))] = commands
        return True
