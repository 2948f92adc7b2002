"""Files people send: one :class:`Attachment` per file, and its download.

A message's photo, document, voice note, audio, video, video note or sticker
becomes an attachment whose ``url`` is Telegram's ``file_id``; nothing is
fetched until the core asks :meth:`Downloader.download` for the bytes, which
goes through ``getFile`` and the file URL under the configured API base
(``<base>/file/bot<token>/<file_path>``), reading at most ``limit`` bytes.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import aiohttp
from aiogram.client.session.aiohttp import AiohttpSession
from aiogram.exceptions import TelegramAPIError, TelegramBadRequest
from aiogram.methods import GetFile
from aiogram.types import Message, PhotoSize

from bot.contracts.media import MediaError, MediaTooLarge
from bot.contracts.messages import Attachment, clean_text
from bot.media.sniff import extension_for
from channels.delivery import DeliveryPolicy, RateLimited, Transient, deliver
from channels.fetching import read_capped
from channels.telegram.client import BotApi, ReplyGate, describe_error

if TYPE_CHECKING:
    from bot.config.settings import Settings

log = logging.getLogger("roost.channels.telegram")

MB = 1024 * 1024
GET_FILE_LIMIT = 20 * MB
"""The largest file the Bot API lets a bot download (``getFile`` refuses bigger ones)."""
FILE_FIELDS = ("photo", "animation", "document", "audio", "voice", "video", "video_note",
               "sticker")
"""The fields of a message :func:`file_attachments` reads a file from."""
NAME_LIMIT = 255
"""Characters kept of a file name Telegram declares (a forged update may send a megabyte)."""


def file_attachments(message: Message, cap: int) -> list[Attachment]:
    """An attachment for each file ``message`` carries; ``cap`` picks the photo size.

    Of a photo's sizes the largest whose declared size is at most ``cap`` is
    taken (all over it: the largest, which the core then refuses by size). A
    GIF arrives as ``animation`` and as ``document`` with the same file: one
    attachment. A static sticker is a ``photo`` (WebP); animated and video
    stickers are ``file``.
    """
    found: list[Attachment] = []
    mid = message.message_id
    if message.photo:
        best = _best_photo(message.photo, cap)
        found.append(Attachment("photo", name=f"photo-{mid}.jpg", url=best.file_id,
                                mime_type="image/jpeg", size=_count(best.file_size),
                                width=_count(best.width), height=_count(best.height)))
    if message.animation is not None:
        found.append(_file("video", message.animation, f"animation-{mid}", "video/mp4"))
    elif message.document is not None:
        found.append(_file("document", message.document, f"document-{mid}", ""))
    if message.audio is not None:
        found.append(_file("audio", message.audio, f"audio-{mid}", "audio/mpeg"))
    if message.voice is not None:
        found.append(_file("voice", message.voice, f"voice-{mid}", "audio/ogg"))
    if message.video is not None:
        found.append(_file("video", message.video, f"video-{mid}", "video/mp4"))
    if message.video_note is not None:
        note = message.video_note
        found.append(Attachment("video", name=f"video_note-{mid}.mp4", url=note.file_id,
                                mime_type="video/mp4", size=_count(note.file_size),
                                width=_count(note.length), height=_count(note.length),
                                duration=float(_count(note.duration))))
    if message.sticker is not None:
        sticker = message.sticker
        if sticker.is_video:
            kind, mime = "file", "video/webm"
        elif sticker.is_animated:
            kind, mime = "file", "application/x-tgsticker"
        else:
            kind, mime = "photo", "image/webp"
        extension = ".tgs" if sticker.is_animated and not sticker.is_video else \
            extension_for(mime)
        found.append(Attachment(kind, name=f"sticker-{mid}{extension}", url=sticker.file_id,
                                mime_type=mime, size=_count(sticker.file_size),
                                width=_count(sticker.width), height=_count(sticker.height)))
    return found


def _best_photo(sizes: Sequence[PhotoSize], cap: int) -> PhotoSize:
    """The largest size whose declared bytes fit ``cap`` (undeclared counts as fitting)."""
    def area(size: PhotoSize) -> tuple[int, int]:
        return _count(size.width) * _count(size.height), _count(size.file_size)

    fitting = [s for s in sizes if _count(s.file_size) <= cap]
    return max(fitting or sizes, key=area)


def _file(kind: str, media: Any, stem: str, default_mime: str) -> Attachment:
    """An attachment for a file with Telegram's optional name, type, size and shape."""
    mime = _clean(getattr(media, "mime_type", None) or "", 128) or default_mime
    name = _clean(getattr(media, "file_name", None) or "", NAME_LIMIT)
    if not name:
        name = stem + extension_for(mime)
    return Attachment(kind, name=name, url=str(media.file_id), mime_type=mime,
                      size=_count(getattr(media, "file_size", None)),
                      width=_count(getattr(media, "width", None)),
                      height=_count(getattr(media, "height", None)),
                      duration=float(_count(getattr(media, "duration", None))))


def _clean(value: str, limit: int) -> str:
    """A declared name or type: on one line, without NULs, at most ``limit`` long
    (a long name keeps its extension)."""
    text = " ".join(clean_text(value).replace("\x00", "").split())
    if len(text) <= limit:
        return text
    stem, dot, extension = text.rpartition(".")
    if dot and stem and len(extension) <= 16:
        return f"{stem[:limit - len(extension) - 1]}.{extension}"
    return text[:limit]


def _count(value: object) -> int:
    """A declared size, dimension or duration; 0 when missing or impossible."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 \
        else 0


class Downloader:
    """Files people sent, fetched: ``getFile``, then the file, streamed and cut at the limit."""

    def __init__(self, settings: Settings, api: BotApi, gate: ReplyGate, *,
                 policy: DeliveryPolicy, request_timeout: float) -> None:
        self.settings = settings
        self.api = api
        self.gate = gate
        self.policy = policy
        self.request_timeout = request_timeout

    async def download(self, attachment: Attachment, limit: int) -> bytes:
        """The bytes of ``attachment`` (its ``url`` is a ``file_id``), at most ``limit``.

        Raises :class:`MediaTooLarge` when the file is over ``limit`` (declared,
        announced by the file server, or counted while reading: never more than
        ``limit + 1`` bytes are kept) or over the 20 MB Telegram lets bots
        download; :class:`MediaError` with a one-line reason for anything else.
        Transient failures (5xx, resets) are retried under the channel's policy.
        """
        if not attachment.url:
            raise MediaError("the attachment has no Telegram file id")
        if attachment.size > limit:
            raise MediaTooLarge(attachment.size, limit)
        if attachment.size > GET_FILE_LIMIT:
            raise _too_big_for_bots(attachment.size)
        async with self.gate.entered() as live:
            if not live:
                raise MediaError("the Telegram channel is stopped")
            return await self._download(attachment, limit)

    async def _download(self, attachment: Attachment, limit: int) -> bytes:
        try:
            bot = self.api.required()
            try:
                found = await self.api.deliver(GetFile(file_id=attachment.url), "getFile")
            except TelegramBadRequest as exc:
                if "file is too big" in exc.message.lower():
                    raise _too_big_for_bots(attachment.size) from None
                raise MediaError(f"Telegram refused the file: {exc.message}") from None
            if not found.file_path:
                raise MediaError("Telegram gave no path for the file")
            if found.file_size is not None and found.file_size > limit:
                raise MediaTooLarge(found.file_size, limit)
            url = bot.session.api.file_url(bot.token, found.file_path)
            if not isinstance(bot.session, AiohttpSession):
                raise MediaError("the Telegram session cannot download files")
            session = await bot.session.create_session()
            return await deliver(lambda: self._fetch_file(session, url, limit),
                                 what="telegram file download", policy=self.policy)
        except MediaError:
            raise
        except (TelegramAPIError, Transient, RateLimited, RuntimeError) as exc:
            raise MediaError(self._reason(exc)) from None

    async def _fetch_file(self, session: aiohttp.ClientSession, url: str, limit: int) -> bytes:
        """One GET of the file: 5xx and network errors are :class:`Transient`."""
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.request_timeout,
                                        sock_read=self.request_timeout)
        try:
            async with session.get(url, timeout=timeout) as response:
                if response.status >= 500:
                    raise Transient(f"the file server answered HTTP {response.status}")
                if response.status != 200:
                    raise MediaError(f"Telegram's file server answered HTTP {response.status}")
                declared = response.content_length
                if (declared is not None and declared <= limit
                        and "Content-Encoding" not in response.headers):
                    # The body is exactly the declared length (aiohttp reads no more), so
                    # it is read whole: the buffers as they came off the socket, joined
                    # once, where 64 KB reads copied each of them again (~45 awaits).
                    return await response.read()
                # Kept only up to limit + 1: enough to know it is over.
                return await read_capped(response, limit)
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            # Never str(exc): aiohttp puts the URL, and so the token, in some messages.
            raise Transient(f"file download: {type(exc).__name__}") from None

    def _reason(self, exc: BaseException) -> str:
        """One line for people, without the token."""
        if isinstance(exc, Transient | RateLimited):
            text = f"Telegram did not deliver the file ({exc or type(exc).__name__})"
        else:
            text = f"the file could not be fetched from Telegram ({describe_error(exc)})"
        token = self.settings.telegram_bot_token
        if token is not None:
            text = text.replace(token.get_secret_value(), "<token>")
        return " ".join(text.split())[:300]


def _too_big_for_bots(size: int) -> MediaTooLarge:
    return MediaTooLarge(max(size, GET_FILE_LIMIT + 1), GET_FILE_LIMIT,
                         "Telegram does not let bots download files over 20 MB")
