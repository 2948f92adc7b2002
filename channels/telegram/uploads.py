"""Files Roost sends: a picture Telegram can show as a photo goes by ``sendPhoto``,
anything else by ``sendDocument`` under its own name.

A reply with text and files sends the text first (as any reply: rendered,
cut, the first piece threaded), then each file with its own caption. One
exception keeps a short reply in one message: text that fits a caption (1,024
characters), with a single file that has no caption of its own and no draft
to replace, becomes that file's caption. Every file is checked before anything
is sent, so a file over Telegram's 50 MB raises :class:`MediaTooLarge` and
nothing of the reply is posted.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiogram.exceptions import TelegramBadRequest, TelegramEntityTooLarge
from aiogram.methods import SendDocument, SendPhoto
from aiogram.types import BufferedInputFile, InputFile, Message, ReplyParameters

from bot.contracts.files import OpenFile
from bot.contracts.media import MediaError, MediaTooLarge
from bot.contracts.messages import OutboundFile, OutboundMessage
from bot.media.images import inspect_image
from channels.telegram.client import describe_error, entity_error
from channels.telegram.interactions import markup_of
from channels.telegram.media import MB
from channels.telegram.outcomes import Outcomes
from channels.telegram.sender import Sender, Target, split_for_telegram, to_html

if TYPE_CHECKING:
    from aiogram import Bot

log = logging.getLogger("roost.channels.telegram")

UPLOAD_LIMIT = 50 * MB
"""The largest file the Bot API takes from a bot (its answer beyond: 413)."""
PHOTO_LIMIT = 10 * MB
"""The largest picture ``sendPhoto`` takes."""
PHOTO_TYPES = frozenset({"image/jpeg", "image/png", "image/webp"})
"""Formats sent as photos; a GIF would lose its animation, so it goes as a document."""
PHOTO_SIDES = 10_000
"""A photo's width and height together may not exceed this."""
PHOTO_RATIO = 20
"""Nor may its longer side be more than this many times the shorter."""
MAX_CAPTION = 1024
"""Telegram's limit on a caption, in UTF-16 code units after entity parsing."""
UPLOAD_RATE = 512 * 1024
"""Bytes per second an upload is allowed at least, on top of the request timeout."""


@dataclass(frozen=True, slots=True)
class _Upload:
    """A file checked and ready to go: as a photo (bytes read) or a document (streamed
    from the file opened once, ``opened``, which the sender closes)."""

    name: str
    size: int
    photo: BufferedInputFile | None
    document: InputFile
    opened: OpenFile


class _OpenedInputFile(InputFile):
    """An upload streamed from a file opened once; each try reads it again from byte 0."""

    def __init__(self, opened: OpenFile, filename: str) -> None:
        super().__init__(filename=filename)
        self.opened = opened

    async def read(self, bot: Bot) -> AsyncGenerator[bytes, None]:
        async for chunk in self.opened.chunks(self.chunk_size):
            yield chunk


def prepare(file: OutboundFile) -> _Upload:
    """Check ``file`` and choose how it goes (blocking: reads it; run in a thread).

    The file is opened once (:meth:`OutboundFile.opened`) and read only through
    that descriptor; close :attr:`_Upload.opened` after sending. Raises
    :class:`MediaTooLarge` over 50 MB, :class:`MediaError` when the file cannot
    be read.
    """
    name = file.name or os.path.basename(file.path)
    try:
        opened = file.opened()
    except OSError as exc:
        raise MediaError(f"{name} cannot be read ({type(exc).__name__})") from None
    try:
        size = opened.size
        if size > UPLOAD_LIMIT:
            raise MediaTooLarge(size, UPLOAD_LIMIT, f"{name} is {size / MB:.1f} MB; Telegram "
                                                    "takes files up to 50 MB from bots")
        document: InputFile = _OpenedInputFile(opened, name)
        if size > PHOTO_LIMIT:
            return _Upload(name, size, None, document, opened)
        data = opened.read_all()
    except OSError as exc:
        opened.close()
        raise MediaError(f"{name} cannot be read ({type(exc).__name__})") from None
    except BaseException:
        opened.close()
        raise
    photo = BufferedInputFile(data, filename=name) if _photo_like(data) else None
    return _Upload(name, len(data), photo, BufferedInputFile(data, filename=name), opened)


def _photo_like(data: bytes) -> bool:
    """Whether Telegram takes ``data`` as a photo: format, size and shape."""
    try:
        info = inspect_image(data)
    except MediaError:
        return False
    small, large = sorted((info.width, info.height))
    return info.mime_type in PHOTO_TYPES and len(data) <= PHOTO_LIMIT \
        and info.width + info.height <= PHOTO_SIDES and large <= small * PHOTO_RATIO


def _photo_refused(exc: TelegramBadRequest) -> bool:
    """A 400 that says the picture cannot be a photo (it can still be a document)."""
    text = exc.message.upper()
    return any(word in text for word in ("PHOTO_", "IMAGE_PROCESS_FAILED", "WRONG FILE",
                                         "FILE IS TOO BIG"))


class Uploader:
    """Replies that carry files: each checked before anything is sent, then the text and
    the files posted."""

    def __init__(self, sender: Sender, outcomes: Outcomes, *, request_timeout: float) -> None:
        self.sender = sender
        self.outcomes = outcomes
        self.request_timeout = request_timeout

    async def deliver_with_files(self, target: Target, message: OutboundMessage) -> str | None:
        """Text first, then the files (or the text as the caption of a single file).

        Returns the id of the last message sent.
        """
        uploads: list[_Upload] = []
        try:
            for file in message.files:
                uploads.append(await asyncio.to_thread(prepare, file))
            return await self._deliver_uploads(target, message, uploads)
        finally:
            for upload in uploads:
                upload.opened.close()

    async def _deliver_uploads(self, target: Target, message: OutboundMessage,
                               uploads: list[_Upload]) -> str | None:
        captions = [f.caption for f in message.files]
        text: str | None = message.text if message.text.strip() else None
        if text is not None and len(uploads) == 1 and not captions[0].strip() \
                and message.replace is None and not message.buttons \
                and len(split_for_telegram(text, MAX_CAPTION)) == 1:
            captions[0], text = text, None
        last: str | None = None
        if text is not None or message.replace is not None:
            # The buttons stay under the text, which stays a message of its own.
            last = await self.sender.deliver_reply(
                target, message.replace, text,
                markup_of(message.buttons) if message.buttons and text is not None else None)
        for upload, caption in zip(uploads, captions, strict=True):
            last = await self._send_file(target if last is None else target.unthreaded(),
                                         upload, caption)
        return last

    async def _send_file(self, target: Target, upload: _Upload, caption: str) -> str:
        """One file with its caption; a caption too long for one goes after it as text."""
        fitting = split_for_telegram(caption, MAX_CAPTION) if caption.strip() else []
        head = fitting[0] if len(fitting) == 1 else None
        sent = await self._post_file(target, upload, head)
        last = str(sent.message_id)
        if len(fitting) > 1:
            for piece in split_for_telegram(caption):
                text_sent = await self.sender.send_piece(target.unthreaded(), piece)
                assert text_sent is not None
                last = str(text_sent.message_id)
        return last

    async def _post_file(self, target: Target, upload: _Upload, caption: str | None) -> Message:
        """``sendPhoto`` or ``sendDocument``; HTML captions fall back to plain text, a
        picture Telegram refuses as a photo goes as a document."""
        reply = ReplyParameters(message_id=target.reply_to, allow_sending_without_reply=True) \
            if target.reply_to is not None else None
        timeout = int(self.request_timeout + upload.size / UPLOAD_RATE)
        variants = [(to_html(caption), "HTML"), (caption, None)] if caption else [(None, None)]
        as_photo = upload.photo is not None
        while True:
            for text, mode in variants:
                method: SendPhoto | SendDocument
                if as_photo and upload.photo is not None:
                    method = SendPhoto(chat_id=target.chat_id, photo=upload.photo, caption=text,
                                       parse_mode=mode, message_thread_id=target.thread_id,
                                       reply_parameters=reply)
                else:
                    method = SendDocument(chat_id=target.chat_id, document=upload.document,
                                          caption=text, parse_mode=mode,
                                          message_thread_id=target.thread_id,
                                          reply_parameters=reply)
                try:
                    return await self.outcomes.post(method, method.__api_method__,
                                                  request_timeout=timeout)
                except TelegramEntityTooLarge:
                    raise MediaTooLarge(upload.size, UPLOAD_LIMIT,
                                        f"Telegram refused {upload.name} as too large "
                                        f"({upload.size / MB:.1f} MB)") from None
                except TelegramBadRequest as exc:
                    if mode is not None and entity_error(exc):
                        log.warning("telegram: HTML caption refused (%s); sending it as plain "
                                    "text", exc.message)
                        continue
                    if as_photo and _photo_refused(exc):
                        log.info("telegram: %s refused as a photo (%s); sending it as a "
                                 "document", upload.name, describe_error(exc))
                        as_photo = False
                        break
                    raise
            else:
                raise AssertionError("unreachable")
