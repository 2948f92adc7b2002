"""A chat channel that can receive files, for media tests: its ``download`` serves bytes.

Build an app as usual (``roost_app`` or :func:`bot.testing.app.build_app`),
then put a :class:`FileChat` in place of its chat::

    chat = await FileChat.join(await roost_app([{"reply": "a receipt"}]))
    photo = chat.add_file("photo.jpg", jpeg_bytes, "photo")
    await chat.say_with("what is this?", photo)
    await chat.settle()
"""

from __future__ import annotations

from typing import Any

from bot.contracts.media import MediaError, MediaTooLarge
from bot.contracts.messages import Attachment, InboundMessage
from bot.testing.app import ChatChannel

__all__ = ["FileChat"]


class FileChat(ChatChannel):
    """:class:`~bot.testing.app.ChatChannel` plus files: ``download`` serves what
    :meth:`add_file` registered, by the attachment's ``url``, as a platform would."""

    def __init__(self, name: str = "console") -> None:
        super().__init__(name)
        self.files: dict[str, bytes] = {}
        """What :meth:`download` serves, by attachment ``url``."""
        self.downloads: list[str] = []
        """The ``url`` of every download asked for, in order."""
        self.failing: dict[str, Exception] = {}
        """Downloads that raise instead, by ``url``."""

    @classmethod
    async def join(cls, chat: ChatChannel) -> FileChat:
        """A file chat in place of ``chat`` in its app (same name, provider and events)."""
        assert chat.app is not None, "build the chat with roost_app or build_app first"
        files = cls(chat.name)
        files.app, files.provider, files.recorder = chat.app, chat.provider, chat.recorder
        await chat.app.add_channel(files)
        return files

    def add_file(self, name: str, data: bytes, kind: str = "document", *, mime_type: str = "",
                 size: int | None = None, **fields: Any) -> Attachment:
        """An attachment whose bytes :meth:`download` serves.

        ``size`` is what the platform declares (default: the real length); other
        keyword arguments are :class:`~bot.contracts.messages.Attachment` fields.
        """
        url = f"test://file/{len(self.files) + 1}/{name}"
        self.files[url] = data
        return Attachment(kind, name, url, mime_type, len(data) if size is None else size,
                          **fields)

    async def download(self, attachment: Attachment, limit: int) -> bytes:
        """The registered bytes; more than ``limit`` of them raises ``MediaTooLarge``."""
        self.downloads.append(attachment.url)
        failure = self.failing.get(attachment.url)
        if failure is not None:
            raise failure
        data = self.files.get(attachment.url)
        if data is None:
            raise MediaError("the file is no longer on the platform")
        if len(data) > limit:
            raise MediaTooLarge(len(data), limit)
        return data

    async def say_with(self, text: str, *attachments: Attachment, sender: str = "user",
                       group: str | None = None, message_id: str = "",
                       event_id: str = "", mentioned: bool = True) -> InboundMessage:
        """Send ``text`` with ``attachments`` (a direct chat, or the group ``group``;
        ``mentioned=False``: a group message that does not address the bot).

        Returns the message once Roost has accepted it; :meth:`settle` waits for
        the answer.
        """
        handler = self._handler
        if handler is None:
            raise RuntimeError("the chat is not started; use FileChat.join")
        self._ids += 1
        message = InboundMessage(
            channel=self.name, chat_id=group if group is not None else sender,
            chat_type="group" if group is not None else "direct", sender_id=sender,
            text=text, message_id=message_id or str(self._ids), mentioned=mentioned,
            attachments=attachments, event_id=event_id)
        await handler(message)
        return message
