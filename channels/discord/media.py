"""Files: attachments in (metadata, and their bytes from the CDN) and uploads out.

Inbound, each ``discord.Attachment`` becomes an :class:`Attachment` whose
``url`` is the attachment's CDN URL (signed by Discord; it stays valid for
about a day, long enough for the core to fetch it right after the message).
:meth:`Media.download` GETs it with a session of the adapter's own (no bot
token: the CDN wants none), reading at most ``limit`` bytes.

Outbound, the files of a reply are uploaded one message each (multipart, as
``discord.File``), with the file's caption as the message text, after the
reply's text. A file over ``discord_max_upload_mb`` (10 MB, Discord's limit
without server boosts) is refused with :class:`MediaTooLarge` before anything
is posted, and so is one Discord itself refuses as too large (HTTP 413, code
40005: a server whose limit is lower than configured).
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Sequence

import aiohttp
import discord

from bot.config.settings import Settings
from bot.contracts.files import OpenFile
from bot.contracts.media import MediaError, MediaTooLarge
from bot.contracts.messages import Attachment, OutboundFile, clean_text
from channels.delivery import DeliveryPolicy
from channels.discord.common import NO_PINGS, defuse_mentions, fit, log, piece_nonce
from channels.discord.rest import Rest
from channels.fetching import fetch_capped

DOWNLOAD_TIMEOUT = 120.0
"""Seconds one CDN download may take, connecting included."""
DEFAULT_MAX_UPLOAD_MB = 10.0
"""Discord's upload limit without server boosts (boosted servers take 25 MB or more)."""
REQUEST_TOO_LARGE = 40005
"""Discord's error code for an upload over the server's limit (with HTTP 413)."""
_MB = 1024 * 1024


class Media:
    """Attachment downloads from the CDN, and a reply's files uploaded through :class:`Rest`."""

    def __init__(self, settings: Settings, rest: Rest, *, delivery: DeliveryPolicy) -> None:
        """``delivery`` tunes the retries of a download (5xx, 429, dropped connections)."""
        self.settings = settings
        self.rest = rest
        self.delivery = delivery
        self._media_session: aiohttp.ClientSession | None = None

    async def download(self, attachment: Attachment, limit: int) -> bytes:
        """The bytes of ``attachment`` from Discord's CDN, at most ``limit`` of them.

        Raises :class:`MediaTooLarge` past ``limit`` (declared or read) and
        :class:`MediaError` with a one-line reason for anything else (an
        expired or deleted link; a CDN error or a dropped connection that
        lasted through the retries of the ``delivery`` policy).
        """
        name = attachment.name or "the file"
        url = attachment.url
        if not url.startswith(("https://", "http://")):
            raise MediaError(f"{name} has no Discord download link")
        session = self._media_session
        if session is None or session.closed:
            session = self._media_session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=DOWNLOAD_TIMEOUT))

        def check(response: aiohttp.ClientResponse) -> None:
            if response.status in (403, 404, 410):
                raise MediaError(f"Discord no longer serves {name} (HTTP {response.status}: "
                                 "the link expired or the file was deleted)")
            if response.status != 200:
                raise MediaError(f"Discord's CDN answered HTTP {response.status} for {name}")

        # No token: the CDN wants none. 5xx, 429 and dropped connections are retried.
        return await fetch_capped(session, url, limit, check=check, policy=self.delivery,
                                  what=f"downloading {name} from Discord")

    async def close(self) -> None:
        """Close the download session (a later download opens another)."""
        if self._media_session is not None:
            await self._media_session.close()
            self._media_session = None

    @property
    def max_upload(self) -> int:
        """The largest file uploaded, in bytes (``discord_max_upload_mb``)."""
        configured = getattr(self.settings, "discord_max_upload_mb", None)
        mb = configured if isinstance(configured, int | float) else DEFAULT_MAX_UPLOAD_MB
        return int(mb * _MB)

    def check_file(self, file: OutboundFile, size: int) -> None:
        """Raise :class:`MediaTooLarge` for a file over the limit (its size when opened).

        Checked (by :func:`channels.uploading.opened_files`) before anything of the
        reply is posted, so a refused file leaves no half-sent reply behind.
        """
        limit = self.max_upload
        if size > limit:
            raise MediaTooLarge(size, limit, _too_large(file.name, size, limit))

    async def upload_files(self, target: int, files: tuple[OutboundFile, ...],
                           opened: Sequence[OpenFile],
                           reference: discord.MessageReference | None,
                           delivery_id: str | None) -> str | None:
        """Post each file as a message of its own (caption as text); the last one's id.

        The first file carries ``reference`` (when the reply has no text).
        Each post has a nonce (derived from ``delivery_id`` when given), so a
        retry after a lost answer does not upload the file twice. The bytes come from
        ``opened`` (each file opened once), never from its path.
        """
        assert self.rest.client is not None
        channel = self.rest.client.get_partial_messageable(target)
        last: str | None = None
        for index, (file, source) in enumerate(zip(files, opened, strict=True)):
            caption = fit(defuse_mentions(file.caption)) if file.caption else None
            nonce: str | int = piece_nonce(f"{delivery_id}f{index}", 0) if delivery_id \
                else secrets.randbelow(1 << 62)
            ref = reference if index == 0 else None

            async def call(file: OutboundFile = file, source: OpenFile = source,
                           caption: str | None = caption, nonce: str | int = nonce,
                           ref: discord.MessageReference | None = ref) -> discord.Message:
                # A fresh reader at byte 0 per try: a failed try has read the first one.
                upload = discord.File(source.reader(), filename=file.name)
                try:
                    if ref is None:
                        return await channel.send(caption, file=upload,
                                                  allowed_mentions=NO_PINGS, nonce=nonce)
                    return await channel.send(caption, file=upload, allowed_mentions=NO_PINGS,
                                              reference=ref, nonce=nonce)
                finally:
                    upload.close()

            try:
                sent = await self.rest.deliver(
                    call, what=f"uploading {file.name} to discord:{target}")
            except discord.HTTPException as exc:
                if exc.status == 413 or exc.code == REQUEST_TOO_LARGE:
                    raise MediaTooLarge(source.size, 0, f"{file.name} is "
                                        f"{source.size / _MB:.1f} MB; Discord refused it as "
                                        "too large for this server") from exc
                raise
            except OSError as exc:
                raise MediaError(f"cannot read {file.name}: {exc.strerror or exc}") from exc
            self.rest.own.add(sent.id)
            log.info("discord: uploaded %s (%d bytes) to %s", file.name, source.size, target)
            last = str(sent.id)
        return last


def attachment_of(attachment: discord.Attachment, message_id: int) -> Attachment:
    """The core's :class:`Attachment` for one of a message's attachments.

    discord.py keeps the fields as the payload had them, and the core stores
    them as given (it cleans only text and names): text without lone
    surrogates, numbers only when they are numbers.
    """
    mime = clean_text(str(attachment.content_type or "")).split(";", 1)[0].strip().lower()
    major = mime.split("/", 1)[0]
    duration = _number(attachment.duration)
    if attachment.duration is not None and attachment.waveform is not None:
        kind = "voice"  # a voice message recorded in the Discord app
    elif major == "image":
        kind = "photo"
    elif major in ("audio", "video"):
        kind = major
    else:
        kind = "document" if mime else "file"
    name = clean_text(str(attachment.filename or "")) or f"{kind}-{message_id}"
    return Attachment(kind=kind, name=name, url=clean_text(str(attachment.url)),
                      mime_type=mime, size=_count(attachment.size),
                      width=_count(attachment.width), height=_count(attachment.height),
                      duration=duration)


def _count(value: object) -> int:
    return value if type(value) is int and value >= 0 else 0


def _number(value: object) -> float:
    # Stored as JSON in the inbox: no NaN or infinity.
    if (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value) and value >= 0):
        return float(value)
    return 0.0


def _too_large(name: str, size: int, limit: int) -> str:
    return (f"{name} is {size / _MB:.1f} MB; Discord takes files up to "
            f"{limit / _MB:g} MB")
